"""The client's bulk data path: chunk reads and writes over the framed protocol.

:class:`ConnectionPool` keeps TCP connections to storage servers, pooled per
data address and bounded per server, safe to share between threads.
:class:`DataClient` reads a chunk range from a SERVING replica of its chain
(least outstanding requests first, failing over to the other replicas and
then the tail) straight into the caller's buffer, verifying every block's
CRC32C, and writes chunk data to the chain head with idempotent retries
(same request id) while a chain is being reconfigured.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import socket
import threading
from collections import defaultdict, deque

from google.protobuf.message import DecodeError

from emberfs.client.retry import RequestIds, TransientError, retry
from emberfs.client.routing import RoutingCache
from emberfs.common import framing, wire
from emberfs.common.framing import Op
from emberfs.common.routing import ChainView, RoutingView, TargetView
from emberfs.proto import data_pb2


def _check_answer(resp, inode: int, index: int, offset: int, data_len: int) -> None:
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

    Made by :meth:`DataClient.start_read`; used once, by :meth:`finish_into`
    or :meth:`cancel`.
    """

    __slots__ = ("_client", "_lane", "chunk", "length", "_state", "_answer")

    def __init__(self, client: DataClient, lane: _Lane, chunk: tuple[int, int, int], length: int):
        self._client = client
        self._lane = lane
        self.chunk = chunk  # (inode, index, offset) asked
        self.length = length
        self._state = _SENT
        self._answer: tuple | None = None  # (header, meta, crcs, data) when kept

    def finish_into(self, out: memoryview) -> bool:
        """Receive the answer into ``out`` (``length`` bytes); True when it is all there.

        Every byte is verified against its block CRC32C. The answers of reads
        sent before it on the same connection are received first (dropped when
        cancelled, kept for their own ``finish_into`` otherwise). An answer
        that names another chunk or offset closes the connection. False, with
        ``out`` in any state, when the replica refused, answered with fewer
        bytes (a hole or the chunk's end), failed or sent a bad checksum: the
        caller then reads the range with :meth:`DataClient.read_chunk`, which
        retries other replicas.
        """
        client, lane = self._client, self._lane
        with lane.recv_lock:
            try:
                while True:
                    with client._lock:
                        if self._state != _SENT:
                            break
                        if not client._is_open(lane):  # the connection broke
                            return False
                        head = lane.queue[0]
                    with client.pool.watching(lane.address, lane.sock):
                        answer = self._receive(lane.sock, out if head is self else None)
                    with client._lock:
                        lane.queue.popleft()
                        if head is self:
                            return answer is True
                        if head._state == _SENT:  # a cancelled read's answer is dropped
                            head._state, head._answer = _KEPT, answer
                if self._state == _KEPT:
                    return self._use(out)
                return False  # finished or cancelled before
            except (OSError, framing.FrameError, DecodeError):
                client._break(lane)
                return False
            except BaseException:  # the socket may hold half an answer: nobody may read on
                client._break(lane)
                raise
            finally:
                client._end(self)

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
        _check_answer(resp, *self.chunk, header.data_len)
        return header.data_len == n == self.length and resp.skip == 0

    def _verified(self, out: memoryview, crcs, block_size: int) -> bool:
        """Whether ``out`` matches its block CRCs (a mismatch marks the server bad)."""
        try:
            framing.verify(out, crcs, block_size)
        except framing.ChecksumError:
            self._client.pool.mark_bad(self._lane.address)
            return False
        return True

    def _use(self, out: memoryview) -> bool:
        """Fill ``out`` from the answer kept in memory."""
        answer, self._answer = self._answer, None
        if answer is None:
            return False
        header, meta, crcs, data = answer
        if not self._usable(header, meta, len(out)):
            return False
        out[:] = data
        return self._verified(out, crcs, header.block_size)

    def cancel(self) -> None:
        """Give up on the answer: it is dropped when the connection reaches it."""
        self._client._end(self, cancel=True)


