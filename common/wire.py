"""Talking the framed data protocol: one connection pool, one exchange, one error table.

Every sender of frames goes through this module: the client's chunk reads and
writes, a storage server forwarding a write down its chain, a resync copying
chunks to a returning replica, the metaserver cutting a file's chunks.
:mod:`emberfs.common.framing` fixes the bytes of a frame; this module moves
frames over connections.

* :class:`ConnectionPool` keeps TCP connections per data address, bounded per
  server or not, lends them (:meth:`~ConnectionPool.acquire`), takes healthy
  ones back (:meth:`~ConnectionPool.release`), closes broken ones
  (:meth:`~ConnectionPool.discard`) and remembers servers that failed a
  transfer (:meth:`~ConnectionPool.mark_bad`, tried last for a while). Given
  the cluster's live servers it runs a :class:`~emberfs.common.stalls.StallWatch`
  over its exchanges, so a transfer waiting on a server the cluster declared
  offline ends at once.
* :class:`Call` sends a request now and receives its answer when asked
  (a head sends its successor the update before staging it locally);
  :func:`call` does both. A connection reused from the pool that its peer
  closed while idle (the server restarted) fails at once: the request is sent
  once more on a fresh connection. No other failure is retried here; callers
  retry with fresh routing.
* :class:`Refused` and its subclasses are the one table from a framing
  :class:`~emberfs.common.framing.Status` to an exception: a server's error
  frame is raised as ``refusal(status, message)`` by every receiver, and the
  replication rules return them as their refusals.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.message import DecodeError

from emberfs.common import framing
from emberfs.common.addresses import split_address
from emberfs.common.framing import Status
from emberfs.common.stalls import StallWatch, Watched
from emberfs.proto import data_pb2

# ----------------------------------------------------------------------------
# the status table


class Refused(Exception):
    """A storage server answered with an error status (the whole error frame was read).

    Attributes
    ----------
    status : int
        The framing status.
    message : str
        The server's message.
    routing_version : int
        The routing version the server had (0 when it did not say).
    """

    status: int = Status.INTERNAL

    def __init__(self, message: str = "", *, status: int | None = None, routing_version: int = 0):
        if status is not None:
            self.status = status
        super().__init__(f"{framing.status_name(self.status)}: {message}")
        self.message = message
        self.routing_version = routing_version

    @property
    def retryable(self) -> bool:
        """Whether another replica, or the request after a routing refresh, may succeed."""
        return self.status in framing.RETRYABLE


class ChunkNotFound(Refused):
    status = Status.NOT_FOUND  # the chunk does not exist on this target


class StaleChain(Refused):
    status = Status.STALE_CHAIN  # the chain version differs: refresh the routing


class NotCommitted(Refused):
    status = Status.NOT_COMMITTED  # a pending version here (forwarded: send the whole chunk)


class ChecksumMismatch(Refused):
    status = Status.CHECKSUM  # a block's CRC32C did not match on the receiver


class BadRequest(Refused):
    status = Status.BAD_REQUEST  # malformed or out of range: no replica will take it


class NotServing(Refused):
    status = Status.NOT_SERVING  # not in the chain, not serving, or not the head


class ServerError(Refused):
    status = Status.INTERNAL  # the server failed while handling the request


class Busy(Refused):
    status = Status.BUSY  # too many requests or connections: retry later


class NoSpace(Refused):
    status = Status.NO_SPACE  # a replica of the chain has no room for the update


class Denied(Refused):
    status = Status.DENIED  # no credentials, wrong ones, or ones that do not cover the request


_BY_STATUS: dict[int, type[Refused]] = {cls.status: cls for cls in Refused.__subclasses__()}


def refusal(status: int, message: str = "", *, routing_version: int = 0) -> Refused:
    """The exception of a framing ``status`` (a :class:`Refused` for an unknown one)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        return Refused(message, status=status, routing_version=routing_version)
    return cls(message, routing_version=routing_version)


def send_refusal(sock: socket.socket, op: int, refused: Refused, routing_version: int = 0) -> None:
    """Answer request ``op`` with the error frame of ``refused``."""
    framing.send_error(sock, op, refused.status, refused.message, routing_version=routing_version)


