"""The KV cache index (kvindex) through its MetaService calls (kvservice), on each metadata engine."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emberfs.common import errors, kvgeometry
from emberfs.common.layout import MAX_STRIPE
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.kvcache import entries as index_entries
from emberfs.metaserver.kvcache.service import KVCacheCalls
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import common_pb2, kvcache_pb2, meta_pb2

ALICE = common_pb2.RequestContext(uid=1000, gid=1000, client_id="alice-1")
BOB = common_pb2.RequestContext(uid=1001, gid=1001, client_id="bob-1")
BLOCK = 256 * 1024  # four to a chunk of 1 MiB


class Clock:
    """Nanoseconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 10**18

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


class Harness:
    """A namespace with its KV cache calls, and requests made the way clients make them."""

    def __init__(self, engine) -> None:
        self.clock = Clock()
        self.ns = Namespace(engine, chain_table=lambda: [1, 2, 3], clock=self.clock)
        self.calls = KVCacheCalls(self.ns, keys=None, capability_ttl=60)
        self._ids = itertools.count(1)

    def ctx(self, base=ALICE, client_id: str | None = None, request_id: int | None = None):
        ctx = common_pb2.RequestContext()
        ctx.CopyFrom(base)
        if client_id is not None:
            ctx.client_id = client_id
        ctx.request_id = next(self._ids) if request_id is None else request_id
        return ctx

    def make(self, path="/kv", block=BLOCK, slots=16, slab_slots=4, mode=0o755, owner=ALICE):
        g = kvgeometry.plan(block, slots * block, slab_slots * block)
        self.ns.mkdir(meta_pb2.MkdirRequest(ctx=owner, path=path, mode=mode))
        layout = common_pb2.Layout(chunk_size=g.chunk_size, stripe=MAX_STRIPE)
        self.ns.set_layout(meta_pb2.SetLayoutRequest(ctx=owner, path=path, layout=layout))
        slabs = []
        for n in range(kvgeometry.slab_count(g)):
            p = f"{path}/slab-{n}"
            attr = self.ns.create(meta_pb2.CreateRequest(ctx=owner, path=p, mode=0o644)).attr
            length = kvgeometry.slab_bytes(g, kvgeometry.slab_capacity(g, n))
            self.ns.truncate(meta_pb2.TruncateRequest(ctx=owner, path=p, length=length))
            slabs.append(attr.inode)
        req = kvcache_pb2.KvCreateRequest(ctx=owner, path=path, geometry=g, slabs=slabs)
        return self.calls.create(req)

    def reserve(self, cache, keys, ctx=None, lengths=None):
        req = kvcache_pb2.KvReserveRequest(
            ctx=ctx or self.ctx(),
            cache_id=cache,
            keys=keys,
            lengths=lengths or [BLOCK] * len(keys),
        )
        return list(self.calls.reserve(req).reservations)

    def commit(self, cache, keys, reservations, ctx=None, written=True, crc=7):
        items = [
            kvcache_pb2.KvCommitItem(key=k, generation=r.generation, crc=crc, written=written)
            for k, r in zip(keys, reservations, strict=True)
        ]
        req = kvcache_pb2.KvCommitRequest(ctx=ctx or self.ctx(), cache_id=cache, items=items)
        return list(self.calls.commit(req).committed)

    def put(self, cache, keys, ctx=None):
        got = self.reserve(cache, keys, ctx)
        ok = [(k, r) for k, r in zip(keys, got, strict=True) if r.state == kvcache_pb2.KV_RESERVED]
        if ok:
            self.commit(cache, [k for k, _ in ok], [r for _, r in ok], ctx)
        return [r.state for r in got]

    def lookup(self, cache, keys, prefix=False, touch=False, ctx=None):
        req = kvcache_pb2.KvLookupRequest(
            ctx=ctx or self.ctx(), cache_id=cache, keys=keys, prefix=prefix, touch=touch
        )
        return self.calls.lookup(req)

    def stats(self, cache):
        return self.calls.stats(kvcache_pb2.KvStatsRequest(ctx=self.ctx(), cache_id=cache)).stats

    def entries(self, cache) -> dict[bytes, index_entries.Entry]:
        base = index_entries.entry_prefix(cache)
        return {
            k[len(base) :]: index_entries.Entry.decode(v)
            for k, v in self.ns.engine.scan_prefix(base)
        }


