"""Chunk reads of the data server: committed data sent straight from the chunk file."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from emberfs.common import framing, wire
from emberfs.common.framing import Op, Status
from emberfs.common.routing import RoutingView
from emberfs.proto import data_pb2
from emberfs.storageserver import metrics
from emberfs.storageserver import replication as rp
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.connection import CLIENT, Connection
from emberfs.storageserver.metrics import IoCounters


class Reads:
    """Answers the reads of one data server.

    Parameters
    ----------
    stores : callable
        Returns the current ``{target_id: ChunkStore}`` of local targets.
    routing : callable
        Returns the node's newest :class:`~emberfs.common.routing.RoutingView`.
    counters : IoCounters
        Where the bytes sent are counted.
    frame_timeout : float
        The connection's socket timeout, restored after a read is sent.
    """

    def __init__(
        self,
        stores: Callable[[], Mapping[int, ChunkStore]],
        routing: Callable[[], RoutingView],
        counters: IoCounters,
        frame_timeout: float,
    ):
        self._stores = stores
        self._routing = routing
        self._counters = counters
        self._frame_timeout = frame_timeout

    def read(self, conn: Connection, req: data_pb2.ChunkReadRequest) -> wire.Refused | None:
        """Send the data ``req`` asks for on ``conn``; the refusal to answer instead, if any."""
        stores = self._stores()
        reject = rp.check_read(self._routing(), stores.keys(), req)
        if reject is not None:
            return reject
        store = stores[req.target_id]
        inode, index = req.chunk.inode, req.chunk.index
        with contextlib.ExitStack() as stack:
            try:
                fd, meta = stack.enter_context(store.committed_file(inode, index))
            except KeyError:  # nothing committed: say why (missing, or only pending)
                return rp.uncommitted(store.meta(inode, index))
            plan = rp.plan_read(meta, req.offset, req.length, store.block_size)
            if isinstance(plan, wire.Refused):
                return plan
            crcs = meta.crcs[plan.crc_first : plan.crc_first + plan.crc_count]
            conn.responding = True
            conn.status = Status.OK
            # os.sendfile needs a blocking descriptor (a socket with a timeout is
            # non-blocking underneath); SO_SNDTIMEO, set at accept, bounds each stall.
            conn.sock.settimeout(None)
            try:
                framing.send_file_frame(
                    conn.sock,
                    Op.READ | framing.RESPONSE,
                    plan.response(inode, index).SerializeToString(),
                    fd,
                    plan.data_offset,
                    plan.send_length,
                    crcs,
                    store.block_size,
                )
            finally:
                conn.sock.settimeout(self._frame_timeout)
            self._counters.count(req.target_id, read=plan.send_length)
            if conn.kind == CLIENT:
                metrics.count_client(conn.peer, read=plan.send_length)
        return None
