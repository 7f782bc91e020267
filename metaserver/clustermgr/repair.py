"""Read repair: a replica that readers found without data its chain's others hold is resynced.

A reader that asked a serving replica for chunk data the file says is on
storage, got none (no such chunk, a damaged one, or a shorter one) and then got
it from another serving replica of the chain reports it
(``ClusterService.ReportLostChunk``). The report is a claim, not a fact: a
removal or truncation may be passing down the chain, and anyone may send one.
:class:`ReadRepair` queues it, and a worker thread checks it against the
storage servers and the file before it acts:

* the file still holds the bytes (its size covers them, they are no hole);
* the reported replica is serving and lacks them (``ListChunks`` shows no
  chunk, a damaged one or a shorter one);
* another serving replica holds them, committed and with no update pending.

Then :meth:`ClusterManager.resync_target` takes the replica out of service:
it leaves the readers' replicas at once, and its chain's last serving member
resyncs it (copying what it lacks, replacing what differs) as it would a
replica that returns from a failure. A replica already waiting or syncing is
left alone; reports of one target are checked once at a time.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from functools import partial

import grpc

from emberfs.common import errors, extents, grpcauth
from emberfs.common.auth import ClusterKeys
from emberfs.common.routing import ChainView, RoutingView, TargetView
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.proto import cluster_pb2, common_pb2, meta_pb2, storage_pb2, storage_pb2_grpc

log = logging.getLogger(__name__)

QUEUE_LIMIT = 256  # reports waiting for a check; more are dropped (readers report again)
CHECK_TIMEOUT = 5.0  # seconds for each storage server's answer


def list_chunk(
    target: TargetView,
    inode: int,
    index: int,
    *,
    check: int = storage_pb2.CHUNK_CHECK_NONE,
    mark_damaged: bool = False,
    timeout: float = CHECK_TIMEOUT,
    keys: ClusterKeys | None = None,
    tls: grpcauth.TLSFiles | None = None,
) -> storage_pb2.ChunkMeta | None:
    """Chunk ``index`` of ``inode`` on ``target`` as its storage server lists it (None: absent).

    ``check`` and ``mark_damaged`` as in ``ListChunksRequest``; ``keys`` sign the
    call, over TLS with ``tls``.
    """
    with grpcauth.channel(target.grpc_address, keys=keys, tls=tls) as channel:
        stub = storage_pb2_grpc.StorageServiceStub(channel)
        req = storage_pb2.ListChunksRequest(
            target_id=target.target_id,
            inode=inode,
            after_inode=inode,
            has_after=index > 0,
            after_index=index - 1 if index > 0 else 0,
            limit=1,
            check=check,
            mark_damaged=mark_damaged,
        )
        resp = stub.ListChunks(req, timeout=timeout)
    for chunk in resp.chunks:
        if chunk.inode == inode and chunk.index == index:
            return chunk
    return None


_replica_chunk = list_chunk  # the default of ReadRepair's list_chunk


class ReadRepair:
    """Checks readers' reports of replicas without data, and resyncs the replicas found so.

    Parameters
    ----------
    cluster : ClusterManager
    stat_inode : callable
        ``stat_inode(inode)`` -> the file's ``InodeAttr``; raises
        :class:`errors.EmberError` when there is no such file.
    list_chunk : callable, optional
        Default: :func:`list_chunk` with the cluster's keys.
        How a replica's chunk is asked for (tests substitute their own).
    """

    def __init__(
        self,
        cluster: ClusterManager,
        stat_inode: Callable[[int], common_pb2.InodeAttr],
        list_chunk: Callable[[TargetView, int, int], storage_pb2.ChunkMeta | None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.stat_inode = stat_inode
        self.list_chunk = list_chunk or partial(_replica_chunk, keys=cluster.keys, tls=cluster.tls)
        self._queue: queue.Queue[cluster_pb2.ReportLostChunkRequest] = queue.Queue(QUEUE_LIMIT)
        self._queued: set[int] = set()  # targets with a report waiting
        self._lock = threading.Lock()
        self.checked = 0  # reports checked
        self.repairs = 0  # replicas taken out of service to be resynced

    def report(
        self, req: cluster_pb2.ReportLostChunkRequest
    ) -> cluster_pb2.ReportLostChunkResponse:
        """Queue a reader's report for a check (``accepted`` False when it cannot be acted on)."""
        chain = self._chain(req.chain_id, req.target_id)
        if chain is None:
            return cluster_pb2.ReportLostChunkResponse(accepted=False)
        with self._lock:
            if req.target_id in self._queued:
                return cluster_pb2.ReportLostChunkResponse(accepted=True)
            try:
                self._queue.put_nowait(req)
            except queue.Full:
                return cluster_pb2.ReportLostChunkResponse(accepted=False)
            self._queued.add(req.target_id)
        return cluster_pb2.ReportLostChunkResponse(accepted=True)

    def _chain(self, chain_id: int, target_id: int) -> ChainView | None:
        """The chain when ``target_id`` serves in it beside another serving member."""
        view = RoutingView.from_proto(self.cluster.routing())
        chain = view.chains.get(chain_id)
        if chain is None:
            raise errors.NotFound(f"no chain {chain_id}")
        if target_id not in chain.target_ids:
            raise errors.NotFound(f"target {target_id} is not in chain {chain_id}")
        serving = {t.target_id for t in chain.serving}
        if target_id not in serving or len(serving) < 2:
            return None
        return chain

    def run(self, stop: threading.Event) -> None:
        """Check queued reports until ``stop`` is set."""
        while not stop.is_set():
            try:
                req = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self.check(req)
            except Exception:  # a bug: log it, keep checking
                log.exception("checking a lost-chunk report failed")
            finally:
                with self._lock:
                    self._queued.discard(req.target_id)

    def check(self, req: cluster_pb2.ReportLostChunkRequest) -> bool:
        """Check one report; resync the replica when it holds. True when it did."""
        self.checked += 1
        chain = self._chain(req.chain_id, req.target_id)
        if chain is None or not self._file_holds(req):
            return False
        by_id = {t.target_id: t for t in chain.serving}
        try:
            mine = self.list_chunk(by_id[req.target_id], req.inode, req.index)
        except grpc.RpcError as exc:
            log.info("target %d did not list its chunk: %s", req.target_id, exc.code())
            return False
        if _holds(mine, req.length):
            return False  # it has the data (the reader raced an update): nothing to repair
        for peer in chain.serving:
            if peer.target_id == req.target_id:
                continue
            try:
                theirs = self.list_chunk(peer, req.inode, req.index)
            except grpc.RpcError:
                continue
            if _holds(theirs, req.length) and not theirs.pending_version:
                return self._resync(req, peer)
        return False

    def _file_holds(self, req: cluster_pb2.ReportLostChunkRequest) -> bool:
        """The file still needs the chunk to hold its first ``length`` bytes."""
        try:
            attr = self.stat_inode(req.inode)
        except errors.EmberError:
            return False
        chunk_size = attr.layout.chunk_size
        if not chunk_size or not 0 < req.length <= chunk_size:
            return False
        start = req.index * chunk_size
        end = start + req.length
        return extents.data_end(extents.holes_of(attr), attr.size, start, end) == end

    def _resync(self, req: cluster_pb2.ReportLostChunkRequest, source: TargetView) -> bool:
        try:
            changed = self.cluster.resync_target(req.target_id)
        except errors.NotFound:
            return False
        if changed:
            self.repairs += 1
            log.warning(
                "target %d lacks chunk %d of inode %d that target %d holds: "
                "it leaves service to be resynced",
                req.target_id,
                req.index,
                req.inode,
                source.target_id,
            )
        return changed


def _holds(chunk: storage_pb2.ChunkMeta | None, length: int) -> bool:
    return chunk is not None and not chunk.damaged and chunk.length >= length


def stat_inode_of(namespace) -> Callable[[int], common_pb2.InodeAttr]:
    """``stat_inode`` for :class:`ReadRepair` over a metaserver's namespace."""

    def stat_inode(inode: int) -> common_pb2.InodeAttr:
        return namespace.stat(meta_pb2.StatRequest(inode=inode)).attr

    return stat_inode
