"""sync_successor against a minimal framed data server and a real StorageService."""

from __future__ import annotations

import os
import socket
import threading
from concurrent import futures

import grpc
import pytest

from emberfs.common import framing, wire
from emberfs.proto import data_pb2
from emberfs.storageserver import resync
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.replica import Replica
from emberfs.storageserver.resync import ResyncInterrupted, sync_successor
from emberfs.storageserver.service import StorageServicer, add_to_server

CS = 1024 * 1024
CHAIN, CHAIN_VERSION, PRED, SUCC = 4, 9, 1, 2


class SyncTarget:
    """The successor: applies sync writes with ChunkStore.install, as the data server does."""

    def __init__(self, store: ChunkStore, *, one_request_per_connection: bool = False):
        self.store = store
        self.one_request = one_request_per_connection
        self.requests: list[data_pb2.ChunkWriteRequest] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.threads: list[threading.Thread] = []
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, sock: socket.socket) -> None:
        with sock:
            while True:
                try:
                    frame = framing.recv_frame(sock)
                except (framing.FrameError, OSError):
                    return
                req = data_pb2.ChunkWriteRequest()
                req.ParseFromString(frame.meta)
                self.requests.append(req)
                op = framing.Op.WRITE
                if req.chain_version != CHAIN_VERSION:
                    framing.send_error(
                        sock, op, framing.Status.STALE_CHAIN, "chain version", routing_version=3
                    )
                elif not (req.sync and req.full_chunk and req.target_id == SUCC):
                    framing.send_error(sock, op, framing.Status.BAD_REQUEST, "not a sync copy")
                else:
                    data = bytes(frame.data) if frame.data is not None else b""
                    assert len(data) <= req.chunk_size
                    self.store.install(
                        req.chunk.inode,
                        req.chunk.index,
                        req.update_version,
                        data,
                        replace=req.replace,
                    )
                    meta = self.store.meta(req.chunk.inode, req.chunk.index)
                    resp = data_pb2.ChunkWriteResponse(
                        version=meta.version, chunk_length=meta.length
                    )
                    framing.send_frame(sock, op | framing.RESPONSE, resp.SerializeToString())
                if self.one_request:
                    return

    def close(self) -> None:
        self.listener.close()
        for t in self.threads:
            t.join(5)


