"""run_gc_once against an in-process ClusterService that serves only the GC queue."""

from __future__ import annotations

import contextlib
import threading
from concurrent import futures

import grpc
import pytest

from emberfs.proto import cluster_pb2, cluster_pb2_grpc
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.gc import run_gc_once

CS = 64 * 1024


class GCQueue(cluster_pb2_grpc.ClusterServiceServicer):
    """The manager's GC queue: an item goes once every target of its chains acknowledged."""

    def __init__(self, chain_targets: dict[int, list[int]]):
        self.chain_targets = chain_targets
        self.items: dict[int, cluster_pb2.GCItem] = {}
        self.acks: dict[int, set[int]] = {}
        self.fetches: list[cluster_pb2.FetchGCRequest] = []
        self.lock = threading.Lock()

    def add(self, gc_id: int, inode: int, chains: list[int]) -> None:
        self.items[gc_id] = cluster_pb2.GCItem(gc_id=gc_id, inode=inode, chains=chains)
        self.acks[gc_id] = set()

    def _targets(self, item) -> set[int]:
        return {t for c in item.chains for t in self.chain_targets.get(c, [])}

    def FetchGC(self, request, context):
        with self.lock:
            self.fetches.append(request)
            mine = set(request.target_ids)
            items = [
                item
                for gc_id, item in sorted(self.items.items())
                if (self._targets(item) & mine) - self.acks[gc_id]
            ]
            return cluster_pb2.FetchGCResponse(items=items[: request.limit or None])

    def AckGC(self, request, context):
        with self.lock:
            for gc_id in request.gc_ids:
                item = self.items.get(gc_id)
                if item is None or request.target_id not in self._targets(item):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad ack {gc_id}")
                self.acks[gc_id].add(request.target_id)
                if self._targets(item) <= self.acks[gc_id]:
                    del self.items[gc_id]
            return cluster_pb2.AckGCResponse()


@pytest.fixture
def manager():
    queue = GCQueue({10: [1, 5], 20: [2, 6], 30: [7, 8]})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    cluster_pb2_grpc.add_ClusterServiceServicer_to_server(queue, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield queue, cluster_pb2_grpc.ClusterServiceStub(channel)
    finally:
        channel.close()
        server.stop(None).wait(10)


@pytest.fixture
def stores(tmp_path):
    s = {1: ChunkStore(tmp_path / "t1"), 2: ChunkStore(tmp_path / "t2")}
    try:
        yield s
    finally:
        for store in s.values():
            store.close()


def fill(store: ChunkStore, inode: int, n: int) -> None:
    for index in range(n):
        store.stage(inode, index, 1, 0, b"chunk", chunk_size=CS)
        store.commit(inode, index, 1)


@pytest.mark.timeout(60)
def test_gc_removes_and_acknowledges(manager, stores):
    queue, stub = manager
    chain_of = {1: 10, 2: 20}
    for inode in (100, 101, 102, 103):
        fill(stores[1], inode, 3)
        fill(stores[2], inode, 2)
    queue.add(1, 100, [10])  # only target 1 holds it here
    queue.add(2, 101, [20, 10])  # both
    queue.add(3, 102, [30])  # none of this node's chains

    removed = run_gc_once(stub, stores, chain_of)
    assert removed == 3 + 3 + 2
    assert queue.fetches[-1].target_ids == [1, 2] and queue.fetches[-1].limit == 256
    assert stores[1].list(100) == [] and stores[1].list(101) == []
    assert len(stores[2].list(100)) == 2  # chain 10 does not include target 2
    assert stores[2].list(101) == []
    assert len(stores[1].list(102)) == 3 and len(stores[2].list(103)) == 2
    assert queue.acks[1] == {1} and queue.acks[2] == {1, 2}
    assert queue.acks[3] == set()
    # nothing left for this node: the next round removes nothing
    assert run_gc_once(stub, stores, chain_of) == 0
    assert stores[1].stats()["chunks"] == 6


@pytest.mark.timeout(60)
def test_gc_pages_with_limit(manager, stores):
    queue, stub = manager
    for inode in range(200, 210):
        fill(stores[1], inode, 1)
        queue.add(inode, inode, [10])
    rounds = []
    while True:
        n = run_gc_once(stub, stores, {1: 10, 2: 20}, limit=4)
        if not n:
            break
        rounds.append(n)
    assert rounds == [4, 4, 2]
    assert stores[1].list() == []
    # items stay queued for the chain's other targets (5 is not on this node)
    assert sorted(queue.items) == list(range(200, 210))


@pytest.mark.timeout(60)
def test_gc_without_targets_or_manager(stores, tmp_path):
    assert run_gc_once(None, {}, {}) == 0
    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        with pytest.raises(grpc.RpcError):
            run_gc_once(cluster_pb2_grpc.ClusterServiceStub(channel), stores, {1: 10}, timeout=1)
    finally:
        channel.close()


@pytest.mark.timeout(60)
def test_gc_holds_each_inode_while_its_chunks_go(manager, stores):
    # the data server's inode lock: no chunk update of the inode is between staging and commit
    queue, stub = manager
    fill(stores[1], 100, 2)
    queue.add(1, 100, [10])
    held = []

    @contextlib.contextmanager
    def hold(target_id, inode):
        held.append((target_id, inode, len(stores[target_id].list(inode))))
        yield

    assert run_gc_once(stub, stores, {1: 10, 2: 20}, hold=hold) == 2
    assert held == [(1, 100, 2)]  # taken before the chunks went
