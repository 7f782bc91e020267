"""How namespace records are stored in the metadata keyspace.

Keys come from :mod:`emberfs.metaserver.store.keys`; this module fixes the values:

- ``INOD`` + inode id: a serialized :class:`common_pb2.InodeAttr`.
- ``DENT`` + parent id + name: :data:`DENTRY_FORMAT`, the child's inode id and
  its :class:`common_pb2.FileType` (so a walk knows a child's type before
  loading it).
- ``DENT`` + parent id with an empty name: the directory's *entry guard*
  (see below). Names are never empty and never start with NUL, so this key
  sorts before every entry of the directory and listings skip it by starting
  after ``prefix + b"\\x00"``.
- ``XATR`` + inode id: the inode's extended attributes, :func:`encode_xattrs`
  (absent when it has none; deleted with the inode).
- ``SESS`` + inode id + session id: :data:`SESSION_FORMAT` (opened-at time,
  last-renewed time) followed by the UTF-8 client id.
- ``SESS`` + inode id alone: the file's *session guard*.
- ``IDEM`` + client id + request id: :data:`IDEMPOTENT_FORMAT` (stored-at
  time, method name length) + method name + serialized response.
- ``CUTS`` + inode id: :data:`CUT_FORMAT`, a shrinking truncation's length and
  the request id its chunk cut is sent with (see :mod:`emberfs.metaserver.fs.cuts`).
- ``CONF`` + counter name: a little-endian u64 (:func:`encode_counter`).

Guards make range checks safe under optimistic transactions, which track
point reads but not scans. Every operation that adds an entry to a directory
writes a fresh random value to the directory's entry guard *without reading
it*, so concurrent creates in one directory never conflict with each other;
every operation that depends on a directory being empty (rmdir, rename over
a directory, a recursive remove) reads the guard, so a concurrent create
makes it retry. Session guards work the same way for "is this the last open
write session of the file".
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2

DENTRY_FORMAT = struct.Struct("<QB")
SESSION_FORMAT = struct.Struct("<qq")
IDEMPOTENT_FORMAT = struct.Struct("<qB")
CUT_FORMAT = struct.Struct("<QQ")
XATTR_FORMAT = struct.Struct("<BI")  # name length, value length
_U64_LE = struct.Struct("<Q")

ROOT_INODE = 1


def encode_inode(attr: common_pb2.InodeAttr) -> bytes:
    """The stored form of an inode."""
    return attr.SerializeToString(deterministic=True)


def decode_inode(raw: bytes) -> common_pb2.InodeAttr:
    """An inode from its stored form."""
    attr = common_pb2.InodeAttr()
    attr.ParseFromString(raw)
    return attr


@dataclass(frozen=True)
class Dentry:
    """A directory entry: the child's inode id and type."""

    inode: int
    type: int


def encode_dentry(inode: int, file_type: int) -> bytes:
    """The stored form of a directory entry."""
    return DENTRY_FORMAT.pack(inode, file_type)


def decode_dentry(raw: bytes) -> Dentry:
    """A directory entry from its stored form."""
    inode, file_type = DENTRY_FORMAT.unpack(raw)
    return Dentry(inode, file_type)


def encode_xattrs(xattrs: dict[str, bytes]) -> bytes:
    """The stored form of an inode's extended attributes: per name, in name order,
    :data:`XATTR_FORMAT` (name and value lengths), the UTF-8 name, the value."""
    out = bytearray()
    for name in sorted(xattrs):
        raw = name.encode("utf-8")
        value = xattrs[name]
        out += XATTR_FORMAT.pack(len(raw), len(value))
        out += raw
        out += value
    return bytes(out)


def decode_xattrs(raw: bytes | None) -> dict[str, bytes]:
    """An inode's extended attributes from their stored form (None: it has none)."""
    xattrs: dict[str, bytes] = {}
    pos = 0
    while raw and pos < len(raw):
        n, size = XATTR_FORMAT.unpack_from(raw, pos)
        pos += XATTR_FORMAT.size
        name = raw[pos : pos + n].decode("utf-8")
        xattrs[name] = raw[pos + n : pos + n + size]
        pos += n + size
    return xattrs


@dataclass(frozen=True)
class Session:
    """An open write session of a file: opened at ``since_ns``, lease renewed at ``renewed_ns``."""

    inode: int
    session_id: int
    client_id: str
    since_ns: int
    renewed_ns: int


def encode_session(client_id: str, since_ns: int, renewed_ns: int | None = None) -> bytes:
    """The stored form of a write session (the key holds inode and session ids).

    ``renewed_ns`` defaults to ``since_ns``: opening a session starts its lease.
    """
    if renewed_ns is None:
        renewed_ns = since_ns
    return SESSION_FORMAT.pack(since_ns, renewed_ns) + client_id.encode("utf-8", "surrogateescape")


def decode_session(key: bytes, raw: bytes) -> Session:
    """A write session from its key and stored value."""
    inode, session_id = keys.session_ids(key)
    since_ns, renewed_ns = SESSION_FORMAT.unpack_from(raw)
    client_id = raw[SESSION_FORMAT.size :].decode("utf-8", "surrogateescape")
    return Session(inode, session_id, client_id, since_ns, renewed_ns)


def new_guard_value() -> bytes:
    """A fresh value for a guard key, different from any earlier one."""
    return os.urandom(8)


@dataclass(frozen=True)
class IdempotentRecord:
    """The stored result of a mutating request."""

    method: str
    stored_ns: int
    response: bytes


def encode_idempotent(method: str, stored_ns: int, response: bytes) -> bytes:
    """The stored form of a request's result."""
    name = method.encode()
    return IDEMPOTENT_FORMAT.pack(stored_ns, len(name)) + name + response


def decode_idempotent(raw: bytes) -> IdempotentRecord:
    """A request's stored result."""
    stored_ns, n = IDEMPOTENT_FORMAT.unpack_from(raw)
    start = IDEMPOTENT_FORMAT.size
    method = raw[start : start + n].decode()
    return IdempotentRecord(method, stored_ns, raw[start + n :])


@dataclass(frozen=True)
class PendingCut:
    """A file's chunk cut that storage may not hold yet."""

    length: int
    request_id: int


def encode_cut(cut: PendingCut) -> bytes:
    return CUT_FORMAT.pack(cut.length, cut.request_id)


def decode_cut(raw: bytes) -> PendingCut:
    return PendingCut(*CUT_FORMAT.unpack(raw))


def encode_counter(value: int) -> bytes:
    """The stored form of a ``CONF`` counter."""
    return _U64_LE.pack(value)


def decode_counter(raw: bytes | None) -> int:
    """A ``CONF`` counter's value (0 when absent)."""
    return 0 if raw is None else _U64_LE.unpack(raw)[0]
