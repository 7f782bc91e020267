"""The framed protocol's one pool, one exchange and one status table, against real sockets."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from emberfs.common import framing, wire
from emberfs.common.framing import Op, Status
from emberfs.proto import data_pb2


class Server:
    """Answers each PING with OK, each READ with a scripted status; closes when told to."""

    def __init__(self, status=Status.OK, close_after: int | None = None, hold: float = 0.0):
        self.status = status
        self.close_after = close_after  # close each connection after this many answers
        self.hold = hold  # seconds to wait before answering
        self.connections = 0
        self.requests = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        answered = 0
        with conn:
            while self.close_after is None or answered < self.close_after:
                try:
                    frame = framing.recv_frame(conn)
                except (framing.FrameError, OSError):
                    return
                self.requests += 1
                time.sleep(self.hold)
                if self.status == Status.OK:
                    framing.send_frame(conn, frame.header.op | framing.RESPONSE, b"ok")
                else:
                    framing.send_error(
                        conn, frame.header.op, self.status, "scripted", routing_version=3
                    )
                answered += 1

    def close(self):
        self.sock.close()


@pytest.fixture
def servers():
    made = []

    def make(**kwargs):
        made.append(Server(**kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_every_status_has_one_exception_and_back():
    for status in Status:
        if status == Status.OK:
            continue
        exc = wire.refusal(status, "why", routing_version=4)
        assert isinstance(exc, wire.Refused) and exc.status == status
        assert exc.message == "why" and exc.routing_version == 4
        assert type(exc) is not wire.Refused  # a class of its own
        assert exc.retryable == (status in framing.RETRYABLE)
    unknown = wire.refusal(99, "new")
    assert type(unknown) is wire.Refused and unknown.status == 99 and not unknown.retryable


def test_no_space_is_its_own_refusal_and_not_retryable():
    exc = wire.refusal(Status.NO_SPACE, "target 3: no space left")
    assert type(exc) is wire.NoSpace and not exc.retryable
    assert str(exc) == "NO_SPACE: target 3: no space left"


def test_an_error_answer_is_raised_and_its_connection_kept(servers):
    server = servers(status=Status.STALE_CHAIN)
    pool = wire.ConnectionPool(connect_timeout=2, io_timeout=5)
    for _ in range(2):
        with pytest.raises(wire.StaleChain) as err:
            wire.call(pool, server.address, Op.PING, b"")
        assert err.value.message == "scripted" and err.value.routing_version == 3
    assert server.connections == 1
    pool.close()


def test_a_pooled_connection_its_server_closed_is_replaced_once(servers):
    server = servers(close_after=1)
    pool = wire.ConnectionPool(connect_timeout=2, io_timeout=5)
    assert wire.call(pool, server.address, Op.PING, b"") == b"ok"
    time.sleep(0.1)  # the server has closed the idle connection meanwhile
    assert wire.call(pool, server.address, Op.PING, b"") == b"ok"
    assert server.connections == 2
    pool.close()


def test_a_fresh_connection_that_fails_is_not_retried(servers):
    server = servers(close_after=0)  # closes every connection without answering
    pool = wire.ConnectionPool(connect_timeout=2, io_timeout=5)
    with pytest.raises((ConnectionError, framing.FrameError)):
        wire.call(pool, server.address, Op.PING, b"")
    assert server.connections == 1
    pool.close()


def test_a_timeout_is_not_retried(servers):
    server = servers(hold=1.0)
    pool = wire.ConnectionPool(connect_timeout=2, io_timeout=5)
    assert wire.call(pool, server.address, Op.PING, b"") == b"ok"  # pooled now
    with pytest.raises(TimeoutError):
        wire.call(pool, server.address, Op.PING, b"", timeout=0.2)
    assert server.requests == 2
    pool.close()


def test_a_call_sends_at_once_and_is_answered_later(servers):
    server = servers()
    pool = wire.ConnectionPool(connect_timeout=2, io_timeout=5)
    pending = wire.Call(pool, server.address, Op.PING, b"")
    deadline = time.monotonic() + 5
    while server.requests < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.requests == 1
    assert pending.result() == b"ok"
    dropped = wire.Call(pool, server.address, Op.PING, b"")
    dropped.abandon()  # its connection is closed, not pooled with an answer in it
    assert wire.call(pool, server.address, Op.PING, b"") == b"ok"
    pool.close()


def test_an_unreachable_server_fails_the_result(servers):
    with socket.create_server(("127.0.0.1", 0)) as s:
        address = f"127.0.0.1:{s.getsockname()[1]}"
    pool = wire.ConnectionPool(connect_timeout=2, io_timeout=5)
    pending = wire.Call(pool, address, Op.PING, b"")
    with pytest.raises(ConnectionRefusedError):
        pending.result()
    pool.close()


def test_a_bounded_pool_waits_and_try_acquire_never_does(servers):
    server = servers()
    pool = wire.ConnectionPool(connect_timeout=0.2, io_timeout=0.2, max_per_address=1)
    sock, reused = pool.acquire(server.address)
    assert not reused
    assert pool.try_acquire(server.address) is None
    with pytest.raises(TimeoutError):
        pool.acquire(server.address)
    pool.release(server.address, sock)
    again, reused = pool.acquire(server.address)
    assert again is sock and reused
    pool.release(server.address, again)
    pool.mark_bad(server.address)  # drops the idle connection, tried last for a while
    assert pool.is_bad(server.address)
    fresh, reused = pool.acquire(server.address)
    assert fresh is not sock and not reused
    pool.discard(server.address, fresh)
    pool.close()
    with pytest.raises(OSError):
        pool.acquire(server.address)


def test_an_unbounded_pool_keeps_at_most_max_idle(servers):
    server = servers()
    pool = wire.ConnectionPool(max_per_address=None, max_idle=2)
    socks = [pool.acquire(server.address)[0] for _ in range(4)]
    for sock in socks:
        pool.release(server.address, sock)
    assert sum(s.fileno() != -1 for s in socks) == 2
    pool.close()


def test_a_stalled_exchange_to_a_server_the_cluster_left_is_cut(servers):
    server = servers(hold=30.0)
    live = {server.address}
    pool = wire.ConnectionPool(io_timeout=60, live=lambda: set(live), stall_check=0.1)
    pending = wire.Call(pool, server.address, Op.PING, b"")
    time.sleep(0.3)
    live.clear()  # the cluster declares the server offline
    with pytest.raises((OSError, framing.FrameError)):
        pending.result()
    assert pool.stalls.abandoned == 1  # cut by the watch, not waited out
    assert pool.is_bad(server.address)
    pool.close()


def test_recv_answer_checks_the_op(servers):
    a, b = socket.socketpair()
    framing.send_frame(
        a, Op.WRITE | framing.RESPONSE, data_pb2.ChunkWriteResponse().SerializeToString()
    )
    with pytest.raises(framing.FrameError):
        wire.recv_answer(b, Op.READ)
    a.close()
    b.close()
