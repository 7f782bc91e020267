"""The ``emberfs metaserver`` process: real process, real gRPC and HTTP, kill -9 and restart."""

from __future__ import annotations

import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import httpx
import pytest

from emberfs.proto import cluster_pb2, cluster_pb2_grpc, common_pb2, meta_pb2, meta_pb2_grpc

HEARTBEAT_TIMEOUT = 1.5


class Metaserver:
    """One ``emberfs metaserver`` child process on ephemeral ports (``kv``: an etcd URL)."""

    def __init__(self, data_dir, kv: str | None = None):
        self.data_dir = data_dir
        self.kv = kv
        self.proc: subprocess.Popen | None = None

    def open_store(self):
        """The metaserver's store, opened directly (while it does not run)."""
        if self.kv is None:
            from emberfs.metaserver.store.kv import RocksEngine

            return RocksEngine(self.data_dir / "meta")
        from emberfs.metaserver.store.etcd import EtcdEngine

        return EtcdEngine(self.kv)

    def start(self, timeout: float = 30.0) -> None:
        store = ["--data-dir", str(self.data_dir)] if self.kv is None else ["--kv", self.kv]
        cmd = [
            sys.executable,
            "-m",
            "emberfs.cli.main",
            "metaserver",
            *store,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--heartbeat-timeout",
            str(HEARTBEAT_TIMEOUT),
            "--insecure",  # these tests call the services as nodes and clients would, bare
            "--trash-days",
            "0",  # removals reach the GC queue at once
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(timeout=0.2):
                line = self.proc.stdout.readline()
                if line.startswith("READY metaserver"):
                    _, _, grpc_addr, _, admin_addr, _, cluster_addr = line.split()
                    self.grpc_address = grpc_addr
                    self.admin_url = f"http://{admin_addr}"
                    self.cluster_address = cluster_addr
                    return
                if not line:
                    break
            if self.proc.poll() is not None:
                break
        raise RuntimeError(f"metaserver did not become ready (exit code {self.proc.poll()})")

    def kill(self, sig=signal.SIGKILL) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=15)
        finally:
            self.proc.stdout.close()
            self.proc = None


@pytest.fixture
def metaserver(tmp_path):
    m = Metaserver(tmp_path / "meta")
    try:
        yield m
    finally:
        m.kill()


@pytest.fixture(params=["rocksdb", "etcd"])
def any_metaserver(request, tmp_path):
    """A metaserver on RocksDB, then on etcd: the same tests run on both stores."""
    kv = request.getfixturevalue("etcd_url") if request.param == "etcd" else None
    m = Metaserver(tmp_path / "meta", kv)
    try:
        yield m
    finally:
        m.kill()


