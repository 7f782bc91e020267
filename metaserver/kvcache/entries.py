"""What the KV cache index stores: a key's entry (:class:`Entry`: slot, generation, CRC32C,
length, stamp, state), a cache's counters (:class:`Counters`, kept in :data:`STAT_SHARDS` shards
per cache so that concurrent calls rarely conflict on them), and the keys of both.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from emberfs.common.errors import InvalidArgument
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Transaction

MAX_KEY = 512  # bytes of one key
MAX_BATCH = 10000  # keys of one call
PENDING, STORED = 0, 1
PENDING_TIMEOUT_NS = 120 * 10**9  # a reservation not committed for this long is taken over
STAT_SHARDS = 16

U64 = struct.Struct(">Q")
# slot, generation, crc, length, stamp, state, the reserving call's request id; then the owner
ENTRY = struct.Struct("<QQIQQBQ")
COUNTERS = struct.Struct("<8q")
COUNTER_NAMES = (
    "hits",
    "misses",
    "hit_bytes",
    "puts",
    "put_bytes",
    "evictions",
    "blocks",
    "bytes",
)


@dataclass
class Entry:
    """One key's place in the cache."""

    slot: int
    generation: int
    crc: int
    length: int
    stamp: int  # ns: when stored, reserved or last read (its KVCR key)
    state: int
    owner: str = ""  # the client id of a pending entry's writer
    request: int = 0  # the request id of the call that reserved a pending entry

    def encode(self) -> bytes:
        head = ENTRY.pack(
            self.slot,
            self.generation,
            self.crc,
            self.length,
            self.stamp,
            self.state,
            self.request,
        )
        return head + self.owner.encode("utf-8", "surrogateescape")

    @classmethod
    def decode(cls, raw: bytes) -> Entry:
        slot, gen, crc, length, stamp, state, request = ENTRY.unpack_from(raw)
        owner = raw[ENTRY.size :].decode("utf-8", "surrogateescape")
        return cls(slot, gen, crc, length, stamp, state, owner, request)


class Counters:
    """The counters of one cache, summed over its shards (or one shard's changes)."""

    __slots__ = COUNTER_NAMES

    def __init__(self, values: Sequence[int] = (0,) * len(COUNTER_NAMES)) -> None:
        for name, value in zip(COUNTER_NAMES, values, strict=True):
            setattr(self, name, value)

    def values(self) -> tuple[int, ...]:
        return tuple(getattr(self, n) for n in COUNTER_NAMES)

    def __bool__(self) -> bool:
        return any(self.values())

    def add(self, other: Counters) -> None:
        for name in COUNTER_NAMES:
            setattr(self, name, getattr(self, name) + getattr(other, name))


# keys ---------------------------------------------------------------------------------------
def cache_key(cache: int) -> bytes:
    return keys.KV_CACHE + U64.pack(cache)


def entry_prefix(cache: int) -> bytes:
    return keys.KV_ENTRY + U64.pack(cache)


def recent_prefix(cache: int) -> bytes:
    return keys.KV_RECENT + U64.pack(cache)


def recent_key(cache: int, stamp: int, key: bytes) -> bytes:
    return recent_prefix(cache) + U64.pack(stamp) + key


def free_prefix(cache: int) -> bytes:
    return keys.KV_FREE + U64.pack(cache)


def fill_key(cache: int, slab: int | None = None) -> bytes:
    base = keys.KV_FILL + U64.pack(cache)
    return base if slab is None else base + U64.pack(slab)


def filled_key(cache: int) -> bytes:
    """Present once every slot of the cache has been handed out."""
    return keys.KV_FILL + U64.pack(cache) + b"F"


def writer_key(cache: int, client_id: str) -> bytes:
    return keys.KV_WRITER + U64.pack(cache) + client_id.encode("utf-8", "surrogateescape")


def stats_prefix(cache: int) -> bytes:
    return keys.KV_STATS + U64.pack(cache)


def stats_key(cache: int, shard: int) -> bytes:
    return stats_prefix(cache) + bytes([shard])


def total(shards) -> Counters:
    """The counters of a cache: the sum of its shards' ``(key, value)`` pairs."""
    total = Counters()
    for _, raw in shards:
        total.add(Counters(COUNTERS.unpack(raw)))
    return total


def u64(raw: bytes | None) -> int:
    return 0 if raw is None else U64.unpack(raw)[0]


def count(txn: Transaction, cache: int, delta: Counters) -> None:
    """Add ``delta`` to one of ``cache``'s counter shards, picked at random."""
    if not delta:
        return
    key = stats_key(cache, random.randrange(STAT_SHARDS))
    raw = txn.get(key)
    now = Counters(COUNTERS.unpack(raw)) if raw is not None else Counters()
    now.add(delta)
    txn.put(key, COUNTERS.pack(*now.values()))


def cache_prefixes(cache: int) -> tuple[bytes, ...]:
    """Every key prefix of one cache's index but its record."""
    c = U64.pack(cache)
    return tuple(
        p + c
        for p in (
            keys.KV_ENTRY,
            keys.KV_RECENT,
            keys.KV_FREE,
            keys.KV_FILL,
            keys.KV_WRITER,
            keys.KV_STATS,
        )
    )


@dataclass
class Reserved:
    """What a reservation gave each key: a state, and the slot and generation of a new one."""

    state: int
    slot: int = 0
    generation: int = 0


def check_keys(key_list: Sequence[bytes]) -> None:
    if len(key_list) > MAX_BATCH:
        raise InvalidArgument(f"more than {MAX_BATCH} keys in one call")
    for k in key_list:
        if not k:
            raise InvalidArgument("an empty key")
        if len(k) > MAX_KEY:
            raise InvalidArgument(f"a key of {len(k)} bytes (at most {MAX_KEY})")
