"""Cutting a file's chunks on the storage targets (``OP_TRUNCATE``).

Truncation is not queued like GC: it runs through each of the file's chains
at once, because a queued cut could land after new writes to the same
chunks. The metaserver sends one ``ChunkTruncateRequest`` per chain to the
chain's head (its first serving target) over the framed data protocol; the
head applies it and forwards it down the chain like a write. Every try of
one cut carries the same request id (:mod:`emberfs.metaserver.fs.cuts` keeps it
until the cut is done), so a head that already applied it answers from memory.
"""

from __future__ import annotations

import contextlib
import time

from emberfs.common import errors, framing, wire
from emberfs.common.framing import Op
from emberfs.common.routing import RoutingView
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.fs import cuts
from emberfs.proto import common_pb2, data_pb2

CLIENT_ID = "metaserver"


class _Retry(Exception):
    """This attempt failed in a way a later attempt (with fresh routing) may not."""


def _send(
    pool: wire.ConnectionPool,
    routing: RoutingView,
    request: data_pb2.ChunkTruncateRequest,
    timeout: float,
) -> int:
    """Send the truncation to the chain's head; the number of chunks it cut there."""
    chain = routing.chains.get(request.chain_id)
    if chain is None:
        raise errors.Internal(f"the file's chain {request.chain_id} does not exist")
    head = chain.head
    if head is None:
        raise _Retry(f"chain {request.chain_id} has no serving target")
    request.chain_version = chain.version
    request.target_id = head.target_id
    try:
        meta = wire.call(
            pool, head.data_address, Op.TRUNCATE, request.SerializeToString(), timeout=timeout
        )
    except wire.Refused as exc:
        message = f"truncate on chain {request.chain_id} at {head.data_address}: {exc}"
        if exc.retryable:
            raise _Retry(message) from None
        if isinstance(exc, wire.BadRequest):
            raise errors.InvalidArgument(message) from None
        raise errors.Internal(message) from None
    except (OSError, framing.FrameError) as exc:
        raise _Retry(f"{head.data_address}: {exc}") from exc
    return data_pb2.ChunkTruncateResponse.FromString(meta).chunks


def truncate_chunks(
    cluster: ClusterManager,
    attr: common_pb2.InodeAttr,
    length: int,
    request_id: int | None = None,
    *,
    pool: wire.ConnectionPool | None = None,
    timeout: float = 10.0,
) -> None:
    """Cut the chunks of the file ``attr`` to ``length`` bytes on every replica.

    For each chain of ``attr.layout.chains`` (at stripe position ``p``) the
    head gets ``ChunkTruncateRequest(stripe_position=p, ...)``: the chunk holding
    ``length`` is cut, and chunks wholly past it are cut to zero bytes.
    Stale chains, targets that do not serve and connection failures are
    retried with fresh routing and backoff until ``timeout`` seconds passed.

    Parameters
    ----------
    cluster : ClusterManager
        Source of routing info.
    attr : common_pb2.InodeAttr
        The file (its inode id and layout).
    length : int
        The new length in bytes.
    request_id : int, optional
        The cut's request id, the same for every try of one cut (the
        heads answer a repeated one from memory); default a fresh one.
    pool : wire.ConnectionPool, optional
        Connections to the storage servers (kept between calls by the
        metaserver); without it the call opens its own.
    timeout : float, default 10.0
        Seconds to keep retrying in all.

    Raises
    ------
    errors.Unavailable
        A chain could not be truncated within ``timeout``.
    errors.InvalidArgument
        A head refused the request as malformed.
    errors.Internal
        A chain of the layout does not exist, or a head failed otherwise.
    """
    if length < 0:
        raise errors.InvalidArgument(f"negative length {length}")
    if pool is None:
        with contextlib.closing(wire.ConnectionPool(max_per_address=None)) as own:
            truncate_chunks(cluster, attr, length, request_id, pool=own, timeout=timeout)
        return
    layout = attr.layout
    if request_id is None:
        request_id = cuts.new_request_id()
    deadline = time.monotonic() + timeout
    for position, chain_id in enumerate(layout.chains):
        request = data_pb2.ChunkTruncateRequest(
            chain_id=chain_id,
            inode=attr.inode,
            length=length,
            chunk_size=layout.chunk_size,
            stripe=len(layout.chains),
            stripe_position=position,
            client_id=CLIENT_ID,
            request_id=request_id,
        )
        delay = 0.02
        while True:
            try:
                routing = RoutingView.from_proto(cluster.routing())
                remaining = max(0.1, deadline - time.monotonic())
                _send(pool, routing, request, min(remaining, 5.0))
                break
            except _Retry as exc:
                now = time.monotonic()
                if now >= deadline:
                    raise errors.Unavailable(
                        f"could not truncate inode {attr.inode} on chain {chain_id} "
                        f"within {timeout:g}s: {exc}"
                    ) from None
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.5)
