"""The index of the KV cache block store: which slot of which slab holds a key's block.

A KV cache (:mod:`emberfs.kvcache`) is a directory of slab files, made and sized by the
client, whose blocks sit at fixed slots; this module keeps the index from keys to slots in the
metadata store, so every inference server that opens the cache shares it, and changes it in
batches (one transaction per call, or per :attr:`KVIndex.per_txn` keys on a store with
transaction limits). Slabs are written without write sessions: making a cache marks them
``unversioned`` so that no client's disk cache keeps their bytes.

An entry is ``key -> (slot, generation, crc, length, stamp, state)``:

* a **reservation** (``Reserve``) hands the writer a slot for each new key,
  with a generation no other reservation of that key had, and records the
  entry as *pending*; the writer writes the block there, then **commits** it
  (``Commit``) with the CRC32C of its bytes, and only then do readers find
  it. A key stored, or pending for another call, is not reserved again: the
  first writer wins. A retried reservation (the same client and request id)
  gets its own pending entries back, and a retried commit finds its entries
  committed, so both are idempotent without a request table. A pending entry
  whose writer went away is taken over after :data:`~.entries.PENDING_TIMEOUT_NS`.
* a **lookup** (``Lookup``) returns each key's slot, generation and CRC; the reader checks the
  CRC of the bytes it read, so a slot reused for another key while it read (evicted, then
  written) is a miss, never another key's block.
* **slots** come from the slots given back, the writer's own slab, slabs with slots never
  handed out, then the least recently used entries, evicted (:mod:`.slots`).

A cache whose directory is removed leaves its index behind; the leader's
sweep (:meth:`KVIndex.sweep_removed`) deletes it a slice at a time.

Counters (hits, misses, bytes, evictions, blocks stored) live in :data:`~.entries.STAT_SHARDS`
keys per cache, one picked at random per transaction, so concurrent calls rarely conflict on them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

from emberfs.common import kvgeometry
from emberfs.common.errors import (
    AlreadyExists,
    InvalidArgument,
    NotADirectory,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from emberfs.common.kvgeometry import slab_bytes, slab_capacity, slab_count
from emberfs.metaserver.fs import access, dataversion, records
from emberfs.metaserver.fs.opcontext import Credentials
from emberfs.metaserver.kvcache.entries import (
    MAX_BATCH,
    PENDING,
    PENDING_TIMEOUT_NS,
    STORED,
    U64,
    Counters,
    Entry,
    Reserved,
    cache_key,
    cache_prefixes,
    check_keys,
    count,
    entry_prefix,
    fill_key,
    free_prefix,
    recent_key,
    stats_prefix,
    total,
    u64,
)
from emberfs.metaserver.kvcache.slots import take_slots
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict, KVEngine, Transaction, prefix_end
from emberfs.metaserver.store.kv import run_transaction as _run_transaction
from emberfs.proto import common_pb2, kvcache_pb2

MAX_LIST = 10000
TOUCH_INTERVAL_NS = 10**9  # a read refreshes an entry's recency at most this often
SLICE = 200  # keys one transaction of clear removes


class KVIndex:
    """The KV caches' index over the metadata store.

    Parameters
    ----------
    engine : KVEngine
    clock : callable, optional
        Wall-clock nanoseconds (default ``time.time_ns``): stamps and timeouts.

    Every method takes the caller's :class:`~emberfs.metaserver.fs.opcontext.Credentials`
    and checks them against the cache directory: reads need read permission
    on it, changes write permission.
    """

    def __init__(self, engine: KVEngine, clock: Callable[[], int] = time.time_ns) -> None:
        self.engine = engine
        self.clock = clock
        # a transaction of a store with limits takes this many keys of a call
        self.per_txn = max(1, engine.max_txn_ops // 8) if engine.max_txn_ops else MAX_BATCH
        self._records: dict[int, kvcache_pb2.KvCacheRecord] = {}
        self._infos: dict[int, kvcache_pb2.KvCacheInfo] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self._last_gen = 0

    # caches -----------------------------------------------------------------------------------
    def _record(self, txn: Transaction, cache: int) -> kvcache_pb2.KvCacheRecord:
        rec = self._records.get(cache)
        if rec is None:
            raw = txn.get(cache_key(cache))
            if raw is None:
                raise NotFound(f"no KV cache {cache}")
            rec = kvcache_pb2.KvCacheRecord.FromString(raw)
            self._records[cache] = rec  # a record never changes once made
        return rec

    def _check(self, txn: Transaction, cache: int, creds: Credentials, want: int) -> None:
        raw = txn.get(keys.inode_key(cache))
        if raw is None:
            raise NotFound(f"the directory of KV cache {cache} is gone")
        access.check(records.decode_inode(raw), creds, want, "KV cache directory")

    def _begin(
        self, txn: Transaction, cache: int, creds: Credentials, want: int
    ) -> kvcache_pb2.KvCacheRecord:
        self._check(txn, cache, creds, want)
        return self._record(txn, cache)

    def create(
        self,
        creds: Credentials,
        directory: common_pb2.InodeAttr,
        geometry: kvcache_pb2.KvGeometry,
        slabs: Sequence[int],
        path: str = "",
    ) -> kvcache_pb2.KvCacheRecord:
        """Make ``directory`` a KV cache over the slab files ``slabs`` (a retry gets it again).

        Each slab must be a file the caller may write, with the geometry's
        chunk size and at least the bytes its slots span.
        """
        try:
            kvgeometry.check(geometry)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if directory.type != common_pb2.DIRECTORY:
            raise NotADirectory("a KV cache is a directory")
        access.check(directory, creds, access.WRITE, "KV cache directory")
        if len(slabs) != slab_count(geometry):
            raise InvalidArgument(f"{slab_count(geometry)} slab files expected, not {len(slabs)}")
        if len(set(slabs)) != len(slabs):
            raise InvalidArgument("a slab file is named twice")
        for start in range(0, len(slabs), self.per_txn):
            part = list(enumerate(slabs))[start : start + self.per_txn]
            run_transaction(
                self.engine, lambda txn, part=part: self._check_slabs(txn, creds, geometry, part)
            )
        record = kvcache_pb2.KvCacheRecord(
            cache_id=directory.inode,
            geometry=geometry,
            slabs=slabs,
            created_ns=self.clock(),
            path=path,
        )

        def attempt(txn: Transaction) -> kvcache_pb2.KvCacheRecord:
            if txn.get(keys.inode_key(directory.inode)) is None:
                raise NotFound("the cache directory is gone")
            raw = txn.get(cache_key(directory.inode))
            if raw is not None:
                old = kvcache_pb2.KvCacheRecord.FromString(raw)
                if old.geometry == geometry and list(old.slabs) == list(slabs):
                    return old
                raise AlreadyExists("the directory is a KV cache already")
            txn.put(cache_key(directory.inode), record.SerializeToString())
            return record

        return run_transaction(self.engine, attempt)

    @staticmethod
    def _check_slabs(txn, creds, geometry, part) -> None:
        for n, inode in part:
            raw = txn.get(keys.inode_key(inode))
            if raw is None:
                raise NotFound(f"slab file {inode} does not exist")
            attr = records.decode_inode(raw)
            if attr.type != common_pb2.FILE:
                raise InvalidArgument(f"slab {inode} is not a file")
            access.check(attr, creds, access.WRITE | access.READ, f"slab file {inode}")
            if attr.layout.chunk_size != geometry.chunk_size:
                raise InvalidArgument(f"slab {inode} has chunks of {attr.layout.chunk_size} bytes")
            if attr.size < slab_bytes(geometry, slab_capacity(geometry, n)):
                raise InvalidArgument(f"slab {inode} is shorter than its slots")
            if dataversion.mark_unversioned(attr):
                txn.put(keys.inode_key(inode), records.encode_inode(attr))

    def open(
        self, creds: Credentials, directory: common_pb2.InodeAttr, path: str
    ) -> kvcache_pb2.KvCacheInfo:
        """The cache whose directory is ``directory`` (found at ``path``): geometry, slabs, chains."""
        if directory.type != common_pb2.DIRECTORY:
            raise NotADirectory("not a KV cache directory")
        access.check(directory, creds, access.READ, path)
        cache = directory.inode
        if run_transaction(self.engine, lambda txn: txn.get(cache_key(cache))) is None:
            raise NotFound("not a KV cache")
        return self.info(cache, path)

    def _load_info(self, cache: int) -> kvcache_pb2.KvCacheInfo:
        rec = run_transaction(self.engine, lambda txn: self._record(txn, cache))
        info = kvcache_pb2.KvCacheInfo(cache_id=cache, geometry=rec.geometry)
        slabs = list(rec.slabs)
        for start in range(0, len(slabs), self.per_txn):
            part = slabs[start : start + self.per_txn]

            def read(txn: Transaction, part=part) -> list[common_pb2.InodeAttr]:
                out = []
                for inode in part:
                    raw = txn.get(keys.inode_key(inode))
                    if raw is None:
                        raise NotFound(f"slab file {inode} of KV cache {cache} is gone")
                    out.append(records.decode_inode(raw))
                return out

            for attr in run_transaction(self.engine, read):
                info.slabs.add(inode=attr.inode, chains=attr.layout.chains)
        self._infos[cache] = info  # slab files and their chains never change
        return info

    def info(self, cache: int, path: str | None = None) -> kvcache_pb2.KvCacheInfo:
        """The cache's geometry and slabs, named ``path`` (default: its path as it was made)."""
        info = self._infos.get(cache) or self._load_info(cache)
        out = kvcache_pb2.KvCacheInfo()
        out.CopyFrom(info)
        out.path = self._records[cache].path if path is None else path
        return out

    def totals(self) -> list[tuple[kvcache_pb2.KvCacheRecord, Counters]]:
        """Every cache's record and counters (for the metrics); removed caches left out."""
        out = []
        for _, raw in self.engine.scan_prefix(keys.KV_CACHE):
            rec = kvcache_pb2.KvCacheRecord.FromString(raw)
            if self.engine.get(keys.inode_key(rec.cache_id)) is None:
                continue  # removed; the sweep deletes its index
            out.append((rec, total(self.engine.scan_prefix(stats_prefix(rec.cache_id)))))
        return out

    def slab_of(self, cache: int, slot: int) -> int:
        """The inode of the slab file that holds ``slot``."""
        rec = self._records[cache]
        return rec.slabs[slot // rec.geometry.slab_slots]

    # reads ------------------------------------------------------------------------------------
    def lookup(
        self,
        creds: Credentials,
        cache: int,
        key_list: Sequence[bytes],
        *,
        prefix: bool = False,
        touch: bool = False,
    ) -> list[Entry | None]:
        """Each key's stored entry, or None (``prefix``: up to the first missing key).

        ``touch`` marks the call as a read: entries read become the most
        recently used, and hits and misses are counted.
        """
        check_keys(key_list)
        out: list[Entry | None] = []
        for part in self._parts(key_list):

            def attempt(txn: Transaction, part=part) -> tuple[list, bool]:
                self._begin(txn, cache, creds, access.READ)
                txn.prefetch([entry_prefix(cache) + k for k in part])
                now = self.clock()
                found: list[Entry | None] = []
                delta = Counters()
                for k in part:
                    raw = txn.get(entry_prefix(cache) + k)
                    e = Entry.decode(raw) if raw is not None else None
                    if e is not None and e.state != STORED:
                        e = None
                    found.append(e)
                    if touch:
                        if e is None:
                            delta.misses += 1
                        else:
                            delta.hits += 1
                            delta.hit_bytes += e.length
                            if now - e.stamp >= TOUCH_INTERVAL_NS:
                                self._restamp(txn, cache, k, e, now)
                    if e is None and prefix:
                        return found, True
                count(txn, cache, delta)
                return found, False

            found, stop = run_transaction(self.engine, attempt, sync=False)
            out.extend(found)
            if stop:
                break
        return out

    def list(self, creds: Credentials, cache: int, start_after: bytes, limit: int):
        """Up to ``limit`` stored keys after ``start_after``, in key order; and whether more are."""
        limit = min(max(1, limit or 1000), MAX_LIST)

        def attempt(txn: Transaction) -> tuple[list[bytes], bool]:
            self._begin(txn, cache, creds, access.READ)
            base = entry_prefix(cache)
            start = base + start_after + b"\x00" if start_after else base
            got: list[bytes] = []
            for k, raw in self.engine.scan(start, prefix_end(base)):
                if Entry.decode(raw).state == STORED:
                    if len(got) == limit:
                        return got, True
                    got.append(k[len(base) :])
            return got, False

        return run_transaction(self.engine, attempt)

    def stats(self, creds: Credentials, cache: int) -> tuple[Counters, int]:
        """The cache's counters and how many slabs writers have started."""

        def attempt(txn: Transaction) -> tuple[Counters, int]:
            self._begin(txn, cache, creds, access.READ)
            return total(txn.scan_prefix(stats_prefix(cache))), u64(txn.get(fill_key(cache)))

        return run_transaction(self.engine, attempt)

    # writes -----------------------------------------------------------------------------------
    def reserve(
        self,
        creds: Credentials,
        writer: str,
        request: int,
        cache: int,
        key_list: Sequence[bytes],
        lengths: Sequence[int],
    ) -> list[Reserved]:
        """A slot for each new key (see the module's description); one :class:`~.entries.Reserved` per key.

        ``writer`` is the client id (whose slab fresh slots come from),
        ``request`` the id of the call: a retry of it gets its reservations back.
        """
        check_keys(key_list)
        if len(lengths) != len(key_list):
            raise InvalidArgument("one length per key")
        if not writer:
            raise InvalidArgument("a reservation needs the writer's client id")
        out: list[Reserved] = []
        with self._cache_lock(cache):
            for start in range(0, len(key_list), self.per_txn):
                part = key_list[start : start + self.per_txn]
                sizes = lengths[start : start + self.per_txn]
                out.extend(
                    run_transaction(
                        self.engine,
                        lambda txn, part=part, sizes=sizes: self._reserve(
                            txn, creds, writer, request, cache, part, sizes
                        ),
                        sync=False,
                    )
                )
        return out

    def _reserve(self, txn, creds, writer, request, cache, part, sizes) -> list[Reserved]:
        rec = self._begin(txn, cache, creds, access.WRITE)
        g = rec.geometry
        base = entry_prefix(cache)
        txn.prefetch([base + k for k in part])
        now = self.clock()
        out: list[Reserved | None] = []
        new: list[int] = []  # indexes into part of keys that need a slot
        reuse: dict[int, int] = {}  # index -> slot of a lapsed reservation taken over
        seen: set[bytes] = set()
        for i, (k, size) in enumerate(zip(part, sizes, strict=True)):
            if not 0 < size <= g.block_size:
                raise InvalidArgument(f"a block of {size} bytes (the cache's are {g.block_size})")
            raw = txn.get(base + k)
            if k in seen:
                out.append(Reserved(kvcache_pb2.KV_BUSY))
                continue
            seen.add(k)
            if raw is None:
                out.append(None)
                new.append(i)
                continue
            e = Entry.decode(raw)
            if e.state == STORED:
                out.append(Reserved(kvcache_pb2.KV_EXISTS))
            elif e.owner == writer and e.request == request:  # this call, retried
                out.append(Reserved(kvcache_pb2.KV_RESERVED, e.slot, e.generation))
            elif now - e.stamp >= PENDING_TIMEOUT_NS:  # its writer went away
                txn.delete(recent_key(cache, e.stamp, k))
                out.append(None)
                new.append(i)
                reuse[i] = e.slot
            else:
                out.append(Reserved(kvcache_pb2.KV_BUSY))
        wanted = len(new) - len(reuse)
        slots = (
            take_slots(txn, cache, g, writer, wanted, now, self.engine.max_txn_ops)
            if wanted > 0
            else []
        )
        it = iter(slots)
        for i in new:
            slot = reuse.get(i)
            if slot is None:
                slot = next(it, None)
            if slot is None:
                out[i] = Reserved(kvcache_pb2.KV_FULL)
                continue
            gen = self._generation()
            e = Entry(slot, gen, 0, sizes[i], now, PENDING, writer, request)
            txn.put(base + part[i], e.encode())
            txn.put(recent_key(cache, now, part[i]), b"")
            out[i] = Reserved(kvcache_pb2.KV_RESERVED, slot, gen)
        return out  # type: ignore[return-value]

    def commit(self, creds: Credentials, writer: str, cache: int, items) -> list[bool]:
        """Store (or give back) reserved blocks; per item whether its key now holds that block."""
        if len(items) > MAX_BATCH:
            raise InvalidArgument(f"more than {MAX_BATCH} items in one call")
        check_keys([it.key for it in items])
        out: list[bool] = []
        for start in range(0, len(items), self.per_txn):
            part = items[start : start + self.per_txn]
            out.extend(
                run_transaction(
                    self.engine,
                    lambda txn, part=part: self._commit(txn, creds, writer, cache, part),
                )
            )
        return out

    def _commit(self, txn, creds, writer, cache, part) -> list[bool]:
        self._begin(txn, cache, creds, access.WRITE)
        base = entry_prefix(cache)
        txn.prefetch([base + it.key for it in part])
        now = self.clock()
        delta = Counters()
        out = []
        for it in part:
            raw = txn.get(base + it.key)
            e = Entry.decode(raw) if raw is not None else None
            if e is None or e.generation != it.generation:
                out.append(False)  # lapsed and taken over, evicted, or deleted meanwhile
                continue
            if e.state == STORED:
                out.append(it.written)  # a retried commit
                continue
            if e.owner != writer:
                raise PermissionDenied("another writer holds this reservation")
            txn.delete(recent_key(cache, e.stamp, it.key))
            if not it.written:
                txn.delete(base + it.key)
                txn.put(free_prefix(cache) + U64.pack(e.slot), b"")
                out.append(False)
                continue
            stored = Entry(e.slot, e.generation, it.crc, e.length, now, STORED)
            txn.put(base + it.key, stored.encode())
            txn.put(recent_key(cache, now, it.key), b"")
            delta.puts += 1
            delta.put_bytes += e.length
            delta.blocks += 1
            delta.bytes += e.length
            out.append(True)
        count(txn, cache, delta)
        return out

    def delete(
        self,
        creds: Credentials,
        cache: int,
        key_list: Sequence[bytes],
        generations: Sequence[int] = (),
    ) -> int:
        """Remove keys (stored or reserved); their slots are given back. How many were stored.

        With ``generations`` (one per key) a key goes only while it still
        has that generation: a reader drops the block it found damaged
        without dropping a newer block stored under the key meanwhile.
        """
        check_keys(key_list)
        if generations and len(generations) != len(key_list):
            raise InvalidArgument("one generation per key")
        gens = list(generations) or [0] * len(key_list)
        total = 0
        for start in range(0, len(key_list), self.per_txn):
            part = list(zip(key_list, gens, strict=True))[start : start + self.per_txn]
            total += run_transaction(
                self.engine, lambda txn, part=part: self._delete(txn, creds, cache, part)
            )
        return total

    def _delete(self, txn, creds, cache, part) -> int:
        self._begin(txn, cache, creds, access.WRITE)
        base = entry_prefix(cache)
        txn.prefetch([base + k for k, _ in part])
        delta = Counters()
        for k, gen in part:
            raw = txn.get(base + k)
            if raw is None:
                continue
            e = Entry.decode(raw)
            if gen and e.generation != gen:
                continue
            txn.delete(base + k)
            txn.delete(recent_key(cache, e.stamp, k))
            txn.put(free_prefix(cache) + U64.pack(e.slot), b"")
            if e.state == STORED:
                delta.blocks -= 1
                delta.bytes -= e.length
        count(txn, cache, delta)
        return -delta.blocks

    def clear(self, creds: Credentials, cache: int) -> int:
        """Remove every key, a slice per transaction; how many stored blocks went."""
        total = 0
        while True:

            def attempt(txn: Transaction) -> list[bytes]:
                self._begin(txn, cache, creds, access.WRITE)
                base = entry_prefix(cache)
                return [
                    k[len(base) :] for k, _ in txn.scan_prefix(base, limit=min(SLICE, self.per_txn))
                ]

            got = run_transaction(self.engine, attempt)
            if not got:
                return total
            total += self.delete(creds, cache, got)

    def sweep_removed(self) -> int:
        """Delete the index of every cache whose directory is gone; how many keys went.

        Run periodically by the leading metaserver, a slice of keys per write.
        A cache's record goes last, so a sweep cut short resumes where it stopped.
        """
        removed = 0
        for _, raw in list(self.engine.scan_prefix(keys.KV_CACHE)):
            rec = kvcache_pb2.KvCacheRecord.FromString(raw)
            if self.engine.get(keys.inode_key(rec.cache_id)) is not None:
                continue
            while self.engine.get(cache_key(rec.cache_id)) is not None:
                removed += self._drop_slice(rec.cache_id)
        return removed

    def _drop_slice(self, cache: int) -> int:
        """Delete up to a slice of ``cache``'s index keys; the record once nothing else is left."""
        budget = min(SLICE, self.per_txn * 4)
        doomed: list[bytes] = []
        for prefix in cache_prefixes(cache):
            if len(doomed) >= budget:
                break
            doomed.extend(k for k, _ in self.engine.scan_prefix(prefix, limit=budget - len(doomed)))
        if not doomed:
            doomed = [cache_key(cache)]
            self._records.pop(cache, None)
            self._infos.pop(cache, None)
        for start in range(0, len(doomed), self.per_txn * 4):
            part = doomed[start : start + self.per_txn * 4]
            self.engine.write({}, set(part))
        return len(doomed)

    # helpers ----------------------------------------------------------------------------------
    def _parts(self, items: Sequence) -> Iterator[Sequence]:
        for start in range(0, len(items), self.per_txn):
            yield items[start : start + self.per_txn]

    def _cache_lock(self, cache: int) -> threading.Lock:
        with self._lock:
            lock = self._locks.get(cache)
            if lock is None:
                lock = self._locks[cache] = threading.Lock()
            return lock

    def _generation(self) -> int:
        with self._lock:
            gen = max(self._last_gen + 1, self.clock())
            self._last_gen = gen
            return gen

    def _restamp(self, txn: Transaction, cache: int, k: bytes, e: Entry, now: int) -> None:
        txn.delete(recent_key(cache, e.stamp, k))
        e.stamp = now
        txn.put(entry_prefix(cache) + k, e.encode())
        txn.put(recent_key(cache, now, k), b"")


def run_transaction(engine: KVEngine, fn, *, sync: bool = True):
    """:func:`~emberfs.metaserver.store.kv.run_transaction`; conflicts to the end are Unavailable."""
    try:
        return _run_transaction(engine, fn, sync=sync)
    except Conflict:
        raise Unavailable("the KV cache index is too busy; retry") from None
