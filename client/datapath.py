"""The client's bulk data path: chunk reads and writes over the framed protocol.

:class:`DataClient` reads a chunk range from a SERVING replica of its chain
(least outstanding requests first, failing over to the other replicas and
then the tail) straight into the caller's buffer, verifying every block's
CRC32C, and writes chunk data to the chain head with idempotent retries
(same request id) while a chain is being reconfigured. Its connections come
from one :class:`~emberfs.common.wire.ConnectionPool`; the reads it sends
ahead travel on the lanes of :mod:`emberfs.client.lanes`.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import queue
import threading
from collections import defaultdict
from collections.abc import Callable

from emberfs.client.capabilities import Capabilities
from emberfs.client.chunkio import ChunkIO
from emberfs.client.lanes import PendingRead, ReadLanes, check_answer
from emberfs.client.retry import RequestIds, TransientError, retry
from emberfs.client.routing import RoutingCache
from emberfs.common import framing, wire
from emberfs.common.auth import CapabilityCredential
from emberfs.common.framing import Op
from emberfs.common.routing import ChainView, RoutingView, TargetView
from emberfs.proto import cluster_pb2, data_pb2

log = logging.getLogger(__name__)


class ChunkLost(OSError):
    """Every serving replica lacks chunk data that was written (EIO).

    The file layer tells a file removed or rewritten while open (ESTALE) from
    data that is gone (see :func:`emberfs.client.chunkio.explain_lost`).
    """

    def __init__(self, chain_id: int, inode: int, index: int, end: int) -> None:
        super().__init__(
            errno.EIO,
            f"chunk {index} (inode {inode}, chain {chain_id}) has no replica holding its "
            f"first {end} bytes",
        )
        self.chain_id, self.inode, self.index = chain_id, inode, index


class LackingReplicas:
    """Reports replicas that lacked chunk data another replica served: the ``on_lacking`` of reads.

    Each (replica, chain version, chunk) is reported once, to the metaserver
    (``ClusterService.ReportLostChunk``), which checks the claim and has the
    replica resynced (:mod:`emberfs.metaserver.clustermgr.repair`). Reports leave from a
    thread of their own, so the read that found one does not wait.

    Parameters
    ----------
    send : callable
        ``send(ReportLostChunkRequest)``; what it raises is logged and dropped.
    """

    REMEMBERED = 4096  # reports remembered against repeats

    def __init__(self, send: Callable[[cluster_pb2.ReportLostChunkRequest], object]) -> None:
        self._send = send
        self._sent: set[tuple[int, int, int, int]] = set()
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __call__(
        self, chain: ChainView, target: TargetView, inode: int, index: int, length: int
    ) -> None:
        key = (target.target_id, chain.version, inode, index)
        with self._lock:
            if key in self._sent:
                return
            if len(self._sent) >= self.REMEMBERED:
                self._sent.clear()
            self._sent.add(key)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="emberfs-lost-chunks", daemon=True
                )
                self._thread.start()
        self._queue.put(
            cluster_pb2.ReportLostChunkRequest(
                chain_id=chain.chain_id,
                target_id=target.target_id,
                inode=inode,
                index=index,
                length=length,
            )
        )

    def _run(self) -> None:
        while (req := self._queue.get()) is not None:
            try:
                self._send(req)
            except Exception as exc:  # the metaserver may be away; readers report again later
                log.info("could not report target %d lacking a chunk: %s", req.target_id, exc)

    def stop(self) -> None:
        """End the reporting thread (reports not yet sent are dropped)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=1)


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
    on_lacking : callable, optional
        ``on_lacking(chain, target, inode, index, length)``: a serving
        replica lacked the first ``length`` bytes of a chunk that another
        replica of its chain then served (see :class:`LackingReplicas`).
    capabilities : Capabilities, optional
        The chunk capabilities of the open files, whose credentials every
        read and write of their chunks carries. A storage server's DENIED
        renews the capability once; a second one is a PermissionError.

    Attributes
    ----------
    lanes : ReadLanes
        The reads sent ahead (:meth:`start_read`), counted in the same load
        per server as the other requests.
    """

    def __init__(
        self,
        routing: RoutingCache,
        ids: RequestIds,
        pool: wire.ConnectionPool,
        *,
        read_timeout: float = 60.0,
        write_timeout: float = 60.0,
        on_lacking: Callable[[ChainView, TargetView, int, int, int], None] | None = None,
        capabilities: Capabilities | None = None,
    ) -> None:
        self.routing = routing
        self.capabilities = capabilities
        self.on_lacking = on_lacking
        self.ids = ids
        self.pool = pool
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self._outstanding: dict[str, int] = defaultdict(int)  # requests in flight per server
        self._rr = itertools.count()
        self._lock = threading.Lock()
        self.lanes = ReadLanes(pool, self._outstanding, self._lock)

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
        credential: CapabilityCredential | None = None,
    ) -> int:
        req = self._read_request(target, chain, inode, index, offset, len(out))

        def receive(sock):
            header, meta, crcs = wire.recv_answer(sock, Op.READ)
            resp = data_pb2.ChunkReadResponse.FromString(meta)
            n_data = header.data_len
            check_answer(resp, inode, index, offset, n_data)
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

        return wire.call(
            self.pool,
            target.data_address,
            Op.READ,
            req,
            receive=receive,
            credential=credential,
        )

    def _credential(self, inode: int, write: bool) -> CapabilityCredential | None:
        caps = self.capabilities
        return caps.credential(inode, write) if caps is not None else None

    def _denied(self, inode: int, write: bool, denials: list, exc: wire.Denied) -> None:
        """A storage server refused the credentials: renew them once, then give up."""
        if denials or self.capabilities is None:
            raise PermissionError(errno.EACCES, f"storage refused the credentials: {exc.message}")
        denials.append(exc)
        self.capabilities.forget(inode, write)

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

    def read(self, io: ChunkIO) -> None:
        """Fill ``io.buf`` with bytes ``[offset, offset+length)`` of chunk ``io.index``.

        The first ``io.need`` of those bytes are data the file says is on storage;
        the rest may lie past the chunk's end (or the chunk may not exist):
        those read as zeros, the holes of the file. A replica that has no such
        chunk, or a shorter one than ``need``, is passed over for another;
        when every serving replica answers so, :class:`ChunkLost` is raised
        (with ``need`` 0 the range then reads as zeros). While one is
        unreachable or refuses, the read is retried. Every byte returned was
        verified against its block CRC32C. Raises OSError(EIO) when no replica
        could serve the chunk within ``read_timeout``.
        """
        chain_id, inode, index, offset, out, need = (
            io.chain,
            io.inode,
            io.index,
            io.offset,
            io.buf,
            io.need,
        )
        if not len(out):
            return
        seen: list[RoutingView | None] = [None]
        fatal: list[BaseException] = []
        denials: list[wire.Denied] = []

        def attempt() -> None:
            info, chain = self.routing.chain(chain_id)
            seen[0] = info
            failures: list[str] = []
            bad_requests = 0
            missing = 0  # replicas without the chunk, or with less of it than ``need``
            lacking: list[TargetView] = []
            credential = self._credential(inode, write=False)
            for target in self._replicas(chain):
                address = target.data_address
                with self._lock:
                    self._outstanding[address] += 1
                try:
                    n = self._read_once(target, chain, inode, index, offset, out, credential)
                except wire.ChunkNotFound:
                    missing += 1
                    lacking.append(target)
                    continue
                except wire.Denied as exc:
                    self._denied(inode, False, denials, exc)
                    raise TransientError(f"{address}: {exc}") from None
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
                if n < need:  # it lacks data that was written: another replica may have it
                    missing += 1
                    lacking.append(target)
                    continue
                if n < len(out):
                    out[n:] = bytes(len(out) - n)
                if need and lacking and self.on_lacking is not None:
                    for lost in lacking:  # this one has what they lack: they get repaired
                        self.on_lacking(chain, lost, inode, index, offset + need)
                return
            if missing and not failures:  # every serving replica says so
                if need:
                    fatal.append(ChunkLost(chain_id, inode, index, offset + need))
                    return
                out[:] = bytes(len(out))  # a hole
                return
            if failures and bad_requests == len(failures):
                fatal.append(OSError(errno.EIO, f"storage refused the read: {failures[0]}"))
                return
            why = "; ".join(failures) or "no serving replica"
            raise TransientError(f"chunk {inode}:{index} on chain {chain_id}: {why}")

        self._retrying(attempt, seen, chain_id, "read", self.read_timeout, max_backoff=0.5)
        if fatal:
            raise fatal[0]

    def start_read(self, io: ChunkIO) -> PendingRead | None:
        """Send the read ``io`` (its ``length`` bytes, no buffer yet) now; receive it later.

        The answer waits in the connection's socket buffers until
        :meth:`PendingRead.finish_into` receives it straight into the
        caller's buffer, so reading ahead costs no buffer and no copy. The
        reads sent to one server share one connection (:attr:`lanes`).
        Returns None when no serving replica can take one more (the caller
        reads the usual way).
        """
        chain_id, inode, index, offset, length = io.chain, io.inode, io.index, io.offset, io.length
        try:
            _, chain = self.routing.chain(chain_id)
        except KeyError:
            return None
        # Sent reads hold their lane's connection until the caller wants the
        # data; the server's other connections serve the fetches that the
        # caller may be waiting for meanwhile.
        try:
            credential = self._credential(inode, write=False)
        except OSError:
            return None  # read the usual way, which raises it
        for target in self._replicas(chain):
            address = target.data_address
            if self.pool.is_bad(address):
                continue
            req = self._read_request(target, chain, inode, index, offset, length)
            pending = self.lanes.send(address, req, (inode, index, offset), length, credential)
            if pending is not None:
                return pending
        return None

    # writes ------------------------------------------------------------------
    def write(self, io: ChunkIO, request_id: int = 0) -> data_pb2.ChunkWriteResponse:
        """Write ``io.buf`` at ``io.offset`` of chunk ``io.index`` through the chain head.

        Returns once the whole chain holds it. Retries (with the same request
        id, so the chain applies it once) after routing refreshes until
        ``write_timeout``; then raises OSError(EIO). A replica of the chain
        without room for the update (NO_SPACE) raises OSError(ENOSPC) at once.
        ``request_id`` (0: a new one) continues a write tried before.
        """
        chain_id, inode, index, offset, chunk_size = (
            io.chain,
            io.inode,
            io.index,
            io.offset,
            io.chunk_size,
        )
        request_id = request_id or self.ids.next()
        seen: list[RoutingView | None] = [None]
        payload = memoryview(io.buf).cast("B")
        denials: list[wire.Denied] = []

        def attempt() -> data_pb2.ChunkWriteResponse:
            info, chain = self.routing.chain(chain_id)
            seen[0] = info
            head = chain.head
            if head is None:
                raise TransientError(f"chain {chain_id} has no serving head")
            credential = self._credential(inode, write=True)
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
                meta = wire.call(
                    self.pool,
                    head.data_address,
                    Op.WRITE,
                    req,
                    payload,
                    credential=credential,
                )
                return data_pb2.ChunkWriteResponse.FromString(meta)
            except wire.Denied as exc:
                self._denied(inode, True, denials, exc)
                raise TransientError(f"{head.data_address}: {exc}") from None
            except wire.NoSpace as exc:
                raise OSError(
                    errno.ENOSPC,
                    f"{os.strerror(errno.ENOSPC)} (chunk {index} on chain {chain_id}: "
                    f"{exc.message})",
                ) from None
            except wire.Refused as exc:
                if exc.retryable or isinstance(exc, wire.ServerError):
                    raise TransientError(f"{head.data_address}: {exc}") from None
                raise OSError(errno.EIO, f"storage refused the write: {exc}") from None
            except (OSError, framing.FrameError) as exc:
                self.pool.failed(head.data_address)
                raise TransientError(f"{head.data_address}: {exc!r}") from None

        return self._retrying(attempt, seen, chain_id, "write", self.write_timeout, max_backoff=1.0)

    def write_batch(self, writes: list[ChunkIO]) -> list:
        """Write several chunks of one chain at once: each one's response, or its OSError.

        One OP_WRITE_BATCH frame to the chain head carries them all; a write it
        does not answer OK (a refusal, a lost connection, routing that moved)
        then goes alone through :meth:`write` with the same request id,
        so the chain applies each write once and every error is the one a
        single write would raise.
        """
        ids = [self.ids.next() for _ in writes]
        out: list = [None] * len(writes)
        chain_id = writes[0].chain if writes else 0
        if len(writes) > 1:
            try:
                self._send_batch(chain_id, writes, ids, out)
            except (wire.Refused, OSError, framing.FrameError) as exc:
                log.debug("write batch on chain %d: %s; writing one by one", chain_id, exc)
        for i, w in enumerate(writes):
            if out[i] is None:
                try:
                    out[i] = self.write(w, ids[i])
                except OSError as exc:
                    out[i] = exc
        return out

    def _send_batch(self, chain_id: int, writes: list[ChunkIO], ids: list[int], out: list):
        """One try of :meth:`write_batch`: fill ``out`` with the writes the head answered OK."""
        _, chain = self.routing.chain(chain_id)
        head = chain.head
        if head is None:
            return
        batch = data_pb2.ChunkWriteBatch()
        credentials = [self._credential(w.inode, write=True) for w in writes]
        for w, request_id, credential in zip(writes, ids, credentials, strict=True):
            batch.writes.append(
                data_pb2.ChunkWriteRequest(
                    chain_id=chain_id,
                    chain_version=chain.version,
                    target_id=head.target_id,
                    chunk=data_pb2.ChunkId(inode=w.inode, index=w.index),
                    offset=w.offset,
                    chunk_size=w.chunk_size,
                    client_id=self.ids.client_id,
                    request_id=request_id,
                )
            )
            batch.lengths.append(w.length)
            if credential is not None:
                batch.capabilities.append(credential.token)
        meta = wire.call(
            self.pool,
            head.data_address,
            Op.WRITE_BATCH,
            batch.SerializeToString(),
            b"".join(w.buf for w in writes),
            credential=credentials[0],
        )
        answer = data_pb2.ChunkWriteBatchResponse.FromString(meta)
        if len(answer.results) != len(writes):
            return
        for i, result in enumerate(answer.results):
            if result.status == framing.Status.OK:
                out[i] = result.written

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
