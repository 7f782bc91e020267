"""Admission to the data server: connection limits, and each request before its data.

Connections are capped at ``max_connections``; the last ``forward_reserve``
of them only take servers (chain forwards, resync, truncation), so busy
clients cannot starve the forwards that their own writes need. A
connection's class (client or server) is settled by its first request.

Every request is admitted before its data is received: the frame's
credentials are checked (with cluster keys: a server's MAC, or a client's
chunk capability covering the request, see :mod:`emberfs.common.auth`), its
meta section decoded and its data length held to the request's limits.
"""

from __future__ import annotations

import socket
import threading

from google.protobuf.message import DecodeError

from emberfs.common import framing, wire
from emberfs.common.auth import SERVER_GRANT, AuthError, ClusterKeys, Grant
from emberfs.common.framing import Op
from emberfs.proto import data_pb2
from emberfs.storageserver import replication as rp
from emberfs.storageserver.connection import CLIENT, OP_NAMES, PENDING, SERVER, Connection

_REQUESTS = {
    Op.READ: data_pb2.ChunkReadRequest,
    Op.WRITE: data_pb2.ChunkWriteRequest,
    Op.TRUNCATE: data_pb2.ChunkTruncateRequest,
    Op.WRITE_BATCH: data_pb2.ChunkWriteBatch,
}


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


def _plain_write(req: data_pb2.ChunkWriteRequest) -> bool:
    """A client writes to the head; versions, copies and replacements are the servers'."""
    return not (req.update_version or req.base_version or req.sync or req.replace)


class Admission:
    """The connections of one data server and what each may send.

    Parameters
    ----------
    keys : ClusterKeys or None
        The cluster's keys: every request must then carry credentials. None
        admits every request as a server's (``--insecure``).
    max_connections : int
        Connections beyond this are refused.
    forward_reserve : int
        Of ``max_connections``, how many only servers may use.
    """

    def __init__(self, keys: ClusterKeys | None, max_connections: int, forward_reserve: int):
        self._keys = keys
        self.max_connections = max_connections
        self.forward_reserve = min(max(0, forward_reserve), max_connections - 1)
        self._clients = 0  # connections (pending or client) outside the forward reserve
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()

    @property
    def connections(self) -> int:
        """Open connections."""
        return len(self._conns)

    def open_connections(self) -> list[Connection]:
        """The connections open now."""
        with self._lock:
            return list(self._conns)

    def accept(self, sock: socket.socket, peer) -> Connection | None:
        """The connection of an accepted socket, or None when there is no room for it."""
        with self._lock:
            full = len(self._conns) >= self.max_connections
            # past the clients' share, a connection must prove to be a server's
            reserve = self._clients >= self.max_connections - self.forward_reserve
            conn = Connection(sock, peer, reserve)
            if not full:
                self._conns.add(conn)
                self._clients += not reserve
        return None if full else conn

    def release(self, conn: Connection) -> None:
        """``conn`` closed: its room is free."""
        with self._lock:
            self._conns.discard(conn)
            self._clients -= conn.kind != SERVER and not conn.reserve

    def admit(self, conn: Connection, header: framing.Header, meta: bytes) -> object:
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
            return wire.Denied(f"the capability does not allow this {OP_NAMES.get(op, op)}")
        return req

    def _classify(self, conn: Connection, server: bool) -> wire.Refused | None:
        """Settle a connection's class at its first request (a refusal: close it)."""
        if conn.kind != PENDING:
            if server or conn.kind == CLIENT:
                return None
            return wire.Denied("a server's connection carries server requests only")
        with self._lock:
            if server:
                conn.kind = SERVER
                if not conn.reserve:
                    self._clients -= 1
                conn.reserve = False
                return None
            if conn.reserve:
                return wire.Busy("too many client connections")
            conn.kind = CLIENT
            return None
