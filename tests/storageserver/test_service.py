"""StorageService over a real in-process gRPC server."""

from __future__ import annotations

import errno
from concurrent import futures

import grpc
import pytest

from emberfs.common import errors
from emberfs.proto import common_pb2, storage_pb2, storage_pb2_grpc
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.service import StorageServicer, add_to_server

CS = 64 * 1024


@pytest.fixture
def node(tmp_path):
    stores = {
        11: ChunkStore(tmp_path / "t11", block_size=4096),
        12: ChunkStore(tmp_path / "t12", block_size=4096),
    }
    servicer = StorageServicer(
        "node-a",
        lambda: stores,
        {11: 3, 12: 0}.get,
        state_of=lambda tid: common_pb2.SERVING if tid == 11 else common_pb2.SYNCING,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield stores, storage_pb2_grpc.StorageServiceStub(channel)
    finally:
        channel.close()
        server.stop(None).wait(10)
        for s in stores.values():
            s.close()


def put(store, inode, index, data, version=1):
    store.stage(inode, index, version, 0, data, chunk_size=CS, full_chunk=True)
    return store.commit(inode, index, version)


def rpc_error(fn, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(request, timeout=10)
    return info.value


@pytest.mark.timeout(60)
def test_list_chunks_pages(node):
    stores, stub = node
    s = stores[11]
    expected = []
    for inode in (2, 5):
        for index in range(7):
            m = put(s, inode, index, bytes([index]) * (index + 1), version=index + 1)
            expected.append((inode, index, m.version, m.length, m.checksum))
    s.stage(5, 9, 1, 0, b"p", chunk_size=CS)
    expected.append((5, 9, 0, 0, 0))

    got, after, pages = [], None, 0
    while True:
        req = storage_pb2.ListChunksRequest(target_id=11, limit=4)
        if after:
            req.has_after, (req.after_inode, req.after_index) = True, after
        resp = stub.ListChunks(req, timeout=10)
        pages += 1
        got += [(c.inode, c.index, c.version, c.length, c.checksum) for c in resp.chunks]
        if not resp.more:
            break
        after = (resp.chunks[-1].inode, resp.chunks[-1].index)
    assert got == expected and pages == 4
    pending = [
        c
        for c in stub.ListChunks(
            storage_pb2.ListChunksRequest(target_id=11, inode=5), timeout=10
        ).chunks
        if c.pending_version
    ]
    assert [(c.index, c.pending_version) for c in pending] == [(9, 1)]

    resp = stub.ListChunks(storage_pb2.ListChunksRequest(target_id=11, inode=2), timeout=10)
    assert [c.index for c in resp.chunks] == list(range(7)) and not resp.more
    resp = stub.ListChunks(storage_pb2.ListChunksRequest(target_id=12), timeout=10)
    assert list(resp.chunks) == [] and not resp.more


@pytest.mark.timeout(60)
def test_bad_requests(node):
    _, stub = node
    err = rpc_error(stub.ListChunks, storage_pb2.ListChunksRequest(target_id=99))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert errors.errno_of(err) == errno.ENOENT
    err = rpc_error(stub.ListChunks, storage_pb2.ListChunksRequest(target_id=11, limit=10001))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = rpc_error(
        stub.ListChunks, storage_pb2.ListChunksRequest(target_id=11, has_after=True, after_inode=0)
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = rpc_error(stub.RemoveChunks, storage_pb2.RemoveChunksRequest(target_id=11, inode=0))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert errors.errno_of(err) == errno.EINVAL
    err = rpc_error(stub.RemoveChunks, storage_pb2.RemoveChunksRequest(target_id=7, inode=1))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    ok = stub.ListChunks(storage_pb2.ListChunksRequest(target_id=11, limit=10000), timeout=10)
    assert not ok.more


@pytest.mark.timeout(60)
def test_remove_chunks_and_stats(node):
    stores, stub = node
    for index in range(5):
        put(stores[12], 8, index, b"x" * 1000)
    put(stores[12], 9, 0, b"y" * 10)
    put(stores[11], 8, 0, b"z")

    resp = stub.RemoveChunks(
        storage_pb2.RemoveChunksRequest(target_id=12, inode=8, indices=[1, 3, 40]), timeout=10
    )
    assert resp.removed == 2
    assert [m.index for m in stores[12].list(8)] == [0, 2, 4]
    resp = stub.RemoveChunks(storage_pb2.RemoveChunksRequest(target_id=12, inode=8), timeout=10)
    assert resp.removed == 3
    assert stores[12].list(8) == [] and len(stores[12].list()) == 1
    assert stores[11].meta(8, 0).version == 1  # other targets untouched

    stats = stub.TargetStats(storage_pb2.TargetStatsRequest(), timeout=10)
    assert stats.node_id == "node-a"
    by_id = {t.target_id: t for t in stats.targets}
    assert set(by_id) == {11, 12}
    assert (by_id[11].chain_id, by_id[11].chunks, by_id[11].used) == (3, 1, 1)
    assert (by_id[12].chain_id, by_id[12].chunks, by_id[12].used) == (0, 1, 10)
    assert by_id[11].local_state == common_pb2.SERVING
    assert by_id[12].local_state == common_pb2.SYNCING
    assert by_id[11].capacity > 0
