"""One connection of the data server: its state and its frame loop.

One thread per connection processes that connection's requests in order
(:func:`serve`). Every request is admitted before its data is received
(:meth:`~emberfs.storageserver.admission.Admission.admit`); only then does the
data get a buffer. A refused request whose data is still on the wire is
answered and its connection closed.

A peer that stays silent between frames for ``idle_timeout`` seconds is
dropped, and so is one whose frame (header to last data byte) does not arrive
within ``frame_timeout`` seconds plus its data length at ``MIN_DATA_RATE``,
or that sends a malformed frame.
"""

from __future__ import annotations

import logging
import mmap
import socket
import time
from typing import TYPE_CHECKING

from emberfs.common import framing, wire
from emberfs.common.framing import Status
from emberfs.storageserver import metrics

if TYPE_CHECKING:
    from emberfs.storageserver.dataserver import DataServer

log = logging.getLogger(__name__)

#: the slowest a frame's data may arrive (bytes/s) before the frame is cut off
MIN_DATA_RATE = 1024 * 1024

# frames up to this size are received into one buffer kept per connection
_CONN_BUFFER_MAX = 16 * 1024 * 1024

# connection classes, known from a connection's first request
PENDING, CLIENT, SERVER = 0, 1, 2

#: names of the chunk operations, as metrics label them
OP_NAMES = {
    framing.Op.READ: "read",
    framing.Op.WRITE: "write",
    framing.Op.TRUNCATE: "truncate",
    framing.Op.WRITE_BATCH: "write_batch",
}


class Connection:
    """One accepted connection: its socket, its class and the state of its answer."""

    __slots__ = ("sock", "peer", "responding", "status", "kind", "reserve", "_buf")

    def __init__(self, sock: socket.socket, peer, reserve: bool = False):
        self.sock = sock
        self.peer = peer
        self.responding = False
        self.status = Status.OK
        self.kind = PENDING
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


def serve(server: DataServer, conn: Connection) -> None:
    """Receive, admit and hand to ``server`` every frame of ``conn`` until it closes."""
    sock = conn.sock
    try:
        while not server.stopping:
            # a connection in the reserve has one frame's time to show it is a server's
            sock.settimeout(server.frame_timeout if conn.reserve else server.idle_timeout)
            try:
                if not sock.recv(1, socket.MSG_PEEK):
                    return
            except (TimeoutError, OSError):
                return
            deadline = time.monotonic() + server.frame_timeout
            try:
                header, meta, crcs = framing.recv_head(sock, deadline)
            except (framing.FrameError, TimeoutError, OSError) as exc:
                log.info("dropping connection from %s: %s", conn.peer, exc)
                return
            if header.is_response:
                log.info("dropping connection from %s: it sent a response frame", conn.peer)
                return
            req = server.admission.admit(conn, header, meta)
            if isinstance(req, wire.Refused):
                metrics.CHUNK_OPS.labels(
                    OP_NAMES.get(header.op, "other"), framing.status_name(req.status)
                ).inc()
                # answer; close when the data is still on the wire, or the peer has
                # no credentials or no room here
                closing = header.data_len or req.status in (Status.DENIED, Status.BUSY)
                if not server.refuse(conn, header.op, req) or closing:
                    return
                continue
            data = None
            if header.data_len:
                data = conn.buffer(header.data_len)
                try:
                    framing.recv_exact_into(sock, data, deadline + header.data_len / MIN_DATA_RATE)
                except (framing.FrameError, TimeoutError, OSError) as exc:
                    log.info("dropping connection from %s: %s", conn.peer, exc)
                    return
            frame = framing.Frame(header, meta, crcs, data)
            if not server.dispatch(conn, frame, req):
                return
    finally:
        server.admission.release(conn)
        sock.close()
