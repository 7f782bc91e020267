"""The pure target-state and chain rules."""

from __future__ import annotations

import pytest

from emberfs.common import errors
from emberfs.metaserver.clustermgr import chainstate as cs
from emberfs.metaserver.clustermgr.chainstate import (
    LASTSRV,
    OFFLINE,
    SERVING,
    SYNCING,
    WAITING,
    Chain,
)


def chain(*members: tuple[int, int], version: int = 5) -> Chain:
    return Chain(7, version, tuple(t for t, _ in members), tuple(s for _, s in members))


def members(c: Chain) -> list[tuple[int, int]]:
    return list(zip(c.targets, c.states, strict=True))


def test_new_chain_serves_at_version_one():
    c = Chain.new(3, [4, 5, 6])
    assert c.version == 1
    assert members(c) == [(4, SERVING), (5, SERVING), (6, SERVING)]
    assert c.head == 4


def test_chain_rejects_duplicate_targets():
    with pytest.raises(ValueError):
        Chain(1, 1, (1, 1), (SERVING, SERVING))


def test_timeout_of_serving_goes_offline_while_another_serves():
    c = cs.on_timeout(chain((1, SERVING), (2, SERVING), (3, SERVING)), 1)
    assert members(c) == [(2, SERVING), (3, SERVING), (1, OFFLINE)]
    assert c.version == 6
    assert c.head == 2


def test_timeout_keeps_relative_order_of_serving_targets():
    c = cs.on_timeout(chain((1, SERVING), (2, SERVING), (3, SERVING)), 2)
    assert members(c) == [(1, SERVING), (3, SERVING), (2, OFFLINE)]


def test_all_replicas_dying_leaves_the_last_serving_one_lastsrv():
    c = chain((1, SERVING), (2, SERVING), (3, SERVING), version=1)
    c = cs.on_timeout(c, 1)
    c = cs.on_timeout(c, 3)
    assert members(c) == [(2, SERVING), (3, OFFLINE), (1, OFFLINE)]
    c = cs.on_timeout(c, 2)
    assert members(c) == [(2, LASTSRV), (3, OFFLINE), (1, OFFLINE)]
    assert c.version == 4
    assert c.head is None
    # a lastsrv target timing out again changes nothing
    assert cs.on_timeout(c, 2) is c


def test_others_returning_before_lastsrv_wait_and_do_not_serve():
    c = chain((2, LASTSRV), (1, OFFLINE), (3, OFFLINE))
    c = cs.on_return(c, 3, restarted=True)
    assert members(c) == [(2, LASTSRV), (3, WAITING), (1, OFFLINE)]
    assert c.version == 6
    c = cs.on_return(c, 1, restarted=False)
    assert members(c) == [(2, LASTSRV), (3, WAITING), (1, WAITING)]
    assert c.head is None


def test_lastsrv_returning_serves_and_the_first_waiting_target_syncs():
    c = chain((2, LASTSRV), (3, WAITING), (1, WAITING))
    c = cs.on_return(c, 2, restarted=True)
    assert members(c) == [(2, SERVING), (3, SYNCING), (1, WAITING)]
    assert c.version == 6


def test_offline_target_returning_while_chain_serves_waits_then_syncs():
    c = chain((2, SERVING), (3, SERVING), (1, OFFLINE))
    c = cs.on_return(c, 1, restarted=False)
    # waiting, and at once the one syncing target (no other sync runs)
    assert members(c) == [(2, SERVING), (3, SERVING), (1, SYNCING)]
    assert c.version == 6


def test_only_one_target_syncs_at_a_time():
    c = chain((1, SERVING), (2, SYNCING), (3, OFFLINE))
    c = cs.on_return(c, 3, restarted=False)
    assert members(c) == [(1, SERVING), (2, SYNCING), (3, WAITING)]


def test_sync_done_serves_and_starts_the_next_sync():
    c = chain((1, SERVING), (2, SYNCING), (3, WAITING))
    c = cs.on_sync_done(c, 5, 2)
    assert members(c) == [(1, SERVING), (2, SERVING), (3, SYNCING)]
    assert c.version == 6
    c = cs.on_sync_done(c, 6, 3)
    assert members(c) == [(1, SERVING), (2, SERVING), (3, SERVING)]
    assert c.version == 7


def test_sync_done_with_a_stale_version_is_refused():
    c = chain((1, SERVING), (2, SYNCING))
    with pytest.raises(errors.Busy) as info:
        cs.on_sync_done(c, 4, 2)
    assert info.value.code.name == "FAILED_PRECONDITION"


