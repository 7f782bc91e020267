"""The replica's state and decisions: answers kept per request, version floors, locks (no I/O)."""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass, field

from emberfs.common import wire
from emberfs.common.framing import Status
from emberfs.common.routing import TargetView
from emberfs.proto import common_pb2, data_pb2
from emberfs.storageserver import replication as rp
from emberfs.storageserver.chunkstore import VersionConflict
from emberfs.storageserver.replica import Replica, ResultCache, WritePlan, request_key

CS = 1024 * 1024
SUCC = TargetView(2, data_address="127.0.0.1:1002", state=common_pb2.SERVING)


@dataclass
class Meta:
    version: int = 0
    pending_version: int = 0
    length: int = 0
    crcs: list = field(default_factory=list)


def wreq(update=0, base=0, full=False, offset=0, client_id="c", request_id=9):
    return data_pb2.ChunkWriteRequest(
        chain_id=1,
        chain_version=7,
        target_id=1,
        chunk=data_pb2.ChunkId(inode=5, index=3),
        offset=offset,
        chunk_size=CS,
        update_version=update,
        base_version=base,
        full_chunk=full,
        client_id=client_id,
        request_id=request_id,
    )


def role(kind=rp.WriteKind.CLIENT, successor=SUCC):
    return rp.WriteRole(kind, 7, successor)


# answers ------------------------------------------------------------------


def test_result_cache_lru_and_ttl():
    now = [0.0]
    cache = ResultCache(max_entries=2, ttl=10, clock=lambda: now[0])
    cache.put(("a", 1), "A")
    cache.put(("b", 1), "B")
    assert cache.get(("a", 1)) == "A"
    cache.put(("c", 1), "C")  # evicts b, the least recently used
    assert cache.get(("b", 1)) is None and cache.get(("a", 1)) == "A"
    now[0] = 11
    assert cache.get(("a", 1)) is None
    assert len(cache) == 1


def test_request_key():
    assert request_key("", 5, 1) is None
    assert request_key("c", 0, 1) is None
    assert request_key("c", 5, 1, 2) == ("c", 5, 1, 2)


def test_only_client_requests_keep_their_answer_and_never_a_refusal():
    replica = Replica()
    key = replica.write_key(wreq(), role())
    assert key == ("c", 9, 1, 5, 3)
    assert replica.write_key(wreq(update=4, base=3), role(rp.WriteKind.FORWARDED)) is None
    assert replica.write_key(wreq(client_id=""), role()) is None
    replica.answer(key, wire.StaleChain("x"))
    assert replica.answered(key) is None
    answer = data_pb2.ChunkWriteResponse(version=4, chunk_length=10)
    replica.answer(key, answer)
    assert replica.answered(key) is answer
    truncate = data_pb2.ChunkTruncateRequest(target_id=1, inode=5, client_id="m", request_id=3)
    assert replica.truncate_key(truncate, role()) == ("m", 3, 1, 5, -1)
    assert replica.truncate_key(truncate, role(rp.WriteKind.FORWARDED)) is None


# write plans --------------------------------------------------------------


def test_a_client_write_goes_above_every_version_and_the_floor():
    replica = Replica()
    plan = replica.plan_write(wreq(), role(), Meta(version=3, pending_version=0))
    assert isinstance(plan, WritePlan)
    assert (plan.version, plan.base_version, plan.full, plan.send_full) == (4, 3, False, False)
    fwd = plan.forward()
    assert (fwd.target_id, fwd.update_version, fwd.base_version, fwd.full_chunk) == (2, 4, 3, False)
    replica.aborted(plan)  # version 4 may live on downstream
    again = replica.plan_write(wreq(), role(), Meta(version=3))
    assert again.version == 5
    replica.committed(again)
    assert replica.floor(plan.key) == 0
    assert replica.plan_write(wreq(), role(), None).version == 1


def test_a_floor_above_a_committed_version_stays():
    replica = Replica()
    high = replica.plan_write(wreq(), role(), Meta(version=8))
    replica.aborted(high)  # floor 9
    low = replica.plan_write(wreq(), role(), Meta(version=8))
    assert low.version == 10
    low.version = 7  # a plan below the floor does not clear it
    replica.committed(low)
    assert replica.floor(low.key) == 9


def test_forwarded_writes_follow_plan_forwarded():
    replica = Replica()
    fwd = role(rp.WriteKind.FORWARDED, successor=None)
    held = replica.plan_write(wreq(update=3, base=2), fwd, Meta(version=3, length=10))
    assert isinstance(held, data_pb2.ChunkWriteResponse) and held.version == 3
    need = replica.plan_write(wreq(update=5, base=4), fwd, Meta(version=2))
    assert isinstance(need, wire.NotCommitted) and need.message == rp.NEED_FULL_CHUNK
    full = replica.plan_write(wreq(update=5, base=4, full=True), fwd, Meta(version=2))
    assert (full.version, full.full) == (5, True)
    part = replica.plan_write(wreq(update=5, base=4, offset=7), fwd, Meta(version=4))
    assert (part.version, part.full, part.base_version) == (5, False, 4)


def test_a_syncing_successor_gets_the_whole_chunk_at_once():
    syncing = TargetView(2, data_address="h:2", state=common_pb2.SYNCING)
    plan = Replica().plan_write(wreq(), role(successor=syncing), Meta(version=1))
    assert plan.send_full and plan.forward().full_chunk and plan.forward().offset == 0


