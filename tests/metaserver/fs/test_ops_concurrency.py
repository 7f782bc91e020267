"""Many threads on one namespace: every operation lands exactly once."""

from __future__ import annotations

from concurrent import futures

import pytest

from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(120)


def test_parallel_creates_renames_and_removes(store):
    ns = Namespace(store(), chain_table=lambda: [1, 2, 3])
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
    ns.mkdir(meta_pb2.MkdirRequest(path="/e"))

    def work(i: int) -> None:
        ctx = common_pb2.RequestContext(client_id=f"c{i % 4}", request_id=i + 1)
        ns.create(meta_pb2.CreateRequest(ctx=ctx, path=f"/d/f{i}"))
        if i % 3 == 0:
            ns.rename(meta_pb2.RenameRequest(src=f"/d/f{i}", dst=f"/e/g{i}"))
        if i % 5 == 0:
            ns.remove(meta_pb2.RemoveRequest(path=f"/d/f{i}" if i % 3 else f"/e/g{i}"))

    with futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(600)))
    d = {e.name for e in ns.list(meta_pb2.ListRequest(path="/d", limit=10000)).entries}
    e = {e.name for e in ns.list(meta_pb2.ListRequest(path="/e", limit=10000)).entries}
    assert d == {f"f{i}" for i in range(600) if i % 3 and i % 5}
    assert e == {f"g{i}" for i in range(600) if i % 3 == 0 and i % 5}
    removed = sum(1 for i in range(600) if i % 5 == 0)
    assert len(list(ns.engine.scan_prefix(keys.GC))) == removed
    counts = ns.counts()
    assert counts["files"] == 600 - removed == len(d) + len(e)
    assert counts["inodes"] == len(list(ns.engine.scan_prefix(keys.INODE)))


def test_racing_creates_and_reservations_never_pass_a_quota(store):
    from emberfs.common import errors

    ns = Namespace(store(), chain_table=lambda: [1, 2, 3])
    ns.mkdir(meta_pb2.MkdirRequest(path="/q"))
    ns.quota_set(meta_pb2.QuotaSetRequest(path="/q", max_inodes=100, max_bytes=400 << 20))
    write = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE

    def retried(call, req):  # as a client retries UNAVAILABLE (a conflict that kept losing)
        while True:
            try:
                return call(req)
            except errors.Unavailable:
                continue

    def work(i: int) -> str:
        ctx = common_pb2.RequestContext(client_id=f"c{i % 8}", request_id=i + 1)
        try:
            req = meta_pb2.OpenRequest(ctx=ctx, path=f"/q/f{i}", flags=write)
            opened = retried(ns.open, req)
        except errors.QuotaExceeded:
            return "inodes"
        req = meta_pb2.QuotaReserveRequest(
            inode=opened.attr.inode, session_id=opened.session_id, end=5 << 20
        )
        try:
            retried(ns.quota_reserve, req)
            return "ok"
        except errors.QuotaExceeded:
            return "bytes"

    with futures.ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(work, range(160)))
    used = ns.quota_get(meta_pb2.QuotaGetRequest(path="/q"))
    assert outcomes.count("inodes") == 60 and used.used_inodes == 100
    assert outcomes.count("bytes") > 0 and used.used_bytes <= 400 << 20