def test_sync_done_for_a_target_that_does_not_sync_is_refused():
    c = chain((1, SERVING), (2, WAITING), (3, SYNCING))
    with pytest.raises(errors.Busy):
        cs.on_sync_done(c, 5, 2)
    with pytest.raises(errors.NotFound):
        cs.on_sync_done(c, 5, 9)


def test_syncing_or_waiting_target_timing_out_goes_offline():
    c = chain((1, SERVING), (2, SYNCING), (3, WAITING))
    c = cs.on_timeout(c, 2)
    # the waiting target takes over the sync
    assert members(c) == [(1, SERVING), (3, SYNCING), (2, OFFLINE)]
    c = cs.on_timeout(c, 3)
    assert members(c) == [(1, SERVING), (3, OFFLINE), (2, OFFLINE)]


def test_serving_target_restarted_while_another_serves_waits():
    c = chain((1, SERVING), (2, SERVING), (3, SERVING))
    c = cs.on_return(c, 1, restarted=True)
    assert members(c) == [(2, SERVING), (3, SERVING), (1, SYNCING)]
    assert c.version == 6


def test_sole_serving_target_restarted_keeps_serving():
    c = chain((1, SERVING), (2, OFFLINE), (3, OFFLINE))
    assert cs.on_return(c, 1, restarted=True) is c


def test_heartbeat_of_a_serving_target_changes_nothing():
    c = chain((1, SERVING), (2, SERVING))
    assert cs.on_return(c, 1, restarted=False) is c


def test_restarted_syncing_target_restarts_its_sync_under_a_new_version():
    c = chain((1, SERVING), (2, SYNCING), (3, WAITING))
    c2 = cs.on_return(c, 2, restarted=True)
    assert members(c2) == members(c)
    assert c2.version == 6


def test_waiting_target_without_any_serving_one_keeps_waiting():
    c = chain((2, LASTSRV), (1, WAITING), (3, OFFLINE))
    assert cs.on_return(c, 1, restarted=True) is c
    c = cs.on_return(c, 3, restarted=True)
    assert members(c) == [(2, LASTSRV), (1, WAITING), (3, WAITING)]


def test_settle_rejects_states_of_other_targets():
    c = chain((1, SERVING), (2, SERVING))
    with pytest.raises(ValueError):
        cs.settle(c, {1: SERVING})


def test_form_chains_three_nodes_spans_every_node_and_rotates_heads():
    free = [(t, f"n{(t - 1) // 4}") for t in range(1, 13)]  # n0: 1-4, n1: 5-8, n2: 9-12
    chains = cs.form_chains(free, 3, 1)
    assert [c.chain_id for c in chains] == [1, 2, 3, 4]
    assert [c.targets for c in chains] == [(1, 5, 9), (6, 10, 2), (11, 3, 7), (4, 8, 12)]
    for c in chains:
        assert c.version == 1 and set(c.states) == {SERVING}
    assert len({(c.targets[0] - 1) // 4 for c in chains[:3]}) == 3  # heads on 3 nodes


def test_form_chains_needs_distinct_nodes():
    assert cs.form_chains([(1, "a"), (2, "a"), (3, "b")], 3, 1) == []
    chains = cs.form_chains([(1, "a"), (2, "a"), (3, "b"), (4, "c")], 3, 10)
    assert [c.targets for c in chains] == [(1, 3, 4)]
    assert chains[0].chain_id == 10


def test_form_chains_prefers_nodes_with_most_free_targets():
    free = [(1, "a"), (2, "b"), (3, "b"), (4, "c"), (5, "c"), (6, "d")]
    chains = cs.form_chains(free, 2, 1)
    # b and c have two free targets each, so they pair first; then by node id
    assert [c.targets for c in chains] == [(2, 4), (3, 1), (5, 6)]
    for c in chains:
        assert len({dict(free)[t] for t in c.targets}) == 2


def test_form_chains_with_one_replica_makes_one_chain_per_target():
    chains = cs.form_chains([(3, "a"), (1, "a"), (2, "b")], 1, 1)
    assert sorted(c.targets for c in chains) == [(1,), (2,), (3,)]


def test_state_names():
    assert cs.state_name(SERVING) == "serving"
    assert cs.state_name(LASTSRV) == "lastsrv"


def test_a_serving_target_that_lost_data_waits_and_the_next_waiting_one_syncs():
    c = cs.on_lost_data(chain((1, SERVING), (2, SERVING), (3, SERVING)), 1)
    assert members(c) == [(2, SERVING), (3, SERVING), (1, SYNCING)]
    assert c.version == 6


def test_the_last_serving_target_keeps_serving_when_it_lost_data():
    before = chain((1, SERVING), (2, SYNCING), (3, OFFLINE))
    assert cs.on_lost_data(before, 1) is before
    assert cs.on_lost_data(before, 2) is before  # not serving: unchanged
