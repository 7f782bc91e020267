"""Chunk I/O of open files: byte ranges planned as chunk reads and writes, run in parallel.

A file's bytes live in chunks of its layout's chunk size, chunk ``i`` on chain
``chains[i % stripe]`` (:mod:`emberfs.common.layout`). :class:`ChunkIO` turns
a byte range of an :class:`~emberfs.client.handles.OpenHandle` into one read
or write per chunk and runs them on the thread pool of the calling process's
runtime, each straight into (or out of) its piece of one buffer:

* :meth:`~ChunkIO.submit_into` fills a view, every chunk in parallel;
* :meth:`~ChunkIO.submit_block` fetches a readahead block into a pooled
  buffer (:class:`~emberfs.client.buffers.BlockPool`), which
  :meth:`~ChunkIO.release_block` takes back;
* :meth:`~ChunkIO.start_block` sends a block's read now and leaves its answer
  in the socket (:mod:`emberfs.client.lanes`);
* :meth:`~ChunkIO.submit_write` writes a piece of one chunk through its chain, and
  :class:`ChunkWrites` keeps an open file's writes in flight, bounded and in order;
* :meth:`~ChunkIO.read_range` and :meth:`~ChunkIO.start_reads` read ranges of
  one file or of many into result buffers
  (:class:`~emberfs.client.buffers.ResultBuffer`).

:class:`HandleReader` is the same for one handle, as the readahead cache
(:mod:`emberfs.client.readahead`) asks for blocks.
"""

from __future__ import annotations

import errno
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING

from emberfs.client.buffers import ResultBuffer, as_bytes, result_buffer
from emberfs.client.datapath import ChunkLost, ChunkWrite
from emberfs.client.handles import OpenHandle
from emberfs.client.meta import MetaClient
from emberfs.common import extents
from emberfs.common.layout import chunk_chain, chunk_spans

if TYPE_CHECKING:
    from emberfs.client.lanes import PendingRead
    from emberfs.client.runtime import ProcessRuntime, Runtime


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


def chunk_reads(h: OpenHandle, start: int, view: memoryview) -> Iterator[tuple]:
    """``read_chunk`` arguments filling ``view`` with the file bytes at ``start``, per chunk.

    The last one of each is how many of the chunk's bytes the file says are on
    storage (below its size, outside its holes: :mod:`emberfs.common.extents`).
    """
    holes = h.holes
    for s in chunk_spans(start, len(view), h.chunk_size):
        lo = s.file_offset - start
        piece = view[lo : lo + s.length]
        end = s.file_offset + s.length
        need = extents.data_end(holes, h.size, s.file_offset, end) - s.file_offset
        yield chunk_chain(h.chains, s.index), h.inode, s.index, s.chunk_offset, piece, need


def explain_lost(meta: MetaClient, h: OpenHandle, lost: ChunkLost) -> OSError:
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


