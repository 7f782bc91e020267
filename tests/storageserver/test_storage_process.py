"""Real processes: one ``emberfs metaserver`` and three ``emberfs storageserver``, R=3.

For each position in the chain (head, middle, tail) a storage server is
killed with SIGKILL while data is on the chain; everything is read back
byte-exact from the survivors once the routing changes, writing goes on, the
server restarts, resyncs, and every replica must then hold identical chunks
(``StorageService.ListChunks``: versions and checksums).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from emberfs.cli.localcluster import LocalCluster
from emberfs.common import framing, wire
from emberfs.common.framing import Op, Status
from emberfs.proto import common_pb2, data_pb2, storage_pb2, storage_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

CHUNK = 4 * 1024 * 1024
N_CHUNKS = 16  # 64 MiB per round


class DataClient:
    """A minimal client of the data protocol: one connection per server, routing from the metaserver."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.routing = cluster.routing()
        # the test speaks for itself, not for a file it opened: as a server of the cluster
        self.pool = wire.ConnectionPool(
            connect_timeout=30,
            io_timeout=30,
            max_per_address=1,
            credential=cluster.keys.server_credential() if cluster.keys else None,
        )
        self.buf = memoryview(bytearray(CHUNK + framing.DEFAULT_BLOCK))
        self.request_id = 0

    def refresh(self) -> None:
        self.routing = self.cluster.routing()

    def chain(self) -> common_pb2.ChainInfo:
        return self.routing.chains[0]

    def target(self, target_id: int) -> common_pb2.TargetInfo:
        return next(t for t in self.routing.targets if t.target_id == target_id)

    def _exchange(self, address, op, meta: bytes, data=None) -> framing.Frame | None:
        """The answer frame (whatever its status), or None when the server was unreachable."""
        try:
            return wire.call(
                self.pool,
                address,
                op,
                meta,
                data,
                receive=lambda s: framing.recv_frame(s, self.buf),
            )
        except (OSError, framing.FrameError) as exc:
            self.last_error = exc
            return None

    def write_once(self, inode: int, index: int, data) -> int:
        chain = self.chain()
        head = self.target(chain.targets[0])
        self.request_id += 1
        req = data_pb2.ChunkWriteRequest(
            chain_id=chain.chain_id,
            chain_version=chain.version,
            target_id=head.target_id,
            chunk=data_pb2.ChunkId(inode=inode, index=index),
            chunk_size=CHUNK,
            client_id="storage-process-test",
            request_id=self.request_id,
        )
        frame = self._exchange(head.data_address, Op.WRITE, req.SerializeToString(), data)
        return Status.NOT_SERVING if frame is None else frame.header.status

    def write(self, inode: int, index: int, data, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = self.write_once(inode, index, data)
            if status == Status.OK:
                return
            assert status in framing.RETRYABLE, framing.status_name(status)
            assert time.monotonic() < deadline, f"write kept failing: {status}"
            time.sleep(0.1)
            self.refresh()

    def read_once(self, target_id: int, inode: int, index: int) -> tuple[int, bytes]:
        chain = self.chain()
        t = self.target(target_id)
        req = data_pb2.ChunkReadRequest(
            chain_id=chain.chain_id,
            target_id=target_id,
            chunk=data_pb2.ChunkId(inode=inode, index=index),
            offset=0,
            length=CHUNK,
            chain_version=chain.version,
        )
        frame = self._exchange(t.data_address, Op.READ, req.SerializeToString())
        assert frame is not None, f"target {target_id} unreachable: {self.last_error!r}"
        if frame.header.status != Status.OK:
            return frame.header.status, b""
        resp = data_pb2.ChunkReadResponse.FromString(frame.meta)
        assert resp.data_offset == 0 and resp.skip == 0
        return Status.OK, bytes(frame.data) if frame.data is not None else b""

    def read(self, target_id: int, inode: int, index: int, timeout: float = 30.0) -> bytes:
        """Read a whole chunk from one target, retrying while that node's routing catches up."""
        deadline = time.monotonic() + timeout
        while True:
            status, data = self.read_once(target_id, inode, index)
            if status == Status.OK:
                return data
            assert status in framing.RETRYABLE, framing.status_name(status)
            assert time.monotonic() < deadline, f"read kept failing: {status}"
            time.sleep(0.1)
            self.refresh()

    def close(self) -> None:
        self.pool.close()


class BackgroundWriter:
    """Keeps rewriting a few 1 MiB chunks in a thread, retrying like a client, until finished."""

    def __init__(self, cluster: LocalCluster, inode: int):
        self.client = DataClient(cluster)
        self.inode = inode
        self.expected: dict[tuple[int, int], str] = {}
        self.count = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                index = self.count % 4
                blob = os.urandom(CHUNK // 4)
                self.client.write(self.inode, index, blob)
                self.expected[(self.inode, index)] = hashlib.sha256(blob).hexdigest()
                self.count += 1
        except BaseException as exc:
            self.error = exc

    def finish(self) -> dict[tuple[int, int], str]:
        self._stop.set()
        self._thread.join(90)
        self.client.close()
        assert not self._thread.is_alive(), "background writer hung"
        if self.error is not None:
            raise self.error
        assert self.count >= 4
        return self.expected


def list_chunks(cluster: LocalCluster, grpc_address: str, target_id: int) -> list[tuple]:
    out = []
    with cluster.channel(grpc_address) as ch:
        stub = storage_pb2_grpc.StorageServiceStub(ch)
        req = storage_pb2.ListChunksRequest(target_id=target_id, limit=1000)
        while True:
            resp = stub.ListChunks(req, timeout=10)
            out.extend(
                (c.inode, c.index, c.version, c.pending_version, c.length, c.checksum)
                for c in resp.chunks
            )
            if not resp.more:
                return out
            req.has_after, req.after_inode, req.after_index = True, out[-1][0], out[-1][1]


def server_of(cluster: LocalCluster, target: common_pb2.TargetInfo) -> int:
    return next(
        i for i in range(len(cluster.storage)) if cluster.storage_address(i) == target.data_address
    )


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(
        tmp_path, storage_servers=3, replicas=3, targets_per_server=1, heartbeat_timeout=2.0
    )
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


def test_kill_each_chain_position_then_resync(cluster):
    client = DataClient(cluster)
    expected: dict[tuple[int, int], str] = {}
    rates = {}
    try:
        for round_no, position in enumerate(("head", "middle", "tail")):
            client.refresh()
            inode = 1000 + round_no
            blobs = [os.urandom(CHUNK) for _ in range(N_CHUNKS)]
            t0 = time.perf_counter()
            for i, blob in enumerate(blobs):
                client.write(inode, i, blob)
            rates.setdefault("write", []).append(N_CHUNKS * CHUNK / (time.perf_counter() - t0))
            for i, blob in enumerate(blobs):
                expected[(inode, i)] = hashlib.sha256(blob).hexdigest()
            chain = client.chain()
            t0 = time.perf_counter()
            for i in range(N_CHUNKS):
                assert client.read(chain.targets[-1], inode, i) == blobs[i]
            rates.setdefault("read", []).append(N_CHUNKS * CHUNK / (time.perf_counter() - t0))

            victim = {"head": 0, "middle": 1, "tail": 2}[position]
            victim_target = chain.targets[victim]
            idx = server_of(cluster, client.target(victim_target))
            writer = BackgroundWriter(cluster, 2000 + round_no)
            time.sleep(0.3)  # let writes be in flight when the server dies
            cluster.kill_storage(idx)
            cluster.wait_for(
                lambda r, v=victim_target: any(
                    t.target_id == v and t.state == common_pb2.OFFLINE for t in r.targets
                ),
                timeout=30,
                what=f"target {victim_target} offline",
            )
            client.refresh()
            assert client.chain().version > chain.version
            survivors = [
                t for t in client.chain().targets if client.target(t).state == common_pb2.SERVING
            ]
            assert len(survivors) == 2 and victim_target not in survivors
            # every chunk so far, byte-exact, from each surviving replica
            for (ino, i), digest in expected.items():
                for t in survivors:
                    assert hashlib.sha256(client.read(t, ino, i)).hexdigest() == digest

            # writes go on: rewrite some chunks, add new ones
            for i in (0, 5, N_CHUNKS + round_no):
                blob = os.urandom(CHUNK // 2 + i)
                client.write(inode, i, blob)
                old = blobs[i] if i < N_CHUNKS else b""
                content = blob + old[len(blob) :]  # a write at offset 0 keeps the rest
                expected[(inode, i)] = hashlib.sha256(content).hexdigest()

            expected.update(writer.finish())
            cluster.start_storage(idx, timeout=60)
            cluster.wait_serving(timeout=120)
            client.refresh()
            lists = [
                list_chunks(cluster, client.target(t).grpc_address, t)
                for t in client.chain().targets
            ]
            assert len(lists[0]) == len(expected)
            assert all(not c[3] for c in lists[0])  # nothing pending
            assert lists[0] == lists[1] == lists[2], f"replicas differ after round {position}"
            for (ino, i), digest in expected.items():
                assert hashlib.sha256(client.read(victim_target, ino, i)).hexdigest() == digest
    finally:
        client.close()
    # SIGTERM stops a storage server cleanly
    assert cluster.storage[0].stop(timeout=20) == 0
    mb = 1024 * 1024
    print(
        "\ndata path, one connection, 4 MiB chunks, R=3: write "
        + ", ".join(f"{r / mb:.0f}" for r in rates["write"])
        + " MiB/s; read "
        + ", ".join(f"{r / mb:.0f}" for r in rates["read"])
        + " MiB/s"
    )