class DataClient:
    """Chunk reads and writes against the replication chains.

    Parameters
    ----------
    routing : RoutingCache
    ids : RequestIds
        Client id and request ids of write requests.
    pool : ConnectionPool
    read_timeout : float, default 60.0
        How long a chunk read keeps trying replicas (a failover takes up to the
        heartbeat timeout) before it raises.
    write_timeout : float, default 60.0
        The same for a chunk write.
    """

    def __init__(
        self,
        routing: RoutingCache,
        ids: RequestIds,
        pool: wire.ConnectionPool,
        *,
        read_timeout: float = 60.0,
        write_timeout: float = 60.0,
    ) -> None:
        self.routing = routing
        self.ids = ids
        self.pool = pool
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self._outstanding: dict[str, int] = defaultdict(int)
        self._pending: dict[str, int] = defaultdict(int)  # sent reads not yet finished
        self._lanes: dict[str, _Lane] = {}  # the connection of each server's sent reads
        self._rr = itertools.count()
        self._lock = threading.Lock()

    @staticmethod
    def _read_request(
        target: TargetView, chain: ChainView, inode: int, index: int, offset: int, length: int
    ) -> bytes:
        return data_pb2.ChunkReadRequest(
            chain_id=chain.chain_id,
            target_id=target.target_id,
            chunk=data_pb2.ChunkId(inode=inode, index=index),
            offset=offset,
            length=length,
            chain_version=chain.version,
        ).SerializeToString()

    def _read_once(
        self,
        target: TargetView,
        chain: ChainView,
        inode: int,
        index: int,
        offset: int,
        out: memoryview,
    ) -> int:
        req = self._read_request(target, chain, inode, index, offset, len(out))

        def receive(sock):
            header, meta, crcs = wire.recv_answer(sock, Op.READ)
            resp = data_pb2.ChunkReadResponse.FromString(meta)
            n_data = header.data_len
            _check_answer(resp, inode, index, offset, n_data)
            if n_data == 0:
                return 0
            if resp.skip == 0 and n_data <= len(out):
                dest = out[:n_data]
                framing.recv_exact_into(sock, dest)
                framing.verify(dest, crcs, header.block_size)
                return n_data
            tmp = memoryview(bytearray(n_data))
            framing.recv_exact_into(sock, tmp)
            framing.verify(tmp, crcs, header.block_size)
            n = max(0, min(n_data - resp.skip, len(out)))
            out[:n] = tmp[resp.skip : resp.skip + n]
            return n

        return wire.call(self.pool, target.data_address, Op.READ, req, receive=receive)

    # reads -------------------------------------------------------------------
    def _replicas(self, chain: ChainView) -> list[TargetView]:
        """SERVING replicas, healthy and least loaded first, the tail last among equals."""
        serving = list(chain.serving)
        if not serving:
            return []
        turn = next(self._rr)
        n = len(serving)
        with self._lock:
            load = {t.data_address: self._outstanding[t.data_address] for t in serving}
        order = sorted(
            range(n),
            key=lambda i: (
                self.pool.is_bad(serving[i].data_address),
                load[serving[i].data_address],
                (i - turn) % n,
            ),
        )
        return [serving[i] for i in order]

    def read_chunk(
        self, chain_id: int, inode: int, index: int, offset: int, out: memoryview
    ) -> None:
        """Fill ``out`` with bytes ``[offset, offset+len(out))`` of chunk ``index``.

        Bytes past the chunk's end (or of a chunk that does not exist) are
        zeros: they are holes within the file size. A replica that has no such
        chunk does not make a hole on its own: the range reads as zeros only
        when every serving replica answered that it has none (while one is
        unreachable or refuses, the read is retried). Every byte returned was
        verified against its block CRC32C. Raises OSError(EIO) when no replica
        could serve the chunk within ``read_timeout``.
        """
        if not len(out):
            return
        seen: list[RoutingView | None] = [None]
        fatal: list[BaseException] = []

        def attempt() -> None:
            info, chain = self.routing.chain(chain_id)
            seen[0] = info
            failures: list[str] = []
            bad_requests = 0
            missing = 0
            for target in self._replicas(chain):
                address = target.data_address
                with self._lock:
                    self._outstanding[address] += 1
                try:
                    n = self._read_once(target, chain, inode, index, offset, out)
                except wire.ChunkNotFound:
                    missing += 1
                    continue
                except wire.Refused as exc:
                    failures.append(f"{address}: {exc}")
                    if isinstance(exc, wire.BadRequest):
                        bad_requests += 1
                    continue
                except (OSError, framing.FrameError) as exc:
                    # connection refused/reset, timeout, bad frame or checksum
                    self.pool.failed(address)
                    failures.append(f"{address}: {exc!r}")
                    continue
                finally:
                    with self._lock:
                        self._outstanding[address] -= 1
                if n < len(out):
                    out[n:] = bytes(len(out) - n)
                return
            if missing and not failures:  # every serving replica says so: a hole
                out[:] = bytes(len(out))
                return
            if failures and bad_requests == len(failures):
                fatal.append(OSError(errno.EIO, f"storage refused the read: {failures[0]}"))
                return
            why = "; ".join(failures) or "no serving replica"
            raise TransientError(f"chunk {inode}:{index} on chain {chain_id}: {why}")

        self._retrying(attempt, seen, chain_id, "read", self.read_timeout, max_backoff=0.5)
        if fatal:
            raise fatal[0]

    def start_read(
        self, chain_id: int, inode: int, index: int, offset: int, length: int
    ) -> PendingRead | None:
        """Send a read of ``length`` bytes at ``offset`` of a chunk now; receive it later.

        The answer waits in the connection's socket buffers until
        :meth:`PendingRead.finish_into` receives it straight into the
        caller's buffer, so reading ahead costs no buffer and no copy. The
        reads sent to one server share one connection (:class:`_Lane`).
        Returns None when no serving replica can take one more (the caller
        reads the usual way).
        """
        try:
            _, chain = self.routing.chain(chain_id)
        except KeyError:
            return None
        # Sent reads hold their lane's connection until the caller wants the
        # data; the server's other connections serve the fetches that the
        # caller may be waiting for meanwhile.
        for target in self._replicas(chain):
            address = target.data_address
            if self.pool.is_bad(address):
                continue
            req = self._read_request(target, chain, inode, index, offset, length)
            for _ in range(2):  # the lane may retire between finding it and sending on it
                with self._lock:
                    if self._pending[address] >= self._lane_depth:
                        break
                    lane = self._lanes.get(address)
                if lane is None:
                    lane = self._open_lane(address)
                    if lane is None:
                        break
                pending = self._send_on(lane, req, (inode, index, offset), length)
                if pending is not None:
                    return pending
        return None

    @property
    def _lane_depth(self) -> int:
        """Sent reads a server may have at once (half the connections one may have)."""
        return max(1, self.pool.max_per_address // 2)

    def _open_lane(self, address: str) -> _Lane | None:
        sock = self.pool.try_acquire(address)
        if sock is None:
            return None
        with self._lock:
            lane = self._lanes.get(address)
            if lane is None:
                lane = self._lanes[address] = _Lane(address, sock)
                return lane
        self.pool.release(address, sock)  # another thread opened one meanwhile
        return lane

    def _send_on(
        self, lane: _Lane, req: bytes, chunk: tuple[int, int, int], length: int
    ) -> PendingRead | None:
        """Queue a read on ``lane`` and send its request (one step, so answers keep the order)."""
        address = lane.address
        with lane.send_lock:
            with self._lock:
                if not self._is_open(lane) or self._pending[address] >= self._lane_depth:
                    return None
                pending = PendingRead(self, lane, chunk, length)
                lane.queue.append(pending)
                self._pending[address] += 1
                self._outstanding[address] += 1
            try:
                framing.send_frame(lane.sock, Op.READ, req, None)
            except OSError:
                self._break(lane)
                self._end(pending)
                return None
        return pending

    def _is_open(self, lane: _Lane) -> bool:
        """Whether ``lane`` still takes reads (it is its server's lane; under ``_lock``)."""
        return self._lanes.get(lane.address) is lane

    def _end(self, pending: PendingRead, cancel: bool = False) -> None:
        """A sent read is finished or cancelled: count it out, and retire its lane if idle."""
        lane = pending._lane
        with self._lock:
            if pending._state in (_DONE, _CANCELLED):
                return
            if cancel and pending._state == _SENT:
                pending._state = _CANCELLED  # still in the queue: its answer is dropped later
            else:
                pending._state = _DONE
            pending._answer = None
            self._outstanding[lane.address] -= 1
            self._pending[lane.address] -= 1
            if not self._is_open(lane) or any(p._state == _SENT for p in lane.queue):
                return
            # nothing left that anybody will receive: retire the lane
            del self._lanes[lane.address]
            clean = not lane.queue
        if clean:
            self.pool.release(lane.address, lane.sock)
        else:  # answers nobody wants are still in the socket
            self.pool.discard(lane.address, lane.sock)

    def _break(self, lane: _Lane) -> None:
        """The lane's connection failed: close it; its sent reads fall back to fetches."""
        with self._lock:
            if not self._is_open(lane):
                return
            del self._lanes[lane.address]
        self.pool.failed(lane.address)
        with contextlib.suppress(OSError):
            lane.sock.shutdown(socket.SHUT_RDWR)  # wakes a receiver blocked on it
        self.pool.discard(lane.address, lane.sock)

    # writes ------------------------------------------------------------------
    def write_chunk(
        self,
        chain_id: int,
        inode: int,
        index: int,
        offset: int,
        data,
        chunk_size: int,
    ) -> data_pb2.ChunkWriteResponse:
        """Write ``data`` at ``offset`` of chunk ``index`` through the chain head.

        Returns once the whole chain holds it. Retries (with the same request
        id, so the chain applies it once) after routing refreshes until
        ``write_timeout``; then raises OSError(EIO).
        """
        request_id = self.ids.next()
        seen: list[RoutingView | None] = [None]
        payload = memoryview(data).cast("B")

        def attempt() -> data_pb2.ChunkWriteResponse:
            info, chain = self.routing.chain(chain_id)
            seen[0] = info
            head = chain.head
            if head is None:
                raise TransientError(f"chain {chain_id} has no serving head")
            req = data_pb2.ChunkWriteRequest(
                chain_id=chain_id,
                chain_version=chain.version,
                target_id=head.target_id,
                chunk=data_pb2.ChunkId(inode=inode, index=index),
                offset=offset,
                chunk_size=chunk_size,
                client_id=self.ids.client_id,
                request_id=request_id,
            ).SerializeToString()

            try:
                meta = wire.call(self.pool, head.data_address, Op.WRITE, req, payload)
                return data_pb2.ChunkWriteResponse.FromString(meta)
            except wire.Refused as exc:
                if exc.retryable or isinstance(exc, wire.ServerError):
                    raise TransientError(f"{head.data_address}: {exc}") from None
                raise OSError(errno.EIO, f"storage refused the write: {exc}") from None
            except (OSError, framing.FrameError) as exc:
                self.pool.failed(head.data_address)
                raise TransientError(f"{head.data_address}: {exc!r}") from None

        return self._retrying(attempt, seen, chain_id, "write", self.write_timeout, max_backoff=1.0)

    def _retrying(
        self, attempt, seen: list, chain_id: int, what: str, timeout: float, max_backoff: float
    ):
        """Run ``attempt`` until it succeeds or ``timeout`` passes; routing refreshed between tries.

        ``seen[0]`` is the routing the last try used. Running out of time, or a
        chain the cluster does not know, raises OSError(EIO).
        """
        try:
            return retry(
                attempt,
                timeout=timeout,
                backoff=0.05,
                max_backoff=max_backoff,
                on_retry=lambda exc: self.routing.refresh(seen[0]),
            )
        except TransientError as exc:
            raise OSError(errno.EIO, f"{what} failed: {exc}") from None
        except KeyError:
            raise OSError(errno.EIO, f"chain {chain_id} is unknown to the cluster") from None