@pytest.fixture
def pair(tmp_path, monkeypatch):
    monkeypatch.setattr(resync, "PAGE", 3)  # exercise paging on both sides
    monkeypatch.setattr(resync, "REMOVE_BATCH", 2)
    pred = ChunkStore(tmp_path / "pred", block_size=4096)
    succ = ChunkStore(tmp_path / "succ", block_size=4096)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_to_server(StorageServicer("node-b", lambda: {SUCC: succ}, lambda t: CHAIN), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    targets: list[SyncTarget] = []

    def start(**kw) -> SyncTarget:
        t = SyncTarget(succ, **kw)
        targets.append(t)
        return t

    try:
        yield pred, succ, f"127.0.0.1:{port}", start
    finally:
        for t in targets:
            t.close()
        server.stop(None).wait(10)
        pred.close()
        succ.close()


def put(store, inode, index, version, data):
    store.stage(inode, index, version, 0, data, chunk_size=CS, full_chunk=True)
    store.commit(inode, index, version)


LOCKS = Replica()  # the chunk locks of the predecessor's node


def run(pred, grpc_address, target, **kw):
    return sync_successor(
        pred,
        hold=lambda inode, index: LOCKS.chunk(PRED, inode, index),
        chain_id=CHAIN,
        chain_version=kw.pop("chain_version", CHAIN_VERSION),
        target_id=PRED,
        successor_target_id=SUCC,
        successor_data_address=target.address,
        successor_grpc_address=grpc_address,
        **kw,
    )


def committed(store):
    return {(m.inode, m.index): (m.version, m.checksum) for m in store.list() if m.version}


def populate(pred, succ) -> int:
    big = os.urandom(300_000)
    put(pred, 1, 0, 3, b"a")  # missing on the successor
    put(pred, 1, 1, 2, b"same")
    put(succ, 1, 1, 2, b"same")
    put(pred, 1, 2, 5, b"new content")  # stale on the successor
    put(succ, 1, 2, 4, b"old content")
    put(pred, 2, 0, 1, b"")  # an empty chunk
    pred.stage(2, 1, 1, 0, b"in flight", chunk_size=CS)  # pending only: not copied
    succ.stage(2, 1, 1, 0, b"in flight", chunk_size=CS)
    put(pred, 3, 0, 2, big)
    put(pred, 1, 3, 2, b"diverged: the serving copy")  # same version, other content
    put(succ, 1, 3, 2, b"diverged: a given-up write")
    # the successor is ahead: with the chunk held no write is in flight here, so it holds a
    # version given up after it was forwarded, and the copy replaces it
    put(pred, 1, 4, 6, b"v6")
    put(succ, 1, 4, 7, b"v7")
    put(succ, 1, 7, 1, b"deleted meanwhile")
    for index in range(3):
        put(succ, 4, index, 1, b"removed file")
    return (
        len(b"a") + len(b"new content") + len(b"diverged: the serving copy") + len(big) + len(b"v6")
    )


@pytest.mark.timeout(60)
def test_sync_copies_and_removes(pair):
    pred, succ, grpc_address, start = pair
    nbytes = populate(pred, succ)
    target = start()
    counts = run(pred, grpc_address, target)
    assert counts == {"copied": 6, "removed": 4, "bytes": nbytes}
    assert succ.meta(1, 4).version == 6
    expected = committed(pred)
    assert committed(succ) == expected
    for inode, index in expected:
        assert succ.read_committed(inode, index)[0] == pred.read_committed(inode, index)[0]
    assert succ.meta(2, 1).pending_version == 1  # the in-flight write is left alone
    reqs = target.requests
    assert {r.client_id for r in reqs} == {"resync"}
    assert len({r.request_id for r in reqs}) == len(reqs)
    assert all(r.chain_id == CHAIN and r.offset == 0 for r in reqs)
    assert {(r.chunk.inode, r.chunk.index): r.chunk_size for r in reqs}[(2, 0)] == 4096
    assert target.connections == 1
    # in sync: a second pass changes nothing
    assert run(pred, grpc_address, target) == {"copied": 0, "removed": 0, "bytes": 0}


@pytest.mark.timeout(60)
def test_a_chunk_the_source_lacks_goes_even_if_it_changed_on_the_successor(pair):
    """A stray update staged on the successor (its sender gave up, or it arrived late) made the
    version-checked removal keep a chunk of a removed file there for good."""
    pred, succ, grpc_address, start = pair
    put(pred, 1, 0, 2, b"kept")
    put(succ, 1, 0, 2, b"kept")
    put(succ, 5, 0, 1, b"a removed file's chunk")
    succ.stage(5, 0, 2, 0, b"a stray update of it", chunk_size=CS)
    target = start()
    counts = run(pred, grpc_address, target)
    assert counts["removed"] == 1
    assert succ.meta(5, 0) is None and committed(succ) == committed(pred)


@pytest.mark.timeout(60)
def test_sync_reconnects_when_the_server_closes(pair):
    pred, succ, grpc_address, start = pair
    populate(pred, succ)
    target = start(one_request_per_connection=True)
    assert run(pred, grpc_address, target)["copied"] == 6
    assert succ.read_committed(1, 3)[0] == b"diverged: the serving copy"
    assert target.connections == 6


@pytest.mark.timeout(60)
def test_refused_copy_raises(pair):
    pred, succ, grpc_address, start = pair
    populate(pred, succ)
    target = start()
    with pytest.raises(wire.Refused) as err:
        run(pred, grpc_address, target, chain_version=CHAIN_VERSION - 1)
    assert err.value.status == framing.Status.STALE_CHAIN
    assert succ.meta(1, 0) is None


@pytest.mark.timeout(60)
def test_should_stop_interrupts(pair):
    pred, succ, grpc_address, start = pair
    populate(pred, succ)
    target = start()
    with pytest.raises(ResyncInterrupted):
        run(pred, grpc_address, target, should_stop=lambda: True)
    assert target.requests == []


@pytest.mark.timeout(60)
def test_damaged_local_chunk_is_not_spread(pair):
    pred, succ, grpc_address, start = pair
    put(pred, 5, 0, 1, os.urandom(20_000))
    (path,) = [p for p in (pred.root / "chunks").rglob("*") if p.is_file()]
    raw = bytearray(path.read_bytes())
    raw[9000] ^= 1
    path.write_bytes(raw)
    target = start()
    reported = []
    with pytest.raises(framing.ChecksumError):
        run(pred, grpc_address, target, on_damaged=lambda m: reported.append((m.inode, m.index)))
    assert succ.meta(5, 0) is None and target.requests == []
    # marked damaged and reported, so the chain repairs it; the next sync passes it over
    assert pred.meta(5, 0).damaged and reported == [(5, 0)]
    run(pred, grpc_address, target)
    assert succ.meta(5, 0) is None and reported == [(5, 0)]


@pytest.mark.timeout(60)
def test_unreachable_successor_raises(pair):
    pred, succ, grpc_address, start = pair
    put(pred, 1, 0, 1, b"x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"

        class Dead:
            address = dead

        with pytest.raises(OSError):
            run(pred, grpc_address, Dead)
        with pytest.raises(grpc.RpcError):
            sync_successor(
                pred,
                hold=lambda inode, index: LOCKS.chunk(PRED, inode, index),
                chain_id=CHAIN,
                chain_version=CHAIN_VERSION,
                target_id=PRED,
                successor_target_id=SUCC,
                successor_data_address=dead,
                successor_grpc_address=dead,
            )


@pytest.mark.timeout(60)
def test_a_damaged_chunk_is_replaced_on_the_successor_and_kept_from_the_source(pair):
    pred, succ, grpc_address, start = pair
    put(pred, 1, 0, 3, b"whole here")
    put(succ, 1, 0, 3, b"whole here")
    put(pred, 1, 1, 2, b"whole on the successor")
    put(succ, 1, 1, 2, b"whole on the successor")
    for store, index in ((succ, 0), (pred, 1)):  # each lost one file in a crash
        assert store.mark_damaged(1, index, store.meta(1, index).version)
    target = start()
    counts = run(pred, grpc_address, target)
    # the source's whole copy replaces the successor's damaged one, and the source's damaged
    # chunk neither removes nor overwrites the successor's whole one
    assert counts["copied"] == 1 and counts["removed"] == 0
    assert succ.read_committed(1, 0)[0] == b"whole here" and not succ.meta(1, 0).damaged
    assert succ.read_committed(1, 1)[0] == b"whole on the successor"
