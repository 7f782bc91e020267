"""Storage nodes in-process against an in-process ClusterService (the real cluster manager)."""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from emberfs.cli.ports import free_port
from emberfs.common import framing
from emberfs.common.framing import Op, Status
from emberfs.metaserver.clustermgr import service as cluster_service
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import common_pb2, data_pb2, storage_pb2, storage_pb2_grpc
from emberfs.storageserver.node import Node

pytestmark = pytest.mark.timeout(90)
CS = 1024 * 1024


class Meta:
    """ClusterService on 127.0.0.1, served by a ClusterManager over a MemoryEngine."""

    def __init__(self, port: int = 0, heartbeat_timeout: float = 1.5, replicas: int = 3):
        self.manager = ClusterManager(
            MemoryEngine(), replicas=replicas, heartbeat_timeout=heartbeat_timeout
        )
        self.servicer = cluster_service.ClusterServicer(self.manager, GCQueue(self.manager))
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        cluster_service.add_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()
        self._stop = threading.Event()
        self._checker = threading.Thread(target=self._check, daemon=True)
        self._checker.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _check(self):
        while not self._stop.wait(0.2):
            self.manager.check_timeouts()

    def routing(self) -> common_pb2.RoutingInfo:
        return self.manager.routing()

    def wait_for(self, predicate, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.routing()
            if predicate(r):
                return r
            time.sleep(0.05)
        raise TimeoutError(str(self.routing()))

    def close(self):
        self._stop.set()
        self.server.stop(0).wait()


@pytest.fixture
def meta():
    m = Meta()
    try:
        yield m
    finally:
        m.close()


@pytest.fixture
def nodes():
    started: list[Node] = []
    try:
        yield started
    finally:
        for n in started:
            n.stop()


def make_node(meta_address, data_dir, nodes, **kw) -> Node:
    kw.setdefault("heartbeat_interval", 0.2)
    kw.setdefault("background_interval", 0.2)
    node = Node(data_dir, meta_address, listen="127.0.0.1:0", **kw)
    nodes.append(node)
    return node


def all_serving(n):
    return lambda r: len(r.targets) == n and all(t.state == common_pb2.SERVING for t in r.targets)


def test_register_persists_ids_and_restart_keeps_them(meta, nodes, tmp_path):
    node = make_node(meta.address, tmp_path / "a", nodes, targets=2)
    assert node.start()
    ids = sorted(node.stores)
    assert len(ids) == 2
    assert (tmp_path / "a" / "node_id").read_text().strip() == node.node_id
    for k, tid in enumerate(ids, start=1):
        assert int((tmp_path / "a" / f"target-{k}" / "target_id").read_text()) == tid
    # the routing reaches the node and names its addresses
    r = meta.routing()
    assert {t.data_address for t in r.targets} == {node.data_address}
    assert node.routing.version == r.version
    node.stop()
    nodes.remove(node)
    again = make_node(meta.address, tmp_path / "a", nodes, targets=2, spare_bytes=0)
    assert again.start()
    assert again.node_id == node.node_id and sorted(again.stores) == ids
    assert len(meta.routing().targets) == 2
    assert all(store.spare_bytes == 0 for store in again.stores.values())


def test_grpc_port_defaults_to_data_port_plus_one(meta, nodes, tmp_path):
    # another process may take a picked port before the node binds it: pick again, a few times
    for attempt in range(5):
        port = free_port(count=2)
        node = Node(
            tmp_path / f"n{attempt}",
            meta.address,
            listen=f"127.0.0.1:{port}",
            heartbeat_interval=0.2,
        )
        nodes.append(node)
        try:
            assert node.start()
            break
        except OSError as exc:
            error = exc
            node.stop()
            nodes.remove(node)
    else:
        pytest.fail(f"no node started on two free consecutive ports in 5 tries: {error}")
    assert node.grpc_address == f"127.0.0.1:{port + 1}"
    with grpc.insecure_channel(node.grpc_address) as ch:
        stats = storage_pb2_grpc.StorageServiceStub(ch).TargetStats(
            storage_pb2.TargetStatsRequest(), timeout=5
        )
    assert stats.node_id == node.node_id and len(stats.targets) == 1


def test_registration_waits_for_the_metaserver(nodes, tmp_path):
    port = free_port()
    node = make_node(f"127.0.0.1:{port}", tmp_path / "n", nodes)
    result = []
    t = threading.Thread(target=lambda: result.append(node.start()))
    t.start()
    time.sleep(0.8)
    assert not result  # still retrying
    m = Meta(port=port)
    try:
        t.join(20)
        assert result == [True] and len(node.stores) == 1
    finally:
        m.close()


def test_stop_during_registration_returns_false(nodes, tmp_path):
    node = make_node(f"127.0.0.1:{free_port()}", tmp_path / "n", nodes)
    result = []
    t = threading.Thread(target=lambda: result.append(node.start()))
    t.start()
    time.sleep(0.3)
    node.request_stop()
    t.join(10)
    assert result == [False]


def test_heartbeats_follow_routing_and_reregister(meta, nodes, tmp_path):
    node = make_node(meta.address, tmp_path / "n", nodes)
    assert node.start()
    (tid,) = node.stores
    # the metaserver forgets the node (its key leaves the store, and the manager reloads
    # the store as one taking the lead does): the next heartbeat registers it again
    meta.manager.engine.write({}, {keys.node_key(node.node_id)})
    meta.manager.take_over()
    deadline = time.monotonic() + 10

    def registered() -> bool:
        return node.node_id in {n.node_id for n in meta.manager.nodes()}

    while not registered() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert registered()
    assert node.routing.version == meta.routing().version or meta.wait_for(
        lambda r: node.routing.version == r.version, 5
    )
    assert sorted(node.stores) == [tid]


class CountingServicer(cluster_service.ClusterServicer):
    """ClusterService that counts the heartbeats it answers."""

    def __init__(self, cluster, gc):
        super().__init__(cluster, gc)
        self.heartbeats = 0

    def Heartbeat(self, request, context):
        self.heartbeats += 1
        return super().Heartbeat(request, context)


def serve_lane(meta: Meta, advertised_host: str = "127.0.0.1"):
    """A second ClusterService of ``meta``'s manager, named to nodes as its cluster address."""
    servicer = CountingServicer(meta.manager, meta.servicer.gc)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    cluster_service.add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    meta.manager.cluster_address = f"{advertised_host}:{port}"
    return server, servicer


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_heartbeats_go_to_the_cluster_address_and_come_back_when_it_moves(meta, nodes, tmp_path):
    first, lane = serve_lane(meta)
    node = make_node(meta.address, tmp_path / "n", nodes)
    assert node.start()
    wait_until(lambda: lane.heartbeats >= 3, what="heartbeats on the cluster address")
    before = meta.routing()
    # the cluster address goes away (a restarted metaserver listens elsewhere): the next
    # heartbeat goes to the main address, whose answer names the new one (a wildcard host
    # stands for the host the node registered with)
    first.stop(0).wait()
    second, moved = serve_lane(meta, advertised_host="0.0.0.0")
    try:
        wait_until(lambda: moved.heartbeats >= 3, what="heartbeats on the new cluster address")
    finally:
        second.stop(0).wait()
    assert meta.routing() == before  # no heartbeat was missed for long


def write_once(routing, chain_id, inode, index, data):
    chain = next(c for c in routing.chains if c.chain_id == chain_id)
    head = chain.targets[0]
    addr = next(t.data_address for t in routing.targets if t.target_id == head)
    host, port = addr.rsplit(":", 1)
    req = data_pb2.ChunkWriteRequest(
        chain_id=chain_id,
        chain_version=chain.version,
        target_id=head,
        chunk=data_pb2.ChunkId(inode=inode, index=index),
        chunk_size=CS,
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        framing.send_frame(sock, Op.WRITE, req.SerializeToString(), data)
        frame = framing.recv_frame(sock)
    return frame.header.status


def write(meta, chain_id, inode, index, data, timeout=10.0):
    """Write as a client does: retry retryable answers with fresh routing."""
    deadline = time.monotonic() + timeout
    while True:
        status = write_once(meta.routing(), chain_id, inode, index, data)
        if status not in framing.RETRYABLE or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def list_chunks(grpc_address, target_id):
    with grpc.insecure_channel(grpc_address) as ch:
        resp = storage_pb2_grpc.StorageServiceStub(ch).ListChunks(
            storage_pb2.ListChunksRequest(target_id=target_id, limit=1000), timeout=5
        )
    return [(c.inode, c.index, c.version, c.checksum, c.length) for c in resp.chunks]


def test_restarted_node_is_resynced_and_serves_again(meta, nodes, tmp_path):
    for name in "abc":
        assert make_node(meta.address, tmp_path / name, nodes).start()
    routing = meta.wait_for(lambda r: len(r.chains) == 1 and all_serving(3)(r))
    blobs = {i: os.urandom(100_000 + i) for i in range(6)}
    for i, blob in blobs.items():
        assert write(meta, 1, 9, i, blob) == Status.OK
    # stop the tail's node; the chain goes on without it
    tail = routing.chains[0].targets[-1]
    victim = next(n for n in nodes if tail in n.stores)
    victim.stop()
    nodes.remove(victim)
    routing = meta.wait_for(
        lambda r: any(t.target_id == tail and t.state == common_pb2.OFFLINE for t in r.targets)
    )
    # writes under the new chain version: new chunks, rewritten chunks
    for i in (0, 1, 7):
        assert write(meta, 1, 9, i, b"new" * 1000) == Status.OK
    revived = make_node(meta.address, victim.data_dir, nodes)
    assert revived.start()
    routing = meta.wait_for(all_serving(3))
    t_by_id = {t.target_id: t for t in routing.targets}
    lists = [list_chunks(t_by_id[t].grpc_address, t) for t in routing.chains[0].targets]
    assert len(lists[0]) == 7
    assert lists[0] == lists[1] == lists[2]
    # heartbeats carry each target's data counters
    head = routing.chains[0].targets[0]
    head_node = next(n for n in nodes if head in n.stores)
    (report,) = [r for r in head_node.reports() if r.target_id == head]
    assert report.bytes_written >= sum(len(b) for b in blobs.values())


@pytest.mark.parametrize(
    "argv",
    [
        ["--meta", "nohostport", "--listen", "127.0.0.1:0", "--insecure"],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:99999", "--insecure"],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--targets", "0", "--insecure"],
        [
            "--meta",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--heartbeat-interval",
            "0",
            "--insecure",
        ],
        [
            "--meta",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--forward-timeout",
            "0",
            "--insecure",
        ],
        [
            "--meta",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--forward-timeout",
            "soon",
            "--insecure",
        ],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--spare-bytes", "lots", "--insecure"],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--spare-bytes", "-1", "--insecure"],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--scrub-rate", "-1", "--insecure"],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--scrub-rate", "nan", "--insecure"],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--scrub-interval", "0", "--insecure"],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--scrub-delay", "-5", "--insecure"],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0"],  # no key file, not --insecure
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--secret-file", "/nonexistent"],
        ["--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--insecure", "--frame-timeout", "0"],
        [
            *("--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--insecure"),
            *("--max-connections", "8", "--forward-reserve", "8"),
        ],
    ],
)
def test_command_line_rejects_bad_arguments(argv, tmp_path, capsys):
    from emberfs.storageserver.main import main

    with pytest.raises(SystemExit) as exc:
        main(["--data-dir", str(tmp_path)] + argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_command_line_spare_bytes(tmp_path):
    from emberfs.storageserver.chunkstore import DEFAULT_SPARE_BYTES
    from emberfs.storageserver.main import parse_args

    base = ["--data-dir", str(tmp_path), "--meta", "127.0.0.1:1", "--listen", "127.0.0.1:0"]
    base.append("--insecure")
    assert parse_args(base).spare_bytes == DEFAULT_SPARE_BYTES
    assert parse_args(base + ["--spare-bytes", "256MiB"]).spare_bytes == 256 << 20
    assert parse_args(base + ["--spare-bytes", "0"]).spare_bytes == 0
    assert parse_args(base).forward_timeout == 30.0
    assert parse_args(base + ["--forward-timeout", "2.5"]).forward_timeout == 2.5


def test_storageserver_command_serves_metrics_and_exits_on_sigterm(meta, tmp_path):
    import signal
    import subprocess
    import sys
    import urllib.request

    metrics_port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "emberfs.cli.main",
            "storageserver",
            "--data-dir",
            str(tmp_path),
            "--meta",
            meta.address,
            "--listen",
            "127.0.0.1:0",
            "--targets",
            "2",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            "--insecure",  # the metaserver of this test runs in the test, without keys
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        while not lines or not lines[-1].startswith("READY"):
            lines.append(proc.stdout.readline())
            assert lines[-1], "".join(lines)  # the process ended before READY
        line = lines[-1]
        assert line.startswith("READY storageserver 127.0.0.1:"), line
        _, _, data_addr, _, grpc_addr = line.split()
        assert len(meta.routing().targets) == 2
        host, port = data_addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            framing.send_frame(sock, Op.PING, b"")
            assert framing.recv_frame(sock).header.status == Status.OK
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert b"emberfs_storage_chunk_ops" in resp.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_target_being_resynced_collects_garbage_only_once_it_serves(
    meta, nodes, tmp_path, monkeypatch
):
    # A resync copy of a chunk its source has not collected yet may arrive after the syncing
    # target collected the inode: it would stay behind on that one replica.
    from emberfs.storageserver import node as node_module

    node = make_node(meta.address, tmp_path / "a", nodes, targets=2, background_interval=3600)
    assert node.start()
    meta.wait_for(all_serving(2))
    collected: list[list[int]] = []
    monkeypatch.setattr(
        node_module,
        "run_gc_once",
        lambda stub, stores, chains, **kw: collected.append(sorted(stores)),
    )
    syncing, serving = sorted(node.stores)
    routing = meta.routing()
    routing.version += 1
    next(t for t in routing.targets if t.target_id == syncing).state = common_pb2.SYNCING
    assert node.set_routing(routing)
    node.background_once()
    assert collected == [[serving]]
    routing.version += 1
    next(t for t in routing.targets if t.target_id == syncing).state = common_pb2.SERVING
    assert node.set_routing(routing)
    node.background_once()
    assert collected[-1] == [syncing, serving]


def test_a_gc_round_cut_short_by_a_moved_cluster_address_is_no_error(
    meta, nodes, tmp_path, monkeypatch, caplog
):
    # A metaserver restart moves its cluster address: the node closes the old channel, and a
    # GC round still using it fails with "closed channel"; the next round uses the new one.
    from emberfs.storageserver import node as node_module

    node = make_node(meta.address, tmp_path / "a", nodes, targets=1, background_interval=3600)
    assert node.start()
    meta.wait_for(all_serving(1))

    def moved_mid_round(stub, stores, chains, **kw):
        node.metaserver.set_cluster_address(f"127.0.0.1:{free_port()}")
        raise ValueError("Cannot invoke RPC on closed channel!")

    monkeypatch.setattr(node_module, "run_gc_once", moved_mid_round)
    with caplog.at_level("INFO", logger="emberfs.storageserver.node"):
        node.background_once()
    cut = [r for r in caplog.records if "garbage collection" in r.getMessage()]
    assert [r.levelname for r in cut] == ["INFO"]

    def broken(stub, stores, chains, **kw):
        raise ValueError("a bug")

    monkeypatch.setattr(node_module, "run_gc_once", broken)
    caplog.clear()
    node.background_once()  # a ValueError of its own is still a logged error
    assert [r.levelname for r in caplog.records if "garbage" in r.getMessage()] == ["ERROR"]