class Nodes:
    """Fake storage nodes that register and heartbeat over real gRPC."""

    def __init__(self, address: str):
        self.connect(address)
        self.beating: set[str] = set()
        self.version = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def connect(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = cluster_pb2_grpc.ClusterServiceStub(self.channel)

    def _beat(self) -> None:
        while not self.stop.wait(0.2):
            for node in sorted(self.beating):
                try:
                    self.stub.Heartbeat(cluster_pb2.HeartbeatRequest(node_id=node), timeout=1)
                except grpc.RpcError:
                    pass  # the metaserver is down for a moment

    def routing(self) -> common_pb2.RoutingInfo:
        return self.stub.GetRouting(cluster_pb2.GetRoutingRequest(), timeout=5).routing

    def register(self, nodes=("a", "b", "c"), first_port: int = 7100) -> None:
        """Register ``nodes`` with one target each (their addresses lead nowhere)."""
        for i, node in enumerate(nodes):
            self.stub.RegisterNode(
                cluster_pb2.RegisterNodeRequest(
                    node_id=node,
                    data_address=f"127.0.0.1:{first_port + 10 * i}",
                    grpc_address=f"127.0.0.1:{first_port + 1 + 10 * i}",
                    targets=[cluster_pb2.TargetReport(capacity=1 << 30)],
                ),
                timeout=5,
            )


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def chains_json(url: str) -> list[dict]:
    return httpx.get(f"{url}/api/v1/chains", timeout=5).json()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_failover_and_restart_keep_chains_and_versions(metaserver):
    metaserver.start()
    nodes = Nodes(metaserver.grpc_address)
    try:
        for i, node in enumerate(("a", "b", "c")):
            r = nodes.stub.RegisterNode(
                cluster_pb2.RegisterNodeRequest(
                    node_id=node,
                    data_address=f"127.0.0.1:{7000 + 10 * i}",
                    grpc_address=f"127.0.0.1:{7001 + 10 * i}",
                    targets=[cluster_pb2.TargetReport(capacity=1 << 30) for _ in range(2)],
                ),
                timeout=5,
            )
            assert list(r.target_ids) == [2 * i + 1, 2 * i + 2]
            assert r.cluster_address == metaserver.cluster_address
            nodes.beating.add(node)
        nodes.thread.start()

        # the cluster address serves ClusterService alone, on workers of its own
        with grpc.insecure_channel(metaserver.cluster_address) as lane:
            answer = cluster_pb2_grpc.ClusterServiceStub(lane).GetRouting(
                cluster_pb2.GetRoutingRequest(), timeout=5
            )
            assert answer.routing == nodes.routing()
            with pytest.raises(grpc.RpcError) as info:
                meta_pb2_grpc.MetaServiceStub(lane).Ping(meta_pb2.PingRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED

        routing = nodes.routing()
        assert [(c.chain_id, c.version, list(c.targets)) for c in routing.chains] == [
            (1, 1, [1, 3, 5]),
            (2, 1, [4, 6, 2]),
        ]
        assert chains_json(metaserver.admin_url)[0] == {
            "id": 1,
            "version": 1,
            "targets": [{"id": t, "state": "serving"} for t in (1, 3, 5)],
        }

        # MetaService on the same port sees the cluster: capacity and chains for new files
        meta = meta_pb2_grpc.MetaServiceStub(nodes.channel)
        ctx = common_pb2.RequestContext(client_id="test", request_id=1)
        assert meta.StatFs(meta_pb2.StatFsRequest(ctx=ctx), timeout=5).capacity == 6 << 30
        created = meta.Create(meta_pb2.CreateRequest(ctx=ctx, path="/f", mode=0o644), timeout=5)
        assert sorted(created.attr.layout.chains) == [1, 2]

        nodes.beating.discard("c")  # node c stops heartbeating
        routing = wait_for(
            lambda: (r := nodes.routing()) and r.targets[4].state == common_pb2.OFFLINE and r,
            10,
            "target 5 to go offline",
        )
        assert [(c.chain_id, c.version, list(c.targets)) for c in routing.chains] == [
            (1, 2, [1, 3, 5]),
            (2, 2, [4, 2, 6]),
        ]
        served = {t.target_id: t.state for t in routing.targets}
        assert [served[t] for t in (1, 2, 3, 4)] == [common_pb2.SERVING] * 4
        assert served[6] == common_pb2.OFFLINE
        chains = chains_json(metaserver.admin_url)
        assert chains[1] == {
            "id": 2,
            "version": 2,
            "targets": [
                {"id": 4, "state": "serving"},
                {"id": 2, "state": "serving"},
                {"id": 6, "state": "offline"},
            ],
        }
        targets = httpx.get(f"{metaserver.admin_url}/api/v1/targets", timeout=5).json()
        assert targets[4]["state"] == "offline" and targets[4]["node"] == "c"

        # usage figures alone are stored without a WAL sync: a kill -9 keeps them too
        used = {1: 100 << 20, 2: 200 << 20}
        nodes.stub.Heartbeat(
            cluster_pb2.HeartbeatRequest(
                node_id="a",
                targets=[
                    cluster_pb2.TargetReport(target_id=t, capacity=1 << 30, used=u)
                    for t, u in used.items()
                ],
            ),
            timeout=5,
        )
        assert meta.StatFs(meta_pb2.StatFsRequest(ctx=ctx), timeout=5).used == 300 << 20
        now = nodes.routing()  # usage changes no state, chain or routing version
        assert now.version == routing.version and list(now.chains) == list(routing.chains)

        assert metaserver.kill(signal.SIGKILL) == -signal.SIGKILL
        metaserver.start()
        nodes.connect(metaserver.grpc_address)
        meta = meta_pb2_grpc.MetaServiceStub(nodes.channel)
        assert meta.StatFs(meta_pb2.StatFsRequest(ctx=ctx), timeout=5).used == 300 << 20
        after = nodes.routing()
        assert after.version == routing.version
        assert list(after.chains) == list(routing.chains)
        assert [(t.target_id, t.state, t.chain_id) for t in after.targets] == [
            (t.target_id, t.state, t.chain_id) for t in routing.targets
        ]
        assert chains_json(metaserver.admin_url) == chains
        stat = meta.Stat(meta_pb2.StatRequest(ctx=ctx, path="/f"), timeout=5)
        assert stat.attr.inode == created.attr.inode  # one store for namespace and cluster

        # a and b keep heartbeating: past the timeout they still serve, c stays offline
        time.sleep(HEARTBEAT_TIMEOUT + 1.0)
        assert nodes.routing() == after
        # c comes back: its targets resync
        nodes.beating.add("c")
        r = wait_for(
            lambda: (r := nodes.routing()) and r.targets[4].state == common_pb2.SYNCING and r,
            10,
            "target 5 to sync",
        )
        assert [c.version for c in r.chains] == [3, 3]
        assert metaserver.kill(signal.SIGTERM) == 0
    finally:
        nodes.stop.set()
        nodes.channel.close()


def test_bad_arguments_exit_with_usage_error(tmp_path):
    (tmp_path / "short.key").write_text("too short\n")
    for args in (
        ["--chunk-size", "1000", "--insecure"],
        ["--replicas", "0", "--insecure"],
        ["--listen", "nowhere", "--insecure"],
        [],  # neither a key file nor --insecure
        ["--secret-file", str(tmp_path / "missing.key")],
        ["--secret-file", str(tmp_path / "short.key")],
        ["--insecure", "--tls-cert", str(tmp_path / "short.key")],  # no key with it
        ["--insecure", "--capability-ttl", "0"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "emberfs.cli.main", "metaserver", "--data-dir", str(tmp_path)]
            + args,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 2, proc.stderr
        assert "emberfs metaserver" in proc.stderr


def _namespace_model_apply(model: dict[str, str], op: tuple) -> None:
    """Apply one namespace operation to a {path: "d"|"f"} model."""
    kind = op[0]
    if kind == "mkdir":
        model[op[1]] = "d"
    elif kind == "create":
        model[op[1]] = "f"
    elif kind == "batch":  # files created by one BatchWriteOpen
        model.update(dict.fromkeys(op[1], "f"))
    elif kind == "rename":
        src, dst = op[1], op[2]
        for path in sorted(model):
            if path == src or path.startswith(src + "/"):
                model[dst + path[len(src) :]] = model.pop(path)
    elif kind == "remove":
        for path in [p for p in model if p == op[1] or p.startswith(op[1] + "/")]:
            del model[path]


def _walk(meta, ctx) -> dict[str, str]:
    """The namespace as {path: "d"|"f"} through paginated List calls."""
    found: dict[str, str] = {}
    todo = ["/"]
    while todo:
        directory = todo.pop()
        after = ""
        while True:
            page = meta.List(
                meta_pb2.ListRequest(ctx=ctx, path=directory, start_after=after, limit=500),
                timeout=10,
            )
            for e in page.entries:
                path = directory.rstrip("/") + "/" + e.name
                if e.attr.type == common_pb2.DIRECTORY:
                    found[path] = "d"
                    todo.append(path)
                else:
                    found[path] = "f"
            if not page.more:
                break
            after = page.entries[-1].name
    return found


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_9_in_a_stream_of_creates_renames_removes_loses_nothing(any_metaserver, tmp_path):
    """Every acknowledged operation survives SIGKILL; nothing is half done.

    The stream includes batches of write opens (one ``BatchWriteOpen``, each
    path its own transaction, one WAL sync for the call): a batch the kill
    interrupted may have created any first part of its paths.
    """
    import random

    from emberfs.metaserver.fs import records
    from emberfs.metaserver.store import keys

    metaserver = any_metaserver
    metaserver.start()
    nodes = Nodes(metaserver.grpc_address)
    nodes.register()
    meta = meta_pb2_grpc.MetaServiceStub(nodes.channel)
    rng = random.Random(7)
    model: dict[str, str] = {}
    acknowledged: list[tuple] = []
    in_flight: tuple | None = None
    request_id = 0
    kill_after = rng.uniform(1.0, 2.0)
    killer = threading.Timer(kill_after, lambda: metaserver.proc.kill())
    killer.start()
    try:
        while True:
            dirs = ["/"] + [p for p, t in model.items() if t == "d"]
            names = sorted(model)
            choice = rng.random()
            request_id += 1
            ctx = common_pb2.RequestContext(client_id="crash-test", request_id=request_id)
            parent = rng.choice(dirs).rstrip("/")
            if choice < 0.2 or not names:
                op = ("mkdir", f"{parent}/d{request_id}")
                method, request = "Mkdir", meta_pb2.MkdirRequest(ctx=ctx, path=op[1], mode=0o755)
            elif choice < 0.5:
                op = ("create", f"{parent}/f{request_id}")
                method = "Create"
                request = meta_pb2.CreateRequest(ctx=ctx, path=op[1], mode=0o644, exclusive=True)
            elif choice < 0.6:
                op = ("batch", [f"{parent}/b{request_id + k}" for k in range(rng.randint(2, 6))])
                request_id += len(op[1]) - 1  # path k has request id ctx.request_id + k
                method = "BatchWriteOpen"
                flags = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE | meta_pb2.OPEN_EXCLUSIVE
                request = meta_pb2.BatchWriteOpenRequest(ctx=ctx, paths=op[1], flags=flags)
            elif choice < 0.8:
                src = rng.choice(names)
                candidates = [d for d in dirs if d != src and not d.startswith(src + "/")]
                op = ("rename", src, f"{rng.choice(candidates).rstrip('/')}/r{request_id}")
                method, request = "Rename", meta_pb2.RenameRequest(ctx=ctx, src=op[1], dst=op[2])
            else:
                op = ("remove", rng.choice(names))
                method = "Remove"
                request = meta_pb2.RemoveRequest(ctx=ctx, path=op[1], recursive=True)
            in_flight = op
            try:
                response = getattr(meta, method)(request, timeout=5)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                break  # the metaserver died under this request
            if method == "BatchWriteOpen":
                assert [r.errno for r in response.results] == [0] * len(op[1])
            acknowledged.append(op)
            _namespace_model_apply(model, op)
            in_flight = None
    finally:
        killer.cancel()
    metaserver.kill()
    assert len(acknowledged) > 20, "the stream was too short to mean anything"

    # Nothing half done, read straight from the store: every entry has its inode and
    # every inode but the root is reachable through an entry.
    engine = metaserver.open_store()
    try:
        inodes = {records.decode_inode(v).inode for _, v in engine.scan_prefix(keys.INODE)}
        # a removed tree detached from the namespace, its entries not all deleted yet
        referenced = {keys.trash_inode(k) for k, _ in engine.scan_prefix(keys.TRASH)}
        for key, value in engine.scan_prefix(keys.DENTRY):
            if keys.dentry_name(key) == "":
                continue  # a directory's guard key, not an entry
            referenced.add(records.decode_dentry(value).inode)
        gc_pending = {keys.gc_id(k) for k, _ in engine.scan_prefix(keys.GC)}
        open_for_write = {  # a removed file keeps its inode while a write session is open
            records.decode_session(k, v).inode
            for k, v in engine.scan_prefix(keys.SESSION)
            if keys.is_session_key(k)
        }
    finally:
        engine.close()
    assert referenced <= inodes, f"entries without an inode: {referenced - inodes}"
    unreachable = inodes - referenced - {1} - open_for_write
    assert not unreachable, f"unreachable inodes: {unreachable}"
    assert not (gc_pending & referenced)

    metaserver.start()
    nodes.connect(metaserver.grpc_address)
    meta = meta_pb2_grpc.MetaServiceStub(nodes.channel)
    found = _walk(meta, common_pb2.RequestContext(client_id="checker"))
    if in_flight is None or in_flight[0] != "batch":
        allowed = [None, in_flight]
    else:  # any first part of the interrupted batch
        allowed = [("batch", in_flight[1][:k]) for k in range(len(in_flight[1]) + 1)]
    possible = []
    for extra in allowed:
        state = dict(model)
        if extra is not None:
            _namespace_model_apply(state, extra)
        possible.append(state)
    assert found in possible, "namespace differs from the acknowledged operations"


@pytest.mark.timeout(60)
def test_a_removed_file_is_fetched_for_gc_at_once_even_below_the_collected_ones(metaserver):
    """The metaserver's removals reach ``FetchGC`` straight away, whatever the inode's age.

    ``FetchGC`` scans from the lowest id still queued; a removal of an old file (a lower
    inode id than the items already collected) lowers that point as it commits, so it
    does not wait for the background sweep (every 10 s).
    """
    metaserver.start()
    nodes = Nodes(metaserver.grpc_address)
    nodes.register()
    targets = sorted(t.target_id for t in nodes.routing().targets)
    meta = meta_pb2_grpc.MetaServiceStub(nodes.channel)
    ctx = common_pb2.RequestContext(client_id="gc-test")
    inodes = {}
    for name in ("old", "new"):
        made = meta.Create(
            meta_pb2.CreateRequest(ctx=ctx, path=f"/{name}", mode=0o644, exclusive=True),
            timeout=5,
        )
        inodes[name] = made.attr.inode
    assert inodes["old"] < inodes["new"]

    def fetched() -> list[int]:
        resp = nodes.stub.FetchGC(cluster_pb2.FetchGCRequest(target_ids=targets), timeout=5)
        return [item.inode for item in resp.items]

    def collect(inode: int) -> None:
        for tid in targets:
            nodes.stub.AckGC(cluster_pb2.AckGCRequest(target_id=tid, gc_ids=[inode]), timeout=5)

    assert fetched() == []
    meta.Remove(meta_pb2.RemoveRequest(ctx=ctx, path="/new"), timeout=5)
    assert fetched() == [inodes["new"]]
    collect(inodes["new"])
    assert fetched() == []  # the queue is empty, and scans now start past its end
    meta.Remove(meta_pb2.RemoveRequest(ctx=ctx, path="/old"), timeout=5)
    assert fetched() == [inodes["old"]]  # at once, not after the next sweep
    collect(inodes["old"])
    assert fetched() == []


def test_background_loop_sweeps_retry_records_and_survives_errors(monkeypatch):
    from emberfs.metaserver import main as meta_main

    monkeypatch.setattr(meta_main, "RETRY_SWEEP_INTERVAL", 0.05)
    sweeps = []
    stop = threading.Event()

    class GCQueue:
        def collect(self):
            pass

    class Namespace:
        def expire_sessions(self):
            pass

        def prune_retry_records(self):
            sweeps.append(time.monotonic())
            if len(sweeps) == 1:
                raise RuntimeError("first sweep fails")
            if len(sweeps) >= 3:
                stop.set()
            return 0

        def purge_detached(self):
            return 0

        class kvcaches:  # noqa: N801 - stands for the namespace's KVIndex attribute
            @staticmethod
            def sweep_removed():
                return 0

    loop = threading.Thread(
        target=meta_main.sweep_loop, args=(GCQueue(), Namespace(), stop, 0.01, 1.0)
    )
    loop.start()
    loop.join(timeout=10)
    assert not loop.is_alive()
    assert len(sweeps) == 3


@pytest.mark.parametrize(
    ("heartbeat_timeout", "session_timeout"), [(5.0, 300.0), (2.0, 3.0), (1.5, 300.0), (60, 0.4)]
)
def test_timeouts_are_checked_at_least_twice_within_a_gap_that_counts_as_a_stall(
    heartbeat_timeout, session_timeout
):
    from emberfs.metaserver import main as meta_main

    max_gap, check, sweep = meta_main.intervals(heartbeat_timeout, session_timeout)
    assert max_gap == min(heartbeat_timeout, session_timeout) / 2
    assert 0 < check <= max_gap / 2 and check <= 0.5
    assert 0 < sweep <= min(meta_main.SESSION_SWEEP_INTERVAL, session_timeout / 4)


def test_the_admin_api_listens_on_a_socket_that_says_tcp():
    """asyncio turns Nagle off only on connections of a socket whose protocol is IPPROTO_TCP;
    with protocol 0 every admin API answer waited ~40 ms for the client's delayed ACK."""
    from emberfs.metaserver.api import create_app
    from emberfs.metaserver.clustermgr.gcqueue import GCQueue
    from emberfs.metaserver.clustermgr.manager import ClusterManager
    from emberfs.metaserver.main import start_admin
    from emberfs.metaserver.store.kv import MemoryEngine

    cluster = ClusterManager(MemoryEngine())
    server, thread, sock = start_admin(create_app(cluster, GCQueue(cluster)), "127.0.0.1:0")
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()
