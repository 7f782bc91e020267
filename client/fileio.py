"""File I/O: byte ranges of open files run as chunk I/O, in parallel, on the runtime's threads.

:class:`FileIO` plans a byte range of an :class:`~emberfs.client.handles.OpenHandle`
as :class:`~emberfs.client.chunkio.ChunkIO` values (one per chunk) and runs
them on the thread pool of the calling process's runtime, each straight into
(or out of) its piece of one buffer:

* :meth:`~FileIO.submit_into` fills a view, every chunk in parallel;
* :meth:`~FileIO.submit_block` fetches a readahead block into a pooled
  buffer (:class:`~emberfs.client.buffers.BlockPool`), which
  :meth:`~FileIO.release_block` takes back;
* :meth:`~FileIO.start_block` sends a block's read now and leaves its answer
  in the socket (:mod:`emberfs.client.lanes`);
* :meth:`~FileIO.submit_write` writes a piece of one chunk through its chain
  (an open file's writes in flight: :class:`~emberfs.client.writer.ChunkWrites`),
  and :meth:`~FileIO.submit_files` the chunks of many whole files in write
  batches;
* :meth:`~FileIO.read_range` and :meth:`~FileIO.start_reads` read ranges of
  one file or of many into result buffers
  (:class:`~emberfs.client.buffers.ResultBuffer`).

:class:`HandleReader` is the same for one handle, as the readahead caches
(:mod:`emberfs.client.readahead`) ask for blocks.

With a disk cache (:class:`~emberfs.client.diskcache.DiskCache`, the
``cache_dir`` option) every read of a file it may keep goes through it, so
the fsspec files, the batch reads and a FUSE mount share it: a chunk the cache
holds is read from the local disk and never from a storage server; a whole
chunk read from the cluster is handed to the cache to keep once the reader
has it (:meth:`DiskCache.offer <emberfs.client.diskcache.DiskCache.offer>`).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

from emberfs.client.buffers import ResultBuffer, as_bytes, result_buffer
from emberfs.client.chunkio import (
    ChunkIO,
    byte_range,
    explain_lost,
    read_ios,
    wait_all,
    write_io,
    write_ios,
)
from emberfs.client.datapath import ChunkLost
from emberfs.client.handles import OpenHandle
from emberfs.common.layout import chunk_chain, chunk_spans

if TYPE_CHECKING:
    from emberfs.client.diskcache import ChunkKey, DiskCache
    from emberfs.client.lanes import PendingRead
    from emberfs.client.runtime import ProcessRuntime, Runtime

#: most chunks, and bytes, of one write batch of :meth:`FileIO.submit_files`
BATCH_WRITES = 32
BATCH_BYTES = 8 * 1024 * 1024


class FileIO:
    """Chunk reads and writes of open files, on the runtime of the calling process.

    Every call takes the runtime of the process it runs in, so one instance
    serves a client before and after a fork.

    Parameters
    ----------
    runtime : ProcessRuntime
        Gives the data client, thread pool and block pool of this process.
    cache : DiskCache or None
        The local disk cache that reads go through.
    """

    def __init__(self, runtime: ProcessRuntime, cache: DiskCache | None = None) -> None:
        self._runtime = runtime
        self.cache = cache

    def _read_of(self, h: OpenHandle):
        """How a chunk read of ``h`` runs: through the disk cache when it may keep ``h``."""
        cache = self.cache
        if cache is None or cache.key(h.attr, 0, h.session_id) is None:
            return read_chunk

        def cached(rt: Runtime, h: OpenHandle, io: ChunkIO) -> None:
            read_through(cache, rt, h, io)

        return cached

    def reader(self, h: OpenHandle) -> HandleReader:
        """The reads of ``h`` for its readahead cache."""
        return HandleReader(self, h)

    def submit_into(self, h: OpenHandle, start: int, view: memoryview) -> list[Future]:
        """Start parallel chunk reads filling ``view`` with the file bytes at ``start``."""
        rt = self._runtime.get()
        read = self._read_of(h)
        return [rt.executor.submit(read, rt, h, io) for io in read_ios(h, start, view)]

    def submit_block(self, h: OpenHandle, start: int, end: int) -> Future:
        """A future of a buffer with the file bytes [start, end) (one task).

        The buffer comes from the runtime's :class:`~emberfs.client.buffers.BlockPool`,
        or for a whole chunk the disk cache holds, from the cache (read into it
        without a copy); :meth:`release_block` gives it back.
        """
        rt = self._runtime.get()
        read = self._read_of(h)
        cache = self.cache
        key = None
        if cache is not None and h.chunk_size and start % h.chunk_size == 0:
            key = cache.key(h.attr, start // h.chunk_size, h.session_id)
            if key is not None and key.length != end - start:
                key = None  # not one whole chunk

        def fetch():
            if key is not None:
                block = cache.read_block(key)  # a hit lands in a buffer of the cache's own
                if block is not None:
                    return block
                cache.missed(key.length)
            buf = rt.blocks.get(end - start)
            view = memoryview(buf)
            for io in read_ios(h, start, view):
                if key is None:
                    read(rt, h, io)
                else:
                    read_chunk(rt, h, io)
            if key is not None:
                cache.offer(key, view)
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
        io = ChunkIO(chunk_chain(h.chains, s.index), h.inode, s.index, s.chunk_offset, s.length)
        key = None if self.cache is None else self.cache.key(h.attr, s.index, h.session_id)
        if key is not None and self.cache.contains(key):
            return None  # fetched instead, from the cache
        pending = self._runtime.get().data.start_read(io)
        if pending is None or key is None:
            return pending
        self.cache.missed(io.length)
        return FillingRead(pending, self.cache, key) if s.chunk_offset == 0 else pending

    def release_block(self, buf) -> None:
        """Take back a block buffer of :meth:`submit_block` that nobody uses any more."""
        if self.cache is not None and self.cache.release(buf):
            return
        rt = self._runtime.current()
        if rt is not None:
            rt.blocks.put(buf)

    def submit_write(self, h: OpenHandle, offset: int, data) -> Future:
        """Start a write of ``data`` at file ``offset`` (within one chunk)."""
        rt = self._runtime.get()
        return rt.executor.submit(rt.data.write, write_io(h, offset, data))

    def submit_files(self, files: list[tuple[OpenHandle, memoryview]]) -> list[list[Future]]:
        """Start writing whole files (``(handle, bytes)``, from offset 0): each file's futures.

        The chunks of the files that go to one chain travel in write batches
        (``DataClient.write_batch``) of at most :data:`BATCH_WRITES` chunks and
        :data:`BATCH_BYTES` bytes, the batches of every chain in parallel on
        the runtime's executor; a future per chunk tells that chunk's outcome.
        """
        rt = self._runtime.get()
        out: list[list[Future]] = []
        by_chain: dict[int, list[tuple[Future, ChunkIO]]] = {}
        for h, view in files:
            futures = []
            for io in write_ios(h, view):
                fut: Future = Future()
                by_chain.setdefault(io.chain, []).append((fut, io))
                futures.append(fut)
            out.append(futures)
        for pending in by_chain.values():
            batch: list[tuple[Future, ChunkIO]] = []
            size = 0
            for item in pending:
                n = item[1].length
                if batch and (len(batch) >= BATCH_WRITES or size + n > BATCH_BYTES):
                    rt.executor.submit(write_batch, rt, batch)
                    batch, size = [], 0
                batch.append(item)
                size += n
            rt.executor.submit(write_batch, rt, batch)
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


def read_chunk(rt: Runtime, h: OpenHandle, io: ChunkIO) -> None:
    """One chunk read of ``h``; data gone from every replica raises ESTALE or EIO."""
    try:
        rt.data.read(io)
    except ChunkLost as lost:
        raise explain_lost(rt.meta, h, lost) from None


def read_through(cache: DiskCache, rt: Runtime, h: OpenHandle, io: ChunkIO) -> None:
    """A chunk read of ``h`` from ``cache``, or from the cluster and then kept in ``cache``."""
    key = cache.key(h.attr, io.index, h.session_id)
    if key is None:
        read_chunk(rt, h, io)
        return
    if cache.read_into(key, io.offset, io.buf):
        return
    cache.missed(io.length)
    read_chunk(rt, h, io)
    if io.offset == 0 and io.length >= key.length:
        cache.offer(key, io.buf[: key.length])


class FillingRead:
    """A read sent ahead (:class:`~emberfs.client.lanes.PendingRead`) of a whole chunk whose
    bytes the disk cache keeps once they are received."""

    __slots__ = ("pending", "cache", "key")

    def __init__(self, pending: PendingRead, cache: DiskCache, key: ChunkKey) -> None:
        self.pending = pending
        self.cache = cache
        self.key = key

    def finish_into(self, out: memoryview) -> bool:
        """Receive the chunk into ``out`` (see ``PendingRead.finish_into``), then offer it."""
        if not self.pending.finish_into(out):
            return False
        if len(out) >= self.key.length:
            # the block CRCs the bytes came with (and were checked against) go along
            self.cache.offer(self.key, out[: self.key.length], crcs=self.pending.crcs)
        return True

    def cancel(self) -> None:
        self.pending.cancel()


def write_batch(rt: Runtime, batch: list[tuple[Future, ChunkIO]]) -> None:
    """Write a batch of :meth:`FileIO.submit_files` (one chain) and settle each chunk's future."""
    try:
        results = rt.data.write_batch([io for _, io in batch])
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
    files : FileIO
    handle : OpenHandle
    """

    __slots__ = ("files", "handle")

    def __init__(self, files: FileIO, handle: OpenHandle) -> None:
        self.files = files
        self.handle = handle

    def submit_into(self, start: int, view: memoryview) -> list[Future]:
        """Futures that fill ``view`` with the file bytes at ``start``."""
        return self.files.submit_into(self.handle, start, view)

    def submit_block(self, start: int, end: int) -> Future:
        """A future of a pooled buffer holding the file bytes [start, end)."""
        return self.files.submit_block(self.handle, start, end)

    def start_block(self, start: int, end: int) -> PendingRead | None:
        """The block [start, end) sent and left unreceived, or None (then fetch it)."""
        return self.files.start_block(self.handle, start, end)

    def release(self, buf) -> None:
        """Take back the buffer of a block the cache is done with."""
        self.files.release_block(buf)
