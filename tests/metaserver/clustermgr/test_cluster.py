"""ClusterManager on the in-memory engine with a hand-driven clock."""

from __future__ import annotations

import pytest

from emberfs.common import errors
from emberfs.metaserver.clustermgr.chainstate import LASTSRV, OFFLINE, SERVING, SYNCING, WAITING
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import cluster_pb2

GiB = 1 << 30


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


def manager(engine, clock, replicas=3) -> ClusterManager:
    return ClusterManager(engine, replicas=replicas, heartbeat_timeout=5.0, clock=clock)


def register(cm, node: str, ids=(0, 0), port=7000):
    req = cluster_pb2.RegisterNodeRequest(
        node_id=node, data_address=f"127.0.0.1:{port}", grpc_address=f"127.0.0.1:{port + 1}"
    )
    for tid in ids:
        req.targets.add(target_id=tid, capacity=10 * GiB, used=GiB, chunks=3)
    return cm.register_node(req)


def heartbeat(cm, node: str, version=0, targets=()):
    req = cluster_pb2.HeartbeatRequest(node_id=node, routing_version=version)
    for tid in targets:
        req.targets.add(target_id=tid, capacity=10 * GiB, used=2 * GiB, chunks=5)
    return cm.heartbeat(req)


def states(cm) -> dict[int, int]:
    return {t.target_id: t.state for t in cm.routing().targets}


def chains(cm) -> dict[int, tuple[int, list[int]]]:
    return {c.chain_id: (c.version, list(c.targets)) for c in cm.routing().chains}


@pytest.fixture
def three(engine, clock):
    """Three nodes with two targets each (ids 1-2, 3-4, 5-6): chains 1 and 2."""
    cm = manager(engine, clock)
    for i, node in enumerate(("a", "b", "c")):
        register(cm, node, port=7000 + 10 * i)
    return cm


def test_registration_assigns_ids_and_forms_chains_over_three_nodes(engine, clock):
    cm = manager(engine, clock)
    r = register(cm, "a")
    assert list(r.target_ids) == [1, 2]
    assert cm.chain_table() == []
    register(cm, "b", port=7010)
    assert cm.chain_table() == []
    r = register(cm, "c", port=7020)
    assert list(r.target_ids) == [5, 6]
    assert cm.chain_table() == [1, 2]
    assert chains(cm) == {1: (1, [1, 3, 5]), 2: (1, [4, 6, 2])}
    assert [c.chain_id for c in r.routing.chains] == [1, 2]
    info = {t.target_id: t for t in cm.routing().targets}
    assert info[3].node_id == "b" and info[3].data_address == "127.0.0.1:7010"
    assert info[3].grpc_address == "127.0.0.1:7011" and info[3].chain_id == 1
    assert set(states(cm).values()) == {SERVING}
    assert cm.usage() == (60 * GiB, 6 * GiB)


def test_single_replica_makes_a_chain_per_target(engine, clock):
    cm = manager(engine, clock, replicas=1)
    register(cm, "a", ids=(0, 0, 0))
    assert cm.chain_table() == [1, 2, 3]
    assert chains(cm) == {1: (1, [1]), 2: (1, [2]), 3: (1, [3])}


def test_known_ids_are_kept_and_foreign_or_unknown_ids_refused(three):
    r = register(three, "a", ids=(1, 2))
    assert list(r.target_ids) == [1, 2]
    version = three.routing_version
    with pytest.raises(errors.InvalidArgument):
        register(three, "a", ids=(1, 3))  # target 3 belongs to b
    with pytest.raises(errors.InvalidArgument):
        register(three, "a", ids=(1, 99))
    with pytest.raises(errors.InvalidArgument):
        register(three, "a", ids=(1, 1))
    assert three.routing_version == version  # nothing half-applied