@pytest.fixture
def h(store):
    return Harness(store())


RESERVED, EXISTS, BUSY, FULL = (
    kvcache_pb2.KV_RESERVED,
    kvcache_pb2.KV_EXISTS,
    kvcache_pb2.KV_BUSY,
    kvcache_pb2.KV_FULL,
)


def test_create_checks_what_it_is_given(h):
    info = h.make()
    assert len(info.slabs) == 4 and all(len(s.chains) == 3 for s in info.slabs)
    assert info.geometry.capacity_slots == 16
    # a retry of the same create gets the same cache; another geometry is refused
    again = h.calls.open(kvcache_pb2.KvOpenRequest(ctx=ALICE, path="/kv"))
    assert again.cache_id == info.cache_id
    rec_slabs = [s.inode for s in info.slabs]
    with pytest.raises(errors.InvalidArgument):  # one slab missing
        h.calls.create(
            kvcache_pb2.KvCreateRequest(
                ctx=ALICE, path="/kv", geometry=info.geometry, slabs=rec_slabs[:3]
            )
        )
    g = kvcache_pb2.KvGeometry()
    g.CopyFrom(info.geometry)
    g.stride = 1000  # smaller than a block
    with pytest.raises(errors.InvalidArgument):
        h.calls.create(kvcache_pb2.KvCreateRequest(ctx=ALICE, path="/kv", geometry=g, slabs=[1]))
    h.ns.create(meta_pb2.CreateRequest(ctx=ALICE, path="/plain"))
    with pytest.raises(errors.NotADirectory):
        h.calls.open(kvcache_pb2.KvOpenRequest(ctx=ALICE, path="/plain"))
    h.ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/empty"))
    with pytest.raises(errors.NotFound):
        h.calls.open(kvcache_pb2.KvOpenRequest(ctx=ALICE, path="/empty"))


def test_slab_files_must_span_their_slots(h):
    g = kvgeometry.plan(BLOCK, 8 * BLOCK, 8 * BLOCK)
    h.ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/short"))
    layout = common_pb2.Layout(chunk_size=g.chunk_size, stripe=3)
    h.ns.set_layout(meta_pb2.SetLayoutRequest(ctx=ALICE, path="/short", layout=layout))
    attr = h.ns.create(meta_pb2.CreateRequest(ctx=ALICE, path="/short/s")).attr
    req = kvcache_pb2.KvCreateRequest(ctx=ALICE, path="/short", geometry=g, slabs=[attr.inode])
    with pytest.raises(errors.InvalidArgument, match="shorter"):
        h.calls.create(req)
    with pytest.raises(errors.PermissionDenied):  # Bob may not write Alice's directory
        h.calls.create(
            kvcache_pb2.KvCreateRequest(ctx=BOB, path="/short", geometry=g, slabs=[attr.inode])
        )


def test_a_block_is_found_only_once_committed(h):
    cache = h.make().cache_id
    got = h.reserve(cache, [b"a", b"b"])
    assert [r.state for r in got] == [RESERVED, RESERVED]
    assert got[0].slot != got[1].slot
    assert h.lookup(cache, [b"a", b"b"]).found == 0
    assert h.commit(cache, [b"a", b"b"], got, crc=99) == [True, True]
    found = h.lookup(cache, [b"a", b"x", b"b"])
    assert [loc.found for loc in found.locations] == [True, False, True]
    assert found.locations[0].crc == 99 and found.locations[0].length == BLOCK
    assert found.locations[0].generation == got[0].generation


def test_first_writer_wins(h):
    cache = h.make().cache_id
    mine = h.reserve(cache, [b"k"], h.ctx(client_id="w1"))
    assert h.reserve(cache, [b"k"], h.ctx(client_id="w2"))[0].state == BUSY
    # another call of the same client is another writer too
    assert h.reserve(cache, [b"k"], h.ctx(client_id="w1"))[0].state == BUSY
    h.commit(cache, [b"k"], mine, h.ctx(client_id="w1"))
    assert h.reserve(cache, [b"k"], h.ctx(client_id="w2"))[0].state == EXISTS
    # a key twice in one call: the second is busy
    states = [r.state for r in h.reserve(cache, [b"d", b"d"])]
    assert states == [RESERVED, BUSY]


