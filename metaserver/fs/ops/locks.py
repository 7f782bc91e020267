"""Lock leases and POSIX locks: OpenLockLease, RenewLockLease, CloseLockLease, SetLock, GetLock.

A client takes its locks under a lock lease of its own (``LKLS`` + lease
id), which it renews every third of the lease's timeout; every lock names
its lease. When the lease ends (:func:`close_lease` at an unmount, or
:func:`expire` once it went unrenewed for the timeout: the client died or was
cut off) every lock held under it goes with it. Whether a lease ran out is
judged on the metaserver's monotonic clock, as for write sessions
(:mod:`emberfs.metaserver.fs.leases`, keyed ``(0, lease id)``): renewals note it
in memory and rewrite the lease's record, and an expiry reads the record
before it asks, so a lease is never ended while its client is told it lives.

The rules of the table are in :mod:`emberfs.metaserver.fs.locktable`.
Permissions: an fcntl read lock needs read permission on the file, a write
lock write permission (the kernel checks too that the descriptor is open
for reading or writing); a flock lock of either type and GetLock need read
or write permission, as a file that could be opened. Unlocking needs none.
A lease is its client's: another client id using it is refused.
Lock calls are not deduplicated: setting the same lock twice is harmless.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from emberfs.common.errors import InvalidArgument, NoSpace, NotFound, PermissionDenied
from emberfs.metaserver.fs import access, locktable
from emberfs.metaserver.fs.leases import Leases
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine
from emberfs.proto import common_pb2, meta_pb2

MAX_LOCKS_PER_FILE = 4096  # beyond: ENOLCK


def lease_ref(lease_id: int) -> tuple[int, int]:
    """The key of a lock lease in its :class:`Leases` table."""
    return (0, lease_id)


def _lease(op: OpContext, lease_id: int) -> locktable.Lease | None:
    """The caller's lease ``lease_id`` (None when it ended); PermissionDenied if another's."""
    raw = op.txn.get(keys.lock_lease_key(lease_id))
    if raw is None:
        return None
    lease = locktable.decode_lease(lease_id, raw)
    if lease.client_id != op.client_id:
        raise PermissionDenied(f"lock lease {lease_id} is another client's")
    return lease


def open_lease(
    op: OpContext, req: meta_pb2.OpenLockLeaseRequest, *, lease_id: int, leases: Leases
) -> meta_pb2.OpenLockLeaseResponse:
    """Record a new lease ``lease_id`` for the caller; its lease starts now."""
    if not op.client_id:
        raise InvalidArgument("a lock lease needs a client id")
    op.txn.put(keys.lock_lease_key(lease_id), locktable.encode_lease(op.client_id, op.now))
    leases.renewed(*lease_ref(lease_id))
    return meta_pb2.OpenLockLeaseResponse(lease_id=lease_id, timeout=leases.timeout)


def renew_lease(
    op: OpContext, req: meta_pb2.RenewLockLeaseRequest, *, leases: Leases
) -> meta_pb2.RenewLockLeaseResponse:
    """Renew the caller's lease; ``gone`` when it ended (its locks went with it)."""
    lease = _lease(op, req.lease_id)
    if lease is None:
        return meta_pb2.RenewLockLeaseResponse(gone=True)
    leases.renewed(*lease_ref(req.lease_id))
    # the record always changes (a metaserver that judges leases sees a renewal so)
    renewed = max(op.now, lease.renewed_ns + 1)
    op.txn.put(
        keys.lock_lease_key(req.lease_id),
        locktable.encode_lease(lease.client_id, lease.since_ns, renewed),
    )
    return meta_pb2.RenewLockLeaseResponse()


def drop_lease(op: OpContext, lease_id: int, touched: list[int]) -> int:
    """Release every lock of the lease and end it; the locks released.

    Appends the inodes whose locks changed to ``touched``.
    """
    released = 0
    for key, _ in list(op.txn.scan_prefix(keys.lock_held_prefix(lease_id))):
        inode = keys.lock_held_inode(key)
        locks = locktable.decode_locks(op.txn.get(keys.lock_key(inode)))
        kept = locktable.without_lease(locks, lease_id)
        released += len(locks) - len(kept)
        _put_locks(op, inode, kept)
        op.txn.delete(key)
        touched.append(inode)
    op.txn.delete(keys.lock_lease_key(lease_id))
    return released


def close_lease(
    op: OpContext, req: meta_pb2.CloseLockLeaseRequest, *, touched: list[int]
) -> meta_pb2.CloseLockLeaseResponse:
    """End the caller's lease now, releasing its locks (nothing when it ended already)."""
    if _lease(op, req.lease_id) is None:
        return meta_pb2.CloseLockLeaseResponse()
    return meta_pb2.CloseLockLeaseResponse(released=drop_lease(op, req.lease_id, touched))


