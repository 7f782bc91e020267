"""Several metaservers on one etcd store: real processes, kill -9 of the leader, etcd outages.

The cluster runs two metaservers over a local etcd and three storage servers; clients and
storage servers are given both metaservers. What must hold: the cluster manager's lead
moves to the survivor within a few seconds of a kill -9, clients see no error, nothing
acknowledged is lost, no target is declared offline during the handover and no chain
version goes back; while etcd has no quorum, metadata calls fail with a clear "unavailable"
error and open files keep reading; everything works again when etcd returns.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request

import pytest

from emberfs.client.fs import EmberFileSystem
from emberfs.proto import common_pb2
from tests.load import WriteReadLoad

MiB = 1 << 20


def get_json(url: str, token: str | None = None) -> dict:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def post_json(url: str, token: str) -> dict:
    request = urllib.request.Request(url, data=b"", method="POST")
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


class RoutingWatch:
    """Polls the routing of every running metaserver; remembers what must never happen."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.not_serving: list[tuple[float, int, int]] = []
        self.versions: dict[int, int] = {}
        self.went_back: list[tuple[int, int, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                routing = self.cluster.routing(timeout=2)
            except Exception:
                continue  # no metaserver answered this round
            for t in routing.targets:
                if t.state != common_pb2.SERVING:
                    self.not_serving.append((time.monotonic(), t.target_id, t.state))
            for c in routing.chains:
                seen = self.versions.get(c.chain_id, 0)
                if c.version < seen:
                    self.went_back.append((c.chain_id, seen, c.version))
                self.versions[c.chain_id] = max(seen, c.version)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_of_the_leading_metaserver_while_clients_write_and_read(private_cluster):
    cluster = private_cluster(kv="etcd", metaservers=2)
    fs = EmberFileSystem(cluster.meta_addresses, skip_instance_cache=True, retry_timeout=60)
    watch = RoutingWatch(cluster)
    load = WriteReadLoad(fs, "/ha")
    try:
        big = os.urandom(48 * MiB)
        fs.pipe_file("/ha/big.bin", big)
        handle = fs.open("/ha/big.bin", "rb")
        first = handle.read(8 * MiB)
        load.start()
        time.sleep(2)
        leader = cluster.leader()
        killed_at = time.monotonic()
        cluster.kill_meta(leader)
        survivor = cluster.leader(timeout=30)
        failover = time.monotonic() - killed_at
        assert survivor != leader
        time.sleep(3)  # clients keep going on the survivor
        rest = handle.read()
        # the killed metaserver comes back as a follower; then the survivor is killed too
        cluster.start_meta(i=leader)
        time.sleep(1)
        killed_again = time.monotonic()
        cluster.kill_meta(survivor)
        assert cluster.leader(timeout=30) == leader
        second_failover = time.monotonic() - killed_again
        time.sleep(2)
        load.stop()
        handle.close()
        load.verify()  # no error reached the application, every acknowledged write reads back
        assert first + rest == big
        assert len(load) > 20
        assert failover < 10 and second_failover < 10, (failover, second_failover)
        assert not watch.not_serving, watch.not_serving[:5]
        assert not watch.went_back
        print(f"failover after kill -9: {failover:.2f} s, then {second_failover:.2f} s")
    finally:
        load.stop()
        watch.close()
        fs.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_any_metaserver_serves_the_admin_api_and_lost_chunk_reports_reach_the_leader(
    private_cluster,
):
    cluster = private_cluster(kv="etcd", metaservers=2)
    token = cluster.admin_token
    leader = cluster.leader()
    follower = 1 - leader
    mine = get_json(cluster.admin_url_of(follower) + "/api/v1/leader")
    theirs = get_json(cluster.admin_url_of(leader) + "/api/v1/leader")
    assert not mine["leading"] and theirs["leading"]
    assert mine["leader"]["id"] == theirs["id"] != mine["id"]
    assert mine["store"].startswith("etcd://")
    # the follower passes every /api/v1 call on to the leader: the nodes' heartbeats show
    summary = get_json(cluster.admin_url_of(follower) + "/api/v1/cluster")
    assert summary["leader"] == f"{cluster.host}:{cluster.meta_ports[leader]}"
    assert summary["store"].startswith("etcd://") and summary["health"] == "healthy"
    nodes = get_json(cluster.admin_url_of(follower) + "/api/v1/nodes")
    assert len(nodes) == 3
    assert all(n["last_heartbeat_seconds"] is not None and n["up"] for n in nodes)
    paused = post_json(cluster.admin_url_of(follower) + "/api/v1/scrub/pause", token)
    assert paused["paused"] is True
    assert get_json(cluster.admin_url_of(leader) + "/api/v1/scrub")["paused"] is True
    # a client that only knows the follower reads, writes and reports as usual
    follower_address = f"{cluster.host}:{cluster.meta_ports[follower]}"
    fs = EmberFileSystem(follower_address, skip_instance_cache=True)
    try:
        fs.pipe_file("/f.bin", b"x" * MiB)
        assert fs.cat_file("/f.bin") == b"x" * MiB
        from emberfs.proto import cluster_pb2

        meta = fs.client.runtime().meta
        routing = meta.routing()
        chain = routing.chains[0]
        resp = meta.cluster(
            "ReportLostChunk",
            cluster_pb2.ReportLostChunkRequest(
                chain_id=chain.chain_id, target_id=chain.targets[0], inode=999999, index=0, length=1
            ),
        )
        assert resp.accepted  # forwarded to the leader, which queues it for a check
        # fsck through the follower: the leader checks the namespace in etcd and every replica
        with urllib.request.urlopen(
            cluster.admin_url_of(follower) + "/api/v1/fsck?deep=true", timeout=60
        ) as answer:
            lines = [json.loads(line) for line in answer.read().splitlines() if line.strip()]
        assert [line for line in lines if "finding" in line] == []
        assert lines[-1]["summary"]["files"] >= 1 and lines[-1]["summary"]["chunks"] >= 1
    finally:
        fs.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_an_etcd_quorum_metadata_fails_clearly_and_open_files_keep_reading(
    private_cluster,
):
    cluster = private_cluster(kv="etcd", metaservers=2, etcd_members=3)
    fs = EmberFileSystem(
        cluster.meta_addresses, skip_instance_cache=True, retry_timeout=4, read_timeout=10
    )
    try:
        data = os.urandom(64 * MiB)
        fs.pipe_file("/keep.bin", data)
        handle = fs.open("/keep.bin", "rb")
        assert handle.read(MiB) == data[:MiB]
        cluster.etcd.kill(0)
        cluster.etcd.kill(1)
        started = time.monotonic()
        reads = 0

        def read_some(seconds: float) -> None:
            # reads of chunks not read before (no readahead holds them) reach the storage
            # servers, well past their lease (half the heartbeat timeout)
            nonlocal reads
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                offset = (reads * 9 + 5) % 63 * MiB + 4096 * (reads % 256)
                handle.seek(offset)
                assert handle.read(4096) == data[offset : offset + 4096], offset
                reads += 1
                time.sleep(0.1)

        read_some(4 * cluster.heartbeat_timeout)
        with pytest.raises(OSError) as failed:
            fs.info("/keep.bin", refresh=True)
        assert failed.value.errno == 11  # EAGAIN
        assert "unavailable" in str(failed.value)
        with pytest.raises(OSError):
            fs.pipe_file("/new.bin", b"y")
        read_some(2)
        assert reads >= 40 and time.monotonic() - started > 10
        cluster.etcd.start_member(0)
        cluster.etcd.start_member(1)
        deadline = time.monotonic() + 60
        while True:
            try:
                fs.pipe_file("/new.bin", b"y" * 1000)
                break
            except OSError:
                assert time.monotonic() < deadline, "the metadata store did not come back"
                time.sleep(0.5)
        handle.seek(0)
        assert handle.read() == data
        handle.close()
        assert fs.cat_file("/new.bin") == b"y" * 1000
        cluster.wait_serving(30)
    finally:
        fs.close()