def test_retries_are_idempotent(h):
    cache = h.make().cache_id
    ctx = h.ctx(client_id="w1")
    first = h.reserve(cache, [b"a", b"b"], ctx)
    again = h.reserve(cache, [b"a", b"b"], ctx)  # the same request id: a retry
    assert [(r.slot, r.generation) for r in again] == [(r.slot, r.generation) for r in first]
    commit_ctx = h.ctx(client_id="w1")
    assert h.commit(cache, [b"a", b"b"], first, commit_ctx) == [True, True]
    assert h.commit(cache, [b"a", b"b"], first, commit_ctx) == [True, True]
    assert h.stats(cache).puts == 2


def test_only_the_reserving_client_commits(h):
    cache = h.make().cache_id
    got = h.reserve(cache, [b"a"], h.ctx(client_id="w1"))
    with pytest.raises(errors.PermissionDenied):
        h.commit(cache, [b"a"], got, h.ctx(client_id="intruder"))


def test_a_failed_write_gives_the_slot_back(h):
    cache = h.make().cache_id
    got = h.reserve(cache, [b"a"])
    assert h.commit(cache, [b"a"], got, written=False) == [False]
    assert h.lookup(cache, [b"a"]).found == 0
    again = h.reserve(cache, [b"b"])
    assert again[0].slot == got[0].slot  # from the free list


def test_a_lapsed_reservation_is_taken_over(h):
    cache = h.make().cache_id
    old = h.reserve(cache, [b"k"], h.ctx(client_id="w1"))
    h.clock.advance(index_entries.PENDING_TIMEOUT_NS / 1e9 + 1)
    new = h.reserve(cache, [b"k"], h.ctx(client_id="w2"))
    assert new[0].state == RESERVED and new[0].generation != old[0].generation
    # the first writer woke up: its commit finds the key no longer its own
    assert h.commit(cache, [b"k"], old, h.ctx(client_id="w1")) == [False]
    assert h.commit(cache, [b"k"], new, h.ctx(client_id="w2")) == [True]
    assert h.lookup(cache, [b"k"]).locations[0].generation == new[0].generation


def test_prefix_lookup_stops_at_the_first_missing_key(h):
    cache = h.make().cache_id
    h.put(cache, [b"1", b"2", b"3", b"5"])
    resp = h.lookup(cache, [b"1", b"2", b"3", b"4", b"5"], prefix=True)
    assert resp.found == 3 and len(resp.locations) == 4
    assert h.lookup(cache, [b"0", b"1"], prefix=True).found == 0


def test_full_cache_evicts_the_least_recently_used(h):
    cache = h.make(slots=8, slab_slots=4).cache_id
    keys = [b"k%d" % i for i in range(8)]
    for k in keys:
        h.put(cache, [k])
        h.clock.advance(2)  # each stored at its own time
    h.lookup(cache, [b"k0", b"k1"], touch=True)  # read again: now the most recent
    assert h.put(cache, [b"n1", b"n2"]) == [RESERVED, RESERVED]
    found = h.lookup(cache, keys).locations
    assert [loc.found for loc in found] == [True, True, False, False] + [True] * 4
    s = h.stats(cache)
    assert (s.used_blocks, s.evictions, s.puts) == (8, 2, 10)
    assert (s.hits, s.misses) == (2, 0)


def test_blocks_being_written_are_not_evicted(h):
    cache = h.make(slots=4, slab_slots=4).cache_id
    pending = h.reserve(cache, [b"a", b"b", b"c", b"d"], h.ctx(client_id="slow"))
    assert all(r.state == RESERVED for r in pending)
    assert h.reserve(cache, [b"e"], h.ctx(client_id="other"))[0].state == FULL
    h.clock.advance(index_entries.PENDING_TIMEOUT_NS / 1e9 + 1)  # the writer went away
    assert h.reserve(cache, [b"e"], h.ctx(client_id="other"))[0].state == RESERVED