def recv_answer(sock: socket.socket, op: int) -> tuple[framing.Header, bytes, tuple[int, ...]]:
    """Receive an answer to request ``op`` up to its data: header, meta and CRC table.

    An error frame is read whole and raised as its :class:`Refused` (the
    connection stays usable); an answer to another op raises FrameError.
    """
    header, meta, crcs = framing.recv_head(sock)
    if header.op != op | framing.RESPONSE:
        raise framing.FrameError(f"unexpected response op {header.op:#x} to op {op}")
    if header.status != Status.OK:
        if header.data_len:
            framing.recv_exact(sock, header.data_len)
        try:
            err = data_pb2.ErrorResponse.FromString(meta)
        except DecodeError:
            err = data_pb2.ErrorResponse()
        raise refusal(header.status, err.message, routing_version=err.routing_version)
    return header, meta, crcs


def _answer_meta(op: int) -> Callable[[socket.socket], bytes]:
    def receive(sock: socket.socket) -> bytes:
        header, meta, _ = recv_answer(sock, op)
        if header.data_len:
            framing.recv_exact(sock, header.data_len)
        return meta

    return receive


# ----------------------------------------------------------------------------
# connections


class ConnectionPool:
    """TCP connections of the data protocol, pooled per ``host:port``, safe across threads.

    Parameters
    ----------
    connect_timeout : float, default 5.0
    io_timeout : float, default 30.0
        Socket timeout of every send and receive.
    max_per_address : int or None, default 8
        Connections open to one server at most (callers wait for a free
        one); None: no bound.
    max_idle : int or None
        Idle connections kept per server (default ``max_per_address``, or 8
        when that is None); more are closed when given back.
    bad_ttl : float, default 2.0
        Seconds an address that failed stays marked bad.
    live : callable, optional
        Returns the data addresses of the servers the cluster counts as up
        (:func:`emberfs.common.stalls.live_addresses`); with it, exchanges
        waiting on another server for ``stall_check`` seconds are checked
        against it and cut once their server is declared down.
    stall_check : float, default 1.0
    credential : framing.Credential, optional
        What the requests sent through the pool carry in their auth section
        unless a :class:`Call` brings its own (a server's pool: the cluster's
        server credential, :mod:`emberfs.common.auth`).
    """

    def __init__(
        self,
        connect_timeout: float = 5.0,
        io_timeout: float = 30.0,
        max_per_address: int | None = 8,
        max_idle: int | None = None,
        bad_ttl: float = 2.0,
        *,
        live: Callable[[], set[str]] | None = None,
        stall_check: float = 1.0,
        credential: framing.Credential | None = None,
    ) -> None:
        self.credential = credential
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout
        self.max_per_address = None if max_per_address is None else max(1, max_per_address)
        self.max_idle = max_idle if max_idle is not None else (self.max_per_address or 8)
        self.bad_ttl = bad_ttl
        self.stalls: StallWatch | None = None
        if live is not None:
            self.stalls = StallWatch(
                live, stall_check, on_abandon=self.mark_bad, on_suspect=self.mark_bad
            )
        self._idle: dict[str, list[socket.socket]] = defaultdict(list)
        self._open: dict[str, int] = defaultdict(int)
        self._bad: dict[str, float] = {}
        self._cond = threading.Condition()
        self._closed = False

    def _connect(self, address: str) -> socket.socket:
        sock = socket.create_connection(split_address(address), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.io_timeout)
        return sock

    def _full(self, address: str) -> bool:
        return self.max_per_address is not None and self._open[address] >= self.max_per_address

    def acquire(self, address: str, fresh: bool = False) -> tuple[socket.socket, bool]:
        """A connection to ``address`` and whether it was reused from the pool.

        With ``fresh`` a new connection is opened (an idle one is closed to
        make room). Waits for a free connection up to the connect and I/O
        timeouts together (TimeoutError).
        """
        deadline = time.monotonic() + self.connect_timeout + self.io_timeout
        with self._cond:
            while True:
                if self._closed:
                    raise OSError(errno.EBADF, "connection pool is closed")
                idle = self._idle[address]
                if idle and not fresh:
                    return idle.pop(), True
                if idle and fresh:
                    idle.pop().close()
                    self._open[address] -= 1
                if not self._full(address):
                    self._open[address] += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no free connection to {address}")
                self._cond.wait(left)
        try:
            return self._connect(address), False
        except BaseException:
            self._forget(address)
            raise

    def try_acquire(self, address: str) -> socket.socket | None:
        """An idle or new connection to ``address``, or None when all are busy (never waits)."""
        with self._cond:
            if self._closed:
                return None
            idle = self._idle[address]
            if idle:
                return idle.pop()
            if self._full(address):
                return None
            self._open[address] += 1
        try:
            return self._connect(address)
        except OSError:
            self._forget(address)
            return None

    def release(self, address: str, sock: socket.socket) -> None:
        """Give back a healthy connection (no unread bytes in it)."""
        with self._cond:
            idle = self._idle[address]
            if self._closed or len(idle) >= self.max_idle:
                sock.close()
                self._open[address] -= 1
            else:
                idle.append(sock)
            self._cond.notify()

    def discard(self, address: str, sock: socket.socket) -> None:
        """Close a connection in an unknown state (an error mid-frame)."""
        try:
            sock.close()
        finally:
            self._forget(address)

    def _forget(self, address: str) -> None:
        with self._cond:
            self._open[address] -= 1
            self._cond.notify()

    def drop_idle(self, address: str) -> None:
        """Close the idle connections to ``address`` (its server went away or restarted)."""
        with self._cond:
            for sock in self._idle.pop(address, []):
                sock.close()
                self._open[address] -= 1
            self._cond.notify_all()

    def mark_bad(self, address: str) -> None:
        """A transfer to ``address`` failed: try it last for ``bad_ttl`` seconds."""
        with self._cond:
            self._bad[address] = time.monotonic() + self.bad_ttl
        self.drop_idle(address)

    def all_idle(self) -> bool:
        """Whether every open connection is idle in the pool (none lent out)."""
        with self._cond:
            return all(self._open[a] == len(self._idle.get(a, [])) for a in self._open)

    def connections(self, address: str) -> int:
        """Connections open to ``address`` (idle or lent out)."""
        with self._cond:
            return self._open.get(address, 0)

    def is_bad(self, address: str) -> bool:
        until = self._bad.get(address)
        return until is not None and until > time.monotonic()

    def failed(self, address: str) -> None:
        """A transfer to ``address`` failed: mark it bad and follow the routing for it."""
        self.mark_bad(address)
        if self.stalls is not None:
            self.stalls.suspect(address)

    @contextlib.contextmanager
    def watching(self, address: str, sock: socket.socket) -> Iterator[Watched]:
        """Watch the transfer on ``sock`` for stalls (see :class:`StallWatch`)."""
        if self.stalls is None:
            yield Watched()
            return
        with self.stalls.watching(address, sock) as watched:
            yield watched

    def close(self) -> None:
        """Close the idle connections and stop the stall watch; later acquires fail."""
        if self.stalls is not None:
            self.stalls.stop()
        with self._cond:
            self._closed = True
            for address, socks in self._idle.items():
                for sock in socks:
                    sock.close()
                self._open[address] -= len(socks)
            self._idle.clear()
            self._cond.notify_all()


