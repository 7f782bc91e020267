"""The storage node's framed-TCP data server: chunk reads, writes and truncation.

One thread per connection processes that connection's requests in order.
Every decision (may this target serve, which version, what to forward, what
to answer) comes from the replication rules
(:mod:`emberfs.storageserver.replication`) and the node's replication state
(:class:`~emberfs.storageserver.replica.Replica`); this module accepts
connections, dispatches requests, touches the
:class:`~emberfs.storageserver.chunkstore.ChunkStore` and talks to successors.

Every request is admitted before its data is received: the frame's
credentials are checked (with cluster keys: a server's MAC, or a client's
chunk capability covering the request, see :mod:`emberfs.common.auth`), its
meta section decoded and its data length held to the request's limits; only
then does the data get a buffer. A refused request whose data is still on
the wire is answered and its connection closed.

A peer that stays silent between frames for ``idle_timeout`` seconds is
dropped, and so is one whose frame (header to last data byte) does not arrive
within ``frame_timeout`` seconds plus its data length at ``MIN_DATA_RATE``,
or that sends a malformed frame. Connections are capped at
``max_connections``; the last ``forward_reserve`` of them only take servers
(chain forwards, resync, truncation), so busy clients cannot starve the
forwards that their own writes need.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping

from google.protobuf.message import DecodeError

from emberfs.common import framing, wire
from emberfs.common.auth import SERVER_GRANT, AuthError, ClusterKeys, Grant
from emberfs.common.framing import Op, Status
from emberfs.common.routing import RoutingView
from emberfs.common.stalls import live_addresses
from emberfs.proto import data_pb2
from emberfs.storageserver import metrics
from emberfs.storageserver import replication as rp
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.forwarding import Successors
from emberfs.storageserver.replica import Replica, WritePlan, written
from emberfs.storageserver.space import is_no_space

log = logging.getLogger(__name__)


_OP_NAMES = {
    Op.READ: "read",
    Op.WRITE: "write",
    Op.TRUNCATE: "truncate",
    Op.WRITE_BATCH: "write_batch",
}


# the answer of a node whose lease from the metaserver ran out (see Node.fenced)
_FENCED = wire.NotServing("fenced: this server has not heard from the metaserver in time")


_REQUESTS = {
    Op.READ: data_pb2.ChunkReadRequest,
    Op.WRITE: data_pb2.ChunkWriteRequest,
    Op.TRUNCATE: data_pb2.ChunkTruncateRequest,
    Op.WRITE_BATCH: data_pb2.ChunkWriteBatch,
}

#: most writes in one OP_WRITE_BATCH frame
MAX_BATCH_WRITES = 256

#: the slowest a frame's data may arrive (bytes/s) before the frame is cut off
MIN_DATA_RATE = 1024 * 1024

# frames up to this size are received into one buffer kept per connection
_CONN_BUFFER_MAX = 16 * 1024 * 1024

# connection classes, known from a connection's first request
_PENDING, _CLIENT, _SERVER = 0, 1, 2


def _client_may(op: int, req, grant: Grant, keys: ClusterKeys | None = None) -> bool:
    """Whether a client's capability allows request ``req``.

    Every write of a batch needs its own capability (``keys`` opens them).
    """
    if op == Op.PING:
        return True
    if op == Op.READ:
        return grant.covers(req.chunk.inode, write=False)
    if op == Op.WRITE:
        return _plain_write(req) and grant.covers(req.chunk.inode, write=True)
    if op == Op.WRITE_BATCH:
        if keys is None or len(req.capabilities) != len(req.writes):
            return False
        for write, token in zip(req.writes, req.capabilities, strict=True):
            try:
                cap = Grant(server=False, capability=keys.open_capability(token))
            except AuthError:
                return False
            if not (_plain_write(write) and cap.covers(write.chunk.inode, write=True)):
                return False
        return True
    return False  # truncation is the metaserver's


def _target_of(op: int, req) -> int:
    """The target a request is for (a batch's first write's; 0 for an empty batch)."""
    if op == Op.WRITE_BATCH:
        return req.writes[0].target_id if req.writes else 0
    return req.target_id


def _plain_write(req: data_pb2.ChunkWriteRequest) -> bool:
    """A client writes to the head; versions, copies and replacements are the servers'."""
    return not (req.update_version or req.base_version or req.sync or req.replace)


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


