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

Block buffers that were read come back to a :class:`BlockPool` through the
cache's ``release`` callback, so a long sequential read keeps reusing a few
buffers whose pages are already mapped instead of faulting in fresh memory
for every block.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, wait

from fsspec.caching import BaseCache, register_cache

# submit(start, end) -> Future of a buffer holding the file bytes [start, end)
BlockSubmitter = Callable[[int, int], Future]
# submit_into(start, view) -> futures that fill view with the bytes at start..
IntoSubmitter = Callable[[int, memoryview], list[Future]]


class BlockPool:
    """Spare block buffers, reused by size, at most ``max_bytes`` of them kept.

    Parameters
    ----------
    max_bytes : int
        Total size of the buffers kept for reuse; beyond it released buffers
        are left to the garbage collector.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self._free: dict[int, list[bytearray]] = {}
        self._kept = 0
        self._lock = threading.Lock()

    def get(self, n: int) -> bytearray:
        """A bytearray of ``n`` bytes (old content: the caller overwrites all of it)."""
        with self._lock:
            free = self._free.get(n)
            if free:
                self._kept -= n
                return free.pop()
        return bytearray(n)

    def put(self, buf) -> None:
        """Give back a buffer nobody reads or writes any more."""
        if not isinstance(buf, bytearray):
            return
        n = len(buf)
        with self._lock:
            if n and self._kept + n <= self.max_bytes:
                self._free.setdefault(n, []).append(buf)
                self._kept += n

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._kept = 0


class ReadaheadCache(BaseCache):
    """Adaptive readahead over fixed blocks, fed by asynchronous fetchers.

    Parameters
    ----------
    blocksize : int
        Readahead unit in bytes (the file's chunk size by default).
    fetcher : callable
        ``fetcher(start, end) -> bytes``, used for random reads.
    size : int
        File size.
    submit : callable or None
        ``submit(start, end) -> Future`` of a buffer; without it reads are
        synchronous and nothing is read ahead.
    submit_into : callable or None
        ``submit_into(start, view) -> list[Future]`` filling ``view``; used by
        :meth:`readinto` for ranges not in flight.
    depth : int, default 8
        Most blocks fetched ahead of the reader.
    release : callable or None
        ``release(buffer)`` takes back the buffer of a block once the cache
        is done with it (see :class:`BlockPool`).
    """

    name = "emberfs"

    def __init__(
        self,
        blocksize: int,
        fetcher,
        size: int,
        *,
        submit: BlockSubmitter | None = None,
        submit_into: IntoSubmitter | None = None,
        depth: int = 8,
        release: Callable[[object], None] | None = None,
    ) -> None:
        super().__init__(max(1, blocksize), fetcher, size)
        self.release = release
        self.submit = submit
        self.submit_into = submit_into
        self.depth = max(0, depth) if submit is not None else 0
        self._blocks: dict[int, Future] = {}
        self._last_start = -1
        self._last_end = -1
        self._streak = 0

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

    def _prefetch(self, first: int, last: int) -> None:
        """Make sure blocks first..last are in flight (within the file)."""
        last = min(last, (self.size - 1) // self.blocksize)
        for b in range(first, last + 1):
            if b not in self._blocks:
                self._blocks[b] = self.submit(*self._block_range(b))

    def _forget(self, fut: Future) -> None:
        """Cancel a block's fetch, or hand its finished buffer to ``release``."""
        if fut.cancel() or self.release is None or not fut.done():
            return
        if fut.exception() is None:
            self.release(fut.result())

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
        if sequential and self.submit is not None:
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
        if self.submit_into is None:
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
            futures.extend(self.submit_into(pos, out[pos - start : run_end - start]))
            pos = run_end
        if sequential and self.submit is not None:
            self._prefetch(last + 1, last + self._window())
        try:
            for b, lo, hi in copies:
                data = memoryview(self._block(b))
                b_start = b * bs
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
