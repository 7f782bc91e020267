"""Deterministic tests of the CRAQ decisions (no sockets, no files)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from emberfs.common import framing
from emberfs.common.framing import Status
from emberfs.common.routing import RoutingView
from emberfs.proto import common_pb2, data_pb2
from emberfs.storageserver import replication as rp

S, Y, W, L, OFF = (
    common_pb2.SERVING,
    common_pb2.SYNCING,
    common_pb2.WAITING,
    common_pb2.LASTSRV,
    common_pb2.OFFLINE,
)
CS = 4 * 1024 * 1024
BS = framing.DEFAULT_BLOCK


@dataclass
class Meta:
    version: int = 0
    pending_version: int = 0
    length: int = 0
    crcs: list = field(default_factory=list)


def view(states: dict[int, int], order=(1, 2, 3), version=7, routing_version=42):
    routing = common_pb2.RoutingInfo(version=routing_version)
    for t, st in states.items():
        routing.targets.add(
            target_id=t,
            node_id=f"n{t}",
            data_address=f"127.0.0.1:{1000 + t}",
            grpc_address=f"127.0.0.1:{2000 + t}",
            state=st,
            chain_id=1,
        )
    routing.chains.add(chain_id=1, version=version, targets=list(order))
    return RoutingView.from_proto(routing)


def wreq(target=1, version=7, offset=0, update=0, base=0, full=False, sync=False, chunk_size=CS):
    return data_pb2.ChunkWriteRequest(
        chain_id=1,
        chain_version=version,
        target_id=target,
        chunk=data_pb2.ChunkId(inode=5, index=0),
        offset=offset,
        chunk_size=chunk_size,
        update_version=update,
        base_version=base,
        full_chunk=full,
        sync=sync,
    )


def rreq(target=1, version=7, offset=0, length=100):
    return data_pb2.ChunkReadRequest(
        chain_id=1,
        target_id=target,
        chunk=data_pb2.ChunkId(inode=5, index=0),
        offset=offset,
        length=length,
        chain_version=version,
    )


# routing view -------------------------------------------------------------


def test_write_chain_head_successor_predecessor():
    v = view({1: S, 2: S, 3: Y})
    assert v.write_chain(1) == [1, 2, 3]
    assert v.head(1) == 1
    assert v.successor(1, 1).target_id == 2
    assert v.successor(1, 2).target_id == 3
    assert v.successor(1, 3) is None
    assert v.predecessor(1, 1) is None
    assert v.predecessor(1, 3).target_id == 2


def test_offline_and_waiting_targets_are_skipped():
    v = view({1: S, 2: OFF, 3: S}, order=(1, 3, 2))
    assert v.write_chain(1) == [1, 3]
    assert v.successor(1, 1).target_id == 3
    v = view({1: L, 2: W, 3: OFF})
    assert v.write_chain(1) == []
    assert v.head(1) is None


def test_syncing_head_is_no_head():
    v = view({1: Y, 2: OFF, 3: OFF})
    assert v.head(1) is None


# reads --------------------------------------------------------------------


def test_read_checks():
    v = view({1: S, 2: S, 3: Y})
    assert rp.check_read(v, [1], rreq(1)) is None
    assert rp.check_read(v, [1], rreq(1, version=0)) is None
    assert rp.check_read(v, [1], rreq(1, version=6)).status == Status.STALE_CHAIN
    assert rp.check_read(v, [2], rreq(1)).status == Status.NOT_SERVING  # not local
    assert rp.check_read(v, [3], rreq(3)).status == Status.NOT_SERVING  # syncing
    bad = rreq(1, offset=rp.MAX_CHUNK_END, length=1)
    assert rp.check_read(v, [1], bad).status == Status.BAD_REQUEST
    unknown = rreq(1)
    unknown.chain_id = 9
    assert rp.check_read(v, [1], unknown).status == Status.STALE_CHAIN


def test_plan_read_widens_to_blocks():
    length = 3 * BS + 100
    meta = Meta(version=3, length=length, crcs=[11, 12, 13, 14])
    plan = rp.plan_read(meta, BS + 10, 20, BS)
    assert (plan.data_offset, plan.send_length, plan.skip) == (BS, BS, 10)
    assert (plan.crc_first, plan.crc_count) == (1, 1)
    plan = rp.plan_read(meta, BS - 1, 2 * BS + 2, BS)  # ends in the short last block
    assert (plan.data_offset, plan.send_length, plan.skip) == (0, length, BS - 1)
    assert (plan.crc_first, plan.crc_count) == (0, 4)
    plan = rp.plan_read(meta, 3 * BS + 50, 10**6, BS)  # past the end: what exists
    assert (plan.data_offset, plan.send_length, plan.skip) == (3 * BS, 100, 50)
    r = plan.response(7, 2)
    assert (r.version, r.chunk_length, r.data_offset, r.skip) == (3, length, 3 * BS, 50)
    assert (r.chunk.inode, r.chunk.index) == (7, 2)


def test_plan_read_past_end_missing_and_pending():
    meta = Meta(version=2, length=10, crcs=[1])
    plan = rp.plan_read(meta, 100, 10, BS)
    assert plan.send_length == 0 and plan.chunk_length == 10
    assert rp.plan_read(None, 0, 10, BS).status == Status.NOT_FOUND
    pending = Meta(version=2, pending_version=3, length=10, crcs=[1])
    assert rp.plan_read(pending, 0, 10, BS).status == Status.NOT_COMMITTED
    broken = Meta(version=2, length=2 * BS, crcs=[1])
    assert rp.plan_read(broken, 0, 2 * BS, BS).status == Status.INTERNAL


# writes -------------------------------------------------------------------


def test_client_write_goes_to_head_only():
    v = view({1: S, 2: S, 3: S})
    role = rp.check_write(v, [1], wreq(1), 10)
    assert role.kind == rp.WriteKind.CLIENT and role.successor.target_id == 2
    assert rp.check_write(v, [2], wreq(2), 10).status == Status.NOT_SERVING
    assert rp.check_write(v, [1], wreq(1, version=6), 10).status == Status.STALE_CHAIN
    assert rp.check_write(v, [1], wreq(1, version=0), 10).status == Status.STALE_CHAIN
    tail = view({1: S}, order=(1,))
    assert rp.check_write(tail, [1], wreq(1), 10).successor is None


def test_write_validation():
    v = view({1: S, 2: S, 3: S})
    assert rp.check_write(v, [1], wreq(1, offset=CS - 5), 10).status == Status.BAD_REQUEST
    assert rp.check_write(v, [1], wreq(1, chunk_size=1000), 10).status == Status.BAD_REQUEST
    assert rp.check_write(v, [1], wreq(1), 0).status == Status.BAD_REQUEST
    assert rp.check_write(v, [1], wreq(1, full=True), 10).status == Status.BAD_REQUEST
    assert rp.check_write(v, [2], wreq(2, update=3, full=True, offset=8), 10).status == (
        Status.BAD_REQUEST
    )
    zero = wreq(1)
    zero.chunk.inode = 0
    assert rp.check_write(v, [1], zero, 10).status == Status.BAD_REQUEST


def test_forwarded_write_roles():
    v = view({1: S, 2: S, 3: Y})
    role = rp.check_write(v, [2], wreq(2, update=4, base=3), 10)
    assert role.kind == rp.WriteKind.FORWARDED and role.successor.target_id == 3
    role = rp.check_write(v, [3], wreq(3, update=4, base=3), 10)
    assert role.kind == rp.WriteKind.FORWARDED and role.successor is None
    # the head has no predecessor: a forwarded update sent to it is refused
    assert rp.check_write(v, [1], wreq(1, update=4), 10).status == Status.NOT_SERVING
    role = rp.check_write(v, [3], wreq(3, update=4, full=True, sync=True), 10)
    assert role.kind == rp.WriteKind.SYNC and role.successor is None
    # resync copies give the content's length as chunk size (not a power of two)
    copy = wreq(3, update=4, full=True, sync=True, chunk_size=5000)
    assert rp.check_write(v, [3], copy, 5000).kind == rp.WriteKind.SYNC
    assert rp.check_write(v, [3], copy, 5001).status == Status.BAD_REQUEST
    off = view({1: S, 2: S, 3: OFF})
    assert rp.check_write(off, [3], wreq(3, update=4), 10).status == Status.NOT_SERVING


def test_versions_never_reused():
    assert rp.next_version(None) == 1
    assert rp.next_version(Meta(version=4)) == 5
    assert rp.next_version(Meta(version=4, pending_version=5)) == 6
    # an aborted version 5 (the tail may have committed it) is not reused
    assert rp.next_version(Meta(version=4), floor=5) == 6


def test_plan_forwarded():
    assert rp.plan_forwarded(Meta(version=5), wreq(2, update=5, base=4)) == rp.Apply.ALREADY
    assert rp.plan_forwarded(Meta(version=6), wreq(2, update=5, base=4)) == rp.Apply.ALREADY
    assert rp.plan_forwarded(Meta(version=4), wreq(2, update=5, base=4)) == rp.Apply.PARTIAL
    assert rp.plan_forwarded(None, wreq(2, update=1, base=0)) == rp.Apply.PARTIAL
    assert rp.plan_forwarded(Meta(version=2), wreq(2, update=5, base=4)) == rp.Apply.NEED_FULL
    assert rp.plan_forwarded(None, wreq(2, update=5, base=4)) == rp.Apply.NEED_FULL
    assert rp.plan_forwarded(Meta(version=2), wreq(2, update=5, full=True)) == rp.Apply.FULL
    # a pending leftover of an aborted update does not count as the base
    assert rp.plan_forwarded(Meta(version=4, pending_version=5), wreq(2, update=6, base=4)) == (
        rp.Apply.PARTIAL
    )


def test_forward_request_and_full_first():
    v = view({1: S, 2: S, 3: Y})
    req = wreq(1, offset=100)
    req.client_id, req.request_id = "c", 9
    fwd = rp.forward_request(
        req, v.targets[2], chain_version=7, version=5, base_version=4, full_chunk=False
    )
    assert (fwd.target_id, fwd.update_version, fwd.base_version, fwd.offset) == (2, 5, 4, 100)
    assert not fwd.full_chunk and fwd.client_id == "c"
    full = rp.forward_request(
        req, v.targets[3], chain_version=7, version=5, base_version=4, full_chunk=True
    )
    assert full.full_chunk and full.offset == 0
    assert rp.send_full_first(v.targets[3], req)
    assert not rp.send_full_first(v.targets[2], req)


def test_interpret_reply():
    assert rp.interpret_reply(Status.OK, "", False)[0] == rp.Reply.OK
    assert rp.interpret_reply(Status.NOT_COMMITTED, rp.NEED_FULL_CHUNK, False)[0] == (
        rp.Reply.RESEND_FULL
    )
    # a full chunk that is refused again is a failure, not a loop
    assert rp.interpret_reply(Status.NOT_COMMITTED, rp.NEED_FULL_CHUNK, True) == (
        rp.Reply.FAIL,
        Status.NOT_SERVING,
    )
    assert rp.interpret_reply(Status.STALE_CHAIN, "", False) == (rp.Reply.FAIL, Status.STALE_CHAIN)
    assert rp.interpret_reply(Status.INTERNAL, "", False) == (rp.Reply.FAIL, Status.NOT_SERVING)
    # a successor without room: passed up as it is, and no retry makes room
    assert rp.interpret_reply(Status.NO_SPACE, "", False) == (rp.Reply.FAIL, Status.NO_SPACE)
    for st in Status:
        outcome, upstream = rp.interpret_reply(st, "", False)
        assert outcome == rp.Reply.OK or upstream in framing.RETRYABLE | {Status.NO_SPACE}


def test_overlay():
    assert rp.overlay(b"abcdef", 2, b"XY") == bytearray(b"abXYef")
    assert rp.overlay(b"ab", 4, b"XY") == bytearray(b"ab\0\0XY")
    assert rp.overlay(b"", 0, b"XY") == bytearray(b"XY")


def test_chain_change_while_write_in_flight():
    """A write checked under chain version 7 is refused by a successor that moved to 8."""
    before = view({1: S, 2: S, 3: S}, version=7)
    role = rp.check_write(before, [1], wreq(1), 10)
    fwd = rp.forward_request(
        wreq(1),
        role.successor,
        chain_version=role.chain_version,
        version=1,
        base_version=0,
        full_chunk=False,
    )
    after = view({1: S, 2: S, 3: OFF}, version=8)
    reject = rp.check_write(after, [2], fwd, 10)
    assert reject.status == Status.STALE_CHAIN
    outcome, upstream = rp.interpret_reply(reject.status, reject.message, False)
    assert (outcome, upstream) == (rp.Reply.FAIL, Status.STALE_CHAIN)
    # the tail of the new chain is target 2
    assert rp.check_write(after, [2], wreq(2, version=8, update=1), 10).successor is None


# truncation ---------------------------------------------------------------


def test_plan_truncate():
    chunks = [(0, CS), (1, CS), (2, CS), (4, CS), (5, 100), (6, CS)]
    steps = rp.plan_truncate(chunks, 4 * CS + 10, CS, 2, 0)
    assert steps == [rp.TruncateStep(4, 10), rp.TruncateStep(6, 0)]
    steps = rp.plan_truncate(chunks, 4 * CS + 10, CS, 2, 1)
    assert steps == [rp.TruncateStep(5, 0)]
    assert rp.plan_truncate(chunks, 0, CS, 1, 0) == [rp.TruncateStep(i, 0) for i, _ in chunks]
    # idempotent: a cut chunk is not cut again
    assert rp.plan_truncate([(4, 10)], 4 * CS + 10, CS, 2, 0) == []
    # a length on a chunk boundary cuts the chunk that starts there to nothing
    assert rp.plan_truncate([(1, CS), (2, 5)], 2 * CS, CS, 1, 0) == [rp.TruncateStep(2, 0)]
    # a chunk already cut to nothing is left alone (versions do not grow on repeats)
    assert rp.plan_truncate([(2, 0)], 0, CS, 1, 0) == []


def test_truncate_checks():
    v = view({1: S, 2: S, 3: S})
    req = data_pb2.ChunkTruncateRequest(
        chain_id=1, chain_version=7, target_id=1, inode=5, length=0, chunk_size=CS, stripe=1
    )
    role = rp.check_truncate(v, [1], req)
    assert role.kind == rp.WriteKind.CLIENT and role.successor.target_id == 2
    req.target_id = 2
    role = rp.check_truncate(v, [2], req)
    assert role.kind == rp.WriteKind.FORWARDED and role.successor.target_id == 3
    req.target_id = 3
    assert rp.check_truncate(v, [3], req).successor is None
    req.stripe_position = 1
    assert rp.check_truncate(v, [3], req).status == Status.BAD_REQUEST
    req.stripe_position, req.chain_version = 0, 3
    assert rp.check_truncate(v, [3], req).status == Status.STALE_CHAIN
    req.chain_version = 7
    off = view({1: S, 2: S, 3: OFF})
    assert rp.check_truncate(off, [3], req).status == Status.NOT_SERVING


# resync -------------------------------------------------------------------


def test_sync_source_is_the_serving_predecessor():
    v = view({1: S, 2: S, 3: Y})
    assert rp.sync_source(v, 1, 3) == 2
    assert rp.sync_source(v, 1, 2) is None  # not syncing
    tasks = rp.sync_tasks(v, [1, 2, 3])
    assert [(t.target_id, t.successor.target_id, t.chain_version) for t in tasks] == [(2, 3, 7)]
    assert rp.sync_tasks(v, [1, 3]) == []
    # two syncing targets: only the first is synced now, from the last serving target
    v = view({1: S, 2: Y, 3: Y})
    assert [(t.target_id, t.successor.target_id) for t in rp.sync_tasks(v, [1, 2, 3])] == [(1, 2)]
    assert rp.sync_source(v, 1, 3) is None
    # offline targets in between are skipped
    v = view({1: S, 2: OFF, 3: Y}, order=(1, 3, 2))
    assert rp.sync_source(v, 1, 3) == 1


@pytest.mark.parametrize("state", [W, L, OFF])
def test_non_writable_states_take_no_forwarded_writes(state):
    v = view({1: S, 2: state, 3: S})
    assert rp.check_write(v, [2], wreq(2, update=3, base=2), 10).status == Status.NOT_SERVING
