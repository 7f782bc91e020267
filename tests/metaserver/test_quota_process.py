"""Directory quotas through a real ``emberfs metaserver``: gRPC statuses and errnos, and usage
after a ``kill -9``, on RocksDB and on etcd."""

from __future__ import annotations

import errno

import grpc
import pytest

from emberfs.proto import common_pb2, meta_pb2, meta_pb2_grpc
from tests.metaserver.test_main import Nodes, any_metaserver  # noqa: F401 - a fixture
from tests.metaserver.test_xattrs_process import refusal

pytestmark = pytest.mark.slow
MiB = 1 << 20
WRITE = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE


def test_quota_statuses_and_usage_survive_kill_9(any_metaserver):  # noqa: F811
    metaserver = any_metaserver
    metaserver.start()
    nodes = Nodes(metaserver.grpc_address)
    nodes.register()
    meta = meta_pb2_grpc.MetaServiceStub(nodes.channel)
    ids = iter(range(1, 1000))

    def ctx():
        return common_pb2.RequestContext(client_id="quota-test", request_id=next(ids))

    def write(path, length):
        opened = meta.Open(meta_pb2.OpenRequest(ctx=ctx(), path=path, flags=WRITE), timeout=10)
        if length > opened.attr.quota_charged:
            req = meta_pb2.QuotaReserveRequest(
                ctx=ctx(), inode=opened.attr.inode, session_id=opened.session_id, end=length
            )
            meta.QuotaReserve(req, timeout=10)
        req = meta_pb2.CloseRequest(
            ctx=ctx(),
            inode=opened.attr.inode,
            session_id=opened.session_id,
            length=length,
            wrote=True,
        )
        return meta.Close(req, timeout=10)

    for d in ("/a", "/b"):
        meta.Mkdir(meta_pb2.MkdirRequest(ctx=ctx(), path=d, mode=0o777), timeout=10)
    set_a = meta_pb2.QuotaSetRequest(ctx=ctx(), path="/a", max_bytes=10 * MiB, max_inodes=5)
    assert meta.QuotaSet(set_a, timeout=10).quota.max_bytes == 10 * MiB
    assert meta.QuotaSet(set_a, timeout=10).quota.path == "/a"  # a retry: the same answer
    meta.QuotaSet(meta_pb2.QuotaSetRequest(ctx=ctx(), path="/b"), timeout=10)
    write("/a/f", 6 * MiB)
    meta.Mkdir(meta_pb2.MkdirRequest(ctx=ctx(), path="/a/d", mode=0o777), timeout=10)

    assert refusal(lambda: write("/a/g", 5 * MiB)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        errno.EDQUOT,
    )
    assert refusal(
        lambda: meta.Rename(meta_pb2.RenameRequest(ctx=ctx(), src="/a/d", dst="/b/d"), timeout=10)
    ) == (grpc.StatusCode.FAILED_PRECONDITION, errno.EXDEV)
    alice = common_pb2.RequestContext(client_id="alice", request_id=1, uid=1000, gid=1000)
    req = meta_pb2.QuotaSetRequest(ctx=alice, path="/b", max_bytes=1)
    assert refusal(lambda: meta.QuotaSet(req, timeout=10)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        errno.EACCES,
    )
    req = meta_pb2.QuotaGetRequest(ctx=ctx(), path="/a/d")
    assert refusal(lambda: meta.QuotaGet(req, timeout=10)) == (
        grpc.StatusCode.NOT_FOUND,
        errno.ENOENT,
    )
    req = meta_pb2.QuotaReserveRequest(ctx=ctx(), inode=12345, session_id=1, end=1)
    assert refusal(lambda: meta.QuotaReserve(req, timeout=10))[1] == errno.ENOENT

    before = meta.QuotaGet(meta_pb2.QuotaGetRequest(ctx=ctx(), path="/a"), timeout=10)
    assert before.used_inodes == 3  # f, d, and the g whose reservation was refused (empty)
    assert metaserver.kill() == -9
    metaserver.start()
    nodes.connect(metaserver.grpc_address)
    meta = meta_pb2_grpc.MetaServiceStub(nodes.channel)
    after = meta.QuotaGet(meta_pb2.QuotaGetRequest(ctx=ctx(), path="/a"), timeout=10)
    assert (after.used_bytes, after.used_inodes) == (before.used_bytes, before.used_inodes)
    listed = meta.QuotaList(meta_pb2.QuotaListRequest(ctx=ctx()), timeout=10).quotas
    assert [q.path for q in listed] == ["/a", "/b"]
