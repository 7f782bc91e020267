"""How the blocks of a KV cache batch travel: chunk I/O over the slab files, small blocks together.

A block at slot ``n`` lives at a fixed offset of one slab file
(:mod:`emberfs.common.kvgeometry`). :func:`plan_transfers` turns the blocks of
a batch into :class:`BlockTransfer` values, each one
:class:`~emberfs.client.chunkio.ChunkIO` (a range of one chunk) and the blocks
it carries: blocks of one chunk close together share one transfer through a
pooled chunk buffer; a lone block, or a piece of a block that spans chunks,
travels straight from (or into) its own buffer.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

from emberfs.client.buffers import BlockPool
from emberfs.client.chunkio import ChunkIO
from emberfs.client.datapath import ChunkLost
from emberfs.common import kvgeometry
from emberfs.common.layout import chunk_chain, chunk_spans

#: keys per index call (the metaserver takes up to 10000)
BATCH = 4096


@dataclass
class BlockTransfer:
    """One chunk read or write of a batch: a range of one chunk, and the blocks it carries.

    ``members`` are ``(block number, offset of the block in the range)``.
    An ``in_place`` transfer moves one block (or the piece of it in this
    chunk) straight from or into the block's own view; the others move
    several blocks through a buffer of the range's own.
    """

    io: ChunkIO
    members: list[tuple[int, int]]
    in_place: bool = False
    buffer: bytearray | None = None  # the pooled buffer ``io.buf`` is part of

    @classmethod
    def of_run(cls, chain, inode, index, run, blocks, pool: BlockPool, size: int) -> BlockTransfer:
        """The transfer of ``run`` (``(offset in chunk, block number)``, in order) of ``blocks``.

        A run of several blocks gets a buffer of ``size`` bytes from ``pool``
        (reused memory: a fresh one costs its page faults).
        """
        if len(run) == 1:
            inner, n = run[0]
            io = ChunkIO.over(chain, inode, index, inner, blocks[n][1], chunk_size=size)
            return cls(io, [(n, 0)], in_place=True)
        first = run[0][0]
        last_inner, last = run[-1]
        span = last_inner + len(blocks[last][1]) - first
        members = [(n, inner - first) for inner, n in run]
        buf = pool.get(size)
        io = ChunkIO.over(chain, inode, index, first, memoryview(buf)[:span], chunk_size=size)
        return cls(io, members, buffer=buf)

    def blocks(self) -> list[int]:
        """The numbers of the blocks it carries."""
        return [n for n, _ in self.members]

    def gather(self, views: list[memoryview]) -> None:
        """Copy the blocks it writes into its buffer, zeros between them (their slots' padding)."""
        if self.in_place:
            return
        view = self.io.buf
        ends = [at for _, at in self.members[1:]] + [len(view)]
        for (n, at), end in zip(self.members, ends, strict=True):
            stop = at + len(views[n])
            view[at:stop] = views[n]
            if end > stop:
                view[stop:end] = bytes(end - stop)

    def scatter(self, dests: list[memoryview]) -> None:
        """Copy the blocks it read out of its buffer."""
        if not self.in_place:
            for n, at in self.members:
                dests[n][:] = self.io.buf[at : at + len(dests[n])]

    def release(self, pool: BlockPool) -> None:
        """Give its buffer back to ``pool`` (once nothing reads or writes it)."""
        if self.buffer is not None:
            pool.put(self.buffer)
            self.buffer = None


def _pieces(geometry, slabs, slot: int, view: memoryview):
    """``(chain, inode, chunk index, chunk offset, piece)`` of a block at ``slot``."""
    slab, offset = kvgeometry.locate(geometry, slot)
    inode, chains = slabs[slab]
    for s in chunk_spans(offset, len(view), geometry.chunk_size):
        lo = s.file_offset - offset
        yield chunk_chain(chains, s.index), inode, s.index, s.chunk_offset, view[lo : lo + s.length]


def plan_transfers(
    geometry, slabs: list, blocks: list[tuple[int, memoryview]], gap: int, pool: BlockPool
) -> list[BlockTransfer]:
    """The transfers that move ``blocks`` (``(slot, view)``), blocks of one chunk together.

    ``slabs`` are the ``(inode, chains)`` of the cache's slab files. Blocks
    at most ``gap`` bytes apart in one chunk (small blocks share chunks)
    travel as one transfer of the range they span, through a chunk-sized
    buffer from ``pool`` (given back by :meth:`BlockTransfer.release`); a
    lone block, or a piece of a block that spans chunks, travels straight
    from (or into) its view.
    """
    g = geometry
    if g.stride > g.chunk_size // 2:  # every chunk holds one slot at most
        return [
            BlockTransfer(
                ChunkIO.over(chain, inode, index, off, piece, chunk_size=g.chunk_size),
                [(n, 0)],
                in_place=True,
            )
            for n, (slot, view) in enumerate(blocks)
            for chain, inode, index, off, piece in _pieces(g, slabs, slot, view)
        ]
    by_chunk: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for n, (slot, _) in enumerate(blocks):
        slab, offset = kvgeometry.locate(g, slot)
        index, inner = divmod(offset, g.chunk_size)
        by_chunk.setdefault((slab, index), []).append((inner, n))
    out: list[BlockTransfer] = []
    for (slab, index), members in by_chunk.items():
        inode, chains = slabs[slab]
        chain = chunk_chain(chains, index)
        members.sort()
        run = [members[0]]
        for inner, n in members[1:]:
            last_inner, last = run[-1]
            if inner - (last_inner + len(blocks[last][1])) <= gap:
                run.append((inner, n))
                continue
            out.append(BlockTransfer.of_run(chain, inode, index, run, blocks, pool, g.chunk_size))
            run = [(inner, n)]
        out.append(BlockTransfer.of_run(chain, inode, index, run, blocks, pool, g.chunk_size))
    return out


def batches(items: list) -> list[list]:
    """``items`` in pieces of :data:`BATCH`, a metaserver call each."""
    return [items[i : i + BATCH] for i in range(0, len(items), BATCH)]


def storage_failure(exc: BaseException) -> bool:
    """Whether a chunk transfer failed for want of storage (a miss, a failed put), not a refusal."""
    return isinstance(exc, ChunkLost) or (
        isinstance(exc, OSError) and not isinstance(exc, PermissionError)
    )


def read_failed(fut: Future) -> bool:
    """Whether a block read failed for want of storage; other errors are raised."""
    exc = fut.exception()
    if exc is None:
        return False
    if storage_failure(exc):
        return True
    raise exc