def _put_locks(op: OpContext, inode: int, locks: list[meta_pb2.FileLock]) -> None:
    if locks:
        op.txn.put(keys.lock_key(inode), locktable.encode_locks(locks))
    else:
        op.txn.delete(keys.lock_key(inode))


def _lockable(op: OpContext, inode: int, lock: meta_pb2.FileLock) -> None:
    """NotFound, InvalidArgument or PermissionDenied unless the caller may take ``lock``."""
    attr = op.get_inode(inode)
    if attr is None:
        raise NotFound(f"no inode {inode}")
    if attr.type != common_pb2.FILE:
        raise InvalidArgument(f"inode {inode} is not a file: only files take locks")
    what = f"inode {inode}"
    if lock.kind == meta_pb2.LOCK_POSIX and lock.type == meta_pb2.LOCK_READ:
        access.check(attr, op.creds, access.READ, what)
    elif lock.kind == meta_pb2.LOCK_POSIX and lock.type == meta_pb2.LOCK_WRITE:
        access.check(attr, op.creds, access.WRITE, what)
    elif not (
        access.allowed(attr, op.creds, access.READ) or access.allowed(attr, op.creds, access.WRITE)
    ):
        raise PermissionDenied(f"permission denied: {what}")


def set_lock(
    op: OpContext, req: meta_pb2.SetLockRequest, *, touched: list[int]
) -> meta_pb2.SetLockResponse:
    """Take, change or release ``req.lock`` for its owner, unless another owner's lock refuses it.

    Appends ``req.inode`` to ``touched`` when locks were released or
    weakened there (a waiter may now get its lock).
    """
    wanted = locktable.validate(req.lock)
    wanted.client_id = op.client_id
    if _lease(op, wanted.lease_id) is None:
        return meta_pb2.SetLockResponse(lease_gone=True)
    if wanted.type != meta_pb2.LOCK_UNLOCK:
        _lockable(op, req.inode, wanted)
    key = keys.lock_key(req.inode)
    locks = locktable.decode_locks(op.txn.get(key))
    conflict = locktable.first_conflict(locks, wanted)
    if conflict is not None:
        return meta_pb2.SetLockResponse(granted=False, conflict=conflict)
    after = locktable.apply(locks, wanted)
    if after == locks:
        return meta_pb2.SetLockResponse(granted=True)
    if len(after) > MAX_LOCKS_PER_FILE:
        raise NoSpace(
            f"more than {MAX_LOCKS_PER_FILE} locks on inode {req.inode}", errno=errno.ENOLCK
        )
    _put_locks(op, req.inode, after)
    held = keys.lock_held_key(wanted.lease_id, req.inode)
    if locktable.held_by(after, wanted.lease_id):
        op.txn.put(held, b"")
    else:
        op.txn.delete(held)
    if wanted.type != meta_pb2.LOCK_WRITE:
        touched.append(req.inode)
    return meta_pb2.SetLockResponse(granted=True)


def get_lock(op: OpContext, req: meta_pb2.GetLockRequest) -> meta_pb2.GetLockResponse:
    """The first lock of another owner that would refuse ``req.lock`` (none: LOCK_UNLOCK)."""
    wanted = locktable.validate(req.lock)
    probe = meta_pb2.FileLock()
    probe.CopyFrom(wanted)
    probe.type = meta_pb2.LOCK_READ if wanted.type == meta_pb2.LOCK_UNLOCK else wanted.type
    _lockable(op, req.inode, meta_pb2.FileLock(kind=meta_pb2.LOCK_FLOCK))
    locks = locktable.decode_locks(op.txn.get(keys.lock_key(req.inode)))
    conflict = locktable.first_conflict(locks, probe)
    if conflict is None:
        return meta_pb2.GetLockResponse(conflict=meta_pb2.FileLock(type=meta_pb2.LOCK_UNLOCK))
    return meta_pb2.GetLockResponse(conflict=conflict)


def stored(engine: KVEngine) -> list[locktable.Lease]:
    """Every lock lease in the store (a snapshot scan)."""
    return [
        locktable.decode_lease(keys.lock_lease_id(key), raw)
        for key, raw in engine.scan_prefix(keys.LOCK_LEASE)
    ]


def expire(
    op: OpContext,
    lease_id: int,
    lapsed: Callable[[locktable.Lease], bool],
    touched: list[int],
) -> int | None:
    """End the lease if it ran out, releasing its locks; the locks released, or None.

    ``lapsed(lease)`` is asked once the lease's record has been read (see
    :mod:`emberfs.metaserver.fs.leases`); None when the lease ended or was
    renewed meanwhile.
    """
    raw = op.txn.get(keys.lock_lease_key(lease_id))
    if raw is None:
        return None
    if not lapsed(locktable.decode_lease(lease_id, raw)):
        return None
    return drop_lease(op, lease_id, touched)
