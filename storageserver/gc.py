"""Garbage collection of removed files' chunks on a storage node.

The metaserver queues a GC item (inode, chains) when a file's last link goes.
A node fetches the items for its targets, removes the inode's chunks from
every local target that is in one of the item's chains, and acknowledges per
target; the metaserver drops an item once every live target of its chains has
acknowledged it. The node's background loop calls :func:`run_gc_once` every
second.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from emberfs.proto import cluster_pb2, cluster_pb2_grpc
from emberfs.storageserver.chunkstore import ChunkStore

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0


def run_gc_once(
    cluster_stub: cluster_pb2_grpc.ClusterServiceStub,
    stores: dict[int, ChunkStore],
    chain_of: dict[int, int],
    *,
    limit: int = 256,
    timeout: float = DEFAULT_TIMEOUT,
    hold: Callable[[int, int], AbstractContextManager] | None = None,
) -> int:
    """Fetch one batch of GC items, remove their chunks locally and acknowledge them.

    Parameters
    ----------
    cluster_stub : ClusterServiceStub
        The metaserver's cluster service.
    stores : dict
        ``{target id: ChunkStore}`` of this node.
    chain_of : dict
        ``{target id: chain id}`` as the node's routing says (0 or missing: no chain).
    limit : int, default 256
        Most items fetched.
    timeout : float, default 10.0
        Deadline of each RPC, in seconds.
    hold : callable, optional
        ``hold(target id, inode)`` holds the inode on the target while its
        chunks go (the data server's
        :meth:`~emberfs.storageserver.replica.Replica.truncating`), so no
        update of it is between staging and commit meanwhile.

    Returns
    -------
    int
        Number of chunks removed.

    Notes
    -----
    A target acknowledges an item only once its chunks are gone; when removing
    fails (an I/O error) the item stays unacknowledged for that target and the
    next round retries it. RPC failures propagate (``grpc.RpcError``).
    """
    if not stores:
        return 0
    resp = cluster_stub.FetchGC(
        cluster_pb2.FetchGCRequest(target_ids=sorted(stores), limit=limit), timeout=timeout
    )
    removed = 0
    handled: dict[int, list[int]] = {}
    for item in resp.items:
        chains = set(item.chains)
        for target_id, store in stores.items():
            chain = chain_of.get(target_id, 0)
            if not chain or chain not in chains:
                continue
            try:
                with hold(target_id, item.inode) if hold else contextlib.nullcontext():
                    removed += store.remove_inode(item.inode)
            except (OSError, ValueError):
                log.exception("GC of inode %d on target %d failed", item.inode, target_id)
                continue
            handled.setdefault(target_id, []).append(item.gc_id)
    for target_id, gc_ids in sorted(handled.items()):
        cluster_stub.AckGC(
            cluster_pb2.AckGCRequest(target_id=target_id, gc_ids=gc_ids), timeout=timeout
        )
    if removed:
        log.info("GC removed %d chunks of %d items", removed, len(resp.items))
    return removed
