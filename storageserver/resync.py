"""Resync: bring a SYNCING target up to date from its serving predecessor.

The node holding the predecessor walks its own chunk list and the successor's
(``ListChunks`` on the successor's StorageService), both ordered by
(inode, index), and

- copies every local committed chunk the successor lacks, holds at an older
  version, or holds at the same version with other content, as a full-chunk
  ``sync`` write on the framed data protocol (the successor applies it only if
  it is newer than what it has, or the same version with other content, so a
  concurrent forwarded write is never overwritten by an older copy); a
  successor already ahead holds a forwarded write we have not committed yet;
- removes the successor's chunks the predecessor no longer has (files deleted
  or truncated while the successor was away).

Writes keep flowing down the chain meanwhile. The caller reports
``ClusterService.SyncDone`` once :func:`sync_successor` returns; on any error
it raises and the caller retries later.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from emberfs.common import framing, grpcauth, wire
from emberfs.common.auth import ClusterKeys
from emberfs.proto import data_pb2, storage_pb2, storage_pb2_grpc
from emberfs.storageserver import replication as rp
from emberfs.storageserver.chunkstore import ChunkMeta, ChunkStore

log = logging.getLogger(__name__)

PAGE = 1000
REMOVE_BATCH = 1000
RPC_TIMEOUT = 30.0
SOCKET_TIMEOUT = 60.0
CLIENT_ID = "resync"

# Request ids only have to be unique per client id on the receiver: start at random.
_request_ids = itertools.count(secrets.randbits(62))


class ResyncInterrupted(Exception):
    """``should_stop`` asked the sync to end before it finished."""


def _remote_chunks(
    stub: storage_pb2_grpc.StorageServiceStub, target_id: int
) -> Iterator[storage_pb2.ChunkMeta]:
    after: tuple[int, int] | None = None
    while True:
        req = storage_pb2.ListChunksRequest(target_id=target_id, limit=PAGE)
        if after is not None:
            req.has_after = True
            req.after_inode, req.after_index = after
        resp = stub.ListChunks(req, timeout=RPC_TIMEOUT)
        yield from resp.chunks
        if not resp.more or not resp.chunks:
            return
        last = resp.chunks[-1]
        after = (last.inode, last.index)


def _local_chunks(store: ChunkStore) -> Iterator[ChunkMeta]:
    after: tuple[int, int] | None = None
    while True:
        page = store.list(after=after, limit=PAGE)
        yield from page
        if len(page) < PAGE:
            return
        after = (page[-1].inode, page[-1].index)


def _copy(
    pool: wire.ConnectionPool,
    address: str,
    store: ChunkStore,
    meta: ChunkMeta,
    *,
    chain_id: int,
    chain_version: int,
    successor_target_id: int,
    replace: bool = False,
) -> int | None:
    """Send the chunk's committed content; returns bytes sent (None: gone locally).

    ``replace``: the successor holds a newer version that its predecessor gave up;
    the copy replaces it.
    """
    try:
        data, meta = store.read_committed(meta.inode, meta.index)
    except KeyError:
        return None
    # Never spread a damaged local copy: the receiver checks the same CRCs.
    framing.verify(data, meta.crcs, store.block_size)
    req = data_pb2.ChunkWriteRequest(
        chain_id=chain_id,
        chain_version=chain_version,
        target_id=successor_target_id,
        chunk=data_pb2.ChunkId(inode=meta.inode, index=meta.index),
        offset=0,
        chunk_size=max(meta.length, framing.MIN_BLOCK),
        client_id=CLIENT_ID,
        request_id=next(_request_ids),
        update_version=meta.version,
        full_chunk=True,
        sync=True,
        replace=replace,
    )
    wire.call(
        pool,
        address,
        framing.Op.WRITE,
        req.SerializeToString(),
        data if data else None,
        block_size=store.block_size,
        crcs=meta.crcs,
    )
    return len(data)


def sync_successor(
    store: ChunkStore,
    *,
    chain_id: int,
    chain_version: int,
    target_id: int,
    successor_target_id: int,
    successor_data_address: str,
    successor_grpc_address: str,
    hold: Callable[[int, int], AbstractContextManager],
    should_stop: Callable[[], bool] = lambda: False,
    on_damaged: Callable[[ChunkMeta], None] = lambda meta: None,
    keys: ClusterKeys | None = None,
    tls: grpcauth.TLSFiles | None = None,
) -> dict:
    """Copy what the successor lacks and remove what it should no longer have.

    Each chunk is decided and copied while ``hold(inode, index)`` holds it (the
    local target's chunk lock, taken by every update of the chunk), so no
    write to it is between staging and commit here meanwhile: what the local
    target has committed then is all the chain acknowledged, and a successor
    ahead of it holds a version that was given up after it was forwarded.

    Parameters
    ----------
    store : ChunkStore
        The local (predecessor) target's store.
    chain_id, chain_version : int
        The chain and the version the sync runs under (the successor refuses
        copies sent under another chain version).
    target_id : int
        The local target's id.
    successor_target_id : int
        The syncing target.
    successor_data_address, successor_grpc_address : str
        ``HOST:PORT`` of the successor's data protocol and StorageService.
    should_stop : callable, optional
        Polled between chunks; when it returns True the sync ends with
        :class:`ResyncInterrupted`.
    hold : callable
        ``hold(inode, index)``: a context manager holding the local chunk (the
        data server's :meth:`~emberfs.storageserver.replica.Replica.chunk`).
    on_damaged : callable, optional
        ``on_damaged(meta)`` when a local chunk fails its block CRC32Cs: it is
        marked damaged (never sent) and the sync raises ``framing.ChecksumError``;
        the next one passes it over.
    keys : ClusterKeys, optional
        The cluster's keys: the sync's calls and frames carry the server credential.
    tls : TLSFiles, optional
        With a CA: the sync's gRPC calls use TLS.

    Returns
    -------
    dict
        ``{"copied": chunks sent, "removed": chunks removed, "bytes": bytes sent}``.

    Raises
    ------
    wire.Refused
        The successor refused a copy (its class and ``status`` say why).
    ResyncInterrupted
        ``should_stop`` returned True.
    grpc.RpcError, OSError, framing.FrameError
        Transport failures; a damaged local chunk raises ``framing.ChecksumError``.
    """
    counts = {"copied": 0, "removed": 0, "bytes": 0}
    pending_removal: list[tuple[int, int, int]] = []  # (inode, index, the successor's version)
    kw = dict(
        chain_id=chain_id, chain_version=chain_version, successor_target_id=successor_target_id
    )
    channel = grpcauth.channel(successor_grpc_address, keys=keys, tls=tls)
    pool = wire.ConnectionPool(
        connect_timeout=SOCKET_TIMEOUT,
        io_timeout=SOCKET_TIMEOUT,
        max_per_address=1,
        credential=keys.server_credential() if keys is not None else None,
    )
    try:
        stub = storage_pb2_grpc.StorageServiceStub(channel)

        def flush_removals() -> None:
            by_inode: dict[int, tuple[list[int], list[int]]] = {}
            for inode, index, version in pending_removal:
                # written here since it was decided: writes reach this target first
                if store.meta(inode, index) is None:
                    indices, versions = by_inode.setdefault(inode, ([], []))
                    indices.append(index)
                    versions.append(version)
            pending_removal.clear()
            for inode, (indices, versions) in by_inode.items():
                # the successor removes a chunk only while it holds the version it listed
                resp = stub.RemoveChunks(
                    storage_pb2.RemoveChunksRequest(
                        target_id=successor_target_id,
                        inode=inode,
                        indices=indices,
                        versions=versions,
                    ),
                    timeout=RPC_TIMEOUT,
                )
                counts["removed"] += resp.removed
                if resp.removed < len(indices):
                    counts["removed"] += remove_changed(inode, indices)

        def remove_changed(inode: int, indices: list[int]) -> int:
            """Remove the chunks of ``inode`` that changed on the successor since it listed them.

            Every update of a chunk reaches the successor through this replica,
            which holds the chunk from before it forwards the update until it
            commits or aborts it. So while the chunk is held here and has no record,
            no update of it is in flight, and what the successor holds of it
            (another version, or one pending: a stray) goes whatever its version.
            """
            with contextlib.ExitStack() as held:
                for index in indices:
                    held.enter_context(hold(inode, index))
                gone = [i for i in indices if store.meta(inode, i) is None]
                if not gone:
                    return 0
                resp = stub.RemoveChunks(
                    storage_pb2.RemoveChunksRequest(
                        target_id=successor_target_id, inode=inode, indices=gone
                    ),
                    timeout=RPC_TIMEOUT,
                )
            if resp.removed:
                log.warning(
                    "resync of target %d: %d chunk(s) of inode %d changed there since they "
                    "were listed, and went all the same",
                    successor_target_id,
                    resp.removed,
                    inode,
                )
            return resp.removed

        def sync_chunk(inode: int, index: int, theirs: storage_pb2.ChunkMeta | None) -> None:
            """Bring one chunk of the successor in line with the local one (held)."""
            with hold(inode, index):
                mine = store.meta(inode, index)
                action = rp.resync_action(mine, theirs)
                if action == rp.Resync.REMOVE:
                    pending_removal.append((inode, index, theirs.version))
                elif action != rp.Resync.KEEP:
                    try:
                        sent = _copy(
                            pool,
                            successor_data_address,
                            store,
                            mine,
                            replace=action == rp.Resync.REPLACE,
                            **kw,
                        )
                    except framing.ChecksumError:
                        if store.mark_damaged(inode, index, mine.version):
                            on_damaged(mine)
                        raise
                    if sent is not None:
                        counts["copied"] += 1
                        counts["bytes"] += sent
            if len(pending_removal) >= REMOVE_BATCH:
                flush_removals()

        local = _local_chunks(store)
        remote = _remote_chunks(stub, successor_target_id)
        mine = next(local, None)
        theirs = next(remote, None)
        while mine is not None or theirs is not None:
            if should_stop():
                raise ResyncInterrupted("resync stopped before it finished")
            my_key = (mine.inode, mine.index) if mine is not None else None
            their_key = (theirs.inode, theirs.index) if theirs is not None else None
            if their_key is None or (my_key is not None and my_key < their_key):
                sync_chunk(*my_key, None)
                mine = next(local, None)
            elif my_key is None or their_key < my_key:
                sync_chunk(*their_key, theirs)
                theirs = next(remote, None)
            else:
                sync_chunk(*my_key, theirs)
                mine = next(local, None)
                theirs = next(remote, None)
        flush_removals()
    finally:
        pool.close()
        channel.close()
    log.info(
        "resync of target %d (chain %d v%d) from target %d: %s",
        successor_target_id,
        chain_id,
        chain_version,
        target_id,
        counts,
    )
    return counts
