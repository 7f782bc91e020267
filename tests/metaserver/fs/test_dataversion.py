"""Data versions and writer counts: every moment a file's bytes may change moves its version."""

from __future__ import annotations

import pytest

from emberfs.common import kvgeometry
from emberfs.common.layout import MAX_STRIPE
from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.kvcache.service import KVCacheCalls
from emberfs.proto import common_pb2, kvcache_pb2, meta_pb2
from tests.metaserver.fs.test_ops_sessions_lease import SECOND, TIMEOUT, WRITE, Clock

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def ns(store, clock):
    return Namespace(
        store(),
        chain_table=lambda: [1, 2, 3],
        clock=clock,
        session_timeout=TIMEOUT,
        grace=Grace(clock=clock.seconds),
    )


def attr(ns, path="/f") -> common_pb2.InodeAttr:
    return ns.stat(meta_pb2.StatRequest(path=path)).attr


def open_(ns, path="/f", flags=WRITE) -> meta_pb2.OpenResponse:
    return ns.open(meta_pb2.OpenRequest(path=path, flags=flags, mode=0o644))


def close(ns, resp, length=0, wrote=False) -> common_pb2.InodeAttr:
    req = meta_pb2.CloseRequest(
        inode=resp.attr.inode, session_id=resp.session_id, length=length, wrote=wrote
    )
    return ns.close(req).attr


def test_write_sessions_count_as_writers_and_each_open_and_close_moves_the_version(ns, clock):
    seen = [ns.create(meta_pb2.CreateRequest(path="/f")).attr.data_version]
    assert seen[0] > 0 and attr(ns).writers == 0
    # reading changes nothing
    clock.advance(1)
    read = open_(ns, flags=meta_pb2.OPEN_READ)
    assert (read.attr.data_version, read.attr.writers, read.session_id) == (seen[0], 0, 0)
    assert attr(ns).data_version == seen[0]
    clock.advance(1)
    a = open_(ns)
    assert a.attr.writers == 1
    seen.append(a.attr.data_version)
    clock.advance(1)
    b = open_(ns, flags=meta_pb2.OPEN_WRITE)
    assert b.attr.writers == 2
    seen.append(b.attr.data_version)
    clock.advance(1)
    after_a = close(ns, a, length=10, wrote=True)
    assert after_a.writers == 1 and after_a.size == 10
    seen.append(after_a.data_version)
    clock.advance(1)
    # a session that reports no write still ends with a new version: its writer may have sent
    # chunks and died before it could say so
    after_b = close(ns, b)
    assert after_b.writers == 0 and after_b.size == 10
    seen.append(after_b.data_version)
    assert seen == sorted(set(seen)) and attr(ns).data_version == seen[-1]


def test_sync_truncate_and_a_truncating_open_move_the_version(ns, clock):
    w = open_(ns)
    versions = [w.attr.data_version]
    clock.advance(1)
    synced = ns.sync(
        meta_pb2.SyncRequest(inode=w.attr.inode, session_id=w.session_id, length=100)
    ).attr
    versions.append(synced.data_version)
    clock.advance(1)
    versions.append(close(ns, w, 100, True).data_version)
    for length in (50, 200):  # shrinking and growing
        clock.advance(1)
        got = ns.truncate(meta_pb2.TruncateRequest(path="/f", length=length)).attr
        assert got.size == length
        versions.append(got.data_version)
    clock.advance(1)
    t = open_(ns, flags=meta_pb2.OPEN_WRITE | meta_pb2.OPEN_TRUNCATE)
    assert t.attr.size == 0 and t.attr.writers == 1
    versions.append(t.attr.data_version)
    assert versions == sorted(set(versions))


def test_attributes_that_leave_the_bytes_alone_keep_the_version(ns, clock):
    v = ns.create(meta_pb2.CreateRequest(path="/f")).attr.data_version
    clock.advance(1)
    ns.setattr(meta_pb2.SetAttrRequest(path="/f", mode=0o600, mtime_ns=5))
    ns.batch_open(meta_pb2.BatchOpenRequest(paths=["/f"]))
    assert attr(ns).data_version == v


def test_a_lapsed_lease_ends_the_writer_with_a_new_version(ns, clock):
    w = open_(ns)
    clock.advance(TIMEOUT + 1)
    (ended,) = ns.expire_sessions()
    assert ended.session_id == w.session_id
    now = attr(ns)
    assert now.writers == 0 and now.data_version > w.attr.data_version


def test_a_clock_behind_the_version_still_gives_a_new_one(ns, clock):
    w = open_(ns)
    clock.now -= 3600 * SECOND  # the clock stepped back (or the store came from elsewhere)
    closed = close(ns, w)
    assert closed.data_version == w.attr.data_version + 1
    again = open_(ns)
    assert again.attr.data_version == closed.data_version + 1


def test_writers_stay_exact_through_many_sessions(ns, clock):
    opened = [open_(ns) for _ in range(5)]
    assert attr(ns).writers == 5
    for n, resp in enumerate(opened):
        close(ns, resp)
        assert attr(ns).writers == 4 - n


def test_slabs_of_a_kv_cache_are_marked_unversioned(ns):
    g = kvgeometry.plan(256 * 1024, 16 * 256 * 1024, 4 * 256 * 1024)
    ns.mkdir(meta_pb2.MkdirRequest(path="/kv"))
    layout = common_pb2.Layout(chunk_size=g.chunk_size, stripe=MAX_STRIPE)
    ns.set_layout(meta_pb2.SetLayoutRequest(path="/kv", layout=layout))
    slabs = []
    for n in range(kvgeometry.slab_count(g)):
        made = ns.create(meta_pb2.CreateRequest(path=f"/kv/slab-{n}")).attr
        length = kvgeometry.slab_bytes(g, kvgeometry.slab_capacity(g, n))
        ns.truncate(meta_pb2.TruncateRequest(path=f"/kv/slab-{n}", length=length))
        assert not attr(ns, f"/kv/slab-{n}").unversioned
        slabs.append(made.inode)
    calls = KVCacheCalls(ns, keys=None, capability_ttl=60)
    calls.create(kvcache_pb2.KvCreateRequest(path="/kv", geometry=g, slabs=slabs))
    assert all(attr(ns, f"/kv/slab-{n}").unversioned for n in range(len(slabs)))
    assert not ns.create(meta_pb2.CreateRequest(path="/kv/other")).attr.unversioned
