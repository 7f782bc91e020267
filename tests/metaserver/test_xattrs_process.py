"""Extended attributes through a real ``emberfs metaserver``: gRPC statuses and errnos,
and what a ``kill -9`` leaves, on RocksDB and on etcd."""

from __future__ import annotations

import errno

import grpc
import pytest

from emberfs.common import errors
from emberfs.proto import common_pb2, meta_pb2, meta_pb2_grpc
from tests.metaserver.test_main import Nodes, any_metaserver  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow


def refusal(call) -> tuple[grpc.StatusCode, int]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), errors.errno_of(info.value)


def test_xattrs_answer_statuses_and_survive_kill_9(any_metaserver):  # noqa: F811
    metaserver = any_metaserver
    metaserver.start()
    nodes = Nodes(metaserver.grpc_address)
    nodes.register()
    meta = meta_pb2_grpc.MetaServiceStub(nodes.channel)
    ids = iter(range(1, 1000))

    def ctx():
        return common_pb2.RequestContext(client_id="xattr-test", request_id=next(ids))

    meta.Create(meta_pb2.CreateRequest(ctx=ctx(), path="/f", mode=0o644), timeout=10)
    meta.Mkdir(meta_pb2.MkdirRequest(ctx=ctx(), path="/d", mode=0o755), timeout=10)
    meta.Create(meta_pb2.CreateRequest(ctx=ctx(), path="/gone", mode=0o644), timeout=10)

    def put(path, name, value, flags=0):
        req = meta_pb2.SetXattrRequest(ctx=ctx(), path=path, name=name, value=value, flags=flags)
        return meta.SetXattr(req, timeout=10)

    def get(path, name):
        req = meta_pb2.GetXattrRequest(ctx=ctx(), path=path, name=name, follow=True)
        return meta.GetXattr(req, timeout=10).value

    put("/f", "user.checksum", b"\x01\x02\x03")
    put("/f", "trusted.origin", b"s3://bucket/key")
    put("/d", "user.owner", b"team-a")
    put("/gone", "user.x", b"1")
    meta.Rename(meta_pb2.RenameRequest(ctx=ctx(), src="/f", dst="/d/f"), timeout=10)
    meta.Remove(meta_pb2.RemoveRequest(ctx=ctx(), path="/gone"), timeout=10)

    # every refusal: its status, and the errno the client raises
    assert refusal(lambda: get("/d/f", "user.missing")) == (
        grpc.StatusCode.NOT_FOUND,
        errno.ENODATA,
    )
    assert refusal(lambda: get("/nowhere", "user.x")) == (grpc.StatusCode.NOT_FOUND, errno.ENOENT)
    assert refusal(lambda: put("/d/f", "system.posix_acl_access", b"")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        errno.EOPNOTSUPP,
    )
    assert refusal(lambda: put("/d/f", "user." + "n" * 300, b"")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        errno.ERANGE,
    )
    assert refusal(lambda: put("/d/f", "user.big", b"x" * 65537)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        errno.E2BIG,
    )
    assert refusal(lambda: put("/d/f", "user.checksum", b"", meta_pb2.XATTR_CREATE)) == (
        grpc.StatusCode.ALREADY_EXISTS,
        errno.EEXIST,
    )
    bob = common_pb2.RequestContext(client_id="bob", request_id=1, uid=1001, gid=1001)
    req = meta_pb2.SetXattrRequest(ctx=bob, path="/d/f", name="user.bob", value=b"")
    assert refusal(lambda: meta.SetXattr(req, timeout=10)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        errno.EACCES,
    )

    assert metaserver.kill() == -9
    metaserver.start()
    nodes.connect(metaserver.grpc_address)
    meta = meta_pb2_grpc.MetaServiceStub(nodes.channel)
    assert get("/d/f", "user.checksum") == b"\x01\x02\x03"
    assert get("/d/f", "trusted.origin") == b"s3://bucket/key"
    assert get("/d", "user.owner") == b"team-a"
    listed = meta.ListXattr(meta_pb2.ListXattrRequest(ctx=ctx(), path="/d/f"), timeout=10)
    assert list(listed.names) == ["trusted.origin", "user.checksum"]
    stat = meta.Stat(meta_pb2.StatRequest(ctx=ctx(), path="/d/f", xattrs=True), timeout=10)
    assert {x.name: x.value for x in stat.xattrs} == {
        "trusted.origin": b"s3://bucket/key",
        "user.checksum": b"\x01\x02\x03",
    }
    metaserver.kill()
    # the removed file's attributes went with it: one record per inode that has some
    from emberfs.metaserver.store import keys

    engine = metaserver.open_store()
    try:
        assert len(list(engine.scan_prefix(keys.XATTR))) == 2
    finally:
        engine.close()
