"""The lock table of one file, as POSIX and flock(2) rule it, and how it is stored.

A file's locks are one record, ``LOCK`` + inode id: a serialized
:class:`meta_pb2.FileLocks`. Each lock has a kind (fcntl byte range or flock),
a type (read or write), an inclusive byte range, and an owner: the kernel's
lock owner under the client's lock lease (``lease_id``, ``owner``). The two
kinds are separate tables, as on Linux: a flock lock never conflicts with an
fcntl lock.

- Two locks conflict when they are of one kind, of different owners, their
  ranges overlap, and one of them is a write lock.
- Setting an fcntl lock replaces whatever its owner held in that range: the
  owner's locks are cut around the range (a lock that covers more is split in
  two), the new one is added (nothing for an unlock), and the owner's locks of
  one type that overlap or touch are merged into one.
- A flock lock covers the whole file; an owner holds at most one, and a new
  request converts it (shared to exclusive or back) at once when it is granted.

``LKHD`` + lease id + inode id marks that a lease holds locks on an inode,
so that a lease that ends finds its locks without a scan of every file;
``LKLS`` + lease id is the lease itself (:data:`LEASE_FORMAT`: opened-at and
last-renewed wall-clock times, then the UTF-8 client id).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from emberfs.common.errors import InvalidArgument
from emberfs.proto import meta_pb2

TO_EOF = (1 << 63) - 1  # the last byte of a lock "to the end of the file"
LEASE_FORMAT = struct.Struct("<qq")


@dataclass(frozen=True)
class Lease:
    """A lock lease as stored: its id, client and wall-clock times (for people)."""

    lease_id: int
    client_id: str
    since_ns: int
    renewed_ns: int


def encode_lease(client_id: str, since_ns: int, renewed_ns: int | None = None) -> bytes:
    """The stored form of a lock lease."""
    renewed = since_ns if renewed_ns is None else renewed_ns
    return LEASE_FORMAT.pack(since_ns, renewed) + client_id.encode("utf-8", "surrogateescape")


def decode_lease(lease_id: int, raw: bytes) -> Lease:
    """A lock lease from its stored form."""
    since, renewed = LEASE_FORMAT.unpack_from(raw)
    client_id = raw[LEASE_FORMAT.size :].decode("utf-8", "surrogateescape")
    return Lease(lease_id, client_id, since, renewed)


def encode_locks(locks: list[meta_pb2.FileLock]) -> bytes:
    """The stored form of a file's locks."""
    return meta_pb2.FileLocks(locks=locks).SerializeToString(deterministic=True)


def decode_locks(raw: bytes | None) -> list[meta_pb2.FileLock]:
    """A file's locks from their stored form (None: no record, no locks)."""
    if raw is None:
        return []
    record = meta_pb2.FileLocks()
    record.ParseFromString(raw)
    return list(record.locks)


def validate(lock: meta_pb2.FileLock) -> meta_pb2.FileLock:
    """A copy of a requested lock, checked (InvalidArgument) and put in its normal form.

    A flock lock covers the whole file whatever range it names.
    """
    if lock.kind not in (meta_pb2.LOCK_POSIX, meta_pb2.LOCK_FLOCK):
        raise InvalidArgument(f"unknown lock kind {lock.kind}")
    if lock.type not in (meta_pb2.LOCK_UNLOCK, meta_pb2.LOCK_READ, meta_pb2.LOCK_WRITE):
        raise InvalidArgument(f"unknown lock type {lock.type}")
    out = meta_pb2.FileLock()
    out.CopyFrom(lock)
    if out.kind == meta_pb2.LOCK_FLOCK:
        out.start, out.end = 0, TO_EOF
    elif out.end > TO_EOF or out.start > out.end:
        raise InvalidArgument(f"bad lock range {out.start}..{out.end}")
    return out


def same_owner(a: meta_pb2.FileLock, b: meta_pb2.FileLock) -> bool:
    return a.kind == b.kind and a.lease_id == b.lease_id and a.owner == b.owner


def _overlap(a: meta_pb2.FileLock, b: meta_pb2.FileLock) -> bool:
    return a.start <= b.end and b.start <= a.end


def conflicts(held: meta_pb2.FileLock, wanted: meta_pb2.FileLock) -> bool:
    """True when ``held`` refuses ``wanted`` (an unlock is never refused)."""
    if wanted.type == meta_pb2.LOCK_UNLOCK or held.kind != wanted.kind:
        return False
    if same_owner(held, wanted) or not _overlap(held, wanted):
        return False
    return held.type == meta_pb2.LOCK_WRITE or wanted.type == meta_pb2.LOCK_WRITE


def first_conflict(
    locks: list[meta_pb2.FileLock], wanted: meta_pb2.FileLock
) -> meta_pb2.FileLock | None:
    """The first lock of ``locks`` that refuses ``wanted``, or None."""
    for held in locks:
        if conflicts(held, wanted):
            return held
    return None


def _piece(lock: meta_pb2.FileLock, start: int, end: int) -> meta_pb2.FileLock:
    out = meta_pb2.FileLock()
    out.CopyFrom(lock)
    out.start, out.end = start, end
    return out


def apply(locks: list[meta_pb2.FileLock], wanted: meta_pb2.FileLock) -> list[meta_pb2.FileLock]:
    """The locks after ``wanted`` is set for its owner (the caller found no conflict)."""
    others = [held for held in locks if not same_owner(held, wanted)]
    mine: list[meta_pb2.FileLock] = []
    for held in locks:
        if not same_owner(held, wanted):
            continue
        if not _overlap(held, wanted):
            mine.append(_piece(held, held.start, held.end))
            continue
        if held.start < wanted.start:
            mine.append(_piece(held, held.start, wanted.start - 1))
        if held.end > wanted.end:
            mine.append(_piece(held, wanted.end + 1, held.end))
    if wanted.type != meta_pb2.LOCK_UNLOCK:
        mine.append(_piece(wanted, wanted.start, wanted.end))
    mine.sort(key=lambda lock: lock.start)
    merged: list[meta_pb2.FileLock] = []
    for lock in mine:
        last = merged[-1] if merged else None
        if last is not None and last.type == lock.type and lock.start <= last.end + 1:
            last.end = max(last.end, lock.end)
            if _overlap(lock, wanted):
                last.pid = wanted.pid
            continue
        merged.append(lock)
    return others + merged


def held_by(locks: list[meta_pb2.FileLock], lease_id: int) -> bool:
    """True when any of ``locks`` is held under the lease ``lease_id``."""
    return any(lock.lease_id == lease_id for lock in locks)


def without_lease(locks: list[meta_pb2.FileLock], lease_id: int) -> list[meta_pb2.FileLock]:
    """``locks`` less every lock held under the lease ``lease_id``."""
    return [lock for lock in locks if lock.lease_id != lease_id]
