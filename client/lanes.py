"""Reads sent ahead: requests sent now whose answers wait in a socket until wanted.

A sequential reader that asks for whole chunks can have the requests for the
coming chunks sent at once and receive each answer straight into its own
buffer when it gets there, so the data crosses memory once and no buffer is
held for it meanwhile. :class:`ReadLanes` sends such reads, one connection
(a lane, :class:`_Lane`) per storage server: a server handles a connection's
requests one after the other, so the answers come back in the order sent.
Each sent read is a :class:`PendingRead`; receiving one first receives the
answers sent before it on its lane (keeping them for their own readers, or
dropping those nobody wants any more). A server has at most half of the
connections the pool allows it in sent reads at once.

:class:`~emberfs.client.datapath.DataClient` chooses the replica and makes
the request; a sent read that fails is read again the usual way.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import defaultdict, deque

from google.protobuf.message import DecodeError

from emberfs.common import framing, wire
from emberfs.common.framing import Op
from emberfs.proto import data_pb2


def check_answer(resp, inode: int, index: int, offset: int, data_len: int) -> None:
    """Raise FrameError unless a read's answer carries the asked chunk at the asked offset.

    The block CRCs travel with the data, so they cannot tell an answer meant
    for another read from the right one; the chunk id and offset it names can.
    """
    chunk = resp.chunk
    if (chunk.inode, chunk.index) != (inode, index) or (
        data_len and resp.data_offset + resp.skip != offset
    ):
        raise framing.FrameError(
            f"answer for chunk {chunk.inode}:{chunk.index} at {resp.data_offset + resp.skip}"
            f" to a read of chunk {inode}:{index} at {offset}"
        )


# states of a sent read
_SENT = 0  # its answer waits in the lane's socket
_KEPT = 1  # its answer was received ahead of its turn and waits in memory
_DONE = 2  # received (or given up) by finish_into
_CANCELLED = 3  # nobody wants the answer; whoever reaches it in the socket drops it


class _Lane:
    """One connection that carries the sent reads of one server, answers in the order sent.

    A storage server handles a connection's requests one after the other, so
    the answers of the reads sent on a lane come back in :attr:`queue` order.
    Sending every read ahead to a server on one connection, instead of one
    connection per read, keeps the connection (and its grown socket buffers)
    warm and the server's connection count low.
    """

    __slots__ = ("address", "sock", "queue", "send_lock", "recv_lock")

    def __init__(self, address: str, sock: socket.socket) -> None:
        self.address = address
        self.sock = sock
        self.queue: deque[PendingRead] = deque()  # sent reads whose answers are in the socket
        self.send_lock = threading.Lock()  # a request is queued and sent as one step
        self.recv_lock = threading.Lock()  # one receiver at a time


class PendingRead:
    """A chunk read whose request is sent and whose answer waits in its lane's socket.

    Made by :meth:`ReadLanes.send` (for :meth:`DataClient.start_read
    <emberfs.client.datapath.DataClient.start_read>`); used once, by
    :meth:`finish_into` or :meth:`cancel`.
    """

    __slots__ = ("_lanes", "lane", "chunk", "length", "state", "answer", "crcs")

    def __init__(self, lanes: ReadLanes, lane: _Lane, chunk: tuple[int, int, int], length: int):
        self._lanes = lanes
        self.lane = lane
        self.chunk = chunk  # (inode, index, offset) asked
        self.length = length
        self.state = _SENT
        self.answer: tuple | None = None  # (header, meta, crcs, data) when kept
        self.crcs: tuple | None = None  # (block CRC32Cs, block size) of the bytes received

    def finish_into(self, out: memoryview) -> bool:
        """Receive the answer into ``out`` (``length`` bytes); True when it is all there.

        Every byte is verified against its block CRC32C. The answers of reads
        sent before it on the same connection are received first (dropped when
        cancelled, kept for their own ``finish_into`` otherwise). An answer
        that names another chunk or offset closes the connection. False, with
        ``out`` in any state, when the replica refused, answered with fewer
        bytes (a hole or the chunk's end), failed or sent a bad checksum: the
        caller then reads the range with :meth:`DataClient.read
        <emberfs.client.datapath.DataClient.read>`, which retries other
        replicas.
        """
        lanes, lane = self._lanes, self.lane
        with lane.recv_lock:
            try:
                while True:
                    with lanes.lock:
                        if self.state != _SENT:
                            break
                        if not lanes.is_open(lane):  # the connection broke
                            return False
                        head = lane.queue[0]
                    with lanes.pool.watching(lane.address, lane.sock):
                        answer = self._receive(lane.sock, out if head is self else None)
                    with lanes.lock:
                        lane.queue.popleft()
                        if head is self:
                            return answer is True
                        if head.state == _SENT:  # a cancelled read's answer is dropped
                            head.state, head.answer = _KEPT, answer
                if self.state == _KEPT:
                    return self._use(out)
                return False  # finished or cancelled before
            except (OSError, framing.FrameError, DecodeError):
                lanes.break_lane(lane)
                return False
            except BaseException:  # the socket may hold half an answer: nobody may read on
                lanes.break_lane(lane)
                raise
            finally:
                lanes.end(self)

    def _receive(self, sock: socket.socket, out: memoryview | None):
        """The next answer in the socket: into ``out`` (True/False), or kept whole in memory.

        With ``out`` the answer is this read's own: True when it filled
        ``out`` and verified. Without, it belongs to an earlier read: it comes
        back as (header, meta, crcs, data), or None for a refusal.
        """
        try:
            header, meta, crcs = wire.recv_answer(sock, Op.READ)
        except wire.Refused:  # the refusal was read whole: the connection is fine
            return False if out is not None else None
        if out is None:
            data = framing.recv_exact(sock, header.data_len) if header.data_len else b""
            return header, meta, crcs, data
        if not self._usable(header, meta, len(out)):
            if header.data_len:
                framing.recv_exact(sock, header.data_len)
            return False
        framing.recv_exact_into(sock, out)
        return self._verified(out, crcs, header.block_size)

    def _usable(self, header, meta: bytes, n: int) -> bool:
        """Whether the answer fills the whole ``n`` bytes asked (FrameError: not this read's)."""
        resp = data_pb2.ChunkReadResponse.FromString(meta)
        check_answer(resp, *self.chunk, header.data_len)
        return header.data_len == n == self.length and resp.skip == 0

    def _verified(self, out: memoryview, crcs, block_size: int) -> bool:
        """Whether ``out`` matches its block CRCs (a mismatch marks the server bad)."""
        try:
            framing.verify(out, crcs, block_size)
        except framing.ChecksumError:
            self._lanes.pool.mark_bad(self.lane.address)
            return False
        self.crcs = (crcs, block_size)
        return True

    def _use(self, out: memoryview) -> bool:
        """Fill ``out`` from the answer kept in memory."""
        answer, self.answer = self.answer, None
        if answer is None:
            return False
        header, meta, crcs, data = answer
        if not self._usable(header, meta, len(out)):
            return False
        out[:] = data
        return self._verified(out, crcs, header.block_size)

    def cancel(self) -> None:
        """Give up on the answer: it is dropped when the connection reaches it."""
        self._lanes.end(self, cancel=True)


class ReadLanes:
    """The reads sent ahead to each storage server, on one lane (connection) per server.

    Parameters
    ----------
    pool : ConnectionPool
        Where lanes take their connections from and give them back.
    outstanding : dict of str to int
        Requests in flight per data address, which the replica choice reads; a
        sent read counts there from its send until it is finished or cancelled.
    lock : threading.Lock
        The lock that guards ``outstanding``. It guards the lanes too, so a
        read is queued and counted in one step.
    """

    def __init__(
        self, pool: wire.ConnectionPool, outstanding: dict[str, int], lock: threading.Lock
    ) -> None:
        self.pool = pool
        self._outstanding = outstanding
        self.lock = lock
        self._pending: dict[str, int] = defaultdict(int)  # sent reads not yet finished
        self._lanes: dict[str, _Lane] = {}  # the connection of each server's sent reads

    def sent(self) -> int:
        """Reads sent ahead and not yet finished or cancelled, on every lane."""
        with self.lock:
            return sum(self._pending.values())

    def send(
        self,
        address: str,
        req: bytes,
        chunk: tuple[int, int, int],
        length: int,
        credential: framing.Credential | None = None,
    ) -> PendingRead | None:
        """Send the read request ``req`` to ``address`` on its lane; receive it later.

        ``chunk`` is the ``(inode, index, offset)`` it asks and ``length`` its
        size, which its answer must match; ``credential`` goes in its auth
        section. Returns None when the server has its
        fill of sent reads or no free connection for a lane.
        """
        for _ in range(2):  # the lane may retire between finding it and sending on it
            with self.lock:
                if self._pending[address] >= self._depth:
                    return None
                lane = self._lanes.get(address)
            if lane is None:
                lane = self._open_lane(address)
                if lane is None:
                    return None
            pending = self._send_on(lane, req, chunk, length, credential)
            if pending is not None:
                return pending
        return None

    @property
    def _depth(self) -> int:
        """Sent reads a server may have at once (half the connections one may have)."""
        return max(1, self.pool.max_per_address // 2)

    def _open_lane(self, address: str) -> _Lane | None:
        sock = self.pool.try_acquire(address)
        if sock is None:
            return None
        with self.lock:
            lane = self._lanes.get(address)
            if lane is None:
                lane = self._lanes[address] = _Lane(address, sock)
                return lane
        self.pool.release(address, sock)  # another thread opened one meanwhile
        return lane

    def _send_on(
        self,
        lane: _Lane,
        req: bytes,
        chunk: tuple[int, int, int],
        length: int,
        credential: framing.Credential | None,
    ) -> PendingRead | None:
        """Queue a read on ``lane`` and send its request (one step, so answers keep the order)."""
        address = lane.address
        with lane.send_lock:
            with self.lock:
                if not self.is_open(lane) or self._pending[address] >= self._depth:
                    return None
                pending = PendingRead(self, lane, chunk, length)
                lane.queue.append(pending)
                self._pending[address] += 1
                self._outstanding[address] += 1
            try:
                framing.send_frame(lane.sock, Op.READ, req, None, credential=credential)
            except OSError:
                self.break_lane(lane)
                self.end(pending)
                return None
        return pending

    def is_open(self, lane: _Lane) -> bool:
        """Whether ``lane`` still takes reads (it is its server's lane; under :attr:`lock`)."""
        return self._lanes.get(lane.address) is lane

    def end(self, pending: PendingRead, cancel: bool = False) -> None:
        """A sent read is finished or cancelled: count it out, and retire its lane if idle."""
        lane = pending.lane
        with self.lock:
            if pending.state in (_DONE, _CANCELLED):
                return
            if cancel and pending.state == _SENT:
                pending.state = _CANCELLED  # still in the queue: its answer is dropped later
            else:
                pending.state = _DONE
            pending.answer = None
            self._outstanding[lane.address] -= 1
            self._pending[lane.address] -= 1
            if not self.is_open(lane) or any(p.state == _SENT for p in lane.queue):
                return
            # nothing left that anybody will receive: retire the lane
            del self._lanes[lane.address]
            clean = not lane.queue
        if clean:
            self.pool.release(lane.address, lane.sock)
        else:  # answers nobody wants are still in the socket
            self.pool.discard(lane.address, lane.sock)

    def break_lane(self, lane: _Lane) -> None:
        """The lane's connection failed: close it; its sent reads fall back to fetches."""
        with self.lock:
            if not self.is_open(lane):
                return
            del self._lanes[lane.address]
        self.pool.failed(lane.address)
        with contextlib.suppress(OSError):
            lane.sock.shutdown(socket.SHUT_RDWR)  # wakes a receiver blocked on it
        self.pool.discard(lane.address, lane.sock)
