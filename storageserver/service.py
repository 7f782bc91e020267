"""StorageService: the gRPC control plane of a storage node.

Lists and removes chunks of the node's targets (resync and garbage collection
use it) and reports per-target statistics. Chunk data never travels here; the
framed data protocol carries it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from emberfs.common import errors
from emberfs.proto import common_pb2, storage_pb2, storage_pb2_grpc
from emberfs.storageserver.chunkrecords import MAX_INDEX, MAX_INODE
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.scrub import check_chunk

log = logging.getLogger(__name__)

DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 10000


class StorageServicer(storage_pb2_grpc.StorageServiceServicer):
    """Serves ListChunks, RemoveChunks and TargetStats for one node's targets.

    Parameters
    ----------
    node_id : str
        The node's id, reported by TargetStats.
    stores : callable
        Returns the node's current ``{target id: ChunkStore}``.
    chain_of : callable
        ``chain_of(target_id)`` gives the chain the target is in (0: none).
    state_of : callable, optional
        ``state_of(target_id)`` gives the target's state (a ``TargetState``
        value) as the node knows it; without it TargetStats reports
        ``TARGET_STATE_UNSPECIFIED``.
    """

    def __init__(
        self,
        node_id: str,
        stores: Callable[[], dict[int, ChunkStore]],
        chain_of: Callable[[int], int],
        *,
        state_of: Callable[[int], int] | None = None,
    ):
        self.node_id = node_id
        self._stores = stores
        self._chain_of = chain_of
        self._state_of = state_of

    def _store(self, target_id: int) -> ChunkStore:
        store = self._stores().get(target_id)
        if store is None:
            raise errors.NotFound(f"target {target_id} is not on node {self.node_id}")
        return store

    def _call(self, context: grpc.ServicerContext, fn):
        try:
            return fn()
        except errors.EmberError as exc:
            errors.to_grpc(context, exc)
        except ValueError as exc:
            errors.to_grpc(context, errors.InvalidArgument(str(exc)))
        except Exception as exc:
            log.exception("storage service call failed")
            errors.to_grpc(context, errors.Internal(f"storage error: {exc}"))

    def ListChunks(self, request, context):
        def run():
            store = self._store(request.target_id)
            limit = request.limit or DEFAULT_LIST_LIMIT
            if limit > MAX_LIST_LIMIT:
                raise errors.InvalidArgument(f"limit {limit} exceeds {MAX_LIST_LIMIT}")
            after = None
            if request.has_after:
                if not 1 <= request.after_inode <= MAX_INODE:
                    raise errors.InvalidArgument("after_inode must be at least 1")
                after = (request.after_inode, request.after_index)
            if request.check not in storage_pb2.ChunkCheck.values():
                raise errors.InvalidArgument(f"unknown chunk check {request.check}")
            metas = store.list(inode=request.inode, after=after, limit=limit + 1)
            more = len(metas) > limit
            out = storage_pb2.ListChunksResponse(more=more)
            for m in metas[:limit]:
                problem = ""
                if request.check and m.version and not m.damaged:
                    m, problem = self._check(store, m, request)
                out.chunks.add(
                    inode=m.inode,
                    index=m.index,
                    version=m.version,
                    pending_version=m.pending_version,
                    length=m.length,
                    checksum=m.checksum,
                    damaged=m.damaged,
                    problem=problem,
                )
            return out

        return self._call(context, run)

    @staticmethod
    def _check(store, meta, request) -> tuple:
        """Check one listed chunk as ``request`` asks; ``(meta now, problem)``."""
        blocks = request.check == storage_pb2.CHUNK_CHECK_BLOCKS
        committed, _, problem = check_chunk(store, meta.inode, meta.index, blocks=blocks)
        if committed is None:  # changed since it was listed
            return store.meta(meta.inode, meta.index) or meta, ""
        if problem and request.mark_damaged:
            store.mark_damaged(committed.inode, committed.index, committed.version)
            committed = store.meta(meta.inode, meta.index) or committed
        return committed, problem

    def RemoveChunks(self, request, context):
        def run():
            store = self._store(request.target_id)
            if not 1 <= request.inode <= MAX_INODE:
                raise errors.InvalidArgument("inode must be at least 1")
            indices = list(request.indices) or None
            if indices is not None and any(i > MAX_INDEX for i in indices):
                raise errors.InvalidArgument("chunk index out of range")
            versions = list(request.versions) or None
            if versions is not None and (indices is None or len(versions) != len(indices)):
                raise errors.InvalidArgument("versions must name one version per index")
            removed = store.remove_inode(request.inode, indices, versions)
            return storage_pb2.RemoveChunksResponse(removed=removed)

        return self._call(context, run)

    def TargetStats(self, request, context):
        def run():
            out = storage_pb2.TargetStatsResponse(node_id=self.node_id)
            for target_id, store in sorted(self._stores().items()):
                st = store.stats()
                state = common_pb2.TARGET_STATE_UNSPECIFIED
                if self._state_of is not None:
                    state = self._state_of(target_id)
                out.targets.add(
                    target_id=target_id,
                    chain_id=self._chain_of(target_id) or 0,
                    capacity=st["capacity"],
                    used=st["used"],
                    chunks=st["chunks"],
                    local_state=state,
                )
            return out

        return self._call(context, run)


def add_to_server(servicer: StorageServicer, server: grpc.Server) -> None:
    """Register ``servicer`` as the StorageService of ``server``."""
    storage_pb2_grpc.add_StorageServiceServicer_to_server(servicer, server)
