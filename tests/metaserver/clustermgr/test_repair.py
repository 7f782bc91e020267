"""Read repair: readers' reports of a replica without data are checked before it is resynced."""

from __future__ import annotations

import threading

import grpc
import pytest

from emberfs.common import errors
from emberfs.metaserver.clustermgr.chainstate import SERVING, SYNCING
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.clustermgr.repair import ReadRepair
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import cluster_pb2, common_pb2, storage_pb2

GiB = 1 << 30
CHUNK = 1 << 20
INODE = 42


class Storage:
    """What each target lists for chunk (INODE, 1); absent targets lack it."""

    def __init__(self) -> None:
        self.chunks: dict[int, storage_pb2.ChunkMeta] = {}
        self.down: set[int] = set()

    def list_chunk(self, target, inode, index):
        if target.target_id in self.down:
            raise FakeRpcError()
        assert target.grpc_address  # asked at the target's own server
        return self.chunks.get(target.target_id) if (inode, index) == (INODE, 1) else None


class FakeRpcError(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def cm():
    manager = ClusterManager(MemoryEngine(), replicas=3, heartbeat_timeout=5.0)
    for n, node in enumerate(("a", "b", "c")):
        req = cluster_pb2.RegisterNodeRequest(
            node_id=node, data_address=f"127.0.0.1:{7000 + n}", grpc_address=f"127.0.0.1:{8000 + n}"
        )
        req.targets.add(target_id=0, capacity=10 * GiB)
        manager.register_node(req)
    return manager


def file_attr(size=3 * CHUNK, holes=()):
    attr = common_pb2.InodeAttr(inode=INODE, size=size)
    attr.layout.chunk_size = CHUNK
    for start, end in holes:
        attr.holes.add(start=start, end=end)
    return attr


def setup(cm, attr=None):
    storage = Storage()
    chain = cm.routing().chains[0]
    for tid in chain.targets:
        storage.chunks[tid] = storage_pb2.ChunkMeta(
            inode=INODE, index=1, version=3, length=CHUNK, checksum=7
        )

    def stat_inode(inode):
        if attr is None or inode != INODE:
            raise errors.NotFound(f"no inode {inode}")
        return attr

    return ReadRepair(cm, stat_inode, storage.list_chunk), storage, chain


def report(chain, target_id, length=CHUNK):
    return cluster_pb2.ReportLostChunkRequest(
        chain_id=chain.chain_id, target_id=target_id, inode=INODE, index=1, length=length
    )


def state(cm, tid):
    return {t.target_id: t.state for t in cm.routing().targets}[tid]


def test_a_replica_without_the_chunk_is_resynced(cm):
    repair, storage, chain = setup(cm, file_attr())
    lost = chain.targets[0]
    del storage.chunks[lost]
    assert repair.check(report(chain, lost))
    assert state(cm, lost) == SYNCING  # out of the readers' replicas, resynced from the chain
    assert cm.routing().chains[0].targets[-1] == lost
    assert repair.repairs == 1


@pytest.mark.parametrize("how", ["damaged", "shorter"])
def test_a_damaged_or_short_replica_is_resynced(cm, how):
    repair, storage, chain = setup(cm, file_attr())
    lost = chain.targets[1]
    if how == "damaged":
        storage.chunks[lost].damaged = True
    else:
        storage.chunks[lost].length = CHUNK // 2
    assert repair.check(report(chain, lost))
    assert state(cm, lost) == SYNCING


def test_a_replica_that_holds_the_data_is_left_alone(cm):
    repair, _, chain = setup(cm, file_attr())
    assert not repair.check(report(chain, chain.targets[0]))
    assert all(t.state == SERVING for t in cm.routing().targets)


@pytest.mark.parametrize(
    "attr",
    [None, file_attr(size=CHUNK), file_attr(holes=[(CHUNK, 2 * CHUNK)])],
    ids=["removed", "truncated", "hole"],
)
def test_a_chunk_the_file_no_longer_needs_repairs_nothing(cm, attr):
    repair, storage, chain = setup(cm, attr)
    del storage.chunks[chain.targets[0]]
    assert not repair.check(report(chain, chain.targets[0]))
    assert all(t.state == SERVING for t in cm.routing().targets)


def test_no_repair_without_a_healthy_committed_peer(cm):
    repair, storage, chain = setup(cm, file_attr())
    lost, *peers = chain.targets
    del storage.chunks[lost]
    storage.chunks[peers[0]].pending_version = 4  # an update passing down the chain
    storage.down.add(peers[1])
    assert not repair.check(report(chain, lost))
    storage.down.clear()
    assert repair.check(report(chain, lost))


def test_reports_are_refused_for_unknown_or_non_serving_targets(cm):
    repair, storage, chain = setup(cm, file_attr())
    with pytest.raises(errors.NotFound):
        repair.report(report(chain, 99))
    with pytest.raises(errors.NotFound):
        repair.report(cluster_pb2.ReportLostChunkRequest(chain_id=77, target_id=1))
    lost = chain.targets[0]
    del storage.chunks[lost]
    assert repair.check(report(chain, lost))
    assert not repair.report(report(chain, lost)).accepted  # syncing now: not a reader's replica


def test_queued_reports_are_checked_by_the_worker_once_per_target(cm):
    repair, storage, chain = setup(cm, file_attr())
    lost = chain.targets[2]
    del storage.chunks[lost]
    assert repair.report(report(chain, lost)).accepted
    assert repair.report(report(chain, lost)).accepted  # joins the queued one
    stop = threading.Event()
    worker = threading.Thread(target=repair.run, args=(stop,))
    worker.start()
    try:
        for _ in range(100):
            if state(cm, lost) == SYNCING:
                break
            stop.wait(0.02)
    finally:
        stop.set()
        worker.join()
    assert state(cm, lost) == SYNCING
    assert repair.checked == 1 and repair.repairs == 1