# ----------------------------------------------------------------------------
# exchanges


def _resend_worthy(exc: BaseException, reused: bool, watched: Watched) -> bool:
    """Whether a failed exchange is sent again on a fresh connection.

    Only a connection taken from the pool that turns out closed (reset,
    closed mid-frame) qualifies: its server restarted or dropped it while it
    was idle. A timeout, a bad checksum or a connection the stall watch cut
    (its server is down) is not retried here.
    """
    return (
        reused
        and isinstance(exc, ConnectionError | framing.FrameError)
        and not isinstance(exc, framing.ChecksumError)
        and not watched.cut
    )


class Call:
    """One request on a pooled connection: sent when made, its answer taken by :meth:`result`.

    Parameters
    ----------
    pool : ConnectionPool
    address : str
        ``host:port`` of the receiving server.
    op : int
        The request's :class:`~emberfs.common.framing.Op`.
    meta : bytes
        The request's meta section.
    data : bytes-like, optional
        The request's data section.
    block_size : int, default framing.DEFAULT_BLOCK
    crcs : list of int, optional
        The data's block CRCs when already known.
    timeout : float, optional
        Socket timeout of this exchange instead of the pool's.
    credential : framing.Credential, optional
        The request's credentials (default: the pool's).

    A failure to connect or send is kept and raised by :meth:`result` (after
    the resend a closed pooled connection gets).

    Attributes
    ----------
    sent : bool
        Whether the request went out whole on a connection. False after a
        failure means the receiver never got it; True means it may have
        acted on it even when no answer came back.
    """

    def __init__(
        self,
        pool: ConnectionPool,
        address: str,
        op: int,
        meta: bytes,
        data=None,
        *,
        block_size: int = framing.DEFAULT_BLOCK,
        crcs: list[int] | None = None,
        timeout: float | None = None,
        credential: framing.Credential | None = None,
    ) -> None:
        self.pool = pool
        self.address = address
        self.op = op
        self._request = (meta, data, block_size, crcs, credential or pool.credential)
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._reused = False
        self._watch: contextlib.ExitStack | None = None
        self._watched = Watched()
        self._error: BaseException | None = None
        self.sent = False  # a request frame went out whole on some connection
        try:
            self._send(fresh=False)
        except Exception as exc:
            self._error = exc

    def _send(self, fresh: bool) -> None:
        sock, reused = self.pool.acquire(self.address, fresh)
        if self._timeout is not None:
            sock.settimeout(self._timeout)
        self._sock, self._reused = sock, reused
        self._watch = contextlib.ExitStack()
        self._watched = self._watch.enter_context(self.pool.watching(self.address, sock))
        meta, data, block_size, crcs, credential = self._request
        try:
            framing.send_frame(
                sock, self.op, meta, data, block_size=block_size, crcs=crcs, credential=credential
            )
        except BaseException:
            self._finish(ok=False)
            raise
        self.sent = True

    def _finish(self, ok: bool) -> None:
        """End the exchange on the current connection: give it back or close it."""
        sock, self._sock = self._sock, None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if sock is None:
            return
        if self._timeout is not None and ok:
            sock.settimeout(self.pool.io_timeout)
        if ok:
            self.pool.release(self.address, sock)
        else:
            self.pool.discard(self.address, sock)

    def result(self, receive: Callable[[socket.socket], Any] | None = None) -> Any:
        """The answer: ``receive(sock)``'s value (by default the answer's meta section).

        ``receive`` reads the whole answer from the socket (start with
        :func:`recv_answer`). Raises the :class:`Refused` of an error answer,
        and OSError or FrameError when the exchange failed.
        """
        receive = receive or _answer_meta(self.op)
        for attempt in (0, 1):
            if self._error is not None:
                exc, self._error = self._error, None
                if attempt == 0 and _resend_worthy(exc, self._reused, self._watched):
                    self._resend()
                    continue
                raise exc
            try:
                value = receive(self._sock)
            except Refused:
                self._finish(ok=True)  # the error frame was read whole
                raise
            except BaseException as exc:
                self._finish(ok=False)
                if attempt == 0 and _resend_worthy(exc, self._reused, self._watched):
                    self._resend()
                    continue
                raise
            self._finish(ok=True)
            return value
        raise AssertionError("unreachable")

    def _resend(self) -> None:
        self.pool.drop_idle(self.address)  # they went stale together
        try:
            self._send(fresh=True)
        except Exception as exc:
            self._error = exc
            self._reused = False

    def abandon(self) -> None:
        """Close the connection without reading the answer."""
        self._finish(ok=False)


def call(
    pool: ConnectionPool,
    address: str,
    op: int,
    meta: bytes,
    data=None,
    *,
    receive: Callable[[socket.socket], Any] | None = None,
    **send: Any,
) -> Any:
    """One request and its answer on a pooled connection (see :class:`Call`)."""
    return Call(pool, address, op, meta, data, **send).result(receive)
