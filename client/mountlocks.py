"""The lock operations of a mount: fcntl byte-range locks and flock, held by the metaserver.

libfuse's high-level API passes them on as ``lock`` (``F_GETLK``,
``F_SETLK``, ``F_SETLKW`` with a ``struct flock`` whose range is absolute)
and ``flock`` (``LOCK_SH``, ``LOCK_EX``, ``LOCK_UN``, with ``LOCK_NB`` or
not), each with the kernel's lock owner in ``fuse_file_info.lock_owner``: a
process's descriptor table for fcntl locks, an open file description for
flock. :class:`LockOps` turns them into ``SetLock`` and ``GetLock`` calls on
the mount's :class:`~emberfs.client.locks.LockLease`, so mounts on different
machines contend for one set of locks.

When locks go:

* fcntl locks of a process are dropped when it closes any descriptor of the
  file: every ``close(2)`` is a FUSE flush, and libfuse follows it with an
  unlock of the whole file for the flushing owner (this mount skips that call
  for owners that took no lock on the file);
* flock locks when the open file description is released (the kernel marks
  that release, ``flock_release``);
* a process that exits closes its descriptors, so both;
* all of the mount's locks at unmount (the lease is closed), or, when the
  mount process dies, once its lease runs out on the metaserver.

A granted lock makes the mount take the file's length anew and the kernel
drop its cached pages and attributes of the file; a lock released sends
what this mount wrote of the file first (as NFS does). So processes that
append or rewrite a file under a lock, on any mounts, see each other's
writes: take the lock, seek to the end (``lseek`` asks for the length), write,
release.

A blocking request (``F_SETLKW``, ``flock`` without ``LOCK_NB``) asks the
metaserver to wait up to :data:`WAIT_MS` for the lock, then asks again, until
it is granted; between two calls it checks whether the kernel interrupted
the request (a signal to the waiting process) and answers EINTR then.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from emberfs.client.fusebind import fuse_errors, interrupted, invalidate_path
from emberfs.client.locks import TO_EOF, LockLease
from emberfs.proto import meta_pb2

if TYPE_CHECKING:
    from emberfs.client.core import Client
    from emberfs.client.mountfiles import Descriptor, OpenNode

log = logging.getLogger(__name__)

WAIT_MS = 1000  # how long one SetLock call of a blocking request waits on the metaserver
MAX_BACKOFF = 0.5  # seconds between calls the metaserver answered at once

_TYPES = {
    fcntl.F_RDLCK: meta_pb2.LOCK_READ,
    fcntl.F_WRLCK: meta_pb2.LOCK_WRITE,
    fcntl.F_UNLCK: meta_pb2.LOCK_UNLOCK,
}
_FCNTL_TYPES = {v: k for k, v in _TYPES.items()}
_FLOCK_TYPES = {
    fcntl.LOCK_SH: meta_pb2.LOCK_READ,
    fcntl.LOCK_EX: meta_pb2.LOCK_WRITE,
    fcntl.LOCK_UN: meta_pb2.LOCK_UNLOCK,
}


class LockOps:
    """The ``lock`` and ``flock`` operations of :class:`~emberfs.client.mount.EmberFuse`.

    Needs ``self.client`` and ``self._handle(fh)`` (an open descriptor, or
    EBADF); call :meth:`_init_locks` in ``__init__``.
    """

    client: Client
    _handle: Callable[[int], Descriptor]
    _nodes: dict[int, OpenNode]

    def _init_locks(self) -> None:
        self.lock_lease = LockLease(lambda: self.client.meta, on_lost=self._locks_lost)
        self._held_lock = threading.Lock()
        # (inode, kind) -> owners that may hold locks of that kind there (no unlock call for others)
        self._holders: dict[tuple[int, int], set[int]] = {}

    def _locks_lost(self) -> None:
        with self._held_lock:
            self._holders.clear()

    def _may_hold(self, inode: int, kind: int, owner: int) -> bool:
        with self._held_lock:
            return owner in self._holders.get((inode, kind), ())

    def _note(self, inode: int, lock: meta_pb2.FileLock) -> None:
        """Remember what a granted ``lock`` left its owner holding."""
        key = (inode, lock.kind)
        with self._held_lock:
            if lock.type != meta_pb2.LOCK_UNLOCK:
                self._holders.setdefault(key, set()).add(lock.owner)
            elif lock.start == 0 and lock.end == TO_EOF:
                owners = self._holders.get(key)
                if owners is not None:
                    owners.discard(lock.owner)
                    if not owners:
                        del self._holders[key]

    def _granted(self, inode: int, path: str | None) -> None:
        """A lock was granted: take the file's length anew, and make the kernel drop its pages
        and attributes of it (what another client wrote under the lock before shows)."""
        attr = self.client.meta.stat_inode(inode, path)
        node = self._nodes.get(inode)
        if node is not None:
            node.learn(attr)
        if path:
            invalidate_path(path)

    def _releasing(self, inode: int) -> None:
        """A lock goes: what this mount wrote of the file reaches the metaserver first."""
        node = self._nodes.get(inode)
        if node is not None and node.handle.session_id:
            node.sync()

    def _set(self, inode: int, lock: meta_pb2.FileLock, block: bool, path: str | None) -> int:
        """Set ``lock``; 0, or -EAGAIN (refused) or -EINTR (interrupted while waiting)."""
        if lock.type == meta_pb2.LOCK_UNLOCK:
            if not self._may_hold(inode, lock.kind, lock.owner):
                return 0
            self._releasing(inode)
        backoff = 0.05
        while True:
            started = time.monotonic()
            resp = self.lock_lease.set(inode, lock, WAIT_MS if block else 0)
            if resp.granted:
                self._note(inode, lock)
                if lock.type != meta_pb2.LOCK_UNLOCK:
                    self._granted(inode, path)
                return 0
            if not block:
                return -errno.EAGAIN
            if interrupted():
                return -errno.EINTR
            if time.monotonic() - started < WAIT_MS / 2000:  # the metaserver did not wait
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                if interrupted():
                    return -errno.EINTR

    @fuse_errors
    def lock(self, path, fi, cmd: int, flock) -> int:
        """fcntl locks: ``F_GETLK``, ``F_SETLK``, ``F_SETLKW`` (``flock``: a ``struct flock *``)."""
        fl = flock.contents
        if fl.l_type not in _TYPES or fl.l_start < 0 or fl.l_len < 0:
            return -errno.EINVAL
        end = TO_EOF if fl.l_len == 0 else fl.l_start + fl.l_len - 1
        lock = meta_pb2.FileLock(
            kind=meta_pb2.LOCK_POSIX,
            type=_TYPES[fl.l_type],
            start=fl.l_start,
            end=min(end, TO_EOF),
            owner=fi.lock_owner,
            pid=max(fl.l_pid, 0),
        )
        inode = self._handle(fi.fh).node.inode
        if cmd == fcntl.F_GETLK:
            held = self.lock_lease.get(inode, lock)
            fl.l_type = _FCNTL_TYPES[held.type]
            if held.type != meta_pb2.LOCK_UNLOCK:
                fl.l_whence = os.SEEK_SET
                fl.l_start = held.start
                fl.l_len = 0 if held.end >= TO_EOF else held.end - held.start + 1
                fl.l_pid = held.pid
            return 0
        if cmd not in (fcntl.F_SETLK, fcntl.F_SETLKW):
            return -errno.EINVAL
        return self._set(inode, lock, cmd == fcntl.F_SETLKW, path)

    @fuse_errors
    def flock(self, path, fi, op: int) -> int:
        """flock(2): ``LOCK_SH``, ``LOCK_EX`` or ``LOCK_UN``, with ``LOCK_NB`` or not."""
        kind = op & ~fcntl.LOCK_NB
        if kind not in _FLOCK_TYPES:
            return -errno.EINVAL
        lock = meta_pb2.FileLock(
            kind=meta_pb2.LOCK_FLOCK,
            type=_FLOCK_TYPES[kind],
            start=0,
            end=TO_EOF,
            owner=fi.lock_owner,
        )
        return self._set(self._handle(fi.fh).node.inode, lock, not op & fcntl.LOCK_NB, path)

    def release_flocks(self, inode: int, owner: int) -> None:
        """The open file description ``owner`` is released: drop its flock lock on ``inode``."""
        unlock = meta_pb2.FileLock(
            kind=meta_pb2.LOCK_FLOCK, type=meta_pb2.LOCK_UNLOCK, start=0, end=TO_EOF, owner=owner
        )
        try:
            self._set(inode, unlock, False, None)
        except OSError as exc:
            log.warning("releasing the flock lock of inode %d: %s", inode, exc)

    def close_locks(self) -> None:
        """Unmounting: end the lock lease, releasing every lock of this mount."""
        try:
            released = self.lock_lease.close()
        except OSError as exc:
            log.warning("ending the lock lease at unmount: %s (its locks go when it lapses)", exc)
            return
        if released:
            log.info("unmounted holding %d lock(s): released", released)
