"""What a store holds: the pairs a migration copies, streamed (:func:`pairs`), and their
count, size and digest per record type (:class:`Tally`), which a copy is checked against.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from emberfs.metaserver.fs import records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict, KVEngine
from emberfs.metaserver.store.migration.errors import (
    MigrationError,
)
from emberfs.proto import common_pb2

SCAN_RESUMES = 8  # times a pass over a store goes on after a conflict of its scan

EXCLUDED = (keys.LEADER, keys.config_key(keys.INODE_COUNTS))
_LENGTHS = struct.Struct(">QQ")


def copied(key: bytes) -> bool:
    """Whether ``key`` is copied: every key but the leader key and a shared store's inode counts."""
    return not key.startswith(EXCLUDED)


def pairs(engine: KVEngine) -> Iterator[tuple[bytes, bytes]]:
    """The copied pairs of ``engine``'s whole keyspace, in key order, streamed.

    An etcd scan whose revision a member cannot serve (its call moved to a
    member behind the one that fixed the revision, or the revision was
    compacted) is a :class:`~emberfs.metaserver.store.kv.Conflict`: the scan goes on
    after the last key it gave, at a new revision, up to :data:`SCAN_RESUMES`
    times. (No metaserver writes the stores meanwhile; were one to, the
    verification would see it.)
    """
    start = b""
    for attempt in range(SCAN_RESUMES + 1):
        try:
            for key, value in engine.scan(start, None):
                start = key + b"\x00"
                if copied(key):
                    yield key, value
            return
        except Conflict:
            if attempt == SCAN_RESUMES:
                raise


@dataclass
class Tally:
    """Keys, bytes, checksum and inodes by type of a stream of pairs (see the module docstring).

    Attributes
    ----------
    keys, bytes : int
        Pairs added, and the bytes of their keys and values.
    prefixes : dict
        Key prefix (its first 4 bytes) -> ``[keys, bytes]``.
    inodes : dict
        File type -> inode records (``INOD`` keys) of that type.
    largest : int
        Bytes of the largest pair (key and value).
    largest_key : bytes
        Its key.
    """

    keys: int = 0
    bytes: int = 0
    prefixes: dict[bytes, list[int]] = field(default_factory=dict)
    inodes: dict[int, int] = field(default_factory=dict)
    largest: int = 0
    largest_key: bytes = b""
    _hash: Any = field(default_factory=hashlib.sha256, repr=False)

    def add(self, key: bytes, value: bytes) -> None:
        size = len(key) + len(value)
        self._hash.update(_LENGTHS.pack(len(key), len(value)))
        self._hash.update(key)
        self._hash.update(value)
        self.keys += 1
        self.bytes += size
        if size > self.largest:
            self.largest, self.largest_key = size, key
        by_prefix = self.prefixes.setdefault(key[:4], [0, 0])
        by_prefix[0] += 1
        by_prefix[1] += size
        if key.startswith(keys.INODE):
            try:
                file_type = records.decode_inode(value).type
            except Exception as exc:
                raise MigrationError(
                    f"the inode record at key {key!r} cannot be read ({exc}); check the "
                    "store with 'emberfs fsck' on the cluster before moving it"
                ) from None
            self.inodes[file_type] = self.inodes.get(file_type, 0) + 1

    @property
    def sha256(self) -> str:
        """The checksum of the pairs added so far (hex)."""
        return self._hash.hexdigest()

    def same(self, other: Tally) -> bool:
        """The same pairs: equal checksums, key and byte counts."""
        return (self.sha256, self.keys, self.bytes) == (other.sha256, other.keys, other.bytes)


def survey(engine: KVEngine) -> Tally:
    """The :class:`Tally` of ``engine``'s copied pairs (one streamed pass)."""
    tally = Tally()
    for key, value in pairs(engine):
        tally.add(key, value)
    return tally


def counts_text(by_type: dict[int, int]) -> str:
    """``N files, N directories, N symlinks`` of inodes by file type."""
    names = (
        (common_pb2.FILE, "files"),
        (common_pb2.DIRECTORY, "directories"),
        (common_pb2.SYMLINK, "symlinks"),
    )
    text = ", ".join(f"{by_type.get(t, 0)} {name}" for t, name in names)
    other = sum(n for t, n in by_type.items() if t not in dict(names))
    return text + (f", {other} others" if other else "")


def prefix_name(prefix: bytes) -> str:
    """A key prefix for people: its text when printable, else its repr."""
    try:
        text = prefix.decode("ascii")
    except UnicodeDecodeError:
        return repr(prefix)
    return text if text.isprintable() and text.strip() == text else repr(prefix)
