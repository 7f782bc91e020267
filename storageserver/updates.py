"""Chain updates of the data server: chunk writes, write batches and truncations.

Every decision (may this target take the update, which version, what to
forward, what to answer) comes from the replication rules
(:mod:`emberfs.storageserver.replication`) and the node's replication state
(:class:`~emberfs.storageserver.replica.Replica`); this module stages and
commits on the :class:`~emberfs.storageserver.chunkstore.ChunkStore` and has
the successors (:class:`~emberfs.storageserver.forwarding.Successors`) apply
the same update. Each update is answered with a response message or a refusal.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

from emberfs.common import framing, wire
from emberfs.common.routing import RoutingView
from emberfs.proto import data_pb2
from emberfs.storageserver import metrics
from emberfs.storageserver import replication as rp
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.forwarding import Successors
from emberfs.storageserver.replica import Replica, WritePlan, written
from emberfs.storageserver.space import is_no_space

log = logging.getLogger(__name__)

#: the answer of a node whose lease from the metaserver ran out (see Node.fenced)
FENCED = wire.NotServing("fenced: this server has not heard from the metaserver in time")

#: most writes in one OP_WRITE_BATCH frame
MAX_BATCH_WRITES = 256


def _batch_refusal(batch: data_pb2.ChunkWriteBatch, data_len: int) -> wire.Refused | None:
    """Why a write batch is malformed (None when it is not): see ``ChunkWriteBatch``."""
    n = len(batch.writes)
    if not n or n > MAX_BATCH_WRITES:
        return wire.BadRequest(f"a write batch holds 1 to {MAX_BATCH_WRITES} writes, not {n}")
    if len(batch.lengths) != n or sum(batch.lengths) != data_len:
        return wire.BadRequest("the write lengths do not add up to the frame's data")
    chunks = set()
    for req in batch.writes:
        if req.sync or req.replace:
            return wire.BadRequest("resync copies are not batched")
        if req.chain_id != batch.writes[0].chain_id:
            return wire.BadRequest("the writes of a batch are on one chain")
        chunks.add((req.target_id, req.chunk.inode, req.chunk.index))
    if len(chunks) != n:
        return wire.BadRequest("a write batch names a chunk twice")
    return None


class Updates:
    """Applies the chain updates of one data server's targets.

    Parameters
    ----------
    stores : callable
        Returns the current ``{target_id: ChunkStore}`` of local targets.
    routing : callable
        Returns the node's newest :class:`~emberfs.common.routing.RoutingView`.
    fenced : callable
        True while the node must not serve: updates are then refused.
    replica : Replica
        The replication state of the node's targets (floors, answers, locks).
    successors : Successors
        Sends updates down the chain.
    counters : metrics.IoCounters
        Where the bytes written are counted.
    """

    def __init__(
        self,
        stores: Callable[[], Mapping[int, ChunkStore]],
        routing: Callable[[], RoutingView],
        fenced: Callable[[], bool],
        replica: Replica,
        successors: Successors,
        counters: metrics.IoCounters,
    ):
        self._stores = stores
        self._routing = routing
        self._fenced = fenced
        self.replica = replica
        self._successors = successors
        self._counters = counters

    # ------------------------------------------------------------------ writes

    def write(
        self, req: data_pb2.ChunkWriteRequest, frame: framing.Frame
    ) -> wire.Refused | data_pb2.ChunkWriteResponse:
        """The answer to one chunk write."""
        stores = self._stores()
        data = frame.data if frame.data is not None else memoryview(b"")
        role = rp.check_write(self._routing(), stores.keys(), req, len(data))
        if isinstance(role, wire.Refused):
            return role
        store = stores[req.target_id]
        inode, index = req.chunk.inode, req.chunk.index
        with self.replica.updating(req.target_id, inode, index):
            # The chain may have changed while the write waited for the chunk: a write
            # accepted under an older version could otherwise commit here after a resync
            # of a returning replica copied this chunk without it.
            role = rp.check_write(self._routing(), stores.keys(), req, len(data))
            return self._update(store, req, FENCED if self._fenced() else role, data, frame)

    def _update(
        self,
        store: ChunkStore,
        req: data_pb2.ChunkWriteRequest,
        role: rp.WriteRole | wire.Refused,
        data: memoryview,
        frame: framing.Frame,
    ) -> wire.Refused | data_pb2.ChunkWriteResponse:
        """The answer to an accepted write (the chunk is held): kept, installed or replicated."""
        if isinstance(role, wire.Refused):
            return role
        inode, index = req.chunk.inode, req.chunk.index
        if role.kind == rp.WriteKind.SYNC:
            if store.install(inode, index, req.update_version, data, replace=req.replace):
                metrics.count_written(req.target_id, len(data))
            return written(store.meta(inode, index))
        key = self.replica.write_key(req, role)
        result = self.replica.answered(key)
        if result is None:
            result = self.replica.plan_write(req, role, store.meta(inode, index))
            if isinstance(result, WritePlan):
                result = self._replicate(store, result, data, frame)
            self.replica.answer(key, result)
        return result

    def _replicate(
        self,
        store: ChunkStore,
        plan: WritePlan,
        data: memoryview,
        frame: framing.Frame | None,
    ) -> wire.Refused | data_pb2.ChunkWriteResponse:
        """Forward ``plan`` down the chain while staging it here, then commit (chunk lock held).

        The update goes to the successor before it is staged here, so both
        write at once; the replica decides what every outcome leads to. A head
        that gives up an update it forwarded puts its content back on the chain
        (:meth:`_given_up`). A target without room for the update answers
        NO_SPACE before either. ``frame`` is the received frame (None for a repair).
        """
        req = plan.req
        inode, index = req.chunk.inode, req.chunk.index
        if not store.admit_write(inode, index, req.offset, len(data), full_chunk=plan.full):
            return wire.NoSpace(f"target {req.target_id} has no room for the update")
        forward = self._successors.send(store, plan, data, frame) if plan.successor else None
        try:
            # the frame's block CRCs were verified against the data on arrival
            same_blocks = frame is not None and frame.header.block_size == store.block_size
            store.stage(
                inode,
                index,
                plan.version,
                req.offset,
                data,
                chunk_size=req.chunk_size,
                full_chunk=plan.full,
                crcs=list(frame.crcs) if same_blocks else None,
            )
        except BaseException as exc:
            if forward is not None:
                forward.abandon()
                # a head out of room cannot stage its repair either: the next write mends it
                self._given_up(store, plan, forward, repair=not is_no_space(exc))
            refusal = self.replica.staging_failed(plan, exc, forwarded=forward is not None)
            if refusal is None:
                raise
            return refusal
        successor = None
        if forward is not None:
            successor = lambda: self._successors.await_write(store, plan, data, frame, forward)  # noqa: E731
        return self._conclude(store, plan, data, forward, successor)

    def write_batch(
        self, batch: data_pb2.ChunkWriteBatch, frame: framing.Frame
    ) -> wire.Refused | data_pb2.ChunkWriteBatchResponse:
        """Writes of several chunks of one chain: each as :meth:`write` would, forwarded together.

        The chunks are taken in one order (target, inode, index), so batches
        and single writes cannot deadlock; every answer is kept per write.
        """
        data = frame.data if frame.data is not None else memoryview(b"")
        refusal = _batch_refusal(batch, len(data))
        if refusal is not None:
            return refusal
        stores = self._stores()
        pieces, at = [], 0
        for n in batch.lengths:
            pieces.append(data[at : at + n])
            at += n
        writes = batch.writes
        results: list = [None] * len(writes)
        order = sorted(
            range(len(writes)),
            key=lambda i: (writes[i].target_id, writes[i].chunk.inode, writes[i].chunk.index),
        )
        with contextlib.ExitStack() as held:
            accepted = []
            for i in order:
                req = writes[i]
                role = rp.check_write(self._routing(), stores.keys(), req, len(pieces[i]))
                if isinstance(role, wire.Refused):
                    results[i] = role
                    continue
                held.enter_context(
                    self.replica.updating(req.target_id, req.chunk.inode, req.chunk.index)
                )
                accepted.append(i)
            fenced = self._fenced()
            planned: list[tuple[int, tuple | None, WritePlan]] = []
            for i in accepted:  # as write: the chain may have changed while it waited
                req = writes[i]
                role = rp.check_write(self._routing(), stores.keys(), req, len(pieces[i]))
                if fenced:
                    role = FENCED
                if isinstance(role, wire.Refused) or role.kind == rp.WriteKind.SYNC:
                    results[i] = role if isinstance(role, wire.Refused) else wire.BadRequest()
                    continue
                key = self.replica.write_key(req, role)
                result = self.replica.answered(key)
                if result is None:
                    meta = stores[req.target_id].meta(req.chunk.inode, req.chunk.index)
                    result = self.replica.plan_write(req, role, meta)
                    if isinstance(result, WritePlan):
                        planned.append((i, key, result))
                        continue
                    self.replica.answer(key, result)
                results[i] = result
            outcomes = self._replicate_many(stores, [(plan, pieces[i]) for i, _, plan in planned])
            for (i, key, _), result in zip(planned, outcomes, strict=True):
                self.replica.answer(key, result)
                results[i] = result
        answer = data_pb2.ChunkWriteBatchResponse()
        for result in results:
            item = answer.results.add()
            if isinstance(result, wire.Refused):
                item.status, item.message = result.status, result.message
            else:
                item.written.CopyFrom(result)
        return answer

    def _replicate_many(
        self, stores: Mapping[int, ChunkStore], items: list[tuple[WritePlan, memoryview]]
    ) -> list:
        """:meth:`_replicate` of several plans (their chunks held): one forward for all.

        The plans forwarded to one successor go in one OP_WRITE_BATCH frame
        while they are staged here; what each answer leads to is decided per
        plan as for a single write (a successor asking for a whole chunk gets
        it in a write of its own). Returns each plan's answer, in order.
        """
        out: list = [None] * len(items)
        admitted: list[int] = []
        for i, (plan, data) in enumerate(items):
            req = plan.req
            store = stores[req.target_id]
            if store.admit_write(
                req.chunk.inode, req.chunk.index, req.offset, len(data), full_chunk=plan.full
            ):
                admitted.append(i)
            else:
                out[i] = wire.NoSpace(f"target {req.target_id} has no room for the update")
        by_successor: dict[str, list[int]] = {}
        for i in admitted:
            successor = items[i][0].successor
            if successor is not None:
                by_successor.setdefault(successor.data_address, []).append(i)
        sent = [
            (
                group,
                self._successors.send_many(
                    [(stores[items[i][0].req.target_id], *items[i]) for i in group]
                ),
            )
            for group in by_successor.values()
        ]
        forwards = {i: call for group, call in sent for i in group}
        failed: dict[int, Exception] = {}
        for i in admitted:
            plan, data = items[i]
            req = plan.req
            try:
                stores[req.target_id].stage(
                    req.chunk.inode,
                    req.chunk.index,
                    plan.version,
                    req.offset,
                    data,
                    chunk_size=req.chunk_size,
                    full_chunk=plan.full,
                )
            except Exception as exc:
                failed[i] = exc
        answers: dict[int, tuple[int, str]] = {}
        for group, call in sent:
            answers.update(zip(group, self._successors.answers_of(call, len(group)), strict=True))
        for i in admitted:
            plan, data = items[i]
            store = stores[plan.req.target_id]
            try:
                out[i] = self._settle(
                    store, plan, data, forwards.get(i), answers.get(i), failed.get(i)
                )
            except Exception as exc:
                log.exception("chunk %d:%d: batched write failed", *plan.key[1:])
                out[i] = wire.ServerError(f"{type(exc).__name__}: {exc}")
        return out

    def _settle(
        self,
        store: ChunkStore,
        plan: WritePlan,
        data: memoryview,
        forward: wire.Call | None,
        answer: tuple[int, str] | None,
        error: Exception | None,
    ) -> wire.Refused | data_pb2.ChunkWriteResponse:
        """The end of one plan of :meth:`_replicate_many`, as :meth:`_replicate` ends one.

        ``error`` is what staging it raised; ``answer`` the successor's
        (status, message) when it was forwarded.
        """
        if error is not None:
            if forward is not None:
                # a head out of room cannot stage its repair either: the next write mends it
                self._given_up(store, plan, forward, repair=not is_no_space(error))
            refusal = self.replica.staging_failed(plan, error, forwarded=forward is not None)
            if refusal is None:
                raise error
            return refusal
        successor = None
        if forward is not None and answer is not None:
            successor = lambda: self._successors.settle(store, plan, data, *answer)  # noqa: E731
        return self._conclude(store, plan, data, forward, successor)

    def _conclude(
        self,
        store: ChunkStore,
        plan: WritePlan,
        data: memoryview,
        forward: wire.Call | None,
        successor: Callable[[], wire.Refused | None] | None,
    ) -> wire.Refused | data_pb2.ChunkWriteResponse:
        """Commit the staged ``plan`` once ``successor()`` allows it (None: the successor
        holds it), or at once without one; else abort it and answer the refusal."""
        inode, index = plan.req.chunk.inode, plan.req.chunk.index
        try:
            refusal = successor() if successor is not None else None
        except BaseException:
            store.abort(inode, index, plan.version)
            self._given_up(store, plan, forward)
            raise
        if refusal is not None:
            store.abort(inode, index, plan.version)
            self._given_up(store, plan, forward)
            return refusal
        meta = store.commit(inode, index, plan.version)
        self.replica.committed(plan)
        self._counters.count(plan.req.target_id, written=len(data))
        return written(meta)

    def _given_up(
        self, store: ChunkStore, plan: WritePlan, forward: wire.Call | None, repair: bool = True
    ) -> None:
        """``plan`` was given up; if it was forwarded, its version may live on downstream.

        The version is never used again here; when the successor may have
        received it, the head also puts its committed content back on the chain
        (:meth:`Replica.repair_plan`).
        """
        inode, index = plan.req.chunk.inode, plan.req.chunk.index
        self.replica.aborted(plan)
        if not repair or forward is None or not forward.sent:
            return
        repair = self.replica.repair_plan(plan, store.meta(inode, index))
        if repair is None:
            return
        try:
            try:
                content, _ = store.read_committed(inode, index)
            except KeyError:
                content = b""
            outcome = self._replicate(store, repair, memoryview(content), None)
        except Exception as exc:  # the update's own failure is what is answered
            outcome = exc
        if isinstance(outcome, BaseException):
            log.warning("chunk %d:%d: the chain keeps a given-up update: %s", inode, index, outcome)

    # ------------------------------------------------------------------ truncation

    def truncate(
        self, req: data_pb2.ChunkTruncateRequest
    ) -> wire.Refused | data_pb2.ChunkTruncateResponse:
        """The answer to the truncation of an inode's chunks."""
        stores = self._stores()
        role = rp.check_truncate(self._routing(), stores.keys(), req)
        if isinstance(role, wire.Refused):
            return role
        store = stores[req.target_id]
        with self.replica.truncating(req.target_id, req.inode):
            role = rp.check_truncate(self._routing(), stores.keys(), req)  # as for writes
            role = FENCED if self._fenced() else role
            key = self.replica.truncate_key(req, role) if isinstance(role, rp.WriteRole) else None
            result = role if isinstance(role, wire.Refused) else self.replica.answered(key)
            if result is None:
                result = self._cut(store, req, role)
                self.replica.answer(key, result)
        return result

    def _cut(
        self, store: ChunkStore, req: data_pb2.ChunkTruncateRequest, role: rp.WriteRole
    ) -> wire.Refused | data_pb2.ChunkTruncateResponse:
        """Cut the inode's chunks as a chain update (the inode is held alone).

        The head plans and numbers the cuts; every replica stages them, has its
        successor apply the same steps, then commits (or aborts, so a failed
        truncation leaves no replica cut that its predecessor is not).
        """
        if role.kind == rp.WriteKind.CLIENT:
            steps = self.replica.plan_cut(req, self._chunks(store, req.inode))
            if isinstance(steps, wire.Refused):
                return steps
            forward = steps
        else:
            steps = self.replica.forwarded_cut(req, lambda i: store.meta(req.inode, i))
            if isinstance(steps, wire.Refused):
                return steps
            forward = list(req.steps)
        staged: list[data_pb2.TruncateStep] = []
        with contextlib.ExitStack() as held:
            try:
                for step in sorted(steps, key=lambda st: st.index):
                    held.enter_context(self.replica.chunk(req.target_id, req.inode, step.index))
                    store.stage_truncate(req.inode, step.index, step.version, step.length)
                    staged.append(step)
                refusal = (
                    self._successors.truncate(store, req, role, forward) if role.successor else None
                )
            except BaseException:
                self._abort_cut(store, req, staged)
                raise
            if refusal is not None:
                self._abort_cut(store, req, staged)
                return refusal
            for step in staged:
                store.commit(req.inode, step.index, step.version)
            self.replica.cut_committed(req, staged)
        return data_pb2.ChunkTruncateResponse(chunks=len(staged))

    @staticmethod
    def _chunks(store: ChunkStore, inode: int) -> list:
        """The metadata of every chunk of ``inode`` on ``store``."""
        chunks: list = []
        after = None
        while True:
            page = store.list(inode=inode, after=after, limit=1000)
            chunks.extend(page)
            if len(page) < 1000:
                return chunks
            after = (page[-1].inode, page[-1].index)

    def _abort_cut(
        self, store: ChunkStore, req: data_pb2.ChunkTruncateRequest, staged: list
    ) -> None:
        for step in staged:
            store.abort(req.inode, step.index, step.version)
        self.replica.cut_aborted(req, staged)
