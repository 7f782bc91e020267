"""The client's read path end to end against real data servers, compared with a byte model.

Two in-process data servers (a chain of two targets over real chunk stores, a
static routing) hold one file of a few 256 KiB chunks. Random programs write
ranges through the chain head (``DataClient.write``), cut or grow the
file (``OP_TRUNCATE`` as the metaserver sends it; a file grown this way has
chunks shorter than the file, whose missing bytes read as zeros), and read
ranges at offsets at and around the 64 KiB CRC blocks, past a chunk's end and
in chunks that were never written, both with ``DataClient.read`` and
with a read sent ahead (``start_read`` / ``finish_into``, falling back to
``read`` as the readahead does). Every read must give the model's bytes.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import example, given, note
from hypothesis import strategies as st

from emberfs.client.chunkio import ChunkIO
from emberfs.client.datapath import DataClient
from emberfs.client.retry import RequestIds
from emberfs.client.routing import RoutingCache
from emberfs.common import wire
from emberfs.common.framing import Op
from emberfs.common.routing import RoutingView
from emberfs.common.wire import ConnectionPool
from emberfs.proto import common_pb2, data_pb2
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.dataserver import DataServer

BLOCK = 64 * 1024  # the CRC block of the data protocol (the chunk stores' default)
CS = 4 * BLOCK  # chunk size of the file
N_CHUNKS = 3
CHAIN = 1

pytestmark = pytest.mark.timeout(120)


class Chain:
    """Targets 1 (head) and 2 on two data servers, chain 1, and a client of them."""

    def __init__(self, tmp_path) -> None:
        self.stores = {t: ChunkStore(tmp_path / f"target-{t}") for t in (1, 2)}
        self.view = RoutingView()
        self.servers = {
            t: DataServer(
                "127.0.0.1", 0, stores=lambda t=t: {t: self.stores[t]}, routing=lambda: self.view
            ).start()
            for t in (1, 2)
        }
        self.routing = common_pb2.RoutingInfo(version=1)
        for t, server in self.servers.items():
            host, port = server.address
            self.routing.targets.add(
                target_id=t,
                node_id=f"n{t}",
                data_address=f"{host}:{port}",
                state=common_pb2.SERVING,
                chain_id=CHAIN,
            )
        self.routing.chains.add(chain_id=CHAIN, version=1, targets=[1, 2])
        self.view = RoutingView.from_proto(self.routing)
        self.pool = ConnectionPool(connect_timeout=5, io_timeout=10)
        self.client = DataClient(
            RoutingCache(lambda: self.routing, min_interval=0),
            RequestIds(),
            self.pool,
            read_timeout=10,
            write_timeout=10,
        )
        self._inodes = itertools.count(100)
        self._request_ids = itertools.count(1)

    def new_inode(self) -> int:
        return next(self._inodes)

    def truncate(self, inode: int, length: int) -> None:
        """Cut the file to ``length`` bytes, as the metaserver does (one request to the head)."""
        req = data_pb2.ChunkTruncateRequest(
            chain_id=CHAIN,
            chain_version=1,
            target_id=1,
            inode=inode,
            length=length,
            chunk_size=CS,
            stripe=1,
            stripe_position=0,
            client_id="model",
            request_id=next(self._request_ids),
        )
        host, port = self.servers[1].address
        wire.call(self.pool, f"{host}:{port}", Op.TRUNCATE, req.SerializeToString())

    def close(self) -> None:
        self.pool.close()
        for server in self.servers.values():
            server.stop()
        for store in self.stores.values():
            store.close()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    c = Chain(tmp_path_factory.mktemp("datapath-model"))
    try:
        yield c
    finally:
        c.close()


def positions(limit: int) -> st.SearchStrategy[int]:
    """Offsets in ``[0, limit]``, often at or next to a CRC block boundary."""
    near = sorted(
        {p + d for p in range(0, limit + 1, BLOCK) for d in (-1, 0, 1) if 0 <= p + d <= limit}
    )
    return st.one_of(st.sampled_from(near), st.integers(0, limit))


@st.composite
def ranges(draw, limit: int) -> tuple[int, int]:
    """A non-empty ``(offset, length)`` inside ``[0, limit]``."""
    a, b = sorted((draw(positions(limit)), draw(positions(limit))))
    if a == b:
        a, b = (a, a + 1) if a < limit else (a - 1, a)
    return a, b - a


@st.composite
def to_chunk_end(draw) -> tuple[int, int]:
    """``(offset, length)`` reaching the chunk size: past the end of a shorter chunk."""
    offset = draw(positions(CS - 1))
    return offset, CS - offset


indexes = st.integers(0, 1) | st.integers(0, N_CHUNKS - 1)  # often the same few chunks
reads = ranges(CS) | to_chunk_end()
steps = st.one_of(
    st.tuples(st.just("write"), indexes, ranges(CS), st.integers(0, 2**16)),
    st.tuples(st.just("truncate"), positions(N_CHUNKS * CS)),
    st.tuples(st.just("read"), indexes, reads),
    st.tuples(st.just("read ahead"), indexes, reads),
)


def written(base: bytes, offset: int, data: bytes) -> bytes:
    """``base`` with ``data`` written at ``offset``; a gap past its end reads as zeros."""
    out = bytearray(base)
    if len(out) < offset:
        out += bytes(offset - len(out))
    out[offset : offset + len(data)] = data
    return bytes(out)


@given(program=st.lists(steps, min_size=2, max_size=12))
# an offset read at the end of a short chunk of a file grown past it: the answer starts at the
# read's block, ``skip`` bytes before the offset asked
@example(
    program=[
        ("write", 0, (0, BLOCK + 100), 1),
        ("truncate", N_CHUNKS * CS),
        ("read", 0, (BLOCK + 10, CS - BLOCK - 10)),
    ]
)
def test_reads_return_the_bytes_written_and_zeros_past_them(chain, program):
    note(f"steps: {program!r}")
    client = chain.client
    inode = chain.new_inode()
    chunks: dict[int, bytes] = {}  # the model: each chunk's bytes (missing: never written)
    size = 0  # the file's size (the metaserver's; reads stay inside it)
    for n, step in enumerate(program):
        kind = step[0]
        if kind == "write":
            _, index, (offset, length), seed = step
            data = random.Random(f"{n}-{seed}").randbytes(length)
            client.write(ChunkIO.over(CHAIN, inode, index, offset, data, chunk_size=CS))
            chunks[index] = written(chunks.get(index, b""), offset, data)
            size = max(size, index * CS + offset + length)
        elif kind == "truncate":
            _, length = step
            chain.truncate(inode, length)
            for index, data in chunks.items():
                chunks[index] = data[: max(0, length - index * CS)]
            size = length
        else:
            _, index, (offset, length) = step
            # inside the file: a read of the client never asks past its size
            end = min(offset + length, size - index * CS)
            if end <= offset:
                continue
            expect = chunks.get(index, b"")[offset:end]
            expect += bytes(end - offset - len(expect))  # past the chunk's end: zeros
            out = bytearray(b"\xee" * (end - offset))
            view = memoryview(out)
            pending = None
            if kind == "read ahead":
                pending = client.start_read(ChunkIO(CHAIN, inode, index, offset, end - offset))
            if pending is None or not pending.finish_into(view):
                client.read(ChunkIO.over(CHAIN, inode, index, offset, view))
            assert bytes(out) == expect, f"chunk {index} [{offset}, {end}) of a {size}-byte file"