@pytest.mark.parametrize(
    "node, data, grpc_addr",
    [("", "h:1", "h:2"), ("a b", "h:1", "h:2"), ("a", "h", "h:2"), ("a", "h:1", "h:99999")],
)
def test_bad_registrations_are_refused(engine, clock, node, data, grpc_addr):
    cm = manager(engine, clock)
    req = cluster_pb2.RegisterNodeRequest(node_id=node, data_address=data, grpc_address=grpc_addr)
    with pytest.raises(errors.InvalidArgument):
        cm.register_node(req)
    assert cm.routing().targets == []


def test_heartbeat_reports_usage_and_routing_only_when_newer(three):
    v = three.routing_version
    resp = heartbeat(three, "a", version=v, targets=(1, 2))
    assert resp.routing_version == v and not resp.HasField("routing") and not resp.reregister
    assert three.usage() == (60 * GiB, 8 * GiB)
    assert three.routing_version == v  # usage does not bump the routing version
    resp = heartbeat(three, "a", version=v - 1)
    assert resp.routing.version == v and len(resp.routing.chains) == 2


class RecordingEngine(MemoryEngine):
    """Records whether each applied batch asked for a WAL sync."""

    def __init__(self) -> None:
        super().__init__()
        self.synced: list[bool] = []

    def _write(self, puts, deletes, sync):
        self.synced.append(sync)
        super()._write(puts, deletes, sync)


def test_usage_alone_is_stored_without_a_sync_and_state_changes_with_one(clock):
    engine = RecordingEngine()
    cm = manager(engine, clock)
    for i, node in enumerate(("a", "b", "c")):
        register(cm, node, port=7000 + 10 * i)
    assert engine.synced and all(engine.synced)  # registrations and chains
    engine.synced.clear()
    heartbeat(cm, "a", version=cm.routing_version, targets=(1, 2))
    assert engine.synced == [False]
    # stored all the same: a manager over the same store reads the new figures
    assert manager(engine, clock).usage() == (60 * GiB, 8 * GiB)
    heartbeat(cm, "a", targets=(1, 2))  # unchanged figures write nothing
    assert engine.synced == [False]
    clock.now += 6
    heartbeat(cm, "a")
    heartbeat(cm, "b")
    cm.check_timeouts()  # c goes offline: synced
    assert engine.synced[-1] is True and len(engine.synced) == 2
    heartbeat(cm, "c", targets=(5, 6))  # c returns, with new usage: one synced batch
    assert engine.synced[-1] is True and len(engine.synced) == 3
    assert states(cm)[5] == SYNCING


def test_heartbeat_from_unknown_node_asks_to_reregister(three):
    resp = heartbeat(three, "zz")
    assert resp.reregister


def test_heartbeat_with_a_foreign_target_is_refused(three):
    with pytest.raises(errors.InvalidArgument):
        heartbeat(three, "a", targets=(3,))


def test_timeout_takes_targets_offline_and_bumps_chain_versions(three, clock):
    v = three.routing_version
    clock.now += 4
    for node in ("a", "b"):
        heartbeat(three, node)
    clock.now += 2  # c silent for 6 s
    three.check_timeouts()
    assert states(three)[5] == OFFLINE and states(three)[6] == OFFLINE
    assert chains(three) == {1: (2, [1, 3, 5]), 2: (2, [4, 2, 6])}
    assert three.routing_version == v + 1
    three.check_timeouts()  # nothing new
    assert three.routing_version == v + 1


def test_return_after_timeout_waits_then_syncs_then_serves(three, clock):
    clock.now += 6
    heartbeat(three, "a")
    heartbeat(three, "b")
    three.check_timeouts()
    heartbeat(three, "c")  # heartbeats resume
    s = states(three)
    assert s[5] == SYNCING and s[6] == SYNCING
    assert chains(three)[1] == (3, [1, 3, 5])
    with pytest.raises(errors.Busy):
        three.sync_done(cluster_pb2.SyncDoneRequest(chain_id=1, chain_version=2, target_id=5))
    resp = three.sync_done(cluster_pb2.SyncDoneRequest(chain_id=1, chain_version=3, target_id=5))
    assert {c.chain_id: c.version for c in resp.routing.chains}[1] == 4
    assert states(three)[5] == SERVING
    with pytest.raises(errors.NotFound):
        three.sync_done(cluster_pb2.SyncDoneRequest(chain_id=9, chain_version=1, target_id=5))


