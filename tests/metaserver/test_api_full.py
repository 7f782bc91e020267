"""A full target as the cluster manager keeps it and the admin API and metrics show it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from emberfs.metaserver.api import create_app
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import cluster_pb2

GiB = 1024**3


def manager(engine: MemoryEngine) -> ClusterManager:
    return ClusterManager(engine, replicas=2, heartbeat_timeout=3600.0)


def report(tid: int, full: bool = False) -> cluster_pb2.TargetReport:
    return cluster_pb2.TargetReport(
        target_id=tid, capacity=10 * GiB, used=GiB if not full else 10 * GiB, chunks=3, full=full
    )


def test_a_full_target_is_shown_in_the_api_metrics_and_kept_across_a_restart():
    engine = MemoryEngine()
    cm = manager(engine)
    for i, node in enumerate(("a", "b")):
        cm.register_node(
            cluster_pb2.RegisterNodeRequest(
                node_id=node,
                data_address=f"127.0.0.1:{7000 + i}",
                grpc_address=f"127.0.0.1:{8000 + i}",
                targets=[report(0)],
            )
        )
    version = cm.routing_version
    cm.heartbeat(cluster_pb2.HeartbeatRequest(node_id="b", targets=[report(2, full=True)]))
    assert cm.routing_version == version  # reported like usage: no new routing
    client = TestClient(create_app(cm, GCQueue(cm)))
    targets = {t["id"]: t for t in client.get("/api/v1/targets").json()}
    assert targets[2]["full"] is True and targets[2]["state"] == "serving"
    assert targets[1]["full"] is False
    assert client.get("/api/v1/targets/2").json()["full"] is True
    summary = client.get("/api/v1/cluster").json()
    assert summary["targets"]["full"] == 1 and summary["targets"]["serving"] == 2
    assert "emberfs_targets_full 1.0" in client.get("/metrics").text
    page = client.get("/static/app.js").text
    assert "t.full" in page and "c.targets.full" in page

    # a restarted metaserver shows what the last heartbeat said until the next one
    again = manager(engine)
    assert [t.full for t in again.routing().targets] == [False, True]
    again.heartbeat(cluster_pb2.HeartbeatRequest(node_id="b", targets=[report(2)]))
    client = TestClient(create_app(again, GCQueue(again)))
    assert not any(t["full"] for t in client.get("/api/v1/targets").json())
    assert client.get("/api/v1/cluster").json()["targets"]["full"] == 0
    assert "emberfs_targets_full 0.0" in client.get("/metrics").text
