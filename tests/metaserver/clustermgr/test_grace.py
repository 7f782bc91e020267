"""Grace after the metaserver's own stalls and restarts, with a hand-driven clock."""

from __future__ import annotations

import threading
import time

import pytest

from emberfs.metaserver.clustermgr.chainstate import LASTSRV, OFFLINE, SERVING
from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import cluster_pb2

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 5.0
ROUND = 0.5  # the metaserver's timeout check runs this often


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def test_a_gap_longer_than_max_gap_is_a_stall(clock):
    grace = Grace(max_gap=2.5, clock=clock)
    start = grace.since
    clock.now += 2.5
    assert grace.check() == clock.now
    assert grace.since == start and grace.stalls == 0
    clock.now += 2.6
    assert grace.check() == clock.now
    assert grace.since == clock.now
    assert grace.stalls == 1 and grace.stalled_seconds == pytest.approx(2.6)
    # silence counts from the stall's end at the earliest
    assert grace.silence(start, clock.now + 1) == pytest.approx(1)
    assert grace.silence(clock.now + 0.5, clock.now + 1) == pytest.approx(0.5)
    assert grace.silence(clock.now + 2, clock.now + 1) == 0


def test_begin_judges_from_when_the_servers_listen(clock):
    grace = Grace(max_gap=2.5, clock=clock)
    clock.now += 10  # opening the store, building the servers
    grace.begin()
    assert grace.since == clock.now
    clock.now += ROUND
    grace.check()
    assert grace.stalls == 0  # the start-up is no stall


def test_without_max_gap_no_stall_is_noticed(clock):
    grace = Grace(clock=clock)
    clock.now += 1e6
    grace.check()
    assert grace.stalls == 0


def test_max_gap_must_be_positive():
    with pytest.raises(ValueError):
        Grace(max_gap=0)


def register(cm, node: str, port: int):
    req = cluster_pb2.RegisterNodeRequest(
        node_id=node, data_address=f"127.0.0.1:{port}", grpc_address=f"127.0.0.1:{port + 1}"
    )
    req.targets.add(target_id=0, capacity=1 << 30)
    return cm.register_node(req)


def heartbeat(cm, node: str):
    return cm.heartbeat(cluster_pb2.HeartbeatRequest(node_id=node))


def states(cm) -> dict[int, int]:
    return {t.target_id: t.state for t in cm.routing().targets}


def versions(cm) -> list[int]:
    return [c.version for c in cm.routing().chains]


def run(cm, clock, seconds: float, beating=("a", "b", "c")) -> None:
    """``seconds`` of rounds: the nodes in ``beating`` heartbeat, then the timeout check."""
    for _ in range(round(seconds / ROUND)):
        clock.now += ROUND
        for node in beating:
            heartbeat(cm, node)
        cm.check_timeouts()


@pytest.fixture
def three(clock):
    grace = Grace(max_gap=TIMEOUT / 2, clock=clock)
    cm = ClusterManager(MemoryEngine(), replicas=3, heartbeat_timeout=TIMEOUT, grace=grace)
    for i, node in enumerate(("a", "b", "c")):
        register(cm, node, 7000 + 10 * i)
    assert set(states(cm).values()) == {SERVING}
    return cm


def test_a_stall_of_the_metaserver_takes_no_node_offline(three, clock):
    cm = three
    run(cm, clock, 3)
    before = cm.routing()
    clock.now += 3 * TIMEOUT  # stopped: the heartbeats sent meanwhile were never read
    cm.check_timeouts()
    assert cm.grace.stalls == 1
    assert cm.routing() == before
    assert all(age == 0 for age in cm.heartbeat_ages().values())
    # the grace is one heartbeat timeout: a node silent since the stall goes then
    run(cm, clock, TIMEOUT, beating=("a", "b"))
    assert cm.routing() == before
    run(cm, clock, ROUND, beating=("a", "b"))
    assert [s for s in states(cm).values()].count(OFFLINE) == 1
    assert cm.grace.stalls == 1


def test_a_short_stall_leaves_ages_as_they_are(three, clock):
    cm = three
    run(cm, clock, 1)
    clock.now += TIMEOUT / 2  # not longer than max_gap: no stall
    cm.check_timeouts()
    assert cm.grace.stalls == 0
    assert all(age == pytest.approx(TIMEOUT / 2) for age in cm.heartbeat_ages().values())
    assert set(states(cm).values()) == {SERVING}


def test_restarted_manager_judges_known_nodes_from_when_it_listens(three, clock):
    cm = three
    before = cm.routing()
    clock.now += 100  # down
    grace = Grace(max_gap=TIMEOUT / 2, clock=clock)
    reopened = ClusterManager(cm.engine, replicas=3, heartbeat_timeout=TIMEOUT, grace=grace)
    clock.now += 3 * TIMEOUT  # a slow start: opening the store, building the servers
    grace.begin()
    run(reopened, clock, TIMEOUT, beating=())
    assert reopened.routing() == before
    run(reopened, clock, ROUND, beating=())
    assert set(states(reopened).values()) == {OFFLINE, LASTSRV}


def test_a_heartbeat_waiting_for_the_cluster_lock_has_already_counted(clock):
    cm = ClusterManager(MemoryEngine(), replicas=3, heartbeat_timeout=TIMEOUT, clock=clock)
    for i, node in enumerate(("a", "b", "c")):
        register(cm, node, 7000 + 10 * i)
    clock.now += TIMEOUT - ROUND
    done = threading.Event()
    with cm.locked():  # a slow change holds the cluster lock
        beat = threading.Thread(target=lambda: (heartbeat(cm, "a"), done.set()))
        beat.start()
        deadline = time.monotonic() + 30
        while cm.heartbeat_ages()["a"] != 0:
            assert time.monotonic() < deadline, "the heartbeat was not noted"
            time.sleep(0.01)
        assert not done.is_set()
        clock.now += ROUND * 2  # b and c are past the timeout now, a is not
    cm.check_timeouts()
    beat.join(timeout=30)
    node_of = {t.target_id: t.node_id for t in cm.routing().targets}
    down = {node_of[t] for t, s in states(cm).items() if s != SERVING}
    assert down == {"b", "c"}
