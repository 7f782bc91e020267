"""Inode counts by type in a store that several metaservers share.

A metaserver that owns its store counts inodes once at start and then keeps
the count in memory (:class:`~emberfs.metaserver.fs.namespace.Namespace`). That
cannot hold when other metaservers create and remove files in the same store,
and one stored counter would make every create conflict with every other.
So on a shared store the counts live in :data:`SHARDS` counter records
(``CONF`` ``inode_counts.NNN``: files, directories, symlinks as three
little-endian i64), and every transaction that creates or drops inodes adds
its changes to one shard of its own choosing, at random, in the same
commit: the count is exact and durable with the operation, and two
concurrent operations conflict over it only when they picked the same shard.
"""

from __future__ import annotations

import random
import struct

from emberfs.metaserver.fs import records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine, Transaction
from emberfs.proto import common_pb2

SHARDS = 256
TYPES = (common_pb2.FILE, common_pb2.DIRECTORY, common_pb2.SYMLINK)
_FORMAT = struct.Struct("<qqq")


def shard_key(shard: int) -> bytes:
    return keys.config_key(f"{keys.INODE_COUNTS}{shard:03d}")


def pick_shard() -> int:
    """The shard an operation adds its changes to."""
    return random.randrange(SHARDS)


def _decode(raw: bytes | None) -> list[int]:
    return [0, 0, 0] if raw is None else list(_FORMAT.unpack(raw))


def add(txn: Transaction, shard: int, delta: dict[int, int]) -> None:
    """Add ``delta`` (file type -> inodes added, negative for dropped) to one shard in ``txn``."""
    if not any(delta.values()):
        return
    key = shard_key(shard)
    values = _decode(txn.get(key))
    for i, file_type in enumerate(TYPES):
        values[i] += delta.get(file_type, 0)
    txn.put(key, _FORMAT.pack(*values))


def totals(engine: KVEngine) -> dict[int, int]:
    """File type -> inodes, summed over every shard (one range read)."""
    sums = [0, 0, 0]
    for _, raw in engine.scan_prefix(keys.config_key(keys.INODE_COUNTS)):
        for i, n in enumerate(_decode(raw)):
            sums[i] += n
    return dict(zip(TYPES, sums, strict=True))


def recount(engine: KVEngine) -> dict[int, int]:
    """Count every inode of the store and write the result as the shards (the others zeroed).

    For a store whose counts are missing or wrong: one imported from
    another engine (``emberfs migrate``). Not atomic with operations running
    meanwhile: run it while no metaserver serves the store.
    """
    counts = dict.fromkeys(TYPES, 0)
    for _, raw in engine.scan_prefix(keys.INODE):
        file_type = records.decode_inode(raw).type
        if file_type in counts:
            counts[file_type] += 1
    prefix = keys.config_key(keys.INODE_COUNTS)
    stale = {k for k, _ in engine.scan_prefix(prefix)} - {shard_key(0)}
    for key in sorted(stale):
        engine.write({}, {key})
    engine.write({shard_key(0): _FORMAT.pack(*(counts[t] for t in TYPES))})
    return counts
