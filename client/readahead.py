"""The read cache of ``EmberFile``: an adaptive readahead pipeline.

:class:`ReadaheadCache` is an fsspec cache (registered under the name
``"emberfs"``) that tells sequential from random access:

* random reads (a Parquet footer, a column chunk) fetch exactly the asked
  range and nothing more;
* once reads move forward from where the last one ended, whole blocks (the
  file's chunks) are fetched ahead of the reader, in parallel on a thread
  pool; the window doubles with every sequential read up to ``depth`` blocks;
* :meth:`ReadaheadCache.readinto` fetches the blocks not already in flight
  straight into the caller's buffer.

The cache reads through a :class:`BlockReader` bound to one open file
(:class:`~emberfs.client.chunkio.HandleReader`). Block buffers that were read
go back to it (:meth:`BlockReader.release`), so a long sequential read keeps
reusing a few buffers whose pages are already mapped
(:class:`~emberfs.client.buffers.BlockPool`) instead of faulting in fresh
memory for every block.

A ``readinto`` stream of reads of at least a block each reads ahead without
buffers where the reader can send a read ahead (:meth:`BlockReader.start_block`):
the request for a coming block is sent at once and its answer waits in the
connection's socket buffers until the ``readinto`` call that wants the block
receives it straight into the caller's buffer (:class:`_SentBlock`). The data
then crosses memory once, as in a plain socket read, instead of landing in a
block buffer and being copied again.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait
from typing import Protocol

from fsspec.caching import BaseCache, register_cache


class BlockReader(Protocol):
    """What the cache reads a file through."""

    def submit_into(self, start: int, view: memoryview) -> list[Future]:
        """Futures that fill ``view`` with the file bytes at ``start``."""

    def submit_block(self, start: int, end: int) -> Future:
        """A future of a buffer holding the file bytes [start, end)."""

    def start_block(self, start: int, end: int):
        """The read of [start, end) sent and left unreceived, or None.

        What it returns has ``finish_into(view) -> bool`` (False: fetch the
        block instead) and ``cancel()``.
        """

    def release(self, buf) -> None:
        """Take back the buffer of a block the cache is done with."""


class _SentBlock:
    """A block whose read request is sent; its answer waits in a socket.

    It stands in the cache's block table beside the futures of fetched
    blocks and answers the same questions (``result``, ``cancel``, ``done``,
    ``exception``); :meth:`into` receives it straight into a caller's buffer.
    A sent read that fails (a refusal, a hole, a dead replica, a checksum)
    falls back to the usual parallel fetch, which retries other replicas.
    """

    __slots__ = ("pending", "start", "end", "_reader", "_buf")

    def __init__(self, pending, start: int, end: int, reader: BlockReader) -> None:
        self.pending = pending
        self.start = start
        self.end = end
        self._reader = reader
        self._buf: bytearray | None = None

    @property
    def unused(self) -> bool:
        return self.pending is not None

    def into(self, view: memoryview) -> None:
        """Fill ``view`` (the whole block) with the block's bytes."""
        pending, self.pending = self.pending, None
        if pending is not None and pending.finish_into(view):
            return
        futures = self._reader.submit_into(self.start, view)
        wait(futures)
        for fut in futures:
            fut.result()

    def result(self) -> bytearray:
        """The block's bytes in a buffer of its own (received on first use)."""
        if self._buf is None:
            buf = bytearray(self.end - self.start)
            self.into(memoryview(buf))
            self._buf = buf
        return self._buf

    def cancel(self) -> bool:
        """Drop the answer unless it was received into a buffer (then False)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.cancel()
        return self._buf is None

    def done(self) -> bool:
        return self._buf is not None

    def exception(self) -> None:
        return None


class ReadaheadCache(BaseCache):
    """Adaptive readahead over fixed blocks, fed by an asynchronous reader.

    Parameters
    ----------
    blocksize : int
        Readahead unit in bytes (the file's chunk size by default).
    fetcher : callable
        ``fetcher(start, end) -> bytes``, used for random reads.
    size : int
        File size.
    reader : BlockReader or None
        Fetches blocks ahead (``submit_block``), fills ranges not in flight
        straight into the caller's buffer for :meth:`readinto`
        (``submit_into``), sends the reads of coming blocks for ``readinto``
        streams (``start_block``) and takes back the buffers of blocks the
        cache is done with (``release``). Without it reads are synchronous
        through ``fetcher`` and nothing is read ahead.
    depth : int, default 8
        Most blocks fetched ahead of the reader.
    """

    name = "emberfs"

    def __init__(
        self,
        blocksize: int,
        fetcher,
        size: int,
        *,
        reader: BlockReader | None = None,
        depth: int = 8,
    ) -> None:
        super().__init__(max(1, blocksize), fetcher, size)
        self.reader = reader
        self.depth = max(0, depth) if reader is not None else 0
        self._blocks: dict[int, Future] = {}
        self._last_start = -1
        self._last_end = -1
        self._streak = 0

    @property
    def held(self) -> int:
        """Blocks fetched or being fetched, not yet read or dropped."""
        return len(self._blocks)

    # access pattern ------------------------------------------------------------
    def _observe(self, start: int, stop: int) -> bool:
        """Record a read of [start, stop); True when it continues a sequential scan."""
        sequential = self._last_start <= start <= self._last_end and self._last_end >= 0
        if sequential:
            self._streak += 1
        else:
            self._streak = 0
            self.drop()
        self._last_start, self._last_end = start, stop
        return sequential

    def _window(self) -> int:
        if self._streak <= 0 or self.depth <= 0:
            return 0
        return min(self.depth, 1 << min(self._streak - 1, 16))

    def _block_range(self, b: int) -> tuple[int, int]:
        start = b * self.blocksize
        return start, min(self.size, start + self.blocksize)

    def _prefetch(self, first: int, last: int, sent: bool = False) -> None:
        """Make sure blocks first..last are in flight (within the file).

        ``sent``: send the reads and leave their answers in the sockets
        (:class:`_SentBlock`) where the reader can.
        """
        last = min(last, (self.size - 1) // self.blocksize)
        for b in range(first, last + 1):
            if b in self._blocks:
                continue
            lo, hi = self._block_range(b)
            pending = self.reader.start_block(lo, hi) if sent else None
            if pending is not None:
                self._blocks[b] = _SentBlock(pending, lo, hi, self.reader)
            else:
                self._blocks[b] = self.reader.submit_block(lo, hi)

    def _forget(self, fut: Future) -> None:
        """Cancel a block's fetch, or give its finished buffer back to the reader."""
        if fut.cancel() or not fut.done():
            return
        if fut.exception() is None:
            self.reader.release(fut.result())

    def _trim(self, first: int) -> None:
        for b in [b for b in self._blocks if b < first]:
            self._forget(self._blocks.pop(b))

    def _block(self, b: int):
        fut = self._blocks[b]
        try:
            return fut.result()
        except BaseException:
            self._blocks.pop(b, None)
            raise

    def drop(self) -> None:
        """Forget every block (cancelling those not started)."""
        for fut in self._blocks.values():
            self._forget(fut)
        self._blocks.clear()

    def close(self) -> None:
        self.drop()

    # fsspec cache interface -----------------------------------------------------------
    def _fetch(self, start: int | None, stop: int | None) -> bytes:
        start = 0 if start is None else start
        stop = self.size if stop is None else min(stop, self.size)
        if start >= self.size or start >= stop:
            return b""
        sequential = self._observe(start, stop)
        bs = self.blocksize
        first, last = start // bs, (stop - 1) // bs
        cached = all(b in self._blocks for b in range(first, last + 1))
        if not sequential and not cached:
            self.miss_count += 1
            self.total_requested_bytes += stop - start
            return bytes(self.fetcher(start, stop))
        if sequential and self.reader is not None:
            self._prefetch(first, last + self._window())
        elif not cached:
            self.miss_count += 1
            self.total_requested_bytes += stop - start
            return bytes(self.fetcher(start, stop))
        self.hit_count += 1
        parts = []
        for b in range(first, last + 1):
            data = self._block(b)
            b_start = b * bs
            lo = max(start, b_start) - b_start
            hi = min(stop, b_start + bs) - b_start
            parts.append(memoryview(data)[lo:hi])
        self._trim(first)
        return b"".join(parts)

    def readinto(self, start: int, out: memoryview) -> int:
        """Read the bytes at ``start`` into ``out``; returns how many (short at EOF)."""
        out = memoryview(out).cast("B")
        stop = min(self.size, start + len(out))
        if start >= stop:
            return 0
        n = stop - start
        if self.reader is None:
            data = self._fetch(start, stop)
            out[: len(data)] = data
            return len(data)
        sequential = self._observe(start, stop)
        bs = self.blocksize
        first, last = start // bs, (stop - 1) // bs
        futures: list[Future] = []
        copies = []
        pos = start
        while pos < stop:
            b = pos // bs
            b_end = min(stop, (b + 1) * bs)
            if b in self._blocks:
                copies.append((b, pos, b_end))
                pos = b_end
                continue
            # a run of blocks not in flight: fetch straight into the caller's buffer
            run_end = b_end
            while run_end < stop and (run_end // bs) not in self._blocks:
                run_end = min(stop, (run_end // bs + 1) * bs)
            futures.extend(self.reader.submit_into(pos, out[pos - start : run_end - start]))
            pos = run_end
        if sequential and self.reader is not None:
            # Reads of a block or more take each coming block whole, straight from
            # its socket; smaller reads take pieces of it from a pooled buffer.
            self._prefetch(last + 1, last + self._window(), sent=n >= bs)
        try:
            for b, lo, hi in copies:
                blk = self._blocks[b]
                b_start = b * bs
                if isinstance(blk, _SentBlock) and blk.unused and (lo, hi) == (blk.start, blk.end):
                    # the whole block is wanted: receive it where it goes
                    del self._blocks[b]
                    blk.into(out[lo - start : hi - start])
                    continue
                data = memoryview(self._block(b))
                out[lo - start : hi - start] = data[lo - b_start : hi - b_start]
        finally:
            # never return (or raise) while a fetch may still write into ``out``
            wait(futures)
        for fut in futures:
            fut.result()
        self._trim(last if sequential else first)
        self.hit_count += bool(copies)
        self.miss_count += bool(futures)
        self.total_requested_bytes += n
        return n


register_cache(ReadaheadCache, clobber=True)


class _Shared:
    """A block of :class:`SharedReadahead`: its fetch, the reads copying out of it, and how
    many of its bytes they took."""

    __slots__ = ("fut", "users", "dropped", "served", "length")

    def __init__(self, fut: Future, length: int) -> None:
        self.fut = fut
        self.users = 0
        self.dropped = False
        self.served = 0
        self.length = length


class SharedReadahead:
    """Readahead of one open file for reads that arrive from several threads at once.

    A FUSE mount's kernel sends the reads of one sequential reader from
    several threads: its readahead window (``window`` bytes) is split into
    requests that arrive slightly out of order and overlap in time;
    :class:`ReadaheadCache` expects one caller. Here a read counts as
    sequential when it starts within the kernel's window around the furthest
    byte read so far. A sequential read takes the blocks it touches whole
    (fetched once, shared by every read that wants a piece of them) and has
    the blocks after it fetched ahead, the window doubling with every
    sequential read up to ``depth`` blocks. A block is given back to the
    reader once reads took all its bytes (or it fell far behind), and only
    when no read is still copying out of it. A read elsewhere (a seek) forgets
    the blocks and is fetched straight into the caller's buffer.

    Parameters
    ----------
    reader : BlockReader
    blocksize : int
        The file's chunk size.
    size : int
        The file's size (reads stop there); :meth:`resize` changes it.
    depth : int
        Most blocks fetched ahead.
    window : int
        The kernel's readahead window in bytes: how far apart the reads of
        one sequential reader may arrive.
    """

    def __init__(
        self, reader: BlockReader, blocksize: int, size: int, depth: int = 8, window: int = 0
    ) -> None:
        self.reader = reader
        self.blocksize = max(1, blocksize)
        self.size = size
        self.depth = max(0, depth)
        # how far from the stream's front a read of it may land: the kernel has up to two
        # windows in flight (the next one starts before the last has arrived)
        self.span = max(2 * window, 2 * self.blocksize)
        self._lock = threading.Lock()
        self._blocks: dict[int, _Shared] = {}
        self._done: set[int] = set()  # blocks whose every byte was read (not fetched again)
        self._front = -1  # end of the furthest read of the stream
        self._seek = -1  # end of the last read away from it
        self._streak = 0

    def held(self) -> list[tuple[int, int]]:
        """``(bytes read, length)`` of each block fetched or being fetched, not yet dropped."""
        with self._lock:
            return [(b.served, b.length) for b in self._blocks.values()]

    def resize(self, size: int) -> None:
        """The file's size changed (a write or truncation): forget every block."""
        with self._lock:
            self.size = size
            self._drop_all()

    def close(self) -> None:
        with self._lock:
            self._drop_all()

    def _drop(self, b: int) -> None:
        blk = self._blocks.pop(b)
        blk.dropped = True
        if blk.users == 0:
            self._forget(blk.fut)

    def _drop_all(self) -> None:
        for b in list(self._blocks):
            self._drop(b)
        self._done.clear()

    def _forget(self, fut: Future) -> None:
        if fut.cancel() or not fut.done():
            if not fut.cancelled():  # running: give its buffer back once it is done
                fut.add_done_callback(self._forget)
            return
        if fut.exception() is None:
            self.reader.release(fut.result())

    def _near(self, front: int, start: int) -> bool:
        return front >= 0 and front - self.span <= start <= front + self.span

    def _fetch(self, b: int) -> _Shared:
        lo = b * self.blocksize
        hi = min(self.size, lo + self.blocksize)
        blk = self._blocks[b] = _Shared(self.reader.submit_block(lo, hi), hi - lo)
        return blk

    def readinto(self, start: int, out: memoryview) -> int:
        """Read the bytes at ``start`` into ``out``; returns how many (short at the end)."""
        out = memoryview(out).cast("B")
        bs = self.blocksize
        with self._lock:
            stop = min(self.size, start + len(out))
            if start >= stop:
                return 0
            first, last = start // bs, (stop - 1) // bs
            near = self._near(self._front, start)
            if not near and self._near(self._seek, start):
                # reads go on from where an earlier one jumped to: that is the stream now.
                # Nothing is dropped: two reads that arrived late look the same, and the
                # blocks of the stream they lag behind are still wanted.
                self._front, self._seek, self._streak, near = self._seek, -1, 0, True
            if near:
                self._streak += 1
                self._front = max(self._front, stop)
            else:  # a jump, or a read that ran far ahead of the others: read just it
                self._seek = stop
            shared = {}
            for b in range(first, last + 1):
                blk = self._blocks.get(b)
                if blk is None and near:
                    blk = self._fetch(b)
                if blk is not None:
                    blk.users += 1
                    shared[b] = blk
            window = min(self.depth, 1 << min(self._streak - 1, 16)) if self._streak else 0
            last_block = (self.size - 1) // bs
            for b in range(last + 1, min(last + window, last_block) + 1):
                if b not in self._blocks and b not in self._done:
                    self._fetch(b)
            behind = (self._front - self.span) // bs
            for b in [b for b in self._blocks if b < behind]:
                self._drop(b)
            self._done = {b for b in self._done if b >= behind}
        n = stop - start
        futures: list[Future] = []
        try:
            pos = start
            while pos < stop:
                b = pos // bs
                b_end = min(stop, (b + 1) * bs)
                if b in shared:
                    pos = b_end
                    continue
                run_end = b_end
                while run_end < stop and (run_end // bs) not in shared:
                    run_end = min(stop, (run_end // bs + 1) * bs)
                futures.extend(self.reader.submit_into(pos, out[pos - start : run_end - start]))
                pos = run_end
            for b, blk in shared.items():
                lo, hi = max(start, b * bs), min(stop, (b + 1) * bs)
                data = memoryview(blk.fut.result())
                out[lo - start : hi - start] = data[lo - b * bs : hi - b * bs]
                blk.served += hi - lo
        finally:
            wait(futures)  # never return while a fetch may still write into ``out``
            with self._lock:
                for b, blk in shared.items():
                    blk.users -= 1
                    if blk.dropped:
                        if blk.users == 0:
                            self._forget(blk.fut)
                    elif blk.fut.done() and blk.fut.exception() is not None:
                        self._drop(b)  # a failed block is fetched again next time
                    elif blk.served >= blk.length and self._blocks.get(b) is blk:
                        self._drop(b)  # every byte of it was read
                        self._done.add(b)
        for fut in futures:
            fut.result()
        return n
