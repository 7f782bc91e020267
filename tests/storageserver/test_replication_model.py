"""The CRAQ decisions against a byte model of a chain.

A model chain of replicas, each holding per chunk its committed version and bytes
and the real replication state of a node (:class:`~emberfs.storageserver.replica.Replica`:
version floors), runs random sequences of steps the way the data server runs
them, with every decision taken by the real rules (``replication``) and state: client writes at the head (partial updates forwarded with their base
version, full chunks where a successor asks for them or syncs), writes that a
replica fails to stage after it forwarded them (so its successors commit a
version that it and its predecessors abort), updates sent to a successor twice,
replicas that go offline and come back syncing, resyncs, truncations of the file
(numbered by the head, applied by every replica as the head's steps, the cut
chunks sent whole to a replica whose content is not the head's) and
block-widened reads.

The model knows the bytes of every version the head ever gave out (its committed
bytes with the update on top, computed here independently). After every step every
replica holding version v of a chunk must hold exactly those bytes; a write that
nothing made fail must succeed, and a successful write must be on every replica of
the write chain at the head's version.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field

from hypothesis import given, note
from hypothesis import strategies as st

from emberfs.common import wire
from emberfs.common.framing import Status
from emberfs.common.routing import RoutingView
from emberfs.proto import common_pb2, data_pb2
from emberfs.storageserver import replication as rp
from emberfs.storageserver.replica import Replica, WritePlan

SERVING, SYNCING, OFFLINE = common_pb2.SERVING, common_pb2.SYNCING, common_pb2.OFFLINE
BLOCK = 64 * 1024  # the CRC block of the data protocol
CS = 4 * BLOCK  # chunk size of the model's file
INODE = 9
CHAIN = 1
N_INDEXES = 4  # chunks 0..3 of the file may live on the chain


@dataclass
class Meta:
    version: int
    pending_version: int
    length: int
    crcs: list


@dataclass(frozen=True)
class Listed:
    version: int
    length: int
    checksum: int


@dataclass(frozen=True)
class Fault:
    kind: str  # "stage": the replica fails to stage the update after forwarding it;
    # "twice": the replica sends the update to its successor twice (its first answer was lost)
    target_id: int


@dataclass
class Copy:
    """One replica: its chunks' committed versions and bytes, and its node's replication state."""

    target_id: int
    state: int = SERVING
    chunks: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # index: (version, bytes)
    replica: Replica = field(default_factory=Replica)

    def key(self, index: int) -> tuple[int, int, int]:
        return (self.target_id, INODE, index)

    def floors(self) -> dict[int, int]:
        return {i: f for i in range(N_INDEXES) if (f := self.replica.floor(self.key(i)))}

    def meta(self, index: int, with_index: bool = False) -> Meta | None:
        if index not in self.chunks:
            return None
        version, data = self.chunks[index]
        meta = Meta(version, 0, len(data), [0] * -(-len(data) // BLOCK))
        if with_index:
            meta.index = index
        return meta

    def data(self, index: int) -> bytes:
        return self.chunks.get(index, (0, b""))[1]

    def listed(self, index: int) -> Listed | None:
        """The chunk as ``ListChunks`` shows it (version, length, checksum)."""
        if index not in self.chunks:
            return None
        version, data = self.chunks[index]
        return Listed(version, len(data), zlib.crc32(data))


class Model:
    def __init__(self, n_replicas: int) -> None:
        self.replicas = {t: Copy(t) for t in range(1, n_replicas + 1)}
        self.order = list(self.replicas)  # chain order, head first
        self.chain_version = 1
        # (index, version): the bytes the head gave that version
        self.expected: dict[tuple[int, int], bytes] = {}

    # routing ------------------------------------------------------------------
    def view(self) -> RoutingView:
        routing = common_pb2.RoutingInfo(version=self.chain_version)
        for t in self.order:
            routing.targets.add(
                target_id=t, node_id=f"n{t}", data_address=f"h{t}:1", state=self.replicas[t].state
            )
        routing.chains.add(chain_id=CHAIN, version=self.chain_version, targets=self.order)
        return RoutingView.from_proto(routing)

    def reorder(self) -> None:
        """The cluster manager's chain order: serving, syncing, offline (stable)."""
        rank = {SERVING: 0, SYNCING: 1, OFFLINE: 2}
        self.order.sort(key=lambda t: rank[self.replicas[t].state])
        self.chain_version += 1

    def write_chain(self) -> list[Copy]:
        return [self.replicas[t] for t in self.view().write_chain(CHAIN)]

    def assign(self, index: int, version: int, content: bytes) -> None:
        """The head gives ``version`` of a chunk to ``content``.

        A number may come again only when no replica holds it: one that a head
        gave out and that nobody committed (the update was given up before any
        replica staged it), or whose holders left, is free again.
        """
        old = self.expected.get((index, version))
        if old is not None and old != content:
            holders = [
                r.target_id
                for r in self.replicas.values()
                if r.chunks.get(index, (0,))[0] == version
            ]
            assert not holders, f"chunk {index} v{version} given other bytes; {holders} hold it"
        self.expected[(index, version)] = content

    # writes -------------------------------------------------------------------
    def write(self, index: int, offset: int, data: bytes, fault: Fault | None) -> bool:
        """A client write at the head; True when the head answered OK."""
        view = self.view()
        head = view.head(CHAIN)
        req = data_pb2.ChunkWriteRequest(
            chain_id=CHAIN,
            chain_version=self.chain_version,
            target_id=head,
            chunk=data_pb2.ChunkId(inode=INODE, index=index),
            offset=offset,
            chunk_size=CS,
        )
        status, message = self._apply(view, req, data, fault)
        if fault is None or fault.kind == "twice":  # nothing failed: the write must succeed
            assert status == Status.OK, (status, message)
        if status == Status.OK:
            version = self.replicas[head].chunks[index][0]
            for r in self.write_chain():  # the whole chain holds it
                assert r.chunks[index][0] == version, (r.target_id, r.chunks[index][0], version)
        return status == Status.OK

    def _apply(
        self, view: RoutingView, req, payload: bytes, fault: Fault | None
    ) -> tuple[int, str]:
        """One replica's handling of a write, as the data server's ``_write`` and ``_replicate``."""
        r = self.replicas[req.target_id]
        fails = fault is not None and fault.kind == "stage" and fault.target_id == r.target_id
        twice = fault is not None and fault.kind == "twice" and fault.target_id == r.target_id
        role = rp.check_write(view, [r.target_id], req, len(payload))
        assert isinstance(role, rp.WriteRole), role
        index = req.chunk.index
        plan = r.replica.plan_write(req, role, r.meta(index))
        if isinstance(plan, wire.Refused):
            return plan.status, plan.message
        if not isinstance(plan, WritePlan):  # the committed version holds it already
            assert role.kind == rp.WriteKind.FORWARDED
            return Status.OK, ""
        if role.kind == rp.WriteKind.CLIENT:
            self.assign(index, plan.version, written(r.data(index), req.offset, payload))
        failure = None
        if plan.successor is not None:
            while True:
                body = payload
                if plan.send_full and not plan.full:
                    base = r.data(index) if plan.base_version else b""
                    body = bytes(rp.overlay(base, req.offset, payload))
                if plan.successor.state == SYNCING:  # a syncing replica gets whole chunks
                    assert plan.send_full
                fwd = plan.forward()
                status, message = self._apply(view, fwd, body, fault)
                if twice and status == Status.OK:
                    # the answer was lost and the update sent again: applied once
                    successor = self.replicas[plan.successor.target_id]
                    held = dict(successor.chunks)
                    status, message = self._apply(view, fwd, body, fault)
                    assert status == Status.OK and successor.chunks == held
                if fails:
                    break  # it failed to stage meanwhile: the answer is never read
                step = r.replica.successor_answered(plan, status, message)
                if step == rp.Reply.RESEND_FULL:
                    continue
                failure = step
                break
        if fails:
            error = OSError("staging failed")
            forwarded = plan.successor is not None
            assert r.replica.staging_failed(plan, error, forwarded=forwarded) is None
            return Status.INTERNAL, f"OSError: {error}"
        if failure is not None:
            r.replica.aborted(plan)
            return failure.status, failure.message
        # what the chunk store stages: the whole chunk sent, or the range over the committed bytes
        content = payload if plan.full else written(r.data(index), req.offset, payload)
        r.chunks[index] = (plan.version, bytes(content))
        r.replica.committed(plan)
        return Status.OK, ""

    # truncation ---------------------------------------------------------------
    def truncate(self, length: int, stripe: int, position: int) -> None:
        """The file cut to ``length``: a chain update from the head, as the data server's ``_cut``."""
        chain = self.write_chain()
        head = chain[0]
        before = dict(head.chunks)
        req = data_pb2.ChunkTruncateRequest(
            chain_id=CHAIN,
            chain_version=self.chain_version,
            target_id=head.target_id,
            inode=INODE,
            length=length,
            chunk_size=CS,
            stripe=stripe,
            stripe_position=position,
        )
        status, message = self._cut(self.view(), req)
        assert status == Status.OK, (status, message)  # no fault is injected into a truncation
        for i, (_, data) in head.chunks.items():
            if i % stripe == position:
                assert len(data) <= max(0, length - i * CS), (i, length)
                if len(before[i][1]) <= max(0, length - i * CS):
                    assert head.chunks[i] == before[i]  # nothing to cut: left alone
            else:
                assert head.chunks[i] == before[i]  # other chains' chunks
        for i in head.chunks:  # every chunk the head cut is the head's on every replica
            if head.chunks[i] != before[i]:
                for r in chain:
                    assert r.chunks.get(i) == head.chunks[i], (r.target_id, i)

    def _cut(self, view: RoutingView, req) -> tuple[int, str]:
        """One replica's handling of a truncation: plan or apply the steps, forward, commit."""
        r = self.replicas[req.target_id]
        role = rp.check_truncate(view, [r.target_id], req)
        assert isinstance(role, rp.WriteRole), role
        if role.kind == rp.WriteKind.CLIENT:
            chunks = [r.meta(i, with_index=True) for i in sorted(r.chunks)]
            steps = forward = r.replica.plan_cut(req, chunks)
            for step in steps:
                assert step.version > r.chunks[step.index][0]
                self.assign(step.index, step.version, r.data(step.index)[: step.length])
        else:
            steps = r.replica.forwarded_cut(req, r.meta)
            if isinstance(steps, wire.Refused):
                return steps.status, steps.message
            forward = list(req.steps)
        if role.successor is not None:
            fwd = rp.forward_truncate(req, role.successor, forward)
            sent_full = False
            while True:
                status, message = self._cut(view, fwd)
                step = r.replica.cut_answered(role, status, message, sent_full)
                if step != rp.Reply.RESEND_FULL:
                    break
                sent_full = True
                for cut in forward:  # the successor's content is not ours: send the cuts whole
                    whole = rp.cut_chunk_request(req, role.successor, role.chain_version, cut)
                    data = r.data(cut.index)[: cut.length]
                    assert self._apply(view, whole, data, None) == (Status.OK, "")
            if step is not None:
                r.replica.cut_aborted(req, steps)
                return step.status, step.message
        for step in steps:
            r.chunks[step.index] = (step.version, r.data(step.index)[: step.length])
        r.replica.cut_committed(req, steps)
        return Status.OK, ""

    # membership ---------------------------------------------------------------
    def offline(self, k: int) -> None:
        live = [t for t in self.order if self.replicas[t].state != OFFLINE]
        serving = [t for t in live if self.replicas[t].state == SERVING]
        t = live[k % len(live)]
        if serving == [t]:
            return  # the last serving replica stays
        self.replicas[t].state = OFFLINE
        self.reorder()

    def rejoin(self, k: int) -> None:
        offline = [t for t in self.order if self.replicas[t].state == OFFLINE]
        if offline:
            self.replicas[offline[k % len(offline)]].state = SYNCING
            self.reorder()

    def resync(self) -> None:
        """The first syncing replica copies from its serving predecessor, then serves."""
        view = self.view()
        tasks = rp.sync_tasks(view, list(self.replicas))
        if not tasks:
            return
        task = tasks[0]
        src = self.replicas[task.target_id]
        dst = self.replicas[task.successor.target_id]
        assert rp.sync_source(view, CHAIN, dst.target_id) == src.target_id
        # as resync.py does, each chunk decided while the source holds it (every step of the
        # model runs whole, so no update of it is between staging and commit)
        for i in sorted(set(src.chunks) | set(dst.chunks)):
            action = rp.resync_action(src.listed(i), dst.listed(i))
            if action == rp.Resync.REMOVE:
                del dst.chunks[i]
            elif action == rp.Resync.REPLACE:
                dst.chunks[i] = src.chunks[i]
            elif (
                action == rp.Resync.COPY
            ):  # ChunkStore.install: newer, or the same with other bytes
                mine, theirs = src.chunks[i], dst.chunks.get(i)
                if theirs is None or theirs[0] <= mine[0]:
                    dst.chunks[i] = mine
        assert dst.chunks == src.chunks, "a resync ended with the replicas apart"
        dst.state = SERVING
        self.reorder()

    # reads --------------------------------------------------------------------
    def read(self, k: int, index: int, offset: int, length: int) -> None:
        view = self.view()
        serving = [t for t in self.order if self.replicas[t].state == SERVING]
        r = self.replicas[serving[k % len(serving)]]
        req = data_pb2.ChunkReadRequest(
            chain_id=CHAIN,
            target_id=r.target_id,
            chunk=data_pb2.ChunkId(inode=INODE, index=index),
            offset=offset,
            length=length,
            chain_version=self.chain_version,
        )
        assert rp.check_read(view, [r.target_id], req) is None
        plan = rp.plan_read(r.meta(index), offset, length, BLOCK)
        if index not in r.chunks:
            assert isinstance(plan, wire.ChunkNotFound)
            return
        version, data = r.chunks[index]
        assert isinstance(plan, rp.ReadPlan), plan
        assert (plan.version, plan.chunk_length) == (version, len(data))
        end = plan.data_offset + plan.send_length
        if plan.send_length:
            # whole CRC blocks, the chunk's short last block included, and no more than needed
            assert plan.data_offset % BLOCK == 0 and plan.data_offset <= offset
            assert end % BLOCK == 0 or end == len(data)
            assert end <= len(data)
            assert end - BLOCK < min(offset + length, len(data)) <= end
            assert plan.crc_first == plan.data_offset // BLOCK
            assert plan.crc_count == -(-plan.send_length // BLOCK)
        sent = data[plan.data_offset : end]
        assert sent[plan.skip : plan.skip + length] == data[offset : offset + length]

    # the property -------------------------------------------------------------
    def check(self) -> None:
        for r in self.replicas.values():
            for i, (version, data) in r.chunks.items():
                assert (i, version) in self.expected, (r.target_id, i, version)
                assert data == self.expected[(i, version)], (
                    f"target {r.target_id} holds other bytes for chunk {i} v{version}"
                )


def written(base: bytes, offset: int, data: bytes) -> bytes:
    """``base`` with ``data`` written at ``offset``; a gap past its end reads as zeros."""
    out = bytearray(base)
    if len(out) < offset:
        out += bytes(offset - len(out))
    out[offset : offset + len(data)] = data
    return bytes(out)


def positions(limit: int) -> st.SearchStrategy[int]:
    """Offsets in ``[0, limit]``, often at or next to a CRC block boundary."""
    near = sorted(
        {p + d for p in range(0, limit + 1, BLOCK) for d in (-1, 0, 1) if 0 <= p + d <= limit}
    )
    return st.one_of(st.sampled_from(near), st.integers(0, limit))


@st.composite
def ranges(draw, limit: int) -> tuple[int, int]:
    """A non-empty ``(offset, length)`` inside ``[0, limit]``."""
    a, b = sorted((draw(positions(limit)), draw(positions(limit))))
    if a == b:
        a, b = (a, a + 1) if a < limit else (a - 1, a)
    return a, b - a


indexes = st.integers(0, 1) | st.integers(0, N_INDEXES - 1)  # often the same few chunks
writes = st.tuples(
    st.just("write"),
    indexes,
    ranges(CS),
    st.integers(0, 2**16),
    # None, or (what, which replica of the write chain): "stage" fails to stage the update
    # after it forwarded it; "twice" sends it to its successor a second time
    st.none()
    | st.tuples(st.just("stage"), st.integers(0, 1) | st.integers(0, 3))
    | st.tuples(st.just("twice"), st.integers(0, 3)),
)
steps = st.one_of(
    writes,
    writes,  # twice as likely as any other step
    st.tuples(st.just("truncate"), positions(N_INDEXES * CS), st.sampled_from([(1, 0), (2, 0)])),
    st.tuples(st.just("offline"), st.integers(0, 3)),
    st.tuples(st.just("rejoin"), st.integers(0, 3)),
    st.tuples(st.just("resync")),
    st.tuples(
        st.just("read"),
        st.integers(0, 3),
        st.integers(0, 1),
        positions(CS + BLOCK),
        positions(CS + BLOCK),
    ),
)


def run(model: Model, program) -> None:
    note(f"{len(model.replicas)} replicas; steps: {program!r}")
    for n, step in enumerate(program):
        kind = step[0]
        if kind == "write":
            _, index, (offset, length), seed, fault = step
            data = random.Random(f"{n}-{seed}").randbytes(length)
            chain = model.write_chain()
            if fault is not None:
                kind, at = fault
                fault = Fault(kind, chain[at].target_id) if at < len(chain) else None
            model.write(index, offset, data, fault)
        elif kind == "truncate":
            _, length, (stripe, position) = step
            model.truncate(length, stripe, position)
        elif kind == "offline":
            model.offline(step[1])
        elif kind == "rejoin":
            model.rejoin(step[1])
        elif kind == "resync":
            model.resync()
        else:
            _, k, index, offset, length = step
            model.read(k, index, offset, length)
        model.check()


@given(n_replicas=st.integers(2, 4), program=st.lists(writes, min_size=2, max_size=20))
def test_aborted_writes_leave_no_other_bytes_under_a_version(n_replicas, program):
    """A serving chain: client writes, some given up by a replica after its successor took them."""
    run(Model(n_replicas), program)


@given(n_replicas=st.integers(2, 4), program=st.lists(steps, min_size=10, max_size=40))
def test_every_replica_holds_the_bytes_of_its_version(n_replicas, program):
    """Writes, aborts, replicas leaving and coming back, resyncs, truncations and reads."""
    run(Model(n_replicas), program)
