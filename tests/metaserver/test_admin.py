"""The admin REST API on a ClusterManager with an in-memory store."""

from __future__ import annotations

from fastapi.testclient import TestClient

from emberfs.metaserver.api import create_app
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import cluster_pb2


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_targets_and_chains_json():
    clock = Clock()
    cm = ClusterManager(MemoryEngine(), replicas=2, heartbeat_timeout=5.0, clock=clock)
    for i, node in enumerate(("a", "b")):
        cm.register_node(
            cluster_pb2.RegisterNodeRequest(
                node_id=node,
                data_address=f"127.0.0.1:{7000 + i}",
                grpc_address=f"127.0.0.1:{8000 + i}",
                targets=[cluster_pb2.TargetReport(capacity=1000, used=10, chunks=2)],
            )
        )
    client = TestClient(create_app(cm, GCQueue(cm)))
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/api/v1/targets").json() == [
        {
            "id": 1,
            "node": "a",
            "address": "127.0.0.1:7000",
            "grpc_address": "127.0.0.1:8000",
            "state": "serving",
            "capacity": 1000,
            "used": 10,
            "chunks": 2,
            "chain": 1,
            "full": False,
        },
        {
            "id": 2,
            "node": "b",
            "address": "127.0.0.1:7001",
            "grpc_address": "127.0.0.1:8001",
            "state": "serving",
            "capacity": 1000,
            "used": 10,
            "chunks": 2,
            "chain": 1,
            "full": False,
        },
    ]
    assert client.get("/api/v1/chains").json() == [
        {
            "id": 1,
            "version": 1,
            "targets": [{"id": 1, "state": "serving"}, {"id": 2, "state": "serving"}],
        }
    ]
    clock.now = 3.0
    cm.heartbeat(cluster_pb2.HeartbeatRequest(node_id="b"))
    clock.now = 6.0
    cm.check_timeouts()
    assert client.get("/api/v1/chains").json() == [
        {
            "id": 1,
            "version": 2,
            "targets": [{"id": 2, "state": "serving"}, {"id": 1, "state": "offline"}],
        }
    ]
