"""ClusterService over real gRPC (in-process server, in-memory store)."""

from __future__ import annotations

import errno
from concurrent import futures

import grpc
import pytest

from emberfs.common import errors
from emberfs.metaserver.clustermgr import service as cluster_service
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import cluster_pb2, cluster_pb2_grpc


@pytest.fixture
def stub():
    cm = ClusterManager(MemoryEngine(), replicas=2, heartbeat_timeout=5.0)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    cluster_service.add_to_server(cluster_service.ClusterServicer(cm, GCQueue(cm)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield cluster_pb2_grpc.ClusterServiceStub(channel)
    finally:
        channel.close()
        server.stop(None).wait()


def register(stub, node, port):
    return stub.RegisterNode(
        cluster_pb2.RegisterNodeRequest(
            node_id=node,
            data_address=f"127.0.0.1:{port}",
            grpc_address=f"127.0.0.1:{port + 1}",
            targets=[cluster_pb2.TargetReport(capacity=100)],
        ),
        timeout=5,
    )


def test_register_heartbeat_and_routing_round_trip(stub):
    assert list(register(stub, "a", 7000).target_ids) == [1]
    r = register(stub, "b", 7010)
    assert list(r.target_ids) == [2]
    assert [(c.chain_id, list(c.targets)) for c in r.routing.chains] == [(1, [1, 2])]
    routing = stub.GetRouting(cluster_pb2.GetRoutingRequest(), timeout=5).routing
    assert routing == r.routing
    hb = stub.Heartbeat(cluster_pb2.HeartbeatRequest(node_id="a", routing_version=0), timeout=5)
    assert hb.routing.version == routing.version and not hb.reregister
    hb = stub.Heartbeat(cluster_pb2.HeartbeatRequest(node_id="x"), timeout=5)
    assert hb.reregister


def test_errors_carry_status_and_errno(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.RegisterNode(cluster_pb2.RegisterNodeRequest(node_id="a"), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert errors.errno_of(info.value) == errno.EINVAL
    register(stub, "a", 7000)
    register(stub, "b", 7010)
    with pytest.raises(grpc.RpcError) as info:
        stub.SyncDone(
            cluster_pb2.SyncDoneRequest(chain_id=1, chain_version=1, target_id=1), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # target 1 is not syncing
    with pytest.raises(grpc.RpcError) as info:
        stub.SyncDone(
            cluster_pb2.SyncDoneRequest(chain_id=5, chain_version=1, target_id=1), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert isinstance(errors.from_grpc(info.value), FileNotFoundError)
    with pytest.raises(grpc.RpcError) as info:
        stub.FetchGC(cluster_pb2.FetchGCRequest(target_ids=[42]), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_gc_round_trip_on_an_empty_queue(stub):
    register(stub, "a", 7000)
    assert list(stub.FetchGC(cluster_pb2.FetchGCRequest(target_ids=[1]), timeout=5).items) == []
    stub.AckGC(cluster_pb2.AckGCRequest(target_id=1, gc_ids=[5]), timeout=5)
