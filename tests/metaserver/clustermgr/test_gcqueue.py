"""GCQueue on the in-memory engine, over a ClusterManager with a hand-driven clock."""

from __future__ import annotations

import pytest

from emberfs.common import errors
from emberfs.metaserver.clustermgr.gcqueue import GCFloor, GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store import keys
from emberfs.proto import cluster_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def engine(store):
    return store()


def register(cm, node: str, port: int):
    req = cluster_pb2.RegisterNodeRequest(
        node_id=node, data_address=f"127.0.0.1:{port}", grpc_address=f"127.0.0.1:{port + 1}"
    )
    for _ in range(2):
        req.targets.add(capacity=1 << 30)
    return cm.register_node(req)


def heartbeat(cm, node: str):
    return cm.heartbeat(cluster_pb2.HeartbeatRequest(node_id=node))


@pytest.fixture
def three(engine, clock):
    """Three nodes with two targets each (ids 1-2, 3-4, 5-6): chains 1 and 2."""
    cm = ClusterManager(engine, replicas=3, heartbeat_timeout=5.0, clock=clock)
    for i, node in enumerate(("a", "b", "c")):
        register(cm, node, port=7000 + 10 * i)
    return cm


@pytest.fixture
def gc(three):
    return GCQueue(three)


def test_gc_items_are_fetched_acked_and_removed(gc, engine):
    for gc_id, item_chains in ((10, [1]), (11, [1, 2]), (12, [2])):
        item = cluster_pb2.GCItem(gc_id=gc_id, inode=gc_id, chains=item_chains)
        engine.write({keys.gc_key(gc_id): item.SerializeToString()})
    got = gc.fetch(cluster_pb2.FetchGCRequest(target_ids=[1, 2]))
    assert [i.gc_id for i in got.items] == [10, 11, 12]
    got = gc.fetch(cluster_pb2.FetchGCRequest(target_ids=[1]))
    assert [i.gc_id for i in got.items] == [10, 11]
    assert len(gc.fetch(cluster_pb2.FetchGCRequest(target_ids=[1], limit=1)).items) == 1
    gc.ack(cluster_pb2.AckGCRequest(target_id=1, gc_ids=[10, 11, 12]))  # 12 is not its
    got = gc.fetch(cluster_pb2.FetchGCRequest(target_ids=[1, 2]))
    assert [i.gc_id for i in got.items] == [11, 12]  # 11 still needs target 2 of chain 2
    pending = {p.item.gc_id: p for p in gc.pending()}
    assert pending[10].acked == [1] and pending[10].waiting == [3, 5]
    for tid in (3, 5):
        gc.ack(cluster_pb2.AckGCRequest(target_id=tid, gc_ids=[10]))
    assert engine.get(keys.gc_key(10)) is None
    assert list(engine.scan_prefix(keys.gc_ack_prefix(10))) == []
    gc.ack(cluster_pb2.AckGCRequest(target_id=3, gc_ids=[10]))  # repeated: harmless
    assert engine.get(keys.gc_ack_key(10, 3)) is None
    with pytest.raises(errors.InvalidArgument):
        gc.fetch(cluster_pb2.FetchGCRequest(target_ids=[99]))
    with pytest.raises(errors.InvalidArgument):
        gc.ack(cluster_pb2.AckGCRequest(target_id=99, gc_ids=[11]))


