"""The free space of one storage target's file system, and whether a write fits in it.

A target whose file system runs out of room must refuse new writes before it
touches its disk, and take them again once there is room: a chunk write that
failed half-way costs the whole chain a round trip, and one that fails after
the head forwarded it leaves the successors a version ahead of the head.
:class:`SpaceGuard` answers "does a new chunk version of ``n`` bytes fit?"
(:meth:`SpaceGuard.admit`) without a system call for most writes:

* while there is room it reads the file system's free space (``statvfs``:
  blocks and inodes available) when a write comes ``check_interval`` seconds
  or more after the last reading, and counts the bytes it admitted since; a
  write that would leave less than ``reserve`` bytes free by that count makes
  it read the figures again at once;
* a write that still does not fit makes the target **full**: it refuses every
  write, and reads the figures again at most once per ``check_interval`` (when
  a write comes, or at a heartbeat: :meth:`SpaceGuard.check`) until the write
  it refused would fit; then it is no longer full;
* a file system that answers ENOSPC (or EDQUOT) although the figures showed
  room (another process filled it, or it ran out of inodes) makes the target
  full the same way (:meth:`SpaceGuard.exhausted`), and so does a heartbeat's
  reading that finds less than ``reserve`` bytes free.

Before it calls a target full, the guard asks ``release`` to give back space
the target can spare (the chunk store drops its spare files) and looks again.

The reserve keeps room for what the target writes besides chunk files: its
RocksDB of chunk records writes on every commit and removal, and a RocksDB that
once fails to write its log refuses every later change until it is reopened.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_RESERVE_BYTES = 64 * 1024 * 1024
CHECK_INTERVAL = 1.0
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is a file system's "no space left" (ENOSPC or EDQUOT)."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS


class SpaceGuard:
    """Admits new chunk versions while the target's file system has room for them.

    Parameters
    ----------
    root : Path
        A directory on the file system watched.
    reserve : int, default DEFAULT_RESERVE_BYTES
        Bytes always left free: a write is refused when it would leave less.
    check_interval : float, default CHECK_INTERVAL
        Seconds between two reads of the free space, at most, while nothing
        forces one (see the module notes).
    release : callable, optional
        Called with no argument when a write does not fit: frees what space
        the target can spare and returns how many bytes it freed.
    statvfs : callable, default os.statvfs
    clock : callable, default time.monotonic
    """

    def __init__(
        self,
        root: Path,
        *,
        reserve: int = DEFAULT_RESERVE_BYTES,
        check_interval: float = CHECK_INTERVAL,
        release: Callable[[], int] | None = None,
        statvfs: Callable[[Path], os.statvfs_result] = os.statvfs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if reserve < 0:
            raise ValueError("reserve must not be negative")
        self.root = Path(root)
        self.reserve = reserve
        self.check_interval = check_interval
        self._release = release
        self._statvfs = statvfs
        self._clock = clock
        self._lock = threading.Lock()
        self._free = 0  # bytes available at the last check
        self._inodes = 0  # inodes available at the last check
        self._admitted = 0  # bytes admitted since the last check
        self._checked = float("-inf")
        self._wanted = 0  # the refused write (0: not full)
        self._full = False
        self.check()

    # ------------------------------------------------------------------ figures

    @property
    def full(self) -> bool:
        """Whether the target refuses writes for lack of space."""
        return self._full

    @property
    def free(self) -> int:
        """Bytes available at the last check, less the bytes admitted since."""
        with self._lock:
            return max(0, self._free - self._admitted)

    def _read(self) -> None:
        st = self._statvfs(self.root)
        self._free = st.f_bavail * st.f_frsize
        self._inodes = st.f_favail
        self._admitted = 0
        self._checked = self._clock()

    def _fits(self, nbytes: int) -> bool:
        return self._inodes > 0 and self._free - self._admitted - nbytes >= self.reserve

    def _look(self, nbytes: int) -> bool:
        """Read the figures, giving back spare space first when ``nbytes`` would not fit."""
        self._read()
        if not self._fits(nbytes) and self._release is not None and self._release():
            self._read()
        return self._fits(nbytes)

    def _set_full(self, nbytes: int) -> None:
        if not self._full:
            log.warning(
                "%s: full: %d bytes free, %d inodes, a write of %d bytes does not fit "
                "(reserve %d); refusing writes until it does",
                self.root,
                self._free - self._admitted,
                self._inodes,
                nbytes,
                self.reserve,
            )
        self._full = True
        self._wanted = max(nbytes, 1)

    def _set_room(self) -> None:
        if self._full:
            log.warning("%s: has room again (%d bytes free); taking writes", self.root, self._free)
        self._full = False
        self._wanted = 0

    # ------------------------------------------------------------------ decisions

    def admit(self, nbytes: int) -> bool:
        """Whether a new chunk version of ``nbytes`` bytes may be written now.

        An admitted write is counted against the free space until the next
        check. A full target reads the figures again once ``check_interval``
        has passed since the last check, and refuses until then.
        """
        with self._lock:
            stale = self._clock() - self._checked >= self.check_interval
            if self._full:
                if not stale or not self._look(max(nbytes, self._wanted)):
                    return False
                self._set_room()
            elif (stale or not self._fits(nbytes)) and not self._look(nbytes):
                self._set_full(nbytes)
                return False
            self._admitted += nbytes
            return True

    @contextlib.contextmanager
    def taking(self, nbytes: int) -> Iterator[None]:
        """A write of ``nbytes`` that fails with ENOSPC (or EDQUOT) makes the target full."""
        try:
            yield
        except OSError as exc:
            if is_no_space(exc):
                self.exhausted(nbytes)
            raise

    def exhausted(self, nbytes: int) -> None:
        """A write of ``nbytes`` bytes failed with ENOSPC: the target is full.

        It stays full for at least ``check_interval`` and until a check
        finds room for that write.
        """
        with self._lock:
            self._read()
            self._set_full(nbytes)

    def check(self) -> bool:
        """Read the figures (a full target: once ``check_interval`` has passed); whether full.

        A target with less than ``reserve`` bytes free (after giving back
        spare space) is full from now on, before a write was refused.
        """
        with self._lock:
            if self._full:
                stale = self._clock() - self._checked >= self.check_interval
                if stale and self._look(self._wanted):
                    self._set_room()
            elif not self._look(0):
                self._set_full(0)
            return self._full


__all__ = ["DEFAULT_RESERVE_BYTES", "NO_SPACE_ERRNOS", "SpaceGuard", "is_no_space"]
