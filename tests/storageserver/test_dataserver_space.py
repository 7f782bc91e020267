"""A chain whose target runs out of disk: three in-process data servers, one target on a tmpfs."""

from __future__ import annotations

import os
import time

import pytest

from emberfs.common import framing, wire
from emberfs.common.framing import Op
from emberfs.common.routing import RoutingView
from emberfs.proto import common_pb2, data_pb2
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.dataserver import DataServer

MiB = 1024 * 1024
CS = MiB
INODE = 7

pytestmark = pytest.mark.timeout(60)


class Chain:
    """Targets 1, 2, 3 on three data servers, chain 1 in that order (1 is the head)."""

    def __init__(self, stores: dict[int, ChunkStore]):
        self.stores = stores
        self.servers = {
            t: DataServer(
                "127.0.0.1", 0, stores=lambda t=t: {t: self.stores[t]}, routing=lambda: self.view
            ).start()
            for t in (1, 2, 3)
        }
        routing = common_pb2.RoutingInfo(version=100)
        for t, server in self.servers.items():
            host, port = server.address
            routing.targets.add(
                target_id=t,
                node_id=f"n{t}",
                data_address=f"{host}:{port}",
                state=common_pb2.SERVING,
                chain_id=1,
            )
        routing.chains.add(chain_id=1, version=1, targets=[1, 2, 3])
        self.view = RoutingView.from_proto(routing)
        self.pool = wire.ConnectionPool(connect_timeout=5, io_timeout=20)
        self.request_id = 0

    def address(self, t: int) -> str:
        host, port = self.servers[t].address
        return f"{host}:{port}"

    def write(self, index: int, data: bytes, offset: int = 0) -> data_pb2.ChunkWriteResponse:
        """A client write to the head; raises the refusal it gets."""
        self.request_id += 1
        req = data_pb2.ChunkWriteRequest(
            chain_id=1,
            chain_version=1,
            target_id=1,
            chunk=data_pb2.ChunkId(inode=INODE, index=index),
            offset=offset,
            chunk_size=CS,
            client_id="test",
            request_id=self.request_id,
        )
        meta = wire.call(self.pool, self.address(1), Op.WRITE, req.SerializeToString(), data)
        return data_pb2.ChunkWriteResponse.FromString(meta)

    def read(self, t: int, index: int) -> bytes:
        data, meta = self.stores[t].read_committed(INODE, index)
        framing.verify(data, meta.crcs, self.stores[t].block_size)
        return data

    def metas(self, index: int) -> list:
        return [self.stores[t].meta(INODE, index) for t in (1, 2, 3)]

    def close(self) -> None:
        self.pool.close()
        for server in self.servers.values():
            server.stop()
        for store in self.stores.values():
            store.close()


@pytest.fixture
def chain_on(tmp_path, tmpfs):
    """``chain_on(t, size, reserve)``: a chain whose target ``t`` has a tmpfs of ``size`` bytes."""
    made = []

    def make(small: int, size: int, reserve: int) -> Chain:
        stores = {}
        for t in (1, 2, 3):
            root = tmp_path / f"target-{t}"
            if t == small:
                stores[t] = ChunkStore(tmpfs(root, size), reserve_bytes=reserve)
                stores[t].space.check_interval = 0.0  # look at every write
            else:
                stores[t] = ChunkStore(root)
        made.append(Chain(stores))
        return made[-1]

    try:
        yield make
    finally:
        for chain in made:
            chain.close()


def fill_chain(chain: Chain) -> dict[int, bytes]:
    """Write whole chunks until the chain answers NO_SPACE; the chunks it took."""
    chunks: dict[int, bytes] = {}
    for index in range(32):
        data = os.urandom(CS)
        try:
            chain.write(index, data)
        except wire.NoSpace:
            return chunks
        chunks[index] = data
    raise AssertionError("the small target never filled up")


def assert_chain_holds(chain: Chain, chunks: dict[int, bytes]) -> None:
    for index, data in chunks.items():
        metas = chain.metas(index)
        assert all(not m.pending_version for m in metas), metas
        assert len({(m.version, m.checksum) for m in metas}) == 1, metas
        assert all(chain.read(t, index) == data for t in (1, 2, 3))


@pytest.mark.parametrize("small", [3, 1], ids=["tail", "head"])
def test_a_full_target_makes_its_chain_answer_no_space_until_chunks_go(chain_on, small):
    chain = chain_on(small, 6 * MiB, MiB)
    chunks = fill_chain(chain)
    assert 2 <= len(chunks) <= 5
    refused = len(chunks)
    with pytest.raises(wire.NoSpace) as err:
        chain.write(refused, b"x" * 100)
    assert not err.value.retryable and f"target {small}" in err.value.message
    assert chain.stores[small].stats()["full"]
    # nothing of the refused writes stayed on any replica, pending or committed
    assert chain.metas(refused) == [None, None, None]
    assert_chain_holds(chain, chunks)
    # a partial write to a chunk that exists stages the whole chunk again: refused too
    with pytest.raises(wire.NoSpace):
        chain.write(0, b"y" * 100, offset=10)
    assert_chain_holds(chain, chunks)
    # chunk 0 goes (as garbage collection removes it) and the chain takes writes again
    for store in chain.stores.values():
        store.remove(INODE, 0)
    del chunks[0]
    data = os.urandom(CS)
    chain.write(refused, data)
    chunks[refused] = data
    assert_chain_holds(chain, chunks)
    assert not chain.stores[small].stats()["full"]


def fill(path) -> None:
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(64 * 1024))
        except OSError:
            pass


def test_enospc_at_the_head_after_it_forwarded(chain_on, monkeypatch):
    """The head's disk fills between its check and its stage: NO_SPACE, and no version reused."""
    chain = chain_on(1, 8 * MiB, 0)
    head = chain.stores[1]
    base = os.urandom(CS // 2)
    chain.write(0, base)
    # another process fills the head's file system after the head let the write in
    monkeypatch.setattr(head, "admit_write", lambda *args, **kwargs: True)
    fill(head.root / "filler")
    patch = os.urandom(1000)
    with pytest.raises(wire.NoSpace) as err:
        chain.write(0, patch, offset=100)
    assert "target 1" in err.value.message and head.space.full
    m = head.meta(INODE, 0)
    assert (m.version, m.pending_version) == (1, 0)
    assert chain.read(1, 0) == base
    # the successors got the update before the head failed to stage it: they commit it as
    # version 2, a version ahead of the head, which never uses 2 again for this chunk
    deadline = time.monotonic() + 20
    while [(m.version, m.pending_version) for m in chain.metas(0)[1:]] != [(2, 0), (2, 0)]:
        assert time.monotonic() < deadline, chain.metas(0)
        time.sleep(0.01)
    ahead = bytearray(base)
    ahead[100:1100] = patch
    assert chain.read(2, 0) == chain.read(3, 0) == bytes(ahead)
    assert chain.read(1, 0) == base
    # room again: the next write takes version 3, the successors (whose version 2 is not
    # the base it was staged on) ask for the whole chunk, and the chain agrees on one content
    (head.root / "filler").unlink()
    monkeypatch.undo()
    again = os.urandom(2000)
    assert chain.write(0, again, offset=300).version == 3
    expect = bytearray(base)
    expect[300:2300] = again
    assert_chain_holds(chain, {0: bytes(expect)})
