"""The election of the cluster manager's leader over etcd, with real etcd leases.

Several :class:`EtcdLeadership` candidates share one store (as metaservers do): exactly
one leads at a time, a leader that goes gives way within about its lease's ttl, a
leader that lost the key can change nothing (its fence), and a leader cut off from
etcd freezes (no changes, heartbeats answered) for the outage grace, then steps down.
"""

from __future__ import annotations

import time

import pytest

from emberfs.common import errors
from emberfs.metaserver.clustermgr.leadership import EtcdLeadership, LeaderInfo
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.etcd import EtcdEngine
from emberfs.metaserver.store.kv import Conflict
from emberfs.proto import cluster_pb2
from tests.relay import Relay

TTL = 2.0


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached after {timeout} s"
        time.sleep(0.05)
    return time.monotonic()


@pytest.fixture
def candidates(etcd_url):
    """A factory of candidates over one key prefix, each with an engine of its own."""
    made: list[tuple[EtcdLeadership, EtcdEngine]] = []

    def make(name: str, url: str | None = None, **kw) -> EtcdLeadership:
        engine = EtcdEngine((url or etcd_url) + "?timeout=1")
        kw.setdefault("ttl", TTL)
        kw.setdefault("outage_grace", 6.0)
        lead = EtcdLeadership(
            engine, LeaderInfo(name, f"{name}:9400", f"{name}:9402", f"http://{name}:9401"), **kw
        )
        made.append((lead, engine))
        return lead

    yield make
    for lead, engine in made:
        lead.stop()
        engine.close()


def test_exactly_one_candidate_leads_and_the_others_point_at_it(candidates):
    elected = []
    leads = [candidates(n) for n in ("a", "b", "c")]
    for lead in leads:
        lead.start(on_elected=lambda lead=lead: elected.append(lead.me.id))
    wait_for(lambda: any(lead.leading() for lead in leads), what="a leader")
    time.sleep(3 * leads[0].poll)
    leaders = [lead for lead in leads if lead.leading()]
    assert len(leaders) == 1 and elected == [leaders[0].me.id]
    (leader,) = leaders
    for lead in leads:
        assert lead.leader().id == leader.me.id
        if lead is not leader:
            with pytest.raises(errors.NotLeader) as refused:
                lead.require()
            assert refused.value.leader == leader.me.address
    assert keys.LEADER in leader.fence


def test_a_leader_that_stops_gives_way_at_once_and_one_that_dies_within_its_ttl(candidates):
    a, b = candidates("a"), candidates("b")
    a.start()
    wait_for(a.leading, what="a leads")
    b.start()
    a.stop()  # a clean shutdown gives the key up
    wait_for(b.leading, timeout=3 * b.poll + 2, what="b leads after a stopped")
    # b dies: its lease is no longer kept alive, nor its key given up
    b.halt()
    died = time.monotonic()
    c = candidates("c")
    c.start()
    took = wait_for(c.leading, timeout=TTL + 5, what="c leads after b died") - died
    assert took <= TTL + 2 * c.poll + 1.0
    # b, deposed, cannot change anything: its commits carry its fence
    with pytest.raises(Conflict):
        b.engine.commit(b.fence, {b"CONFchange": b"1"}, set())
    assert b.engine.get(b"CONFchange") is None


def test_a_leader_cut_off_from_etcd_freezes_then_steps_down_and_another_leads(
    candidates, etcd, etcd_url
):
    prefix = etcd_url.rsplit("/", 1)[1]
    relay = Relay(etcd.endpoints[0])
    try:
        deposed = []
        a = candidates("a", url=f"etcd://{relay.address}/{prefix}", outage_grace=6.0)
        a.start(on_deposed=lambda: deposed.append(time.monotonic()))
        wait_for(a.leading, what="a leads")
        cut = time.monotonic()
        relay.cut()
        # past its lease's end it no longer leads, but keeps granting node leases
        wait_for(lambda: not a.leading(), timeout=TTL + 1, what="a stops leading")
        assert a.granting()
        b = candidates("b")
        b.start()
        wait_for(b.leading, timeout=TTL + 5, what="b leads once a's lease expired")
        assert a.granting()  # still frozen: b holds back for the outage grace
        wait_for(lambda: not a.granting(), timeout=8, what="a stops granting")
        assert 6.0 - 1.0 <= time.monotonic() - cut <= 6.0 + 2 * a.poll + 1.5
        wait_for(lambda: deposed, timeout=3, what="a steps down")
        relay.heal()
        time.sleep(4 * a.poll)
        assert b.leading() and not a.leading()
        assert a.leader().id == "b"
    finally:
        relay.close()


def test_a_new_leader_judges_nodes_only_after_the_outage_grace(candidates, etcd_url):
    """No node that a frozen leader may still be keeping up is declared offline early."""
    a = candidates("a", outage_grace=4.0)
    cm = ClusterManager(a.engine, replicas=1, heartbeat_timeout=1.0, leadership=a)
    a.start(on_elected=cm.take_over)
    wait_for(a.leading, what="a leads")
    req = cluster_pb2.RegisterNodeRequest(
        node_id="n1", data_address="127.0.0.1:7000", grpc_address="127.0.0.1:7001"
    )
    req.targets.add(capacity=1 << 30)
    (tid,) = cm.register_node(req).target_ids
    taken = time.monotonic()
    cm.take_over()  # as a metaserver taking over does (the node says nothing from now)
    for _ in range(int(4.0 / 0.2) - 2):
        cm.check_timeouts()
        assert {t.target_id: t.state for t in cm.routing().targets}[tid] == 1  # SERVING
        time.sleep(0.2)
    wait_for(
        lambda: cm.check_timeouts() or cm.routing().targets[0].state != 1,
        timeout=4.0,
        what="the silent node times out",
    )
    assert time.monotonic() - taken >= 4.0 + 1.0
