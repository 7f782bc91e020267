"""POSIX locks through the metaserver: a client's lock lease and its lock calls.

The metaserver holds every fcntl byte-range lock and flock lock
(:mod:`emberfs.metaserver.fs.ops.locks`) under a lock lease of the client
that took it. :class:`LockLease` is one such client's side: it opens the lease
on the first lock (``OpenLockLease``), renews it every third of the lease's
timeout from a daemon thread (``RenewLockLease``), and ends it, releasing
every lock, at :meth:`LockLease.close`. A client that stops renewing (its
process was killed, its host lost the network) loses its locks once the
timeout has passed; a renewal that finds the lease gone logs that the locks
were lost, and the next lock opens a new lease.

:meth:`LockLease.set` and :meth:`LockLease.get` are ``SetLock`` and
``GetLock`` on that lease, with the metaserver client's retries and error
mapping (a revoked token is ``PermissionError``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from emberfs.common.periodic import Periodic
from emberfs.proto import meta_pb2

if TYPE_CHECKING:
    from emberfs.client.meta import MetaClient

log = logging.getLogger(__name__)

TO_EOF = (1 << 63) - 1  # the last byte of a lock "to the end of the file"


class LockLease:
    """The lock lease of one client, opened on first need and renewed in the background.

    Parameters
    ----------
    meta : callable
        Returns the :class:`~emberfs.client.meta.MetaClient` to call.
    on_lost : callable, optional
        Called (with no argument) when the metaserver ended the lease: every
        lock taken under it is gone.
    """

    def __init__(self, meta: Callable[[], MetaClient], on_lost: Callable[[], None] = lambda: None):
        self._meta = meta
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._lease_id = 0
        self._renewer: Periodic | None = None
        self.timeout = 0.0

    @property
    def lease_id(self) -> int:
        """The lease now (0: none open)."""
        return self._lease_id

    def _open(self) -> int:
        with self._lock:
            if not self._lease_id:
                meta = self._meta()
                resp = meta.meta("OpenLockLease", meta_pb2.OpenLockLeaseRequest(ctx=meta.context()))
                self._lease_id, self.timeout = resp.lease_id, resp.timeout
                if self._renewer is None:
                    self._renewer = Periodic(
                        self.renew_now, resp.timeout / 3, "emberfs-lock-lease", "renewing locks"
                    )
                    self._renewer.start()
            return self._lease_id

    def _lost(self, lease_id: int) -> None:
        with self._lock:
            if self._lease_id != lease_id:
                return
            self._lease_id = 0
        log.error("the lock lease %d ended on the metaserver: its locks are gone", lease_id)
        self._on_lost()

    def renew_now(self) -> None:
        """Renew the lease once (nothing when none is open)."""
        lease_id = self._lease_id
        if not lease_id:
            return
        meta = self._meta()
        req = meta_pb2.RenewLockLeaseRequest(ctx=meta.context(), lease_id=lease_id)
        if meta.meta("RenewLockLease", req).gone:
            self._lost(lease_id)

    def set(
        self, inode: int, lock: meta_pb2.FileLock, wait_ms: int = 0
    ) -> meta_pb2.SetLockResponse:
        """``SetLock`` of ``lock`` (its lease filled in) on ``inode``.

        An unlock without a lease, or whose lease ended, is granted at once
        (nothing is held); a lock whose lease ended is asked again under a
        new lease.
        """
        for _ in range(2):
            if lock.type == meta_pb2.LOCK_UNLOCK and not self._lease_id:
                return meta_pb2.SetLockResponse(granted=True)
            lease_id = self._open()
            lock.lease_id = lease_id
            meta = self._meta()
            req = meta_pb2.SetLockRequest(
                ctx=meta.context(), inode=inode, lock=lock, wait_ms=wait_ms
            )
            resp = meta.meta("SetLock", req)
            if not resp.lease_gone:
                return resp
            self._lost(lease_id)
        return meta_pb2.SetLockResponse(granted=lock.type == meta_pb2.LOCK_UNLOCK)

    def get(self, inode: int, lock: meta_pb2.FileLock) -> meta_pb2.FileLock:
        """The lock of another owner that refuses ``lock`` (type LOCK_UNLOCK: none)."""
        lock.lease_id = self._lease_id
        meta = self._meta()
        req = meta_pb2.GetLockRequest(ctx=meta.context(), inode=inode, lock=lock)
        return meta.meta("GetLock", req).conflict

    def close(self) -> int:
        """End the lease, releasing every lock under it; the locks released."""
        with self._lock:
            lease_id, self._lease_id = self._lease_id, 0
            renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.stop()
        if not lease_id:
            return 0
        meta = self._meta()
        req = meta_pb2.CloseLockLeaseRequest(ctx=meta.context(), lease_id=lease_id)
        return meta.meta("CloseLockLease", req).released