def test_staging_failures_map_to_refusals_and_raise_the_floor_once_forwarded():
    replica = Replica()
    plan = replica.plan_write(wreq(), role(), Meta(version=1))
    conflict = replica.staging_failed(plan, VersionConflict("moved"), forwarded=False)
    assert isinstance(conflict, wire.StaleChain) and replica.floor(plan.key) == 0
    bad = replica.staging_failed(plan, ValueError("too long"), forwarded=True)
    assert isinstance(bad, wire.BadRequest) and replica.floor(plan.key) == plan.version
    assert replica.staging_failed(plan, OSError("disk"), forwarded=True) is None


def test_a_stage_without_room_is_answered_no_space_and_its_version_never_reused():
    replica = Replica()
    plan = replica.plan_write(wreq(), role(), Meta(version=1))
    full = replica.staging_failed(plan, OSError(errno.ENOSPC, "full"), forwarded=True)
    assert isinstance(full, wire.NoSpace) and not full.retryable
    assert replica.floor(plan.key) == plan.version == 2
    again = replica.plan_write(wreq(), role(), Meta(version=1))
    assert again.version == 3  # the successor may hold version 2
    alone = Replica()
    plan = alone.plan_write(wreq(), role(), Meta(version=1))
    quota = alone.staging_failed(plan, OSError(errno.EDQUOT, "quota"), forwarded=False)
    assert isinstance(quota, wire.NoSpace) and alone.floor(plan.key) == 0


def test_successor_answers():
    replica = Replica()
    plan = replica.plan_write(wreq(), role(), Meta(version=1))
    assert replica.successor_answered(plan, Status.OK, "") is None
    step = replica.successor_answered(plan, Status.NOT_COMMITTED, rp.NEED_FULL_CHUNK)
    assert step == rp.Reply.RESEND_FULL and plan.send_full
    again = replica.successor_answered(plan, Status.NOT_COMMITTED, rp.NEED_FULL_CHUNK)
    assert isinstance(again, wire.NotServing) and "successor target 2" in again.message
    stale = replica.successor_answered(plan, Status.STALE_CHAIN, "old")
    assert isinstance(stale, wire.StaleChain) and stale.retryable
    cut = replica.cut_answered(role(), Status.INTERNAL, "boom", sent_full=False)
    assert isinstance(cut, wire.NotServing)
    assert replica.cut_answered(role(), Status.OK, "", sent_full=False) is None
    need = (Status.NOT_COMMITTED, rp.NEED_FULL_CHUNK)
    assert replica.cut_answered(role(), *need, sent_full=False) == rp.Reply.RESEND_FULL
    assert isinstance(replica.cut_answered(role(), *need, sent_full=True), wire.NotServing)


@dataclass
class ChunkMeta(Meta):
    index: int = 0


def truncation(length, steps=()):
    return data_pb2.ChunkTruncateRequest(
        chain_id=1,
        target_id=1,
        inode=5,
        length=length,
        chunk_size=CS,
        stripe=1,
        stripe_position=0,
        steps=list(steps),
    )


def test_the_head_numbers_its_cuts_above_the_floor():
    replica = Replica()
    plan = replica.plan_write(wreq(), role(), Meta(version=2))  # chunk 3
    replica.aborted(plan)  # floor 3
    chunks = [ChunkMeta(version=2, length=CS, index=3), ChunkMeta(version=6, length=CS, index=4)]
    steps = replica.plan_cut(truncation(3 * CS + 100), chunks)
    assert [(s.index, s.length, s.version, s.base_version) for s in steps] == [
        (3, 100, 4, 2),
        (4, 0, 7, 6),
    ]
    assert replica.plan_cut(truncation(5 * CS), chunks) == []  # nothing past the end
    replica.cut_committed(truncation(0), steps[:1])
    assert replica.floor(plan.key) == 0
    replica.cut_aborted(truncation(0), steps)
    assert replica.floor((1, 5, 4)) == 7


def test_a_forwarded_cut_applies_the_heads_steps_or_asks_for_the_chunks():
    steps = [
        data_pb2.TruncateStep(index=0, length=10, version=5, base_version=4),
        data_pb2.TruncateStep(index=1, length=0, version=3, base_version=2),
    ]
    metas = {0: Meta(version=4), 1: Meta(version=3)}  # chunk 1 holds the cut already
    applied = Replica.forwarded_cut(truncation(10, steps), metas.get)
    assert [s.index for s in applied] == [0]
    metas[0] = Meta(version=3)  # not the head's base: its content is not the head's
    need = Replica.forwarded_cut(truncation(10, steps), metas.get)
    assert isinstance(need, wire.NotCommitted) and need.message == rp.NEED_FULL_CHUNK


# locks --------------------------------------------------------------------


def test_a_truncation_waits_for_the_updates_of_its_inode():
    replica = Replica()
    order = []
    entered = threading.Event()
    release = threading.Event()

    def update():
        with replica.updating(1, 5, 0):
            entered.set()
            release.wait(5)
            order.append("update")

    def truncate():
        with replica.truncating(1, 5):
            order.append("truncate")

    t1 = threading.Thread(target=update)
    t1.start()
    assert entered.wait(5)
    t2 = threading.Thread(target=truncate)
    t2.start()
    with replica.updating(1, 5, 1):  # another chunk of the inode is not held up
        order.append("other chunk")
    release.set()
    t1.join(5)
    t2.join(5)
    assert order == ["other chunk", "update", "truncate"]