class ChunkIO:
    """Chunk reads and writes of open files, on the runtime of the calling process.

    Every call takes the runtime of the process it runs in, so one instance
    serves a filesystem before and after a fork.

    Parameters
    ----------
    runtime : ProcessRuntime
        Gives the data client, thread pool and block pool of this process.
    """

    def __init__(self, runtime: ProcessRuntime) -> None:
        self._runtime = runtime

    def reader(self, h: OpenHandle) -> HandleReader:
        """The reads of ``h`` for its readahead cache."""
        return HandleReader(self, h)

    def submit_into(self, h: OpenHandle, start: int, view: memoryview) -> list[Future]:
        """Start parallel chunk reads filling ``view`` with the file bytes at ``start``."""
        rt = self._runtime.get()
        return [rt.executor.submit(self._read, rt, h, r) for r in chunk_reads(h, start, view)]

    @staticmethod
    def _read(rt: Runtime, h: OpenHandle, args: tuple) -> None:
        """One ``read_chunk`` of ``h``; data gone from every replica raises ESTALE or EIO."""
        try:
            rt.data.read_chunk(*args)
        except ChunkLost as lost:
            raise explain_lost(rt.meta, h, lost) from None

    def submit_block(self, h: OpenHandle, start: int, end: int) -> Future:
        """A future of a bytearray with the file bytes [start, end) (one task).

        The buffer comes from the runtime's :class:`~emberfs.client.buffers.BlockPool`;
        :meth:`release_block` gives it back.
        """
        rt = self._runtime.get()

        def fetch() -> bytearray:
            buf = rt.blocks.get(end - start)
            for r in chunk_reads(h, start, memoryview(buf)):
                self._read(rt, h, r)
            return buf

        return rt.executor.submit(fetch)

    def start_block(self, h: OpenHandle, start: int, end: int) -> PendingRead | None:
        """Send the read of file bytes [start, end) now (one chunk); see ``DataClient.start_read``.

        None when the range spans chunks or no replica has a free connection.
        """
        spans = chunk_spans(start, end - start, h.chunk_size)
        if len(spans) != 1:
            return None
        s = spans[0]
        rt = self._runtime.get()
        return rt.data.start_read(
            chunk_chain(h.chains, s.index), h.inode, s.index, s.chunk_offset, s.length
        )

    def release_block(self, buf) -> None:
        """Take back a block buffer of :meth:`submit_block` that nobody uses any more."""
        rt = self._runtime.current()
        if rt is not None:
            rt.blocks.put(buf)

    def submit_write(self, h: OpenHandle, offset: int, data) -> Future:
        """Start a write of ``data`` at file ``offset`` (within one chunk)."""
        rt = self._runtime.get()
        index, inner = divmod(offset, h.chunk_size)
        return rt.executor.submit(
            rt.data.write_chunk,
            chunk_chain(h.chains, index),
            h.inode,
            index,
            inner,
            data,
            h.chunk_size,
        )

    def submit_files(self, files: list[tuple[OpenHandle, memoryview]]) -> list[list[Future]]:
        """Start writing whole files (``(handle, bytes)``, from offset 0): each file's futures.

        The chunks of the files that go to one chain travel in write batches
        (:meth:`DataPath.write_chunks <emberfs.client.datapath.DataPath.write_chunks>`)
        of at most :data:`BATCH_WRITES` chunks and :data:`BATCH_BYTES` bytes, the
        batches of every chain in parallel on the runtime's executor; a future
        per chunk tells that chunk's outcome.
        """
        rt = self._runtime.get()
        out: list[list[Future]] = []
        by_chain: dict[int, list[tuple[Future, ChunkWrite]]] = {}
        for h, view in files:
            futures = []
            for s in chunk_spans(0, len(view), h.chunk_size):
                fut: Future = Future()
                piece = view[s.file_offset : s.file_offset + s.length]
                write = ChunkWrite(h.inode, s.index, s.chunk_offset, piece, h.chunk_size)
                by_chain.setdefault(chunk_chain(h.chains, s.index), []).append((fut, write))
                futures.append(fut)
            out.append(futures)
        for chain_id, pending in by_chain.items():
            batch: list[tuple[Future, ChunkWrite]] = []
            size = 0
            for item in pending:
                n = len(item[1].data)
                if batch and (len(batch) >= BATCH_WRITES or size + n > BATCH_BYTES):
                    rt.executor.submit(_write_batch, rt, chain_id, batch)
                    batch, size = [], 0
                batch.append(item)
                size += n
            rt.executor.submit(_write_batch, rt, chain_id, batch)
        return out

    def read_range(self, h: OpenHandle, start, end) -> bytes:
        """The file bytes [start, end) (as :func:`byte_range` takes them), all chunks at once."""
        start, end = byte_range(h.size, start, end)
        if end <= start:
            return b""
        buf, view = result_buffer(end - start)
        wait_all(self.submit_into(h, start, view))
        return as_bytes(buf)

    def start_reads(
        self, handles: list, starts, ends
    ) -> list[tuple[OSError | None, ResultBuffer | None, list[Future]]]:
        """Start reading a range of each handle: ``(error, buffer, futures)`` per handle.

        A handle that is an error (its open failed) gives ``(error, None, [])``;
        the others a :class:`~emberfs.client.buffers.ResultBuffer` that their
        futures fill.
        """
        jobs = []
        for h, s, e in zip(handles, starts, ends, strict=True):
            if isinstance(h, OSError):
                jobs.append((h, None, []))
                continue
            lo, hi = byte_range(h.size, s, e)
            buf, view = result_buffer(hi - lo)
            jobs.append((None, buf, self.submit_into(h, lo, view) if hi > lo else []))
        return jobs


