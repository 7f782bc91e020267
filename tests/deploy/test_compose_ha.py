"""The HA profile of the docker compose cluster: three etcd members, two metaservers.

One cluster for the module, started by ``deploy/cluster.sh up --ha`` under a project name and
host ports of its own and always taken down again. Clients run on the host and are given both
metaservers. What must hold: after a kill -9 of the leading metaserver the other one leads
within seconds, clients keep working without an error and every write they were told succeeded
reads back; the killed one comes back as a follower. The loss of one etcd member changes
nothing. Without an etcd quorum metadata calls fail with a clear error while open files keep
reading, and everything works again once etcd is back.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from emberfs.cli.ports import free_port
from emberfs.client.fs import EmberFileSystem
from tests.deploy.test_compose import (
    ROOT,
    SKIP_REASON,
    STORAGE_SERVICES,
    TARGETS_PER_NODE,
    ComposeCluster,
    project_leftovers,
    wait_until,
)
from tests.load import WriteReadLoad

METASERVERS = ("metaserver", "metaserver2")
ETCD_SERVICES = ("etcd1", "etcd2", "etcd3")
HEARTBEAT_TIMEOUT = 3.0  # --heartbeat-timeout in deploy/docker-compose.ha.yml
CHUNK = 4 * 1024 * 1024  # the default chunk size
MiB = 1024 * 1024

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
    # Bringing the cluster up may build the base image and the server image first.
    pytest.mark.timeout(1500),
]


class HAComposeCluster(ComposeCluster):
    """A project of the HA profile: etcd1..3, metaserver and metaserver2, storage1..3."""

    def __init__(self, project: str) -> None:
        super().__init__(project)
        self.meta2_port = free_port(avoid={self.meta_port, self.admin_port})
        self.admin2_port = free_port(avoid={self.meta_port, self.admin_port, self.meta2_port})
        self.env.update(
            EMBERFS_HA="1",
            EMBERFS_META2_PORT=str(self.meta2_port),
            EMBERFS_ADMIN2_PORT=str(self.admin2_port),
        )
        self.admin_urls = {
            "metaserver": f"http://127.0.0.1:{self.admin_port}",
            "metaserver2": f"http://127.0.0.1:{self.admin2_port}",
        }
        self.meta = f"127.0.0.1:{self.meta_port},127.0.0.1:{self.meta2_port}"
        self._containers: dict[str, str] = {}

    def container(self, service: str) -> str:
        # looked up once: a killed container keeps its id
        if service not in self._containers:
            self._containers[service] = super().container(service)
        return self._containers[service]

    def get(self, path: str):
        """A GET of the admin API of the first metaserver that answers (either serves it all)."""
        failure: OSError | None = None
        for service in METASERVERS:
            try:
                with urllib.request.urlopen(self.admin_urls[service] + path, timeout=5) as r:
                    return json.load(r)
            except OSError as exc:
                failure = exc
        raise failure

    def leader_view(self, service: str) -> dict | None:
        """What ``/api/v1/leader`` of one metaserver says (None when it does not answer)."""
        try:
            with urllib.request.urlopen(
                self.admin_urls[service] + "/api/v1/leader", timeout=2
            ) as r:
                return json.load(r)
        except OSError:
            return None

    def leads(self, service: str) -> bool:
        view = self.leader_view(service)
        return view is not None and view["leading"]

    def leader(self) -> str | None:
        """The metaserver that leads, if every metaserver that answers names it."""
        views = {m: v for m in METASERVERS if (v := self.leader_view(m)) is not None}
        leading = [m for m, v in views.items() if v["leading"]]
        if len(leading) != 1:
            return None
        lead_id = views[leading[0]]["id"]
        if any((v["leader"] or {}).get("id") != lead_id for v in views.values()):
            return None
        return leading[0]

    def wait_leader(self, timeout: float = 60) -> str:
        found: list[str | None] = [None]

        def known() -> bool:
            found[0] = self.leader()
            return found[0] is not None

        wait_until(known, timeout, "a metaserver that leads", interval=0.2)
        return found[0]

    def fs(self, **kwargs) -> EmberFileSystem:
        return EmberFileSystem(meta=self.meta, skip_instance_cache=True, **kwargs)

    def etcd_leader(self) -> str:
        """The etcd member that leads the etcd cluster."""
        endpoints = ",".join(f"http://{e}:2379" for e in ETCD_SERVICES)
        for service in ETCD_SERVICES:
            r = subprocess.run(
                ["docker", "exec", self.container(service), "etcdctl", "--endpoints", endpoints]
                + ["--command-timeout=3s", "endpoint", "status", "-w", "json"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            for status in json.loads(r.stdout or "[]"):
                if status["Status"]["leader"] == status["Status"]["header"]["member_id"]:
                    return status["Endpoint"].removeprefix("http://").split(":")[0]
        raise AssertionError("no etcd member names a leader")

    def wait_healthy(self, services, timeout: float = 90) -> None:
        wait_until(
            lambda: all(self.health(s) == "running/healthy" for s in services),
            timeout,
            f"{', '.join(services)} healthy",
        )


class TargetWatch:
    """Polls the targets through the admin API; remembers every target seen not serving."""

    def __init__(self, cluster: HAComposeCluster) -> None:
        self.cluster = cluster
        self.not_serving: list[tuple[float, int, str]] = []
        self.polls = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.3):
            try:
                targets = self.cluster.targets()
            except OSError:
                continue  # neither admin API answered this round
            self.polls += 1
            for t in targets:
                if t["state"] != "serving":
                    self.not_serving.append((time.monotonic(), t["id"], t["state"]))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture(scope="module")
def ha_cluster():
    project = f"emberfsha{uuid.uuid4().hex[:8]}"
    cluster = HAComposeCluster(project)
    try:
        cluster.up()
        yield cluster
    finally:
        r = cluster.down()
        if r.returncode != 0:
            print(f"cluster.sh down failed: {r.stderr}")


def test_ha_cluster_up_with_a_leader_and_host_clients(ha_cluster: HAComposeCluster):
    c = ha_cluster
    for service in (*ETCD_SERVICES, *METASERVERS, *STORAGE_SERVICES):
        assert c.health(service) == "running/healthy", service
    leader = c.leader()  # 'up' returned once there was one
    assert leader in METASERVERS
    follower = next(m for m in METASERVERS if m != leader)
    views = {m: c.leader_view(m) for m in METASERVERS}
    for view in views.values():
        assert view["store"].startswith("etcd://etcd1:2379,etcd2:2379,etcd3:2379"), view
    # the leader is named by the address it advertises on the cluster network
    octet = {"metaserver": 10, "metaserver2": 20}[leader]
    assert views[follower]["leader"]["address"] == f"{c.net_prefix}.{octet}:9400"
    assert views[follower]["leader"]["admin_url"] == f"http://{c.net_prefix}.{octet}:9401"
    # the follower's admin API answers for the leader, which hears every storage server
    with urllib.request.urlopen(c.admin_urls[follower] + "/api/v1/nodes", timeout=5) as r:
        nodes = json.load(r)
    assert len(nodes) == len(STORAGE_SERVICES)
    assert all(n["up"] and n["last_heartbeat_seconds"] is not None for n in nodes), nodes
    targets = c.targets()
    assert len(targets) == len(STORAGE_SERVICES) * TARGETS_PER_NODE
    assert {t["state"] for t in targets} == {"serving"}
    expected = {f"storage{i}": f"{c.net_prefix}.1{i}:95{i}0" for i in (1, 2, 3)}
    assert {t["node"]: t["address"] for t in targets} == expected

    # The client config 'up' wrote names both metaservers: the command line works at once.
    config = Path(c.env["EMBERFS_CLIENT_CONFIG"]).read_text()
    assert f'meta = "127.0.0.1:{c.meta_port},127.0.0.1:{c.meta2_port}"' in config
    assert f'admin = "http://127.0.0.1:{c.admin_port}"' in config
    blob = os.urandom(5 * MiB + 11)
    local = Path(os.environ.get("TMPDIR", "/tmp")) / f"{c.project}-cli.bin"
    try:
        local.write_bytes(blob)
        c.cli("put", str(local), "/up/cli.bin")
    finally:
        local.unlink(missing_ok=True)
    assert "cli.bin" in c.cli("ls", "/up").decode()
    fs = c.fs()
    try:
        assert fs.cat_file("/up/cli.bin") == blob
    finally:
        fs.close()


def test_kill_9_of_the_leading_metaserver_while_clients_write_and_read(
    ha_cluster: HAComposeCluster,
):
    c = ha_cluster
    fs = c.fs(retry_timeout=60)
    load = WriteReadLoad(fs, "/failover")
    watch = TargetWatch(c)
    victim_service = victim = None
    try:
        big = os.urandom(40 * MiB)
        fs.pipe_file("/failover/big.bin", big)
        handle = fs.open("/failover/big.bin", "rb")
        first = handle.read(8 * MiB)
        load.start()
        wait_until(lambda: len(load) >= 10 or bool(load.errors), 60, "the first writes")
        leader = c.wait_leader()
        survivor = next(m for m in METASERVERS if m != leader)
        victim_service, victim = leader, c.container(leader)

        killed_at = time.monotonic()
        c.docker("kill", "-s", "KILL", victim)
        wait_until(lambda: c.leads(survivor), 15, f"{survivor} to lead", interval=0.1)
        failover = time.monotonic() - killed_at
        print(f"\nfailover after kill -9 of {leader}: {failover:.2f} s to {survivor}")

        # The clients go on with the survivor, and the storage servers heartbeat to it.
        at_failover = len(load)
        wait_until(
            lambda: len(load) >= at_failover + 20 or bool(load.errors), 60, "writes on the survivor"
        )
        wait_until(
            lambda: all(
                n["last_heartbeat_seconds"] is not None
                and n["last_heartbeat_seconds"] < HEARTBEAT_TIMEOUT
                for n in c.get("/api/v1/nodes")
            ),
            30,
            f"every storage server heartbeating to {survivor}",
        )
        assert "f0" in c.cli("ls", "/failover/w0").decode()  # the client config's list too
        rest = handle.read()
        handle.close()

        # The killed metaserver comes back as a follower of the survivor, under load.
        c.docker("start", victim)
        c.wait_healthy([leader], 60)
        survivor_id = c.leader_view(survivor)["id"]
        wait_until(
            lambda: (
                (v := c.leader_view(leader)) is not None
                and not v["leading"]
                and (v["leader"] or {}).get("id") == survivor_id
            ),
            30,
            f"{leader} to follow {survivor}",
        )
        victim = None
        at_rejoin = len(load)
        wait_until(
            lambda: len(load) >= at_rejoin + 10 or bool(load.errors), 60, "writes after the rejoin"
        )
        assert c.leader() == survivor
        load.stop()
        load.verify()  # no error reached the application, every acknowledged write reads back
        assert first + rest == big
        assert len(load) > at_failover + 30
        watch.close()
        assert watch.polls > 10
        assert not watch.not_serving, f"targets left the serving state: {watch.not_serving[:5]}"
        assert failover < 15
        print(f"{len(load)} acknowledged writes read back, {at_failover} before the kill")
    finally:
        load.stop()
        watch.close()
        fs.close()
        if victim is not None:  # the next tests need both metaservers, even after a failure
            c.docker("start", victim)
            c.wait_healthy([victim_service], 60)
        c.wait_leader()


def test_one_etcd_member_killed_the_cluster_keeps_serving(ha_cluster: HAComposeCluster):
    c = ha_cluster
    fs = c.fs(retry_timeout=30)
    files = {f"/one-etcd/before-{i}.bin": os.urandom(2 * MiB + i) for i in range(3)}
    victim_service = c.etcd_leader()  # the hardest member to lose: etcd elects another
    victim = c.container(victim_service)
    try:
        for path, data in files.items():
            fs.pipe_file(path, data)
        c.docker("kill", "-s", "KILL", victim)
        # creates, writes, reads, renames, removals, listings
        fs.mkdir("/one-etcd/made")
        for i in range(8):
            path = f"/one-etcd/made/during-{i}.bin"
            files[path] = os.urandom(MiB + 7 * i)
            fs.pipe_file(path, files[path])
        files["/one-etcd/before-0.bin"] = os.urandom(6 * MiB)
        fs.pipe_file("/one-etcd/before-0.bin", files["/one-etcd/before-0.bin"])
        fs.mv("/one-etcd/before-1.bin", "/one-etcd/made/moved.bin")
        files["/one-etcd/made/moved.bin"] = files.pop("/one-etcd/before-1.bin")
        fs.rm("/one-etcd/before-2.bin")
        del files["/one-etcd/before-2.bin"]
        with fs.open("/one-etcd/made/appended.bin", "wb") as f:
            f.write(b"a" * MiB)
        with fs.open("/one-etcd/made/appended.bin", "ab") as f:
            f.write(b"b" * MiB)
        files["/one-etcd/made/appended.bin"] = b"a" * MiB + b"b" * MiB
        assert sorted(fs.find("/one-etcd")) == sorted(files)
        for path, data in files.items():
            assert fs.info(path)["size"] == len(data), path
            assert fs.cat_file(path) == data, path
        assert c.wait_leader(10) in METASERVERS
        assert c.all_serving()
        assert c.health(victim_service).startswith("exited/")
    finally:
        c.docker("start", victim)
        c.wait_healthy(ETCD_SERVICES)
    # the member catches up; nothing changed for the clients
    fs.pipe_file("/one-etcd/after.bin", b"z" * 1000)
    assert fs.cat_file("/one-etcd/after.bin") == b"z" * 1000
    fs.close()
    c.wait_serving(60)


def test_without_an_etcd_quorum_metadata_fails_clearly_and_open_files_keep_reading(
    ha_cluster: HAComposeCluster,
):
    c = ha_cluster
    chunks = 24
    data = os.urandom(chunks * CHUNK)
    # each read goes to a chunk not read before, so no readahead or cache can answer it
    order = [k * 7 % chunks for k in range(1, chunks)]  # every chunk but the first, scattered
    fs = c.fs(retry_timeout=4, read_timeout=10)
    victims = [c.container(s) for s in ETCD_SERVICES[:2]]
    killed: list[str] = []
    try:
        fs.pipe_file("/quorum/keep.bin", data)
        handle = fs.open("/quorum/keep.bin", "rb")
        assert handle.read(MiB) == data[:MiB]

        def read_new_chunk() -> None:
            chunk = order.pop(0)
            offset = chunk * CHUNK + (chunk * 131072) % (CHUNK - 8192)
            handle.seek(offset)
            assert handle.read(8192) == data[offset : offset + 8192], f"chunk {chunk}"

        for victim in victims:
            c.docker("kill", "-s", "KILL", victim)
            killed.append(victim)
        started = time.monotonic()
        while time.monotonic() - started < 2 * HEARTBEAT_TIMEOUT:
            read_new_chunk()
            time.sleep(0.4)

        asked = time.monotonic()
        with pytest.raises(OSError) as failed:
            fs.info("/quorum/keep.bin")
        assert failed.value.errno == errno.EAGAIN, failed.value
        assert "metadata store" in str(failed.value) and "unavailable" in str(failed.value)
        with pytest.raises(OSError) as failed:
            fs.pipe_file("/quorum/new.bin", b"y")
        assert failed.value.errno == errno.EAGAIN, failed.value
        print(f"\nwithout a quorum: a stat and a create failed in {time.monotonic() - asked:.1f} s")

        while len(order) > 4:  # the open file still reads, later than two heartbeat timeouts
            read_new_chunk()
            time.sleep(0.2)
        assert time.monotonic() - started > 2 * HEARTBEAT_TIMEOUT

        outage = time.monotonic() - started
        for victim in victims:
            c.docker("start", victim)
        killed.clear()
        deadline = time.monotonic() + 90
        while True:
            try:
                fs.pipe_file("/quorum/new.bin", b"y" * 1000)
                break
            except OSError:
                assert time.monotonic() < deadline, "the metadata store did not come back"
                time.sleep(0.5)
        back = time.monotonic() - started - outage
        print(f"etcd without a quorum for {outage:.1f} s, metadata back {back:.1f} s after")
        while order:
            read_new_chunk()
        handle.seek(0)
        assert handle.read() == data
        handle.close()
        assert fs.cat_file("/quorum/new.bin") == b"y" * 1000
        c.wait_healthy(ETCD_SERVICES)
        c.wait_serving(90)
        assert c.wait_leader(30) in METASERVERS
    finally:
        for victim in killed:
            c.docker("start", victim)
        fs.close()


def test_down_leaves_nothing_behind(ha_cluster: HAComposeCluster):
    c = ha_cluster
    leftovers = project_leftovers(c.project)
    assert any("etcd1-data" in x for x in leftovers), leftovers
    # every volume of a container, named or anonymous
    mounted = set()
    for service in (*ETCD_SERVICES, *METASERVERS, *STORAGE_SERVICES):
        names = "{{range .Mounts}}{{if .Name}}{{.Name}} {{end}}{{end}}"
        mounted.update(c.docker("inspect", "-f", names, c.container(service)).split())
    assert len(mounted) >= len(ETCD_SERVICES) + len(METASERVERS) + len(STORAGE_SERVICES)
    r = c.down()
    assert r.returncode == 0, r.stderr
    assert project_leftovers(c.project) == []
    assert not mounted & set(c.docker("volume", "ls", "-q").split())
    assert not (ROOT / "deploy" / ".cache" / "clusters" / f"{c.project}.env").exists()
