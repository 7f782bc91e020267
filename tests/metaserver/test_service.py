"""MetaService over a real gRPC channel: status codes, errno trailer, client-side errors."""

from __future__ import annotations

import errno
from concurrent import futures

import grpc
import pytest

from emberfs.common import errors
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.service import MetaServicer, add_to_server
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import common_pb2, meta_pb2, meta_pb2_grpc

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def stub():
    namespace = Namespace(MemoryEngine(), chain_table=lambda: [1, 2, 3], usage=lambda: (100, 40))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_to_server(MetaServicer(namespace), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield meta_pb2_grpc.MetaServiceStub(channel)
    finally:
        channel.close()
        server.stop(grace=None)


def fails(call, request):
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    return info.value


def trailer_errno(exc):
    return dict(exc.trailing_metadata())[errors.ERRNO_KEY]


def test_round_trip(stub):
    stub.Ping(meta_pb2.PingRequest(), timeout=10)
    made = stub.Mkdir(meta_pb2.MkdirRequest(path="/d/e", parents=True), timeout=10).attr
    assert made.type == common_pb2.DIRECTORY
    opened = stub.Open(
        meta_pb2.OpenRequest(path="/d/e/f", flags=meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE),
        timeout=10,
    )
    assert opened.session_id and len(opened.attr.layout.chains) == 3
    stub.Close(
        meta_pb2.CloseRequest(
            inode=opened.attr.inode, session_id=opened.session_id, length=42, wrote=True
        ),
        timeout=10,
    )
    listing = stub.List(meta_pb2.ListRequest(path="/d/e"), timeout=10)
    assert [(e.name, e.attr.size) for e in listing.entries] == [("f", 42)]
    fs = stub.StatFs(meta_pb2.StatFsRequest(), timeout=10)
    assert (fs.capacity, fs.free, fs.files, fs.directories) == (100, 60, 1, 3)


@pytest.mark.parametrize(
    "setup, call, request_, code, err, os_error",
    [
        (
            [],
            "Stat",
            meta_pb2.StatRequest(path="/missing"),
            grpc.StatusCode.NOT_FOUND,
            errno.ENOENT,
            FileNotFoundError,
        ),
        (
            [meta_pb2.MkdirRequest(path="/d")],
            "Mkdir",
            meta_pb2.MkdirRequest(path="/d"),
            grpc.StatusCode.ALREADY_EXISTS,
            errno.EEXIST,
            FileExistsError,
        ),
        (
            [meta_pb2.CreateRequest(path="/f")],
            "List",
            meta_pb2.ListRequest(path="/f"),
            grpc.StatusCode.FAILED_PRECONDITION,
            errno.ENOTDIR,
            NotADirectoryError,
        ),
        (
            [meta_pb2.MkdirRequest(path="/d")],
            "Open",
            meta_pb2.OpenRequest(path="/d", flags=meta_pb2.OPEN_WRITE),
            grpc.StatusCode.FAILED_PRECONDITION,
            errno.EISDIR,
            IsADirectoryError,
        ),
        (
            [
                meta_pb2.MkdirRequest(path="/p", mode=0o700),
            ],
            "Create",
            meta_pb2.CreateRequest(ctx=common_pb2.RequestContext(uid=5, gid=5), path="/p/x"),
            grpc.StatusCode.PERMISSION_DENIED,
            errno.EACCES,
            PermissionError,
        ),
        (
            [meta_pb2.MkdirRequest(path="/d"), meta_pb2.CreateRequest(path="/d/f")],
            "Remove",
            meta_pb2.RemoveRequest(path="/d"),
            grpc.StatusCode.FAILED_PRECONDITION,
            errno.ENOTEMPTY,
            OSError,
        ),
        (
            [],
            "Mkdir",
            meta_pb2.MkdirRequest(path="/" + "n" * 300),
            grpc.StatusCode.INVALID_ARGUMENT,
            errno.ENAMETOOLONG,
            OSError,
        ),
        (
            [meta_pb2.MkdirRequest(path="/d")],
            "Hardlink",
            meta_pb2.HardlinkRequest(src="/d", dst="/e"),
            grpc.StatusCode.PERMISSION_DENIED,
            errno.EPERM,
            PermissionError,
        ),
    ],
)
def test_errors_reach_the_client_typed(stub, setup, call, request_, code, err, os_error):
    for req in setup:
        method = {
            meta_pb2.MkdirRequest: stub.Mkdir,
            meta_pb2.CreateRequest: stub.Create,
        }[type(req)]
        method(req, timeout=10)
    exc = fails(getattr(stub, call), request_)
    assert exc.code() == code
    assert trailer_errno(exc) == str(err)
    converted = errors.from_grpc(exc, "/some/path")
    assert type(converted) is os_error
    assert converted.errno == err and converted.filename == "/some/path"


def test_unavailable_without_chains():
    namespace = Namespace(MemoryEngine(), chain_table=lambda: [])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_to_server(MetaServicer(namespace), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = meta_pb2_grpc.MetaServiceStub(channel)
            exc = fails(stub.Create, meta_pb2.CreateRequest(path="/f"))
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
            assert exc.code() in errors.RETRYABLE_CODES
    finally:
        server.stop(grace=None)


def test_unexpected_exception_is_internal(stub, monkeypatch):
    def broken(self, request):
        raise RuntimeError("boom")

    monkeypatch.setattr(Namespace, "stat", broken)
    exc = fails(stub.Stat, meta_pb2.StatRequest(path="/"))
    assert exc.code() == grpc.StatusCode.INTERNAL
    assert "boom" not in exc.details()
    assert isinstance(errors.from_grpc(exc), OSError)


def test_idempotent_retry_over_the_wire(stub):
    ctx = common_pb2.RequestContext(client_id="c", request_id=9)
    first = stub.Mkdir(meta_pb2.MkdirRequest(ctx=ctx, path="/once"), timeout=10)
    assert stub.Mkdir(meta_pb2.MkdirRequest(ctx=ctx, path="/once"), timeout=10) == first
