"""Sending updates down the chain: forwarded writes and truncations, and their answers.

A replica that is not its chain's tail hands every update it takes to its
successor before committing it. :class:`Successors` does that talking for the
data server: it sends a write's range, or the whole new chunk when the
successor asks for it or is syncing; it sends a truncation's steps, and the cut
chunks whole to a successor whose content is not this replica's; and it turns
each answer into ``(status, message)`` for the replica's decisions
(:class:`~emberfs.storageserver.replica.Replica`), a failed exchange being
NOT_SERVING. Every exchange goes through :mod:`emberfs.common.wire`.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import DecodeError

from emberfs.common import framing, wire
from emberfs.common.framing import Op, Status
from emberfs.proto import data_pb2
from emberfs.storageserver import metrics
from emberfs.storageserver import replication as rp
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.replica import Replica, WritePlan


class Successors:
    """The successor side of a node's chain updates.

    Parameters
    ----------
    pool : wire.ConnectionPool
        Connections to the other storage servers.
    replica : Replica
        The node's replication state, which decides what each answer leads to.
    on_stale : callable, optional
        Called when a successor answers STALE_CHAIN to a forwarded write (the
        node's routing may be old).
    """

    def __init__(
        self,
        pool: wire.ConnectionPool,
        replica: Replica,
        on_stale: Callable[[], None] | None = None,
    ) -> None:
        self._pool = pool
        self._replica = replica
        self._on_stale = on_stale

    @staticmethod
    def answer(exchange: wire.Call) -> tuple[int, str]:
        """A successor's answer as (status, message); a failed exchange is NOT_SERVING."""
        try:
            exchange.result()
        except wire.Refused as exc:
            return exc.status, exc.message
        except (OSError, framing.FrameError) as exc:
            return Status.NOT_SERVING, f"{exchange.address}: {exc}"
        return Status.OK, ""

    # writes --------------------------------------------------------------------

    @staticmethod
    def _whole(store: ChunkStore, plan: WritePlan, data: memoryview):
        """The whole new chunk of a range write: its committed base with ``data`` laid over it."""
        req = plan.req
        base = b""
        if plan.base_version:
            base, _ = store.read_committed(req.chunk.inode, req.chunk.index)
        return rp.overlay(base, req.offset, data)

    def send(
        self, store: ChunkStore, plan: WritePlan, data: memoryview, frame: framing.Frame | None
    ) -> wire.Call:
        """Send ``plan`` to the successor now: the received range, or the whole new chunk."""
        if plan.send_full and not plan.full:
            payload = self._whole(store, plan, data)
            block_size, crcs = store.block_size, None
        elif frame is None:  # content of this replica's own
            payload, block_size, crcs = data, store.block_size, None
        else:
            payload = data
            block_size = frame.header.block_size or store.block_size
            crcs = list(frame.crcs) if frame.data is not None else None
        return wire.Call(
            self._pool,
            plan.successor.data_address,
            Op.WRITE,
            plan.forward().SerializeToString(),
            payload if len(payload) else None,
            block_size=block_size,
            crcs=crcs,
        )

    def await_write(
        self,
        store: ChunkStore,
        plan: WritePlan,
        data: memoryview,
        frame: framing.Frame | None,
        forward: wire.Call,
    ) -> wire.Refused | None:
        """None once the successor holds ``plan``, else the refusal to answer upstream."""
        while True:
            step = self._judge(plan, *self.answer(forward))
            if step != rp.Reply.RESEND_FULL:
                return step
            forward = self.send(store, plan, data, frame)

    def _judge(self, plan: WritePlan, status: int, message: str):
        """What the successor's answer ``status`` to ``plan`` leads to (the replica decides)."""
        metrics.CHUNK_OPS.labels("forward", framing.status_name(status)).inc()
        if status == Status.STALE_CHAIN and self._on_stale is not None:
            self._on_stale()
        return self._replica.successor_answered(plan, status, message)

    def send_many(self, items: list[tuple[ChunkStore, WritePlan, memoryview]]) -> wire.Call:
        """Send the ``(store, plan, data)`` plans, all for one successor, in one write batch."""
        batch = data_pb2.ChunkWriteBatch()
        payloads = []
        for store, plan, data in items:
            payload = self._whole(store, plan, data) if plan.send_full and not plan.full else data
            batch.writes.append(plan.forward())
            batch.lengths.append(len(payload))
            payloads.append(payload)
        joined = b"".join(payloads)
        return wire.Call(
            self._pool,
            items[0][1].successor.data_address,
            Op.WRITE_BATCH,
            batch.SerializeToString(),
            joined if joined else None,
            block_size=items[0][0].block_size,
        )

    def answers_of(self, exchange: wire.Call, n: int) -> list[tuple[int, str]]:
        """The (status, message) of each of the ``n`` writes of a batch sent by :meth:`send_many`.

        A failed exchange, or an answer that does not account for every write,
        is NOT_SERVING for all of them.
        """
        status, message = Status.OK, ""
        try:
            answer = data_pb2.ChunkWriteBatchResponse.FromString(exchange.result())
        except wire.Refused as exc:
            status, message = exc.status, exc.message
        except (OSError, framing.FrameError, DecodeError) as exc:
            status, message = Status.NOT_SERVING, f"{exchange.address}: {exc}"
        else:
            if len(answer.results) == n:
                return [(r.status, r.message) for r in answer.results]
            status, message = Status.NOT_SERVING, f"{exchange.address}: a short batch answer"
        return [(status, message)] * n

    def settle(
        self, store: ChunkStore, plan: WritePlan, data: memoryview, status: int, message: str
    ) -> wire.Refused | None:
        """:meth:`await_write` of a plan whose forward was answered ``status`` already."""
        step = self._judge(plan, status, message)
        if step != rp.Reply.RESEND_FULL:
            return step
        return self.await_write(store, plan, data, None, self.send(store, plan, data, None))

    # truncations ---------------------------------------------------------------

    def truncate(
        self,
        store: ChunkStore,
        req: data_pb2.ChunkTruncateRequest,
        role: rp.WriteRole,
        steps: list[data_pb2.TruncateStep],
    ) -> wire.Refused | None:
        """Have the successor apply the head's ``steps``; None once it holds them."""
        fwd = rp.forward_truncate(req, role.successor, steps).SerializeToString()
        sent_full = False
        while True:
            status, message = self.answer(
                wire.Call(self._pool, role.successor.data_address, Op.TRUNCATE, fwd)
            )
            step = self._replica.cut_answered(role, status, message, sent_full)
            if step != rp.Reply.RESEND_FULL:
                return step
            sent_full = True
            refusal = self._send_cut_chunks(store, req, role, steps)
            if refusal is not None:
                return refusal

    def _send_cut_chunks(
        self,
        store: ChunkStore,
        req: data_pb2.ChunkTruncateRequest,
        role: rp.WriteRole,
        steps: list[data_pb2.TruncateStep],
    ) -> wire.Refused | None:
        """Give the successor every cut chunk whole (its content was not this replica's)."""
        for step in steps:
            try:
                content, _ = store.read_committed(req.inode, step.index, 0, step.length)
            except KeyError:
                content = b""
            fwd = rp.cut_chunk_request(req, role.successor, role.chain_version, step)
            status, message = self.answer(
                wire.Call(
                    self._pool,
                    role.successor.data_address,
                    Op.WRITE,
                    fwd.SerializeToString(),
                    content if content else None,
                    block_size=store.block_size,
                )
            )
            refusal = self._replica.cut_answered(role, status, message, sent_full=True)
            if refusal is not None:
                return refusal
        return None
