"""The lock calls of the namespace: lock leases, their expiry, and waiting for a lock.

:class:`Locking` runs the operations of :mod:`emberfs.metaserver.fs.ops.locks`
through the namespace's :class:`~emberfs.metaserver.fs.oprunner.OpRunner`
(each one transaction) and adds what lies outside a transaction:

* **Lease expiry** (:meth:`Locking.expire_leases`, the metaserver's sweep):
  a lease not renewed for ``timeout`` seconds on the monotonic clock ends
  with all its locks, each lease in a transaction of its own.
* **A bounded wait.** A ``SetLock`` with ``wait_ms`` that finds a conflict
  waits on this metaserver, up to ``wait_ms`` (at most :data:`MAX_WAIT`
  seconds), and tries again whenever a lock here is released or weakened,
  and every :data:`POLL` seconds (a release through another metaserver of a
  shared store); then it answers, granted or not, and the client asks again.
  At most ``max_waiters`` calls wait at once (a few of the gRPC workers):
  beyond that a call answers at once and its client backs off, so waiting
  lock requests never hold the metaserver's threads.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.fs import locktable
from emberfs.metaserver.fs.leases import Leases
from emberfs.metaserver.fs.opcontext import Credentials, IdAllocator, OpContext
from emberfs.metaserver.fs.oprunner import OpRunner
from emberfs.metaserver.fs.ops import locks
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict, KVEngine, Transaction, run_transaction
from emberfs.proto import meta_pb2

DEFAULT_LEASE_TIMEOUT = 15.0
MAX_WAIT = 2.0  # seconds one SetLock call waits at most
POLL = 0.25  # seconds between tries of a waiting call without a release seen here
MAX_WAITERS = 8

log = logging.getLogger(__name__)


class Releases:
    """Wakes the waiting lock calls when a lock is released here; bounds how many wait."""

    def __init__(self, max_waiters: int) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._slots = threading.BoundedSemaphore(max_waiters)

    def generation(self) -> int:
        with self._cond:
            return self._generation

    def released(self) -> None:
        """Locks were released or weakened (on any file): every waiter tries again."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> None:
        """Until a release after generation ``seen``, or ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self._generation != seen, timeout)

    def slot(self) -> bool:
        """Take a waiter's slot (False: all taken); give it back with :meth:`free`."""
        return self._slots.acquire(blocking=False)

    def free(self) -> None:
        self._slots.release()


class Locking:
    """Lock leases and locks of a namespace's files.

    Parameters
    ----------
    engine : KVEngine
    runner : OpRunner
        Runs each call in one transaction.
    grace : Grace
        The monotonic clock leases are judged by (the namespace's).
    timeout : float
        Seconds a lock lease lives without a renewal (default 15).
    clock : callable
        Wall-clock nanoseconds, for the times stored in lease records.
    max_waiters : int
        Calls that may wait for a lock at once.
    """

    def __init__(
        self,
        engine: KVEngine,
        runner: OpRunner,
        grace: Grace,
        timeout: float = DEFAULT_LEASE_TIMEOUT,
        clock: Callable[[], int] = time.time_ns,
        max_waiters: int = MAX_WAITERS,
    ) -> None:
        self.engine = engine
        self.runner = runner
        self.grace = grace
        self.clock = clock
        self.leases = Leases(grace, timeout)
        self.releases = Releases(max_waiters)
        self._ids = IdAllocator(engine, keys.NEXT_LOCK_LEASE, first=1)

    @property
    def timeout(self) -> float:
        return self.leases.timeout

    def _run(self, fn: Callable[..., Any], req: Any, **kwargs: Any) -> Any:
        touched: list[int] = []
        try:
            return self.runner.run(functools.partial(fn, touched=touched, **kwargs), req, None)
        finally:
            if touched:
                self.releases.released()

    def open_lease(self, req: meta_pb2.OpenLockLeaseRequest) -> meta_pb2.OpenLockLeaseResponse:
        """A new lock lease for the caller."""
        lease_id = self._ids.next()
        fn = functools.partial(locks.open_lease, lease_id=lease_id, leases=self.leases)
        return self.runner.run(fn, req, None)

    def renew_lease(self, req: meta_pb2.RenewLockLeaseRequest) -> meta_pb2.RenewLockLeaseResponse:
        """Renew the caller's lease (``gone``: it ended)."""
        return self.runner.run(functools.partial(locks.renew_lease, leases=self.leases), req, None)

    def close_lease(self, req: meta_pb2.CloseLockLeaseRequest) -> meta_pb2.CloseLockLeaseResponse:
        """End the caller's lease and release its locks."""
        return self._run(locks.close_lease, req)

    def get_lock(self, req: meta_pb2.GetLockRequest) -> meta_pb2.GetLockResponse:
        """The lock of another owner that would refuse the one described."""
        return self.runner.run(locks.get_lock, req, None)

    def set_lock(self, req: meta_pb2.SetLockRequest) -> meta_pb2.SetLockResponse:
        """Set a lock; with ``wait_ms``, wait that long at most for a conflict to go."""
        wait = min(req.wait_ms / 1000.0, MAX_WAIT)
        if wait <= 0 or req.lock.type == meta_pb2.LOCK_UNLOCK or not self.releases.slot():
            return self._run(locks.set_lock, req)
        try:
            deadline = time.monotonic() + wait
            while True:
                seen = self.releases.generation()
                resp = self._run(locks.set_lock, req)
                left = deadline - time.monotonic()
                if resp.granted or resp.lease_gone or left <= 0:
                    return resp
                self.releases.wait(seen, min(left, POLL))
        finally:
            self.releases.free()

    # expiry ------------------------------------------------------------------

    def expire_leases(self) -> list[tuple[locktable.Lease, int]]:
        """End the lock leases not renewed within the timeout, with their locks.

        A judging round of the grace (see
        :meth:`Namespace.expire_sessions
        <emberfs.metaserver.fs.namespace.Namespace.expire_sessions>`); each
        lease ends in a transaction of its own. Returns the ended leases with
        the number of locks each released.
        """
        now = self.grace.check()
        stored = locks.stored(self.engine)
        self.leases.retain(locks.lease_ref(lease.lease_id) for lease in stored)
        ended = []
        for lease in stored:
            ref = locks.lease_ref(lease.lease_id)
            silence = self.leases.silence(*ref, now, lease.renewed_ns)
            if silence < self.leases.timeout:
                continue
            released = self._expire_one(lease.lease_id)
            if released is None:
                continue
            ended.append((lease, released))
            log.warning(
                "lock lease %d of client %r expired (not renewed for %.1f s): %d lock(s) released",
                lease.lease_id,
                lease.client_id,
                silence,
                released,
            )
        return ended

    def _expire_one(self, lease_id: int) -> int | None:
        touched: list[int] = []

        def lapsed(lease: locktable.Lease) -> bool:
            return self.leases.lapsed(*locks.lease_ref(lease.lease_id), lease.renewed_ns)

        def attempt(txn: Transaction) -> int | None:
            touched.clear()
            op = OpContext(txn, Credentials(0, 0, frozenset()), self.runner.env, self.clock())
            return locks.expire(op, lease_id, lapsed, touched)

        try:
            return run_transaction(self.engine, attempt)
        except Conflict:
            log.warning("lock lease %d: expiry conflicted; retrying later", lease_id)
            return None
        finally:
            if touched:
                self.releases.released()