class _Conn:
    __slots__ = ("sock", "peer", "responding", "status", "kind", "reserve", "_buf")

    def __init__(self, sock: socket.socket, peer, reserve: bool = False):
        self.sock = sock
        self.peer = peer
        self.responding = False
        self.status = Status.OK
        self.kind = _PENDING
        self.reserve = reserve  # accepted into the forward reserve: must be a server
        self._buf: mmap.mmap | None = None

    def buffer(self, n: int) -> memoryview:
        """An ``n``-byte receive buffer, reused by the connection's next frames.

        A connection handles one request at a time and nothing keeps a
        request's data after it is answered, so one buffer serves them all.
        """
        if n > _CONN_BUFFER_MAX:
            return memoryview(bytearray(n))
        if self._buf is None or len(self._buf) < n:
            # page-aligned, so the chunk store writes straight from it with O_DIRECT
            self._buf = mmap.mmap(-1, n)
        return memoryview(self._buf)[:n]


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
        self._stores = stores
        self._routing = routing
        self._keys = keys
        self.max_connections = max_connections
        self.forward_reserve = min(max(0, forward_reserve), max_connections - 1)
        self._clients = 0  # connections (pending or client) outside the forward reserve
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
        self._successors = Successors(self._pool, self.replica, on_stale)
        self._io: dict[int, list[int]] = {}  # target id -> [bytes read, bytes written]
        self._io_lock = threading.Lock()
        self._conns: set[_Conn] = set()
        self._conns_lock = threading.Lock()
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
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
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
        with self._io_lock:
            read, written = self._io.get(target_id, (0, 0))
            return read, written

    def _count(self, target_id: int, read: int = 0, written: int = 0) -> None:
        with self._io_lock:
            counters = self._io.setdefault(target_id, [0, 0])
            counters[0] += read
            counters[1] += written
        if read:
            metrics.count_read(target_id, read)
        if written:
            metrics.count_written(target_id, written)

    @property
    def connections(self) -> int:
        """Open client connections."""
        return len(self._conns)

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
            with self._conns_lock:
                full = len(self._conns) >= self.max_connections
                # past the clients' share, a connection must prove to be a server's
                reserve = self._clients >= self.max_connections - self.forward_reserve
                conn = _Conn(sock, peer, reserve)
                if not full:
                    self._conns.add(conn)
                    self._clients += not reserve
            if full:
                with contextlib.suppress(OSError):
                    sock.settimeout(1.0)
                    wire.send_refusal(sock, Op.PING, wire.Busy("too many connections"))
                sock.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name=f"data-{peer}", daemon=True
            ).start()

    # ------------------------------------------------------------------ connections

    def _serve(self, conn: _Conn) -> None:
        sock = conn.sock
        try:
            while not self._stopping.is_set():
                # a connection in the reserve has one frame's time to show it is a server's
                sock.settimeout(self.frame_timeout if conn.reserve else self.idle_timeout)
                try:
                    if not sock.recv(1, socket.MSG_PEEK):
                        return
                except (TimeoutError, OSError):
                    return
                deadline = time.monotonic() + self.frame_timeout
                try:
                    header, meta, crcs = framing.recv_head(sock, deadline)
                except (framing.FrameError, TimeoutError, OSError) as exc:
                    log.info("dropping connection from %s: %s", conn.peer, exc)
                    return
                if header.is_response:
                    log.info("dropping connection from %s: it sent a response frame", conn.peer)
                    return
                req = self._admit(conn, header, meta)
                if isinstance(req, wire.Refused):
                    metrics.CHUNK_OPS.labels(
                        _OP_NAMES.get(header.op, "other"), framing.status_name(req.status)
                    ).inc()
                    # answer; close when the data is still on the wire, or the peer has
                    # no credentials or no room here
                    closing = header.data_len or req.status in (Status.DENIED, Status.BUSY)
                    if not self._error(conn, header.op, req) or closing:
                        return
                    continue
                data = None
                if header.data_len:
                    data = conn.buffer(header.data_len)
                    try:
                        framing.recv_exact_into(
                            sock, data, deadline + header.data_len / MIN_DATA_RATE
                        )
                    except (framing.FrameError, TimeoutError, OSError) as exc:
                        log.info("dropping connection from %s: %s", conn.peer, exc)
                        return
                frame = framing.Frame(header, meta, crcs, data)
                if not self._dispatch(conn, frame, req):
                    return
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
                self._clients -= conn.kind != _SERVER and not conn.reserve
            sock.close()

    def _admit(self, conn: _Conn, header: framing.Header, meta: bytes) -> object:
        """The decoded request of a frame whose data has not been received, or its refusal.

        Checks, in order: the credentials, the connection's class (a client in
        the forward reserve is refused), the meta section, the data length
        against the request, and that a client's capability covers the request.
        """
        op = header.op
        if self._keys is None:
            grant = SERVER_GRANT
        else:
            try:
                grant = self._keys.check_frame(header.body, header.auth, meta, header.table)
            except AuthError as exc:
                return wire.Denied(str(exc))
        refusal = self._classify(conn, grant.server)
        if refusal is not None:
            return refusal
        if op == Op.PING:
            req = None
        elif op in _REQUESTS:
            try:
                req = _REQUESTS[op].FromString(meta)
            except DecodeError as exc:
                return wire.BadRequest(f"bad request: {exc}")
        else:
            return wire.BadRequest(f"unknown op {op}")
        limit = framing.MAX_DATA if op == Op.WRITE_BATCH else rp.MAX_CHUNK_END
        if header.data_len and (op not in (Op.WRITE, Op.WRITE_BATCH) or header.data_len > limit):
            return wire.BadRequest(f"{header.data_len} data bytes do not fit the request")
        if not grant.server and not _client_may(op, req, grant, self._keys):
            return wire.Denied(f"the capability does not allow this {_OP_NAMES.get(op, op)}")
        return req

    def _classify(self, conn: _Conn, server: bool) -> wire.Refused | None:
        """Settle a connection's class at its first request (a refusal: close it)."""
        if conn.kind != _PENDING:
            if server or conn.kind == _CLIENT:
                return None
            return wire.Denied("a server's connection carries server requests only")
        with self._conns_lock:
            if server:
                conn.kind = _SERVER
                if not conn.reserve:
                    self._clients -= 1
                conn.reserve = False
                return None
            if conn.reserve:
                return wire.Busy("too many client connections")
            conn.kind = _CLIENT
            return None

    def _dispatch(self, conn: _Conn, frame: framing.Frame, req) -> bool:
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
            name = _OP_NAMES.get(op)
            if name is not None:
                metrics.CHUNK_OPS.labels(name, framing.status_name(conn.status)).inc()
                metrics.CHUNK_OP_LATENCY.labels(name).observe(time.perf_counter() - started)

    def _handle(self, conn: _Conn, op: int, frame: framing.Frame, req) -> bool:
        try:
            if frame.data is not None:
                try:
                    framing.verify(frame.data, frame.crcs, frame.header.block_size)
                except framing.ChecksumError as exc:
                    metrics.CHECKSUM_ERRORS.labels(str(_target_of(op, req))).inc()
                    return self._error(conn, op, wire.ChecksumMismatch(str(exc)))
            if op in _OP_NAMES and self._fenced():
                return self._error(conn, op, _FENCED)
            if op == Op.READ:
                self._read(conn, req)
            elif op == Op.WRITE:
                self._write(conn, req, frame)
            elif op == Op.WRITE_BATCH:
                self._write_batch(conn, req, frame)
            elif op == Op.TRUNCATE:
                self._truncate(conn, req)
            else:
                self._respond(conn, op, b"")
            return True
        except (OSError, framing.FrameError) as exc:
            if conn.responding:
                log.info("connection to %s lost while answering: %s", conn.peer, exc)
                return False
            if is_no_space(exc):
                # a truncation or a resync copy the target has no room for
                return self._error(conn, op, wire.NoSpace(f"{type(exc).__name__}: {exc}"))
            log.exception("request from %s failed", conn.peer)
            return self._error(conn, op, wire.ServerError(f"{type(exc).__name__}: {exc}"))
        except Exception as exc:
            log.exception("request from %s failed", conn.peer)
            if conn.responding:
                return False
            return self._error(conn, op, wire.ServerError(f"{type(exc).__name__}: {exc}"))

    def _respond(self, conn: _Conn, op: int, meta: bytes) -> None:
        conn.responding = True
        conn.status = Status.OK
        framing.send_frame(conn.sock, op | framing.RESPONSE, meta)

    def _answer(self, conn: _Conn, op: int, result) -> None:
        """Answer ``op`` with ``result``: a response message, or a refusal."""
        if isinstance(result, wire.Refused):
            self._error(conn, op, result)
        else:
            self._respond(conn, op, result.SerializeToString())

    def _error(self, conn: _Conn, op: int, reject: wire.Refused) -> bool:
        if reject.status == Status.STALE_CHAIN and self._on_stale is not None:
            self._on_stale()
        conn.responding = True
        conn.status = reject.status
        try:
            wire.send_refusal(conn.sock, op, reject, self._routing().version)
        except OSError:
            return False
        return True

    # ------------------------------------------------------------------ reads

    def _read(self, conn: _Conn, req: data_pb2.ChunkReadRequest) -> None:
        stores = self._stores()
        reject = rp.check_read(self._routing(), stores.keys(), req)
        if reject is not None:
            self._error(conn, Op.READ, reject)
            return
        store = stores[req.target_id]
        inode, index = req.chunk.inode, req.chunk.index
        with contextlib.ExitStack() as stack:
            try:
                fd, meta = stack.enter_context(store.committed_file(inode, index))
            except KeyError:  # nothing committed: say why (missing, or only pending)
                self._error(conn, Op.READ, rp.uncommitted(store.meta(inode, index)))
                return
            plan = rp.plan_read(meta, req.offset, req.length, store.block_size)
            if isinstance(plan, wire.Refused):
                self._error(conn, Op.READ, plan)
                return
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
                conn.sock.settimeout(self.frame_timeout)
            self._count(req.target_id, read=plan.send_length)

    # ------------------------------------------------------------------ writes

    def _write(self, conn: _Conn, req: data_pb2.ChunkWriteRequest, frame: framing.Frame) -> None:
        stores = self._stores()
        data = frame.data if frame.data is not None else memoryview(b"")
        role = rp.check_write(self._routing(), stores.keys(), req, len(data))
        if isinstance(role, wire.Refused):
            self._error(conn, Op.WRITE, role)
            return
        store = stores[req.target_id]
        inode, index = req.chunk.inode, req.chunk.index
        with self.replica.updating(req.target_id, inode, index):
            # The chain may have changed while the write waited for the chunk: a write
            # accepted under an older version could otherwise commit here after a resync
            # of a returning replica copied this chunk without it.
            role = rp.check_write(self._routing(), stores.keys(), req, len(data))
            result = self._update(store, req, _FENCED if self._fenced() else role, data, frame)
        self._answer(conn, Op.WRITE, result)

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

    def _write_batch(
        self, conn: _Conn, batch: data_pb2.ChunkWriteBatch, frame: framing.Frame
    ) -> None:
        """Writes of several chunks of one chain: each as :meth:`_write` would, forwarded together.

        The chunks are taken in one order (target, inode, index), so batches
        and single writes cannot deadlock; every answer is kept per write.
        """
        data = frame.data if frame.data is not None else memoryview(b"")
        refusal = _batch_refusal(batch, len(data))
        if refusal is not None:
            self._error(conn, Op.WRITE_BATCH, refusal)
            return
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
            for i in accepted:  # as _write: the chain may have changed while it waited
                req = writes[i]
                role = rp.check_write(self._routing(), stores.keys(), req, len(pieces[i]))
                if fenced:
                    role = _FENCED
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
        self._respond(conn, Op.WRITE_BATCH, answer.SerializeToString())

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
        self._count(plan.req.target_id, written=len(data))
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

    def _truncate(self, conn: _Conn, req: data_pb2.ChunkTruncateRequest) -> None:
        stores = self._stores()
        role = rp.check_truncate(self._routing(), stores.keys(), req)
        if isinstance(role, wire.Refused):
            self._error(conn, Op.TRUNCATE, role)
            return
        store = stores[req.target_id]
        with self.replica.truncating(req.target_id, req.inode):
            role = rp.check_truncate(self._routing(), stores.keys(), req)  # as for writes
            role = _FENCED if self._fenced() else role
            key = self.replica.truncate_key(req, role) if isinstance(role, rp.WriteRole) else None
            result = role if isinstance(role, wire.Refused) else self.replica.answered(key)
            if result is None:
                result = self._cut(store, req, role)
                self.replica.answer(key, result)
        self._answer(conn, Op.TRUNCATE, result)

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
