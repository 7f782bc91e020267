"""The docker compose cluster (deploy/): images, failures of containers, teardown.

One cluster per module, started by ``deploy/cluster.sh up`` under a project name and host
ports of its own and always taken down again. Clients run on the host and reach the storage
servers at the addresses they advertise on the cluster network.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from emberfs.cli.ports import free_port
from emberfs.client.fs import EmberFileSystem
from emberfs.common import grpcauth
from emberfs.common.auth import ClusterKeys
from emberfs.proto import storage_pb2, storage_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "deploy" / "cluster.sh"
STORAGE_SERVICES = ("storage1", "storage2", "storage3")
TARGETS_PER_NODE = 2
MiB = 1024 * 1024


def _docker_unavailable() -> str | None:
    """Why these tests cannot run here, or None when they can."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info failed: {exc}"
    if info.returncode != 0:
        return "the Docker engine is not reachable (docker info failed)"
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    if plugin.returncode != 0 and shutil.which("docker-compose") is None:
        return "neither 'docker compose' nor 'docker-compose' is installed"
    return None


SKIP_REASON = _docker_unavailable()

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
    # Bringing the cluster up may build the base image and the server image first.
    pytest.mark.timeout(1500),
]


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval=0.5) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class ComposeCluster:
    """A running compose project and the ways to poke at it."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.meta_port = free_port()
        self.admin_port = free_port(avoid={self.meta_port})
        self.env = dict(
            os.environ,
            EMBERFS_COMPOSE_PROJECT=project,
            EMBERFS_META_PORT=str(self.meta_port),
            EMBERFS_ADMIN_PORT=str(self.admin_port),
            EMBERFS_UP_TIMEOUT="240",
            # the client config 'up' writes: this cluster's address and admin token
            EMBERFS_CLIENT_CONFIG=str(
                Path(os.environ.get("TMPDIR", "/tmp")) / f"{project}-client.toml"
            ),
        )
        for setting in ("EMBERFS_NET_PREFIX", "EMBERFS_INSECURE", "EMBERFS_HA"):
            self.env.pop(setting, None)
        self.keys: ClusterKeys | None = None
        self.meta = f"127.0.0.1:{self.meta_port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        self.net_prefix = ""

    # processes ------------------------------------------------------------------------
    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(CLUSTER_SH), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def up(self) -> None:
        r = self.script("up", timeout=1200)
        assert r.returncode == 0, f"cluster.sh up failed:\n{r.stdout}\n{r.stderr[-4000:]}"
        settings = dict(
            line.split("=", 1) for line in self.script("env").stdout.splitlines() if "=" in line
        )
        self.net_prefix = settings["EMBERFS_NET_PREFIX"]
        self.keys = ClusterKeys.from_file(settings["EMBERFS_CLUSTER_KEY"])

    def down(self) -> subprocess.CompletedProcess:
        return self.script("down", timeout=180)

    def container(self, service: str) -> str:
        r = self.script("compose", "ps", "-q", service, timeout=60)
        cid = r.stdout.strip()
        assert r.returncode == 0 and cid, f"no container for {service}: {r.stderr}"
        return cid

    @property
    def network(self) -> str:
        return f"{self.project}_emberfs"

    def docker(self, *args: str, timeout: float = 120) -> str:
        r = subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        assert r.returncode == 0, f"docker {' '.join(args)} failed: {r.stderr}"
        return r.stdout

    def health(self, service: str) -> str:
        return self.docker(
            "inspect",
            "-f",
            "{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{end}}",
            self.container(service),
        ).strip()

    # admin API ------------------------------------------------------------------------
    def get(self, path: str):
        with urllib.request.urlopen(self.admin + path, timeout=5) as r:
            return json.load(r)

    def targets(self) -> list[dict]:
        return self.get("/api/v1/targets")

    def chains(self) -> list[dict]:
        return self.get("/api/v1/chains")

    def all_serving(self) -> bool:
        try:
            targets = self.targets()
        except OSError:
            return False
        return len(targets) == len(STORAGE_SERVICES) * TARGETS_PER_NODE and all(
            t["state"] == "serving" for t in targets
        )

    def wait_serving(self, timeout: float = 120) -> None:
        wait_until(self.all_serving, timeout, "every target serving")

    def node_targets(self, node: str) -> list[dict]:
        return [t for t in self.targets() if t["node"] == node]

    # clients --------------------------------------------------------------------------
    def fs(self, **kwargs) -> EmberFileSystem:
        return EmberFileSystem(meta=self.meta, skip_instance_cache=True, **kwargs)

    def cli(self, *args: str, stdin: bytes | None = None, timeout=120) -> bytes:
        # as a user of this host would: nothing set, the client config written by 'up'
        env = dict(os.environ, EMBERFS_CONFIG=self.env["EMBERFS_CLIENT_CONFIG"])
        env.pop("EMBERFS_META", None)
        env.pop("EMBERFS_TOKEN", None)
        r = subprocess.run(
            ["emberfs", *args], input=stdin, capture_output=True, env=env, timeout=timeout
        )
        assert r.returncode == 0, f"emberfs {' '.join(args)}: {r.stderr.decode()[-2000:]}"
        return r.stdout

    def list_chunks(self, target: dict) -> dict[tuple[int, int], tuple[int, int, int, int]]:
        """Every chunk of one target: (inode, index) -> (version, pending, length, crc)."""
        out: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        with grpcauth.channel(target["grpc_address"], keys=self.keys) as channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            req = storage_pb2.ListChunksRequest(target_id=target["id"], limit=1000)
            while True:
                resp = stub.ListChunks(req, timeout=10)
                for c in resp.chunks:
                    out[(c.inode, c.index)] = (c.version, c.pending_version, c.length, c.checksum)
                if not resp.more:
                    return out
                last = resp.chunks[-1]
                req = storage_pb2.ListChunksRequest(
                    target_id=target["id"],
                    limit=1000,
                    has_after=True,
                    after_inode=last.inode,
                    after_index=last.index,
                )


def project_leftovers(project: str) -> list[str]:
    """Containers, networks and volumes that still belong to a compose project."""
    label = f"label=com.docker.compose.project={project}"
    found: list[str] = []
    for kind, cmd in (
        ("container", ["docker", "ps", "-aq", "--filter", label]),
        ("network", ["docker", "network", "ls", "-q", "--filter", label]),
        ("volume", ["docker", "volume", "ls", "-q", "--filter", label]),
        ("network", ["docker", "network", "ls", "-q", "--filter", f"name=^{project}_"]),
        ("volume", ["docker", "volume", "ls", "-q", "--filter", f"name=^{project}_"]),
    ):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
        found += [f"{kind} {x}" for x in out.split()]
    return found


@pytest.fixture(scope="module")
def compose_cluster():
    project = f"emberfstest{uuid.uuid4().hex[:8]}"
    cluster = ComposeCluster(project)
    try:
        cluster.up()
        yield cluster
    finally:
        r = cluster.down()
        if r.returncode != 0:
            print(f"cluster.sh down failed: {r.stderr}")


def _sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


def test_cluster_up_healthy_and_host_clients(compose_cluster: ComposeCluster):
    c = compose_cluster
    for service in ("metaserver", *STORAGE_SERVICES):
        assert c.health(service) == "running/healthy", service
    targets = c.targets()
    assert len(targets) == len(STORAGE_SERVICES) * TARGETS_PER_NODE
    assert {t["state"] for t in targets} == {"serving"}
    # Every storage server advertises its fixed address on the cluster network.
    expected = {f"storage{i}": f"{c.net_prefix}.1{i}:95{i}0" for i in (1, 2, 3)}
    assert {t["node"]: t["address"] for t in targets} == expected
    assert all(len(ch["targets"]) == 3 for ch in c.chains())

    fs = c.fs()
    try:
        payloads = {
            "/basic/empty": b"",
            "/basic/small.txt": b"hello from the host\n",
            "/basic/multi-chunk.bin": os.urandom(11 * MiB + 12345),
        }
        for path, data in payloads.items():
            fs.pipe_file(path, data)
        assert sorted(fs.ls("/basic", detail=False)) == sorted(payloads)
        for path, data in payloads.items():
            assert fs.info(path)["size"] == len(data)
            assert fs.cat_file(path) == data
        with fs.open("/basic/multi-chunk.bin", "rb") as f:
            f.seek(4 * MiB - 10)
            assert f.read(20) == payloads["/basic/multi-chunk.bin"][4 * MiB - 10 : 4 * MiB + 10]
    finally:
        fs.close()

    # The command line, as the README shows it.
    blob = os.urandom(5 * MiB + 7)
    local = Path(os.environ.get("TMPDIR", "/tmp")) / f"{c.project}-cli.bin"
    try:
        local.write_bytes(blob)
        c.cli("put", str(local), "/basic/cli.bin")
    finally:
        local.unlink(missing_ok=True)
    assert c.cli("cat", "/basic/cli.bin") == blob
    assert "cli.bin" in c.cli("ls", "/basic").decode()


def test_kill_storage_during_large_read(compose_cluster: ComposeCluster):
    c = compose_cluster
    size = 256 * MiB
    data = os.urandom(size)
    digest = _sha256(data)
    # each 4 MiB block's digest, so that a mismatch names the blocks that differ
    blocks = [_sha256(data[i : i + 4 * MiB]) for i in range(0, size, 4 * MiB)]
    fs = c.fs()
    victim = c.container("storage2")
    try:
        fs.pipe_file("/big/256m.bin", data)
        del data
        h = hashlib.sha256()
        read = 0
        killed_at = None
        wrong = []
        with fs.open("/big/256m.bin", "rb") as f:
            while True:
                block = f.read(4 * MiB)
                if not block:
                    break
                h.update(block)
                if _sha256(block) != blocks[read // (4 * MiB)]:
                    zeros = block.count(0) == len(block)
                    wrong.append(f"block at {read >> 20} MiB{' (all zeros)' if zeros else ''}")
                read += len(block)
                if killed_at is None and read >= 48 * MiB:
                    c.docker("kill", victim)
                    killed_at = read
        assert killed_at is not None and killed_at < size
        assert read == size
        assert not wrong, f"killed at {killed_at >> 20} MiB; wrong: {wrong}"
        assert h.hexdigest() == digest
        # The metaserver notices: the killed node's targets leave the serving state.
        wait_until(
            lambda: all(t["state"] != "serving" for t in c.node_targets("storage2")),
            30,
            "storage2's targets to go offline",
        )
        # Reads keep working from the two remaining replicas.
        assert _sha256(fs.cat_file("/big/256m.bin")) == digest
    finally:
        fs.close()
        c.docker("start", victim)
        c.wait_serving(180)  # the next tests need the whole cluster, even after a failure here
    assert c.health("storage2").startswith("running/")


def _replicas_identical(c: ComposeCluster) -> tuple[bool, str]:
    targets = {t["id"]: t for t in c.targets()}
    report = []
    ok = True
    for chain in c.chains():
        listings = {m["id"]: c.list_chunks(targets[m["id"]]) for m in chain["targets"]}
        first_id, first = next(iter(listings.items()))
        if any(v[1] for v in first.values()):
            ok = False
            report.append(f"chain {chain['id']}: target {first_id} has pending versions")
        for tid, listing in listings.items():
            if listing != first:
                ok = False
                diff = sorted(set(listing.items()) ^ set(first.items()))[:5]
                report.append(f"chain {chain['id']}: target {tid} != {first_id}: {diff}")
        if not first:
            ok = False
            report.append(f"chain {chain['id']}: no chunks")
    return ok, "; ".join(report)


def test_network_partition_offline_writes_then_resync(compose_cluster: ComposeCluster):
    c = compose_cluster
    fs = c.fs()
    victim = c.container("storage3")
    files: dict[str, bytes] = {}
    disconnected = False
    try:
        for i in range(3):
            files[f"/part/before-{i}.bin"] = os.urandom(6 * MiB + i)
        files["/part/doomed.bin"] = os.urandom(9 * MiB)
        files["/part/rewritten.bin"] = os.urandom(5 * MiB)
        for path, data in files.items():
            fs.pipe_file(path, data)

        c.docker("network", "disconnect", c.network, victim)
        disconnected = True
        wait_until(
            lambda: all(t["state"] == "offline" for t in c.node_targets("storage3")),
            30,
            "storage3's targets to go offline",
        )
        assert all(t["state"] == "serving" for t in c.targets() if t["node"] != "storage3")

        # Writes continue on the remaining replicas: new files, a rewrite, a removal.
        for i in range(3):
            files[f"/part/during-{i}.bin"] = os.urandom(7 * MiB + 3 * i)
            fs.pipe_file(f"/part/during-{i}.bin", files[f"/part/during-{i}.bin"])
        files["/part/rewritten.bin"] = os.urandom(13 * MiB)
        fs.pipe_file("/part/rewritten.bin", files["/part/rewritten.bin"])
        fs.rm("/part/doomed.bin")
        del files["/part/doomed.bin"]

        c.docker(
            "network",
            "connect",
            "--ip",
            f"{c.net_prefix}.13",
            "--alias",
            "storage3",
            c.network,
            victim,
        )
        disconnected = False
        c.wait_serving(180)

        # Resync and garbage collection settle: every replica of a chain holds the same
        # chunks at the same versions with the same checksums.
        state = {"why": ""}

        def identical() -> bool:
            ok, state["why"] = _replicas_identical(c)
            return ok

        try:
            wait_until(identical, 120, "identical replicas", interval=2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {state['why']}") from None

        assert sorted(fs.ls("/part", detail=False)) == sorted(files)
        for path, data in files.items():
            assert fs.cat_file(path) == data, path
    finally:
        fs.close()
        if disconnected:
            subprocess.run(
                ["docker", "network", "connect", "--ip", f"{c.net_prefix}.13", c.network, victim],
                capture_output=True,
                timeout=60,
            )


def _iptables(c: ComposeCluster, service: str, *rule: str) -> None:
    """An iptables rule change inside the network namespace of a service's container."""
    pid = c.docker("inspect", "-f", "{{.State.Pid}}", c.container(service)).strip()
    r = subprocess.run(
        ["nsenter", "-t", pid, "-n", "iptables", "-w", "5", *rule],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, f"iptables {' '.join(rule)}: {r.stderr}"


@pytest.mark.skipif(
    shutil.which("nsenter") is None or shutil.which("iptables") is None or os.geteuid() != 0,
    reason="cutting one container from another needs nsenter, iptables and root",
)
def test_a_replica_cut_from_the_metaserver_alone_serves_no_stale_bytes(
    compose_cluster: ComposeCluster,
):
    """Cut storage3 from the metaserver only: it stops serving before the chains move on.

    A client that still holds the routing from before the cut (every chain lists a
    storage3 target as serving) reads a file rewritten after the cluster declared
    storage3 offline: each read returns the new bytes (storage3 is fenced: it refuses,
    and the client refreshes its routing), never the old bytes storage3 still holds.
    """
    c = compose_cluster
    path = "/fence/f.bin"
    old, new = os.urandom(3 * MiB), os.urandom(3 * MiB)
    stale, fresh = c.fs(), c.fs()
    meta_ip = f"{c.net_prefix}.10"
    rules = [["INPUT", "-s", meta_ip, "-j", "DROP"], ["OUTPUT", "-d", meta_ip, "-j", "DROP"]]
    cut = []
    try:
        fresh.pipe_file(path, old)
        assert stale.cat_file(path) == old  # its routing: storage3 serving in every chain
        for rule in rules:
            _iptables(c, "storage3", "-I", *rule)
            cut.append(rule)
        wait_until(
            lambda: all(t["state"] == "offline" for t in c.node_targets("storage3")),
            30,
            "storage3's targets to go offline",
        )
        fresh.pipe_file(path, new)  # the chains without storage3 take the rewrite
        for i in range(12):  # reads spread over the replicas the stale routing names
            with stale.open(path, "rb", block_size=0) as f:
                got = f.read()
            assert got == new, f"read {i} returned {'the old bytes' if got == old else 'bad bytes'}"
    finally:
        for rule in cut:
            _iptables(c, "storage3", "-D", *rule)
        stale.close()
        fresh.close()
    c.wait_serving(180)
    check = c.fs()
    try:
        assert check.cat_file(path) == new
    finally:
        check.close()


def test_metaserver_restart_keeps_namespace_and_clients(compose_cluster: ComposeCluster):
    c = compose_cluster
    fs = c.fs()
    try:
        files = {f"/restart/d{i % 3}/f{i}.bin": os.urandom(1 * MiB + i) for i in range(9)}
        for path, data in files.items():
            fs.pipe_file(path, data)
        tree_before = {
            p: (i["type"], i["size"]) for p, i in fs.find("/", withdirs=True, detail=True).items()
        }
        chains_before = c.chains()

        restart = subprocess.Popen(
            ["docker", "restart", "-t", "10", c.container("metaserver")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        # A client keeps writing through the restart; its calls are retried.
        written: dict[str, bytes] = {}
        errors: list[BaseException] = []
        started_during_restart = []

        def writer() -> None:
            try:
                i = 0
                while restart.poll() is None or i < 3:
                    if restart.poll() is None:
                        started_during_restart.append(i)
                    path = f"/restart/during/w{i}.bin"
                    written[path] = os.urandom(256 * 1024 + i)
                    fs.pipe_file(path, written[path])
                    i += 1
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        try:
            assert restart.wait(timeout=120) == 0, restart.stderr.read()
        finally:
            t.join(timeout=180)
        assert not t.is_alive(), "the writer hung across the metaserver restart"
        assert not errors, f"writes failed across the restart: {errors[0]!r}"
        assert started_during_restart, "no write overlapped the restart"

        wait_until(lambda: c.health("metaserver") == "running/healthy", 120, "metaserver health")
        c.wait_serving(120)
        tree_after = {
            p: (i["type"], i["size"]) for p, i in fs.find("/", withdirs=True, detail=True).items()
        }
        for path, entry in tree_before.items():
            assert tree_after.get(path) == entry, path
        assert {ch["id"]: sorted(m["id"] for m in ch["targets"]) for ch in c.chains()} == {
            ch["id"]: sorted(m["id"] for m in ch["targets"]) for ch in chains_before
        }
        for path, data in {**files, **written}.items():
            assert fs.cat_file(path) == data, path
        # A new client of the restarted metaserver sees the same namespace.
        fresh = c.fs()
        try:
            assert sorted(fresh.ls("/restart/during", detail=False)) == sorted(written)
        finally:
            fresh.close()
    finally:
        fs.close()


def _in_client(c: ComposeCluster, script: str, timeout: float = 120) -> str:
    """Run a shell script in the client container (EmberFS mounted at /mnt/emberfs)."""
    r = c.script("compose", "exec", "-T", "client", "sh", "-c", script, timeout=timeout)
    assert r.returncode == 0, f"in the client container: {script}\n{r.stdout}\n{r.stderr[-2000:]}"
    return r.stdout


def test_client_container_mount_writes_and_reads(compose_cluster: ComposeCluster):
    """Bytes written through the client container's mount read back there and on the host."""
    c = compose_cluster
    assert c.health("client") == "running/healthy"
    size = 9 * MiB + 4321  # three chunks, the last one short
    out = _in_client(
        c,
        "set -e; mkdir -p /mnt/emberfs/mount; "
        f"head -c {size} /dev/urandom >/tmp/src; "
        "dd if=/tmp/src of=/mnt/emberfs/mount/from-client.bin bs=1M conv=fsync status=none; "
        "sync; sha256sum /tmp/src /mnt/emberfs/mount/from-client.bin",
    )
    written, read_back = (line.split()[0] for line in out.splitlines())
    assert read_back == written
    host_data = os.urandom(5 * MiB + 7)
    fs = c.fs()
    try:
        from_client = fs.cat_file("/mount/from-client.bin")
        assert len(from_client) == size and _sha256(from_client) == written
        fs.pipe_file("/mount/from-host.bin", host_data)
    finally:
        fs.close()
    # a file the mount has never held: its bytes come from the storage servers
    out = _in_client(c, "sha256sum /mnt/emberfs/mount/from-host.bin")
    assert out.split()[0] == _sha256(host_data)


def test_client_container_listing_and_stop_unmounts(compose_cluster: ComposeCluster):
    c = compose_cluster
    out = _in_client(
        c,
        "set -e; grep ' /mnt/emberfs ' /proc/mounts; ls -l /mnt/emberfs/mount; "
        "stat -c '%s %F %U' /mnt/emberfs/mount/from-client.bin",
    )
    mounts, *listing, stat_line = out.splitlines()
    assert mounts.split()[2] == "fuse.emberfs", mounts
    assert {line.split()[-1] for line in listing if line.startswith("-")} == {
        "from-client.bin",
        "from-host.bin",
    }
    assert stat_line == f"{9 * MiB + 4321} regular file root"
    # SIGTERM (compose stop) unmounts: the mount ends within the grace period (10 s),
    # with exit code 0 and without a traceback
    cid = c.container("client")
    started = time.monotonic()
    r = c.script("compose", "stop", "client", timeout=60)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started < 8
    state = c.docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", cid).split()
    assert state == ["exited", "0"], state
    logs = c.script("compose", "logs", "--no-color", "client", timeout=60).stdout
    assert "Traceback" not in logs, logs[-3000:]
    # started again, it mounts again
    r = c.script("compose", "start", "client", timeout=60)
    assert r.returncode == 0, r.stderr
    health = ("inspect", "-f", "{{.State.Health.Status}}", cid)
    wait_until(lambda: c.docker(*health).strip() == "healthy", 60, "the client to mount again")
    assert "from-host.bin" in _in_client(c, "ls /mnt/emberfs/mount")


LOCK_HOLDER = (
    "import fcntl, sys\n"
    "f = open(sys.argv[1], 'rb')\n"
    "fcntl.flock(f, fcntl.LOCK_EX)\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"  # holds the lock until its stdin closes
)
LOCK_TRY = (
    "import fcntl, sys\n"
    "f = open(sys.argv[1], 'rb')\n"
    "try:\n"
    "    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
    "    print('granted')\n"
    "except BlockingIOError:\n"
    "    print('busy')\n"
)
LOCK_WAITER = (
    "import fcntl, sys\n"
    "f = open(sys.argv[1], 'rb')\n"
    "print('waiting', flush=True)\n"
    "fcntl.flock(f, fcntl.LOCK_EX)\n"
    "print('granted', flush=True)\n"
)
LOCK_APPENDER = (
    "import fcntl, os, sys\n"
    "path, name, lines = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
    "with open(path, 'ab', buffering=0) as f:\n"
    "    for i in range(lines):\n"
    "        fcntl.flock(f, fcntl.LOCK_EX)\n"
    "        f.seek(0, os.SEEK_END)\n"
    "        f.write(f'{name} {i:05d}\\n'.encode())\n"
    "        fcntl.flock(f, fcntl.LOCK_UN)\n"
)


def _second_client(c: ComposeCluster) -> str:
    """Another client container like ``client`` (its image, token and network), mounted."""
    first = c.container("client")
    image = c.docker("inspect", "-f", "{{.Config.Image}}", first).strip()
    env = json.loads(c.docker("inspect", "-f", "{{json .Config.Env}}", first))
    token = next(e.split("=", 1)[1] for e in env if e.startswith("EMBERFS_TOKEN="))
    cid = c.docker(
        "run", "-d", "--init", "--user", "root", "--name", f"{c.project}-client2",
        "--network", c.network, "--device", "/dev/fuse", "--cap-add", "SYS_ADMIN",
        "--security-opt", "apparmor=unconfined", "-e", f"EMBERFS_TOKEN={token}",
        image, "mount", "/mnt/emberfs", "--foreground", "--meta=metaserver:9400",
    ).strip()  # fmt: skip

    def mounted() -> bool:
        r = subprocess.run(
            ["docker", "exec", cid, "mountpoint", "-q", "/mnt/emberfs"],
            capture_output=True,
            timeout=30,
        )
        return r.returncode == 0

    wait_until(mounted, 60, "the second client container to mount")
    return cid


def _exec(cid: str, script: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        ["docker", "exec", "-i", cid, "python3", "-c", script, *args], text=True, **popen
    )


def test_two_client_containers_contend_for_locks(compose_cluster: ComposeCluster):
    """flock through two client containers' mounts: one lock, and appends that lose no line."""
    c = compose_cluster
    second = _second_client(c)
    first = c.container("client")
    path = "/mnt/emberfs/locks/log"
    try:
        _in_client(c, f"mkdir -p /mnt/emberfs/locks && : > {path}")
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        holder = _exec(first, LOCK_HOLDER, path, **pipes)
        assert holder.stdout.readline().strip() == "locked"
        tried = _exec(second, LOCK_TRY, path, stdout=subprocess.PIPE)
        assert tried.communicate(timeout=60)[0].strip() == "busy"
        waiter = _exec(second, LOCK_WAITER, path, stdout=subprocess.PIPE)
        assert waiter.stdout.readline().strip() == "waiting"
        time.sleep(2)
        assert waiter.poll() is None, "the waiter got a lock that is held"
        holder.stdin.close()  # the holder exits: its lock goes
        assert holder.wait(60) == 0
        assert waiter.communicate(timeout=60)[0].strip() == "granted"
        lines = 30
        appenders = [
            _exec(cid, LOCK_APPENDER, path, f"{name}{i}", str(lines))
            for cid, name in ((first, "a"), (second, "b"))
            for i in range(2)
        ]
        for proc in appenders:
            assert proc.wait(300) == 0
        fs = c.fs()
        try:
            got = fs.cat_file("/locks/log").decode().splitlines()
        finally:
            fs.close()
        expected = [f"{n}{i} {k:05d}" for n in "ab" for i in range(2) for k in range(lines)]
        assert sorted(got) == sorted(expected)
    finally:
        subprocess.run(["docker", "rm", "-f", second], capture_output=True, timeout=60)


def test_down_leaves_nothing_behind(compose_cluster: ComposeCluster):
    c = compose_cluster
    assert project_leftovers(c.project), "the cluster should exist before it is taken down"
    r = c.down()
    assert r.returncode == 0, r.stderr
    assert project_leftovers(c.project) == []
    assert not (ROOT / "deploy" / ".cache" / "clusters" / f"{c.project}.env").exists()