#: most chunks, and bytes, of one write batch of :meth:`ChunkIO.submit_files`
BATCH_WRITES = 32
BATCH_BYTES = 8 * 1024 * 1024


def _write_batch(rt: Runtime, chain_id: int, batch: list[tuple[Future, ChunkWrite]]) -> None:
    """Write a batch of :meth:`ChunkIO.submit_files` and settle each chunk's future."""
    try:
        results = rt.data.write_chunks(chain_id, [w for _, w in batch])
    except BaseException as exc:
        results = [exc] * len(batch)
    for (fut, _), result in zip(batch, results, strict=True):
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)


class HandleReader:
    """The reads of one open file, as :class:`~emberfs.client.readahead.ReadaheadCache` asks.

    Parameters
    ----------
    chunk_io : ChunkIO
    handle : OpenHandle
    """

    __slots__ = ("chunk_io", "handle")

    def __init__(self, chunk_io: ChunkIO, handle: OpenHandle) -> None:
        self.chunk_io = chunk_io
        self.handle = handle

    def submit_into(self, start: int, view: memoryview) -> list[Future]:
        """Futures that fill ``view`` with the file bytes at ``start``."""
        return self.chunk_io.submit_into(self.handle, start, view)

    def submit_block(self, start: int, end: int) -> Future:
        """A future of a pooled buffer holding the file bytes [start, end)."""
        return self.chunk_io.submit_block(self.handle, start, end)

    def start_block(self, start: int, end: int) -> PendingRead | None:
        """The block [start, end) sent and left unreceived, or None (then fetch it)."""
        return self.chunk_io.start_block(self.handle, start, end)

    def release(self, buf) -> None:
        """Take back the buffer of a block the cache is done with."""
        self.chunk_io.release_block(buf)


class ChunkWrites:
    """The chunk writes of one open file in flight, as a writer sends them.

    At most ``depth`` are in flight, and writes to one chunk stay in the order
    they were sent (a write waits for the earlier ones to its chunk). The first
    failure (with ``path`` as the error's file name) is kept as :attr:`failed`
    and raised by every later :meth:`send`.

    Parameters
    ----------
    chunk_io : ChunkIO
    handle : OpenHandle
    depth : int
    path : str
    """

    def __init__(self, chunk_io: ChunkIO, handle: OpenHandle, depth: int, path: str) -> None:
        self._io = chunk_io
        self._handle = handle
        self._depth = max(1, depth)
        self._path = path
        self._inflight: deque[tuple[int, Future]] = deque()
        self.failed: BaseException | None = None

    def __bool__(self) -> bool:
        """True while writes are in flight."""
        return bool(self._inflight)

    def send(self, offset: int, data) -> None:
        """Start a write of ``data`` at file ``offset`` (within one chunk)."""
        if self.failed is not None:
            raise self.failed
        index = offset // self._handle.chunk_size
        while self._inflight and (
            len(self._inflight) >= self._depth or any(i == index for i, _ in self._inflight)
        ):
            self._reap(self._inflight.popleft()[1])
        self._inflight.append((index, self._io.submit_write(self._handle, offset, data)))

    def _reap(self, fut: Future) -> None:
        try:
            fut.result()
        except BaseException as exc:
            if isinstance(exc, OSError) and exc.filename is None:
                exc.filename = self._path  # the file whose write failed
            if self.failed is None:
                self.failed = exc
            raise

    def wait_all(self) -> None:
        """Wait until the chains hold every write sent; raises the first that failed."""
        while self._inflight:
            self._reap(self._inflight.popleft()[1])

    def abandon(self) -> None:
        """Wait for the writes in flight without raising (after a failure) and forget them."""
        wait([f for _, f in self._inflight])
        self._inflight.clear()
