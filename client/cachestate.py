"""The shared state of a disk cache: bytes in use, size limit and counters, in one flock'd file.

Every process that uses a cache directory (:mod:`emberfs.client.diskcache`)
counts what it does (hits, misses, fills, evictions, ...) in memory, and adds
those counts to the directory's ``state`` file at most once a second, when
asked (:meth:`CacheState.flush`) and when it ends. Entries are added and
evicted under the same ``flock``, which also keeps the bytes in use, so
``emberfs cache stats`` shows the work of every process that used the cache:
forked DataLoader workers, several jobs, a mount.

:class:`PerProcess` gives each process its own value of something that
cannot cross ``os.fork`` (a file descriptor whose lock the parent shares, a
thread, a lock a parent's thread may hold).
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

#: what every process counts, in the order the state file keeps them
COUNTERS = (
    "hits",
    "hit_bytes",
    "misses",
    "miss_bytes",
    "fills",
    "fill_bytes",
    "fill_skips",
    "fill_errors",
    "evictions",
    "evicted_bytes",
    "corrupt",
)
STATE = struct.Struct(f"<8sQQ{len(COUNTERS)}Q")  # magic, bytes in use, size limit, counters
STATE_MAGIC = b"EMBCSTAT"
FLUSH_EVERY = 1.0  # seconds between additions of a process's counts to the shared ones


class PerProcess(Generic[T]):
    """A value built by ``factory()`` in each process that asks for it."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._value: T | None = None
        self._pid = -1
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()

    def get(self) -> T:
        """This process's value, built now if it has none (first use, or after a fork)."""
        pid = os.getpid()
        if self._pid == pid:
            return self._value
        if self._lock_pid != pid:
            # a lock inherited across fork may be held by a thread that does not exist here
            self._lock = threading.Lock()
            self._lock_pid = pid
        with self._lock:
            if self._pid != pid:
                self._value = self._factory()
                self._pid = pid
            return self._value

    def current(self) -> T | None:
        """This process's value, or None when it has not built one."""
        return self._value if self._pid == os.getpid() else None


class _Counts:
    """One process's counts and its own descriptor of the state file (flock is per descriptor)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self.lock = threading.Lock()  # the counts
        self.turn = threading.Lock()  # this process's threads take the flock one at a time
        self.totals = dict.fromkeys(COUNTERS, 0)
        self.unflushed = dict.fromkeys(COUNTERS, 0)
        self.flushed_at = time.monotonic()


def empty_state() -> dict:
    return {"used": 0, "limit": 0, **dict.fromkeys(COUNTERS, 0)}


class CacheState:
    """The ``state`` file at ``path`` (made when missing) and this process's counts.

    Parameters
    ----------
    path : str
    """

    def __init__(self, path: str) -> None:
        self.path = path
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))
        self._counts = PerProcess(lambda: _Counts(path))

    @staticmethod
    def _read(fd: int) -> dict:
        raw = os.pread(fd, STATE.size, 0)
        if len(raw) < STATE.size or raw[:8] != STATE_MAGIC:
            return empty_state()
        _, used, limit, *counts = STATE.unpack(raw)
        return {"used": used, "limit": limit, **dict(zip(COUNTERS, counts, strict=True))}

    def read(self) -> dict:
        """The shared state as last written (without this process's counts not yet added)."""
        return self._read(self._counts.get().fd)

    def update(self, change: Callable[[dict], None]) -> dict:
        """Under the flock: add this process's counts, apply ``change(state)``; the new state.

        ``change`` may do file operations that must not interleave with other
        processes' (adding or evicting entries) and may raise: then nothing is
        written and the counts wait for the next time.
        """
        counts = self._counts.get()
        with counts.turn:
            with counts.lock:
                deltas, counts.unflushed = counts.unflushed, dict.fromkeys(COUNTERS, 0)
                counts.flushed_at = time.monotonic()
            try:
                fcntl.flock(counts.fd, fcntl.LOCK_EX)
                try:
                    state = self._read(counts.fd)
                    for name, n in deltas.items():
                        state[name] += n
                    change(state)
                    state["used"] = max(0, state["used"])
                    values = [state["used"], state["limit"]] + [state[c] for c in COUNTERS]
                    os.pwrite(counts.fd, STATE.pack(STATE_MAGIC, *values), 0)
                    return state
                finally:
                    fcntl.flock(counts.fd, fcntl.LOCK_UN)
            except BaseException:
                with counts.lock:
                    for name, n in deltas.items():
                        counts.unflushed[name] += n
                raise

    def count(self, **counts: int) -> None:
        """Count events of this process (``hits=1, hit_bytes=n``); added up once a second."""
        mine = self._counts.get()
        with mine.lock:
            for name, n in counts.items():
                mine.totals[name] += n
                mine.unflushed[name] += n
            due = time.monotonic() - mine.flushed_at >= FLUSH_EVERY
        if due:
            try:
                self.flush()
            except OSError:
                pass  # added at the next flush

    def flush(self) -> None:
        """Add this process's counts to the shared ones now."""
        if self._counts.current() is not None:
            self.update(lambda state: None)

    def totals(self) -> dict:
        """This process's counts since it began using the cache (or since :meth:`reset`)."""
        mine = self._counts.current()
        if mine is None:
            return dict.fromkeys(COUNTERS, 0)
        with mine.lock:
            return dict(mine.totals)

    def forget(self) -> None:
        """Zero this process's counts (the shared ones were zeroed: a clear)."""
        mine = self._counts.get()
        with mine.lock:
            mine.totals = dict.fromkeys(COUNTERS, 0)
            mine.unflushed = dict.fromkeys(COUNTERS, 0)