def test_gc_scans_start_at_the_floor_and_queued_items_lower_it(gc, engine):
    """Finished items are not scanned again; an old inode removed later is still fetched.

    On a store that other metaservers queue into as well there is no floor: an item
    this metaserver was never told of is fetched at once.
    """

    def floor() -> int:
        start = gc.scan_floor()
        return start if start is not None else 0

    def queue(gc_id: int, report: bool = True) -> None:
        item = cluster_pb2.GCItem(gc_id=gc_id, inode=gc_id, chains=[1])
        engine.write({keys.gc_key(gc_id): item.SerializeToString()})
        if report:
            gc.queued([gc_id])

    def fetched() -> list[int]:
        return [i.gc_id for i in gc.fetch(cluster_pb2.FetchGCRequest(target_ids=[1])).items]

    def finish(gc_id: int) -> None:
        for tid in (1, 3, 5):  # chain 1
            gc.ack(cluster_pb2.AckGCRequest(target_id=tid, gc_ids=[gc_id]))

    assert (gc.scan_floor() is None) == engine.shared
    queue(50)
    queue(60)
    assert fetched() == [50, 60]
    assert floor() == (0 if engine.shared else 50)
    finish(50)
    assert fetched() == [60]
    assert floor() == (0 if engine.shared else 60)  # the next scans start past the finished item
    finish(60)
    assert fetched() == []
    assert engine.shared or floor() > 2**63  # nothing queued: no scan at all
    queue(40)  # an older file removed after the newer ones were collected
    assert fetched() == [40]
    finish(40)
    assert fetched() == []
    queue(30, report=False)  # an item nobody reported is below the floor...
    if engine.shared:
        assert fetched() == [30]  # ...where there is one
    else:
        assert fetched() == []
        assert gc.collect() == 0
        assert fetched() == [30]  # ...until the sweep, which reads the queue from its start
    assert [p.item.gc_id for p in gc.pending()] == [30]


def test_gc_floor_is_not_raised_past_an_item_queued_during_a_scan():
    floor = GCFloor()
    floor.raise_to(50, floor.start()[1])
    start, generation = floor.start()
    assert start == 50
    floor.lower(20)  # committed while the scan ran: perhaps after its snapshot
    floor.raise_to(100, generation)  # the scan's first item was 100: not below 20, though
    assert floor.start()[0] == 20
    floor.raise_to(30, floor.start()[1])  # a scan with no item queued meanwhile
    assert floor.start()[0] == 30
    floor.raise_to(10, floor.start()[1])  # never lowered by a scan
    assert floor.start()[0] == 30


def test_gc_item_completes_when_the_missing_target_goes_offline(three, gc, engine, clock):
    item = cluster_pb2.GCItem(gc_id=20, inode=20, chains=[1])
    engine.write({keys.gc_key(20): item.SerializeToString()})
    for tid in (1, 3):
        gc.ack(cluster_pb2.AckGCRequest(target_id=tid, gc_ids=[20]))
    assert engine.get(keys.gc_key(20)) is not None  # target 5 has not acked
    clock.now += 4
    heartbeat(three, "a")
    heartbeat(three, "b")
    clock.now += 2
    three.check_timeouts()  # c (target 5) offline: it drops the chunks while resyncing
    assert engine.get(keys.gc_key(20)) is None
    assert gc.pending() == []


def test_a_large_acknowledgement_goes_through_whatever_the_store_takes_in_a_commit(gc, engine):
    """A storage server acknowledges up to 256 items in one AckGC; on etcd (128 writes a
    transaction) they are recorded a few items a commit, and finished items go with their acks."""
    item_ids = list(range(100, 400))
    items = {
        keys.gc_key(g): cluster_pb2.GCItem(gc_id=g, inode=g, chains=[1]).SerializeToString()
        for g in item_ids
    }
    pairs = sorted(items.items())
    for i in range(0, len(pairs), 100):
        engine.write(dict(pairs[i : i + 100]))
    gc.queued(item_ids)
    for tid in (1, 3, 5):  # chain 1's members
        fetched = [i.gc_id for i in gc.fetch(cluster_pb2.FetchGCRequest(target_ids=[tid])).items]
        assert fetched == item_ids[:256]
        gc.ack(cluster_pb2.AckGCRequest(target_id=tid, gc_ids=fetched))
    assert [p.item.gc_id for p in gc.pending()] == item_ids[256:]
    assert list(engine.scan_prefix(keys.GC_ACK)) == []
    for tid in (1, 3, 5):
        rest = [i.gc_id for i in gc.fetch(cluster_pb2.FetchGCRequest(target_ids=[tid])).items]
        assert rest == item_ids[256:]
        gc.ack(cluster_pb2.AckGCRequest(target_id=tid, gc_ids=rest))
    assert gc.count() == 0