def test_every_replica_dying_and_the_lastsrv_returning(three, clock):
    clock.now += 3
    heartbeat(three, "b")
    heartbeat(three, "c")
    clock.now += 3
    three.check_timeouts()  # a is gone
    clock.now += 3
    heartbeat(three, "c")
    clock.now += 3
    three.check_timeouts()  # b is gone
    clock.now += 6
    three.check_timeouts()  # c is gone: it was the last to serve
    s = states(three)
    assert s[5] == LASTSRV and s[1] == OFFLINE and s[3] == OFFLINE
    assert chains(three)[1][1] == [5, 3, 1]
    register(three, "a", ids=(1, 2))  # a restarts first: it must not serve stale data
    assert states(three)[1] == WAITING
    assert chains(three)[1][1][0] == 5
    register(three, "c", ids=(5, 6), port=7020)  # the lastsrv comes back
    s = states(three)
    assert s[5] == SERVING and s[1] == SYNCING and s[3] == OFFLINE
    assert chains(three)[1][1] == [5, 1, 3]


def test_serving_node_restarting_within_the_timeout_resyncs(three):
    v = chains(three)[1][0]
    register(three, "a", ids=(1, 2))
    s = states(three)
    assert s[1] == SYNCING and s[2] == SYNCING
    assert chains(three)[1] == (v + 1, [3, 5, 1])


def test_target_left_out_of_a_registration_goes_offline(three):
    register(three, "a", ids=(1,))
    assert states(three)[2] == OFFLINE
    heartbeat(three, "a")  # heartbeats do not bring back a target the node no longer has
    assert states(three)[2] == OFFLINE
    register(three, "a", ids=(1, 2))
    assert states(three)[2] == SYNCING


def test_new_targets_form_new_chains_later(three):
    register(three, "a", ids=(1, 2, 0))
    register(three, "b", ids=(3, 4, 0), port=7010)
    assert cm_chain_ids(three) == [1, 2]
    register(three, "c", ids=(5, 6, 0), port=7020)
    assert cm_chain_ids(three) == [1, 2, 3]
    assert sorted(chains(three)[3][1]) == [7, 8, 9]


def cm_chain_ids(cm):
    return cm.chain_table()


def test_restart_resumes_same_state_with_a_grace_period(three, engine, clock):
    clock.now += 6
    heartbeat(three, "a")
    heartbeat(three, "b")
    three.check_timeouts()
    before = three.routing()
    reopened = manager(engine, clock)
    assert reopened.routing() == before
    # a restarted manager does not time out nodes that simply have not been heard from yet
    clock.now += 4
    reopened.check_timeouts()
    assert reopened.routing() == before
    r = register(reopened, "d", ids=(0,), port=7030)
    assert list(r.target_ids) == [7]  # the id counter survived
    clock.now += 2
    reopened.check_timeouts()
    s = states(reopened)  # nodes a, b, c silent since the restart, d just registered
    assert (s[1], s[3], s[5], s[7]) == (OFFLINE, LASTSRV, OFFLINE, SERVING)


def test_many_nodes_timing_out_at_once_fit_the_store_one_node_a_commit(store, clock):
    """Thirty nodes of four targets (120 targets, some 38 chains) go silent at once: every
    target goes offline, on etcd too, whose transactions take 128 writes."""
    engine = store()
    cm = manager(engine, clock)
    for n in range(30):
        register(cm, f"n{n:02d}", ids=(0, 0, 0, 0), port=7000 + 10 * n)
    assert len(cm.routing().chains) >= 30
    clock.now += 6.0  # past the heartbeat timeout, no heartbeat from anyone
    cm.check_timeouts()
    assert set(states(cm).values()) <= {OFFLINE, LASTSRV}
    again = manager(engine, clock)  # what was stored is what memory said
    assert states(again) == states(cm) and chains(again) == chains(cm)
