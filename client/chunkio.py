"""``ChunkIO``: one read or write of a byte range of one chunk, and the plans that make them.

A file's bytes live in chunks of its layout's chunk size, chunk ``i`` on chain
``chains[i % stripe]`` (:mod:`emberfs.common.layout`). Every transfer of file
data, whether an open file's read or write, a batch of small files or a KV
cache block, is a list of :class:`ChunkIO` values that the data client
(:class:`~emberfs.client.datapath.DataClient`) runs: ``read(io)``,
``write(io)``, ``write_batch(ios)``, ``start_read(io)``.

:func:`read_ios` and :func:`write_io` plan them for a byte range of an open
file (:class:`~emberfs.client.handles.OpenHandle`).
"""

from __future__ import annotations

import errno
from concurrent.futures import wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emberfs.common import extents
from emberfs.common.layout import chunk_chain, chunk_spans

if TYPE_CHECKING:
    from emberfs.client.handles import OpenHandle
    from emberfs.client.meta import MetaClient


@dataclass(slots=True)
class ChunkIO:
    """One chunk I/O: ``length`` bytes at ``offset`` of chunk ``index`` of ``inode`` on ``chain``.

    Attributes
    ----------
    buf : memoryview or None
        Where a read lands, or what a write sends (``length`` bytes); None for
        a read sent ahead (``DataClient.start_read``) that lands later.
    need : int
        Reads: how many of the bytes the file says are on storage (the rest may
        lie past the chunk's end and read as zeros).
    chunk_size : int
        Writes: the chunk size of the file's layout.
    """

    chain: int
    inode: int
    index: int
    offset: int
    length: int
    buf: memoryview | None = None
    need: int = 0
    chunk_size: int = 0

    @classmethod
    def over(cls, chain: int, inode: int, index: int, offset: int, buf, **kw) -> ChunkIO:
        """The I/O of all of ``buf`` at ``offset`` of a chunk."""
        view = memoryview(buf).cast("B")
        return cls(chain, inode, index, offset, len(view), view, **kw)


def wait_all(futures) -> None:
    """Wait for every future, then raise the first error among them."""
    futures = list(futures)
    wait(futures)
    for fut in futures:
        fut.result()


def byte_range(size: int, start, end) -> tuple[int, int]:
    """``[start, end)`` of a file of ``size`` bytes as offsets within it.

    None stands for the file's start or end, a negative offset counts from
    the end, and the range is cut to the file (an empty one when reversed).
    """
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start = max(0, size + start)
    if end < 0:
        end = max(0, size + end)
    return min(start, size), max(min(end, size), min(start, size))


def read_ios(h: OpenHandle, start: int, view: memoryview) -> list[ChunkIO]:
    """The chunk reads filling ``view`` with the file bytes at ``start``.

    Each one's ``need`` is how many of its bytes the file says are on storage
    (below its size, outside its holes: :mod:`emberfs.common.extents`).
    """
    holes = h.holes
    out = []
    for s in chunk_spans(start, len(view), h.chunk_size):
        lo = s.file_offset - start
        end = s.file_offset + s.length
        need = extents.data_end(holes, h.size, s.file_offset, end) - s.file_offset
        out.append(
            ChunkIO(
                chunk_chain(h.chains, s.index),
                h.inode,
                s.index,
                s.chunk_offset,
                s.length,
                view[lo : lo + s.length],
                need,
            )
        )
    return out


def write_io(h: OpenHandle, offset: int, data) -> ChunkIO:
    """The chunk write of ``data`` at file ``offset`` (within one chunk)."""
    index, inner = divmod(offset, h.chunk_size)
    return ChunkIO.over(
        chunk_chain(h.chains, index), h.inode, index, inner, data, chunk_size=h.chunk_size
    )


def write_ios(h: OpenHandle, view: memoryview) -> list[ChunkIO]:
    """The chunk writes of a whole file's bytes ``view``, from offset 0."""
    return [
        write_io(h, s.file_offset, view[s.file_offset : s.file_offset + s.length])
        for s in chunk_spans(0, len(view), h.chunk_size)
    ]


def explain_lost(meta: MetaClient, h: OpenHandle, lost: OSError) -> OSError:
    """The error of a read that found chunk data gone from every replica.

    ESTALE when the file was removed, or changed (rewritten, truncated) since
    it was opened: its old chunks went with that. Otherwise the data is lost:
    EIO naming the file and the chunk.
    """
    try:
        now = meta.stat_inode(h.inode, h.path)
    except FileNotFoundError:
        return OSError(errno.ESTALE, f"{h.path} was removed while it was open", h.path)
    except OSError:
        now = None
    if now is not None and (now.size, now.mtime_ns) != (h.attr.size, h.attr.mtime_ns):
        return OSError(errno.ESTALE, f"{h.path} changed while it was open", h.path)
    return OSError(errno.EIO, f"{h.path}: {lost.strerror}", h.path)
