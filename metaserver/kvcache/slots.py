"""Where a reservation's slots come from.

Slots come from the slots given back (deletes, evictions), then from
the writer's own slab (each writer fills a slab of its own while untouched
slabs last, so writers rarely share a chunk: ``KVCW`` and ``KVCH``), then
from any slab with slots never handed out, then, when every slot is in use, from
the least recently used entries, evicted (``KVCR`` orders entries by the
time they were stored or last read, refreshed at most every
:data:`~emberfs.metaserver.kvcache.index.TOUCH_INTERVAL_NS` per key). The cache never holds more than its
``capacity_slots`` blocks, so its slabs never grow past their size.
"""

from __future__ import annotations

from emberfs.common.kvgeometry import slab_capacity, slab_count
from emberfs.metaserver.kvcache.entries import (
    PENDING_TIMEOUT_NS,
    STORED,
    U64,
    Counters,
    Entry,
    count,
    entry_prefix,
    fill_key,
    filled_key,
    free_prefix,
    recent_prefix,
    u64,
    writer_key,
)

EVICT_MARGIN = 8  # reads an eviction leaves a transaction of a store with limits


def take_slots(txn, cache, g, writer, n, now, max_txn_ops) -> list[int]:
    """``n`` slots (fewer when the cache has no more): given back, fresh, then evicted."""
    slots: list[int] = []
    fp = free_prefix(cache)
    for k, _ in list(txn.scan_prefix(fp, limit=n)):
        if txn.get(k) is None:  # in the read set: two writers never take one slot
            continue
        txn.delete(k)
        slots.append(U64.unpack(k[len(fp) :])[0])
    if len(slots) < n:
        slots.extend(fresh_slots(txn, cache, g, writer, n - len(slots)))
    if len(slots) < n:
        slots.extend(evict(txn, cache, n - len(slots), now, max_txn_ops))
    return slots


def fresh_slots(txn, cache, g, writer, n) -> list[int]:
    """Slots never handed out: the writer's slab, untouched slabs, then any slab with room."""
    if txn.get(filled_key(cache)) is not None:
        return []  # every slot was handed out once; they come back through the free list
    out: list[int] = []
    wkey = writer_key(cache, writer)
    raw = txn.get(wkey)
    slab = None if raw is None else u64(raw)
    while len(out) < n:
        if slab is None:
            nxt = u64(txn.get(fill_key(cache)))
            if nxt >= slab_count(g):
                break
            slab = nxt
            txn.put(fill_key(cache), U64.pack(nxt + 1))
            txn.put(wkey, U64.pack(slab))
        out.extend(fill_slab(txn, cache, g, slab, n - len(out)))
        if len(out) < n:
            slab = None  # this one is full: the next untouched one
    if len(out) < n:
        # Every slab is started: take what is left of others' slabs (writers
        # that went away leave theirs part filled).
        fp = fill_key(cache)
        for k, _ in list(txn.scan_prefix(fp)):
            if len(k) == len(fp) + 8:
                slab = U64.unpack(k[len(fp) :])[0]
                got = fill_slab(txn, cache, g, slab, n - len(out))
                if got:
                    out.extend(got)
                    txn.put(wkey, U64.pack(slab))  # where this writer goes on
                if len(out) == n:
                    break
        else:
            txn.put(filled_key(cache), b"")
    return out


def fill_slab(txn, cache, g, slab, n) -> list[int]:
    """Up to ``n`` slots of ``slab`` never handed out (its fill count moved past them)."""
    fk = fill_key(cache, slab)
    used = u64(txn.get(fk))
    take = min(slab_capacity(g, slab) - used, n)
    if take <= 0:
        return []
    txn.put(fk, U64.pack(used + take))
    first = slab * g.slab_slots + used
    return list(range(first, first + take))


def evict(txn, cache, n, now, max_txn_ops) -> list[int]:
    """Slots of the ``n`` least recently used entries (stored, or reservations lapsed).

    Entries being written are passed over; the scan goes on past them as
    far as a transaction of the store may read.
    """
    out: list[int] = []
    rp = recent_prefix(cache)
    base = entry_prefix(cache)
    delta = Counters()
    limit = max_txn_ops
    budget = None if limit is None else limit - txn.size[0] - EVICT_MARGIN
    after = None
    while len(out) < n and (budget is None or budget > 0):
        want = 4 * (n - len(out)) + 16
        page = list(txn.scan_prefix(rp, start_after=after, limit=min(want, budget or want)))
        if not page:
            break
        after = page[-1][0]
        for rk, _ in page:
            if len(out) == n:
                break
            k = rk[len(rp) + 8 :]
            raw = txn.get(base + k)
            if budget is not None:
                budget -= 1
            if raw is None:
                txn.delete(rk)  # left by an interrupted clear
                continue
            e = Entry.decode(raw)
            if e.state != STORED and now - e.stamp < PENDING_TIMEOUT_NS:
                continue  # being written
            if e.state == STORED:
                delta.evictions += 1
                delta.blocks -= 1
                delta.bytes -= e.length
            txn.delete(rk)
            txn.delete(base + k)
            out.append(e.slot)
    count(txn, cache, delta)
    return out
