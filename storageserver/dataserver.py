"""The storage node's framed-TCP data server: chunk reads, writes and truncation.

The server accepts connections (:mod:`emberfs.storageserver.admission` decides
which get in and what each request may do), serves each on a thread of its
own (:mod:`emberfs.storageserver.connection`), and dispatches every admitted
request: reads to :class:`~emberfs.storageserver.reads.Reads`, writes and
truncations to :class:`~emberfs.storageserver.updates.Updates`, which answer
with a response or a refusal that this module sends.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping

from emberfs.common import framing, wire
from emberfs.common.auth import ClusterKeys
from emberfs.common.framing import Op, Status
from emberfs.common.routing import RoutingView
from emberfs.common.stalls import live_addresses
from emberfs.storageserver import metrics
from emberfs.storageserver.admission import Admission
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.connection import CLIENT, OP_NAMES, Connection, serve
from emberfs.storageserver.forwarding import Successors
from emberfs.storageserver.reads import Reads
from emberfs.storageserver.replica import Replica
from emberfs.storageserver.space import is_no_space
from emberfs.storageserver.updates import FENCED, Updates

log = logging.getLogger(__name__)


def _target_of(op: int, req) -> int:
    """The target a request is for (a batch's first write's; 0 for an empty batch)."""
    if op == Op.WRITE_BATCH:
        return req.writes[0].target_id if req.writes else 0
    return req.target_id


class DataServer:
    """Serves the framed data protocol for the local targets of one node.

    Parameters
    ----------
    host : str
        Address to bind.
    port : int
        Port to bind (0: an ephemeral port, see :attr:`address`).
    stores : callable
        Returns the current ``{target_id: ChunkStore}`` of local targets.
    routing : callable
        Returns the node's newest :class:`~emberfs.common.routing.RoutingView`.
    keys : ClusterKeys or None
        The cluster's keys: every request must then carry credentials. None
        runs the server without authentication (``--insecure``).
    max_connections : int, default 256
        Connections beyond this get a BUSY error and are closed.
    forward_reserve : int, default 32
        Of ``max_connections``, how many only servers may use.
    idle_timeout : float, default 30
        Seconds a connection may stay silent between frames.
    frame_timeout : float, default 10
        Seconds a frame may take to arrive (plus its data at ``MIN_DATA_RATE``).
    forward_timeout : float, default 30
        Seconds to wait for a successor's answer.
    stall_check : float, default 1.0
        Seconds a forward waits before the node's routing is checked; one to
        a successor the cluster has declared offline then ends at once
        (:mod:`emberfs.common.stalls`) instead of after ``forward_timeout``.
    on_stale : callable, optional
        Called when a chain version mismatch suggests the routing is old.
    fenced : callable, optional
        True while the node must not serve (its lease from the metaserver ran
        out): reads, writes and truncations are then refused as NOT_SERVING.

    Attributes
    ----------
    replica : Replica
        The replication state of the node's targets (floors, answers, locks).
    admission : Admission
        The open connections and the admission of their requests.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        stores: Callable[[], Mapping[int, ChunkStore]],
        routing: Callable[[], RoutingView],
        keys: ClusterKeys | None = None,
        max_connections: int = 256,
        forward_reserve: int = 32,
        idle_timeout: float = 30.0,
        frame_timeout: float = 10.0,
        forward_timeout: float = 30.0,
        stall_check: float = 1.0,
        on_stale: Callable[[], None] | None = None,
        fenced: Callable[[], bool] = lambda: False,
    ):
        self._routing = routing
        self.admission = Admission(keys, max_connections, forward_reserve)
        self.idle_timeout = idle_timeout
        self.frame_timeout = frame_timeout
        self._on_stale = on_stale
        self._fenced = fenced
        self._busy = 0  # requests being handled now
        self._busy_lock = threading.Lock()
        self._pool = wire.ConnectionPool(
            io_timeout=forward_timeout,
            max_per_address=None,
            max_idle=8,
            live=lambda: live_addresses(self._routing().targets.values()),
            stall_check=stall_check,
            credential=keys.server_credential() if keys is not None else None,
        )
        self.replica = Replica()
        self._counters = metrics.IoCounters()
        self._reads = Reads(stores, routing, self._counters, frame_timeout)
        self._updates = Updates(
            stores,
            routing,
            fenced,
            self.replica,
            Successors(self._pool, self.replica, on_stale),
            self._counters,
        )
        self._stopping = threading.Event()
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(sockaddr)
        self._listener.listen(512)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> DataServer:
        """Start accepting connections in a background thread."""
        self._thread = threading.Thread(target=self._accept_loop, name="data-accept", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close every connection and wait for the accept thread."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in self.admission.open_connections():
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.close()

    def busy(self) -> bool:
        """True while a request (a client's, or a chain peer's) is being handled."""
        return self._busy > 0

    def io_counters(self, target_id: int) -> tuple[int, int]:
        """(bytes sent to readers, bytes stored by writes) of a target since start."""
        return self._counters.get(target_id)

    @property
    def connections(self) -> int:
        """Open client connections."""
        return self.admission.connections

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping.is_set()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            secs = max(1, int(self.frame_timeout))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", secs, 0))
            conn = self.admission.accept(sock, peer)
            if conn is None:
                with contextlib.suppress(OSError):
                    sock.settimeout(1.0)
                    wire.send_refusal(sock, Op.PING, wire.Busy("too many connections"))
                sock.close()
                continue
            threading.Thread(
                target=serve, args=(self, conn), name=f"data-{peer}", daemon=True
            ).start()

    # ------------------------------------------------------------------ requests

    def dispatch(self, conn: Connection, frame: framing.Frame, req) -> bool:
        """Handle one admitted request; False when the connection must be closed."""
        op = frame.header.op
        conn.responding = False
        conn.status = Status.INTERNAL
        started = time.perf_counter()
        with self._busy_lock:
            self._busy += 1
        try:
            return self._handle(conn, op, frame, req)
        finally:
            with self._busy_lock:
                self._busy -= 1
            name = OP_NAMES.get(op)
            if name is not None:
                metrics.CHUNK_OPS.labels(name, framing.status_name(conn.status)).inc()
                metrics.CHUNK_OP_LATENCY.labels(name).observe(time.perf_counter() - started)
            if conn.kind == CLIENT and conn.status == Status.OK and frame.header.data_len:
                metrics.count_client(conn.peer, written=frame.header.data_len)

    def _handle(self, conn: Connection, op: int, frame: framing.Frame, req) -> bool:
        try:
            if frame.data is not None:
                try:
                    framing.verify(frame.data, frame.crcs, frame.header.block_size)
                except framing.ChecksumError as exc:
                    metrics.CHECKSUM_ERRORS.labels(str(_target_of(op, req))).inc()
                    return self.refuse(conn, op, wire.ChecksumMismatch(str(exc)))
            if op in OP_NAMES and self._fenced():
                return self.refuse(conn, op, FENCED)
            if op == Op.READ:
                refusal = self._reads.read(conn, req)
                if refusal is not None:
                    self.refuse(conn, op, refusal)
            elif op == Op.WRITE:
                self._answer(conn, op, self._updates.write(req, frame))
            elif op == Op.WRITE_BATCH:
                self._answer(conn, op, self._updates.write_batch(req, frame))
            elif op == Op.TRUNCATE:
                self._answer(conn, op, self._updates.truncate(req))
            else:
                self._respond(conn, op, b"")
            return True
        except (OSError, framing.FrameError) as exc:
            if conn.responding:
                log.info("connection to %s lost while answering: %s", conn.peer, exc)
                return False
            if is_no_space(exc):
                # a truncation or a resync copy the target has no room for
                return self.refuse(conn, op, wire.NoSpace(f"{type(exc).__name__}: {exc}"))
            log.exception("request from %s failed", conn.peer)
            return self.refuse(conn, op, wire.ServerError(f"{type(exc).__name__}: {exc}"))
        except Exception as exc:
            log.exception("request from %s failed", conn.peer)
            if conn.responding:
                return False
            return self.refuse(conn, op, wire.ServerError(f"{type(exc).__name__}: {exc}"))

    def _respond(self, conn: Connection, op: int, meta: bytes) -> None:
        conn.responding = True
        conn.status = Status.OK
        framing.send_frame(conn.sock, op | framing.RESPONSE, meta)

    def _answer(self, conn: Connection, op: int, result) -> None:
        """Answer ``op`` with ``result``: a response message, or a refusal."""
        if isinstance(result, wire.Refused):
            self.refuse(conn, op, result)
        else:
            self._respond(conn, op, result.SerializeToString())

    def refuse(self, conn: Connection, op: int, reject: wire.Refused) -> bool:
        """Answer ``op`` with the refusal ``reject``; False when the peer is gone."""
        if reject.status == Status.STALE_CHAIN and self._on_stale is not None:
            self._on_stale()
        conn.responding = True
        conn.status = reject.status
        try:
            wire.send_refusal(conn.sock, op, reject, self._routing().version)
        except OSError:
            return False
        return True
