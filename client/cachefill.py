"""Filling a disk cache without holding up the reads: chunks just read, written in the background.

:class:`FillQueue` takes a copy of each whole chunk a read fetched from the
cluster (:meth:`FillQueue.offer`) and up to :data:`WRITERS` background threads
per process write them into the cache (:meth:`emberfs.client.diskcache.DiskCache.store`).
The reader never waits: when the bytes waiting pass the queue's limit, when
the cache's file system is nearly full, or for a few seconds after a fill
failed, a chunk is not kept (``fill_skips``) and the next epoch reads it from
the cluster again. The buffers of written fills are reused (the cache's
:class:`~emberfs.client.cacheentry.AlignedPool`), so a long first epoch keeps
copying into memory the process already has.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable

from emberfs.client.cachestate import PerProcess

FILL_BUFFER = 64 * 1024 * 1024  # bytes of fills waiting for the background writer, at most
PAUSE_AFTER_ERROR = 5.0  # seconds fills stop after one failed
RESERVE = 256 * 1024 * 1024  # free bytes fills leave on the cache's file system (or 1 % of it)
ROOM_CHECK_EVERY = 1.0  # seconds between looks at the file system's free space
WRITERS = 4  # threads writing one process's fills: a disk takes direct writes best in parallel


class _Queue:
    """One process's fills: waiting, being written, and the buffers to reuse."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: deque = deque()
        self.queued = 0  # bytes waiting or being written
        self.writing = 0  # fills being written
        self.threads: list[threading.Thread] = []
        self.paused_until = 0.0
        self.room_checked = -ROOM_CHECK_EVERY
        self.room = True


class FillQueue:
    """Whole chunks waiting to be written into a cache by background threads.

    Parameters
    ----------
    store : callable
        ``store(key, buffer, crcs) -> bool`` writes one entry (in a background thread).
    count : callable
        ``count(**counts)`` counts skipped fills (``fill_skips=1``).
    directory : str
        The cache's directory, whose file system's free space is watched.
    limit : int
        Bytes of fills that may wait at once in one process.
    allocate, release : callable
        ``allocate(n)``: a buffer for ``n`` bytes (the cache's aligned ones);
        ``release(buffer)`` takes it back once written.
    """

    def __init__(
        self,
        store: Callable,
        count: Callable,
        directory: str,
        limit: int = FILL_BUFFER,
        allocate: Callable = bytearray,
        release: Callable = lambda buf: None,
    ) -> None:
        self._store = store
        self._count = count
        self._allocate = allocate
        self._release = release
        self.directory = directory
        self.limit = limit
        self._queues = PerProcess(_Queue)

    def offer(self, key, data, crcs=None) -> bool:
        """Copy ``data`` (the whole chunk of ``key``) to be written; False when skipped.

        ``crcs`` goes along to ``store``.
        """
        n = len(data)
        q = self._queues.get()
        with q.cond:
            skip = (
                q.queued + n > self.limit or time.monotonic() < q.paused_until or not self._room(q)
            )
            if not skip:
                q.queued += n
        if skip:
            self._count(fill_skips=1)
            return False
        buf = self._allocate(n)
        buf[:n] = data
        with q.cond:
            q.items.append((key, buf, n, crcs))
            q.threads = [t for t in q.threads if t.is_alive()]
            if len(q.threads) < WRITERS and len(q.items) + q.writing > len(q.threads):
                t = threading.Thread(
                    target=self._run, args=(q,), name="emberfs-cache-fill", daemon=True
                )
                t.start()
                q.threads.append(t)
            q.cond.notify_all()  # a writer (waiters of wait() share the condition)
        return True

    def pause(self) -> None:
        """A fill failed: take no more for a few seconds."""
        q = self._queues.get()
        with q.cond:
            q.paused_until = time.monotonic() + PAUSE_AFTER_ERROR

    def _room(self, q: _Queue) -> bool:
        """Whether the cache's file system has room for fills (looked at once a second)."""
        now = time.monotonic()
        if now - q.room_checked >= ROOM_CHECK_EVERY:
            q.room_checked = now
            try:
                st = os.statvfs(self.directory)
                reserve = min(RESERVE, st.f_blocks * st.f_frsize // 100)
                q.room = st.f_bavail * st.f_frsize > reserve
            except OSError:
                q.room = False
        return q.room

    def _run(self, q: _Queue) -> None:
        while True:
            with q.cond:
                while not q.items:
                    q.cond.wait()
                key, buf, n, crcs = q.items.popleft()
                q.writing += 1
            try:
                self._store(key, buf, crcs)
            finally:
                self._release(buf)
                with q.cond:
                    q.writing -= 1
                    q.queued -= n
                    q.cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until this process's fills are written; False when ``timeout`` passed first."""
        q = self._queues.current()
        if q is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with q.cond:
            while q.items or q.writing:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                q.cond.wait(left)
        return True