def test_eviction_looks_past_many_blocks_being_written(h):
    # the least recently used entries are 30 reservations still being written: the
    # eviction passes over all of them to the stored blocks behind
    cache = h.make(slots=40, slab_slots=40).cache_id
    pending = h.reserve(cache, [b"p%d" % i for i in range(30)], h.ctx(client_id="slow"))
    assert all(r.state == RESERVED for r in pending)
    h.clock.advance(1)
    assert h.put(cache, [b"s%d" % i for i in range(10)]) == [RESERVED] * 10
    h.clock.advance(1)
    assert h.reserve(cache, [b"new"], h.ctx(client_id="other"))[0].state == RESERVED
    assert h.stats(cache).evictions == 1
    assert h.lookup(cache, [b"s0"]).found == 0  # the oldest stored block went


def test_writers_fill_slabs_of_their_own_then_the_rest(h):
    info = h.make(slots=16, slab_slots=4)
    cache, per = info.cache_id, info.geometry.slab_slots
    a = h.reserve(cache, [b"a1", b"a2"], h.ctx(client_id="a"))
    b = h.reserve(cache, [b"b1"], h.ctx(client_id="b"))
    assert {r.slot // per for r in a} == {0} and b[0].slot // per == 1
    # two more writers take slabs 2 and 3 and go away; a fifth finds no untouched slab
    h.reserve(cache, [b"c1"], h.ctx(client_id="c"))
    h.reserve(cache, [b"d1"], h.ctx(client_id="d"))
    got = h.reserve(cache, [b"e%d" % i for i in range(11)], h.ctx(client_id="e"))
    assert all(r.state == RESERVED for r in got)  # what the others left, not evictions
    slots = [r.slot for r in a + b + got] + [
        e.slot for k, e in h.entries(cache).items() if k in (b"c1", b"d1")
    ]
    assert sorted(slots) == list(range(16))
    assert h.stats(cache).evictions == 0
    assert h.reserve(cache, [b"f"], h.ctx(client_id="f"))[0].state == FULL  # all pending


def test_delete_frees_slots_and_respects_generations(h):
    cache = h.make().cache_id
    h.put(cache, [b"a", b"b"])
    gen_a = h.lookup(cache, [b"a"]).locations[0].generation
    req = kvcache_pb2.KvDeleteRequest(ctx=h.ctx(), cache_id=cache, keys=[b"a"], generations=[1])
    assert h.calls.delete(req).deleted == 0  # not that generation: kept
    req = kvcache_pb2.KvDeleteRequest(ctx=h.ctx(), cache_id=cache, keys=[b"a"], generations=[gen_a])
    assert h.calls.delete(req).deleted == 1
    req = kvcache_pb2.KvDeleteRequest(ctx=h.ctx(), cache_id=cache, keys=[b"b", b"zz"])
    assert h.calls.delete(req).deleted == 1
    assert h.stats(cache).used_blocks == 0
    with pytest.raises(errors.PermissionDenied):  # deleting needs write permission
        h.calls.delete(kvcache_pb2.KvDeleteRequest(ctx=h.ctx(BOB), cache_id=cache, keys=[b"x"]))


def test_permissions_follow_the_directory(h):
    cache = h.make(mode=0o750).cache_id
    h.put(cache, [b"a"])
    with pytest.raises(errors.PermissionDenied):
        h.lookup(cache, [b"a"], ctx=h.ctx(BOB))
    with pytest.raises(errors.PermissionDenied):
        h.reserve(cache, [b"b"], ctx=h.ctx(BOB))
    reader = common_pb2.RequestContext(uid=1001, gid=1001, groups=[1000], client_id="r")
    assert h.lookup(cache, [b"a"], ctx=h.ctx(reader)).found == 1
    with pytest.raises(errors.PermissionDenied):
        h.reserve(cache, [b"b"], ctx=h.ctx(reader))


def test_bad_requests_are_refused(h):
    cache = h.make().cache_id
    with pytest.raises(errors.InvalidArgument):
        h.reserve(cache, [b""])
    with pytest.raises(errors.InvalidArgument):
        h.reserve(cache, [b"x" * (index_entries.MAX_KEY + 1)])
    with pytest.raises(errors.InvalidArgument):
        h.reserve(cache, [b"a"], lengths=[BLOCK + 1])
    with pytest.raises(errors.InvalidArgument):
        h.reserve(cache, [b"a", b"b"], lengths=[1])
    with pytest.raises(errors.NotFound):
        h.lookup(cache + 12345, [b"a"])
    assert h.entries(cache) == {}  # nothing half done


def test_list_clear_and_stats(h):
    cache = h.make().cache_id
    h.put(cache, [b"c", b"a", b"b"])
    h.reserve(cache, [b"pending"])
    resp = h.calls.list(kvcache_pb2.KvListRequest(ctx=h.ctx(), cache_id=cache, limit=2))
    assert list(resp.keys) == [b"a", b"b"] and resp.more
    resp = h.calls.list(
        kvcache_pb2.KvListRequest(ctx=h.ctx(), cache_id=cache, start_after=b"b", limit=2)
    )
    assert list(resp.keys) == [b"c"] and not resp.more
    h.lookup(cache, [b"a", b"zz"], touch=True)
    s = h.stats(cache)
    assert (s.used_blocks, s.used_bytes, s.hits, s.misses, s.hit_bytes) == (
        3,
        3 * BLOCK,
        1,
        1,
        BLOCK,
    )
    cleared = h.calls.clear(kvcache_pb2.KvClearRequest(ctx=h.ctx(), cache_id=cache)).deleted
    assert cleared == 3 and h.entries(cache) == {}
    assert h.stats(cache).used_blocks == 0


def test_the_index_of_a_removed_cache_is_swept(h):
    cache = h.make().cache_id
    h.put(cache, [b"a", b"b"])
    other = h.make(path="/kept").cache_id
    h.put(other, [b"a"])
    assert h.ns.kvcaches.sweep_removed() == 0
    h.ns.remove(meta_pb2.RemoveRequest(ctx=ALICE, path="/kv", recursive=True))
    assert h.ns.kvcaches.sweep_removed() > 0
    c = index_entries.U64.pack(cache)
    leftover = [
        k for k, _ in h.ns.engine.scan_prefix(b"KVC") if k[4:12] == c
    ]  # every KV prefix starts with KVC
    assert leftover == []
    assert h.lookup(other, [b"a"]).found == 1
    with pytest.raises(errors.NotFound):
        h.lookup(cache, [b"a"])


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "get", "delete", "lapse", "reserve"]),
            st.lists(st.integers(0, 11), min_size=1, max_size=5),
            st.integers(0, 2),
        ),
        max_size=40,
    )
)
def test_random_calls_keep_the_index_consistent(calls):
    """Whatever the calls, no two keys share a slot and the cache never exceeds its capacity."""
    h = Harness(MemoryEngine())
    info = h.make(slots=6, slab_slots=2)
    cache, capacity = info.cache_id, info.geometry.capacity_slots
    stored: set[bytes] = set()
    for op, ids, writer in calls:
        keys = [b"k%d" % i for i in dict.fromkeys(ids)]
        ctx = h.ctx(client_id=f"w{writer}")
        if op == "put":
            got = h.reserve(cache, keys, ctx)
            ok = [(k, r) for k, r in zip(keys, got, strict=True) if r.state == RESERVED]
            if ok:
                done = h.commit(cache, [k for k, _ in ok], [r for _, r in ok], h.ctx(ctx))
                stored.update(k for (k, _), d in zip(ok, done, strict=True) if d)
        elif op == "reserve":
            h.reserve(cache, keys, ctx)  # and never commit
        elif op == "get":
            h.lookup(cache, keys, touch=True)
        elif op == "delete":
            h.calls.delete(kvcache_pb2.KvDeleteRequest(ctx=ctx, cache_id=cache, keys=keys))
        else:
            h.clock.advance(index_entries.PENDING_TIMEOUT_NS / 1e9 + 1)
        h.clock.advance(0.5)
        entries = h.entries(cache)
        slots = [e.slot for e in entries.values()]
        assert len(slots) == len(set(slots)), "two keys share a slot"
        assert all(0 <= s < capacity for s in slots)
        free = [k for k, _ in h.ns.engine.scan_prefix(index_entries.free_prefix(cache))]
        free_slots = {index_entries.U64.unpack(k[-8:])[0] for k in free}
        assert not free_slots & set(slots), "a slot in use is also free"
        recent = list(h.ns.engine.scan_prefix(index_entries.recent_prefix(cache)))
        assert len(recent) == len(entries), "recency and entries disagree"
        s = h.stats(cache)
        assert s.used_blocks == sum(e.state == index_entries.STORED for e in entries.values())
