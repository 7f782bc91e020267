"""Cutting a file's chunks on the storage targets (``OP_TRUNCATE``).

Truncation is not queued like GC: it runs through each of the file's chains
at once, because a queued cut could land after new writes to the same
chunks. The metaserver sends one ``ChunkTruncateRequest`` per chain to the
chain's head (its first serving target) over the framed data protocol; the
head applies it and forwards it down the chain like a write.
"""

from __future__ import annotations

import itertools
import secrets
import socket
import time

from emberfs.common import errors, framing
from emberfs.common.addresses import split_address
from emberfs.common.framing import Op, Status
from emberfs.metaserver.cluster import ClusterManager
from emberfs.proto import common_pb2, data_pb2

CLIENT_ID = "metaserver"
_request_ids = itertools.count(secrets.randbits(62))
_RETRY_STATUSES = framing.RETRYABLE


class _Retry(Exception):
    """This attempt failed in a way a later attempt (with fresh routing) may not."""


def _head_address(routing: common_pb2.RoutingInfo, chain_id: int) -> tuple[int, int, str]:
    """(chain version, head target id, head data address) of a chain."""
    chain = next((c for c in routing.chains if c.chain_id == chain_id), None)
    if chain is None:
        raise errors.Internal(f"the file's chain {chain_id} does not exist")
    targets = {t.target_id: t for t in routing.targets}
    for tid in chain.targets:
        info = targets.get(tid)
        if info is not None and info.state == common_pb2.SERVING:
            return chain.version, tid, info.data_address
    raise _Retry(f"chain {chain_id} has no serving target")


def _send(address: str, request: data_pb2.ChunkTruncateRequest, timeout: float) -> int:
    try:
        with socket.create_connection(split_address(address), timeout=timeout) as sock:
            framing.send_frame(sock, Op.TRUNCATE, request.SerializeToString())
            frame = framing.recv_frame(sock)
    except (OSError, framing.FrameError) as exc:
        raise _Retry(f"{address}: {exc}") from exc
    if frame.header.op != Op.TRUNCATE | framing.RESPONSE:
        raise _Retry(f"{address} answered op {frame.header.op:#x} to a truncate")
    if frame.header.status == Status.OK:
        return data_pb2.ChunkTruncateResponse.FromString(frame.meta).chunks
    err = data_pb2.ErrorResponse.FromString(frame.meta)
    message = f"truncate on chain {request.chain_id} at {address}: " + (
        f"{framing.status_name(frame.header.status)} {err.message}"
    )
    if frame.header.status in _RETRY_STATUSES:
        raise _Retry(message)
    if frame.header.status == Status.BAD_REQUEST:
        raise errors.InvalidArgument(message)
    raise errors.Internal(message)


def truncate_chunks(
    cluster: ClusterManager,
    attr: common_pb2.InodeAttr,
    length: int,
    *,
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
    layout = attr.layout
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
            request_id=next(_request_ids),
        )
        delay = 0.02
        while True:
            try:
                version, head, address = _head_address(cluster.routing(), chain_id)
                request.chain_version = version
                request.target_id = head
                remaining = max(0.1, deadline - time.monotonic())
                _send(address, request, min(remaining, 5.0))
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
