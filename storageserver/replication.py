"""CRAQ chain replication rules, without I/O and without state.

Every question the data server must answer before it touches a chunk or a
socket is decided here, over plain data: the node's routing view, a chunk's
metadata and the fields of a request; refusals are the framed protocol's
:class:`~emberfs.common.wire.Refused` errors. What a replica remembers between
requests (version floors, answers, locks) lives in
:class:`~emberfs.storageserver.replica.Replica`, which applies these rules; the
data server's updates (:mod:`emberfs.storageserver.updates`) do the sending and writing.

The rules, as 3FS applies CRAQ:

* The *write chain* of a chain is its targets, in chain order, whose state is
  SERVING or SYNCING. Its first target is the head and must be SERVING; each
  target forwards to the next one (its successor); the last is the tail.
* Clients write to the head only. The head picks the update version
  ``max(committed, pending, highest aborted) + 1`` (a version is never reused
  for different content), stores the update as pending, forwards it and
  commits once the successor has answered OK. The tail commits at once.
* A forwarded update applies on top of ``base_version``. A replica whose
  committed version differs answers :data:`NEED_FULL_CHUNK` and the sender
  resends the whole new chunk content. An update whose version is not newer
  than the replica's committed version was applied already.
* Reads are served by SERVING targets only, from the committed version; a
  pending version makes the replica answer NOT_COMMITTED.
* The sync source of a SYNCING target is its predecessor in the write chain,
  which must be SERVING (the last SERVING target before it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from emberfs.common import framing, layout, wire
from emberfs.common.framing import Status
from emberfs.common.routing import (
    SERVING,
    SYNCING,
    WRITABLE_STATES,
    ChainView,
    RoutingView,
    TargetView,
)
from emberfs.proto import data_pb2

#: Message of the NOT_COMMITTED answer that asks the sender of a forwarded
#: partial update to resend the whole new chunk content.
NEED_FULL_CHUNK = "need full chunk"

#: Largest chunk offset + length a request may name.
MAX_CHUNK_END = layout.MAX_CHUNK_SIZE


class ChunkMetaLike(Protocol):
    """The fields of a chunk's metadata the decisions read."""

    version: int
    pending_version: int
    length: int
    crcs: Any


# ----------------------------------------------------------------------------
# decisions


def _chain_checks(
    view: RoutingView, local: Iterable[int], target_id: int, chain_id: int, chain_version: int
) -> wire.Refused | ChainView:
    if target_id not in set(local):
        return wire.NotServing(f"target {target_id} is not on this node")
    chain = view.chains.get(chain_id)
    if chain is None:
        return wire.StaleChain(f"chain {chain_id} is unknown at routing {view.version}")
    if target_id not in chain.target_ids:
        return wire.NotServing(f"target {target_id} is not in chain {chain_id}")
    if chain_version and chain_version != chain.version:
        return wire.StaleChain(
            f"chain {chain_id} is at version {chain.version}, request has {chain_version}",
        )
    return chain


def check_read(
    view: RoutingView, local: Iterable[int], req: data_pb2.ChunkReadRequest
) -> wire.Refused | None:
    """May ``req.target_id`` serve this read? None when it may."""
    if req.chunk.inode == 0:
        return wire.BadRequest("inode 0 is invalid")
    if req.offset + req.length > MAX_CHUNK_END:
        return wire.BadRequest("read range exceeds the largest chunk size")
    if req.length > framing.MAX_DATA:
        return wire.BadRequest("read length exceeds the frame limit")
    chain = _chain_checks(view, local, req.target_id, req.chain_id, req.chain_version)
    if isinstance(chain, wire.Refused):
        return chain
    if view.state(req.target_id) != SERVING:
        return wire.NotServing(f"target {req.target_id} is not serving")
    return None


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What to send for a read: whole CRC blocks ``[data_offset, data_offset+send_length)``."""

    version: int
    chunk_length: int
    data_offset: int
    send_length: int
    skip: int
    crc_first: int  # index of the first block's CRC in the chunk's CRC table
    crc_count: int

    def response(self, inode: int, index: int) -> data_pb2.ChunkReadResponse:
        """The answer's meta, naming the chunk read (the client checks it)."""
        return data_pb2.ChunkReadResponse(
            version=self.version,
            chunk_length=self.chunk_length,
            data_offset=self.data_offset,
            skip=self.skip,
            chunk=data_pb2.ChunkId(inode=inode, index=index),
        )


def uncommitted(meta: ChunkMetaLike | None) -> wire.Refused:
    """Why a replica cannot serve a read now: the chunk is missing, or a version is pending."""
    if meta is None:
        return wire.ChunkNotFound("chunk not found")
    if damaged(meta):
        return wire.ChunkNotFound("damaged here: its file was lost; other replicas hold it")
    if meta.pending_version:
        return wire.NotCommitted(f"version {meta.pending_version} is pending")
    return wire.NotCommitted(f"version {meta.version} committed while the read looked for it")


def plan_read(
    meta: ChunkMetaLike | None, offset: int, length: int, block_size: int
) -> wire.Refused | ReadPlan:
    """Widen a read of ``[offset, offset+length)`` to whole CRC blocks of the committed chunk.

    A range past the chunk's end yields the bytes that exist (possibly none).
    """
    if meta is None or meta.pending_version:
        return uncommitted(meta)
    chunk_length = meta.length
    end = min(offset + length, chunk_length)
    if offset >= end:
        return ReadPlan(meta.version, chunk_length, min(offset, chunk_length), 0, 0, 0, 0)
    start = offset // block_size * block_size
    stop = min(-(-end // block_size) * block_size, chunk_length)
    first = start // block_size
    count = framing.n_blocks(stop - start, block_size)
    if first + count > len(meta.crcs):
        return wire.ServerError("the chunk's CRC table is shorter than its length")
    return ReadPlan(meta.version, chunk_length, start, stop - start, offset - start, first, count)


class WriteKind:
    """How a write request is to be handled."""

    CLIENT = "client"  # from a client, at the head
    FORWARDED = "forwarded"  # from the predecessor in the chain
    SYNC = "sync"  # a resync copy from the predecessor


@dataclass(frozen=True, slots=True)
class WriteRole:
    """An accepted write: how to apply it and where to forward it."""

    kind: str
    chain_version: int
    successor: TargetView | None


def check_write(
    view: RoutingView, local: Iterable[int], req: data_pb2.ChunkWriteRequest, data_len: int
) -> wire.Refused | WriteRole:
    """Validate a write request and decide this target's role in it."""
    if req.chunk.inode == 0:
        return wire.BadRequest("inode 0 is invalid")
    if req.sync:
        # A resync copy carries the chunk's content; its chunk_size only bounds it.
        if data_len > min(req.chunk_size, MAX_CHUNK_END):
            return wire.BadRequest("the copy is larger than its chunk size")
    else:
        try:
            layout.validate_chunk_size(req.chunk_size)
        except ValueError as exc:
            return wire.BadRequest(str(exc))
    if req.offset + data_len > req.chunk_size:
        return wire.BadRequest("the write crosses the chunk's end")
    if req.replace and not req.sync:
        return wire.BadRequest("only a resync copy replaces a chunk")
    if req.sync or req.full_chunk:
        if req.offset:
            return wire.BadRequest("a full-chunk write starts at offset 0")
        if req.update_version == 0:
            return wire.BadRequest("full-chunk and sync writes carry a version")
    elif data_len == 0:
        return wire.BadRequest("empty write")
    chain = _chain_checks(view, local, req.target_id, req.chain_id, 0)
    if isinstance(chain, wire.Refused):
        return chain
    if req.chain_version != chain.version:
        return wire.StaleChain(
            f"chain {chain.chain_id} is at version {chain.version}, request has {req.chain_version}",
        )
    state = view.state(req.target_id)
    if req.update_version == 0:
        if view.head(req.chain_id) != req.target_id:
            return wire.NotServing(f"target {req.target_id} is not the chain head")
        return WriteRole(
            WriteKind.CLIENT, chain.version, view.successor(req.chain_id, req.target_id)
        )
    if state not in WRITABLE_STATES:
        return wire.NotServing(f"target {req.target_id} takes no writes")
    if view.predecessor(req.chain_id, req.target_id) is None:
        return wire.NotServing(f"target {req.target_id} has no predecessor")
    if req.sync:
        return WriteRole(WriteKind.SYNC, chain.version, None)
    return WriteRole(
        WriteKind.FORWARDED, chain.version, view.successor(req.chain_id, req.target_id)
    )


def next_version(meta: ChunkMetaLike | None, floor: int = 0) -> int:
    """The head's version for a new update: above everything ever used for the chunk."""
    if meta is None:
        return floor + 1
    return max(meta.version, meta.pending_version, floor) + 1


def committed_version(meta: ChunkMetaLike | None) -> int:
    return meta.version if meta is not None else 0


class Apply:
    """What a replica does with a forwarded update."""

    ALREADY = "already"  # the committed version holds it: answer OK
    FULL = "full"  # replace the chunk with the sent content
    PARTIAL = "partial"  # apply the sent range on top of the committed version
    NEED_FULL = "need_full"  # base version differs: ask for the whole chunk


def damaged(meta: ChunkMetaLike | None) -> bool:
    """Whether the chunk's committed content was lost here (see ``ChunkRecords.recover``)."""
    return bool(getattr(meta, "damaged", False))


def _apply(meta: ChunkMetaLike | None, version: int, base_version: int, full: bool) -> str:
    if damaged(meta):  # only a whole new content can stand in for what was lost
        return Apply.FULL if full else Apply.NEED_FULL
    committed = committed_version(meta)
    if version <= committed:
        return Apply.ALREADY
    if full:
        return Apply.FULL
    if base_version == committed:
        return Apply.PARTIAL
    return Apply.NEED_FULL


def plan_forwarded(meta: ChunkMetaLike | None, req: data_pb2.ChunkWriteRequest) -> str:
    """Decide how a replica applies a forwarded update (one of :class:`Apply`)."""
    return _apply(meta, req.update_version, req.base_version, req.full_chunk)


def forward_request(
    req: data_pb2.ChunkWriteRequest,
    successor: TargetView,
    *,
    chain_version: int,
    version: int,
    base_version: int,
    full_chunk: bool,
) -> data_pb2.ChunkWriteRequest:
    """The request a replica sends its successor for an update it has staged."""
    out = data_pb2.ChunkWriteRequest()
    out.CopyFrom(req)
    out.target_id = successor.target_id
    out.chain_version = chain_version
    out.update_version = version
    out.base_version = base_version
    out.full_chunk = full_chunk
    out.sync = False
    if full_chunk:
        out.offset = 0
    return out


def send_full_first(successor: TargetView, req: data_pb2.ChunkWriteRequest) -> bool:
    """Send the whole chunk at once (a SYNCING successor, or the update is whole already)."""
    return bool(req.full_chunk) or successor.state == SYNCING


class Reply:
    """What to do with the successor's answer."""

    OK = "ok"
    RESEND_FULL = "resend_full"
    FAIL = "fail"


def interpret_reply(status: int, message: str, sent_full: bool) -> tuple[str, Status]:
    """Classify the successor's answer; on failure also the status to answer upstream.

    The upstream status is retryable (the client refreshes its routing and
    retries, and nothing is answered OK unless the whole chain holds the
    update), except NO_SPACE, passed up unchanged: a replica has no room for
    the update, and no retry makes room.
    """
    if status == Status.OK:
        return Reply.OK, Status.OK
    if status == Status.NOT_COMMITTED and message == NEED_FULL_CHUNK and not sent_full:
        return Reply.RESEND_FULL, Status.OK
    if status in (Status.STALE_CHAIN, Status.BUSY, Status.CHECKSUM, Status.NO_SPACE):
        return Reply.FAIL, Status(status)
    return Reply.FAIL, Status.NOT_SERVING


def upstream_refusal(
    successor: TargetView, upstream: int, status: int, message: str
) -> wire.Refused:
    """The refusal a replica answers when its successor answered ``status`` (see interpret_reply)."""
    return wire.refusal(
        upstream,
        f"successor target {successor.target_id}: {framing.status_name(status)} {message}",
    )


def overlay(base: bytes | memoryview, offset: int, data: bytes | memoryview) -> bytearray:
    """The chunk content after writing ``data`` at ``offset`` over ``base`` (holes are zeros)."""
    end = offset + len(data)
    out = bytearray(max(len(base), end))
    out[: len(base)] = base
    out[offset:end] = data
    return out


# ----------------------------------------------------------------------------
# truncation


def check_truncate(
    view: RoutingView, local: Iterable[int], req: data_pb2.ChunkTruncateRequest
) -> wire.Refused | WriteRole:
    """Validate a truncation and decide this target's role in it.

    The head takes it from the metaserver (kind CLIENT); any other writable
    target of the chain takes it from its predecessor (kind FORWARDED).
    """
    if req.inode == 0:
        return wire.BadRequest("inode 0 is invalid")
    try:
        layout.validate_chunk_size(req.chunk_size)
    except ValueError as exc:
        return wire.BadRequest(str(exc))
    if not 1 <= req.stripe <= layout.MAX_STRIPE or req.stripe_position >= req.stripe:
        return wire.BadRequest("invalid stripe or stripe position")
    chain = _chain_checks(view, local, req.target_id, req.chain_id, 0)
    if isinstance(chain, wire.Refused):
        return chain
    if req.chain_version != chain.version:
        return wire.StaleChain(
            f"chain {chain.chain_id} is at version {chain.version}, request has {req.chain_version}",
        )
    succ = view.successor(req.chain_id, req.target_id)
    if view.head(req.chain_id) == req.target_id:
        return WriteRole(WriteKind.CLIENT, chain.version, succ)
    if view.state(req.target_id) not in WRITABLE_STATES:
        return wire.NotServing(f"target {req.target_id} takes no writes")
    if view.predecessor(req.chain_id, req.target_id) is None:
        return wire.NotServing(f"target {req.target_id} is not the chain head")
    return WriteRole(WriteKind.FORWARDED, chain.version, succ)


@dataclass(frozen=True, slots=True)
class TruncateStep:
    """One chunk's part of a truncation: cut it to ``length`` bytes at a new version.

    Chunks wholly past the new end are cut to zero bytes rather than removed: their
    version numbers then keep growing, so a replica that was away (and still holds an
    old, longer version) is recognised as older and overwritten by the resync. The
    zero-length chunks go when the file is removed (garbage collection).
    """

    index: int
    length: int


def plan_truncate(
    chunks: Iterable[tuple[int, int]], length: int, chunk_size: int, stripe: int, position: int
) -> list[TruncateStep]:
    """Steps for the chunks ``(index, chunk_length)`` of one inode on one chain.

    Chunks of other chains' stripe positions are left alone; a chunk already
    no longer than its cut is left alone too, so a repeated truncation changes nothing.
    """
    steps = []
    for index, chunk_length in chunks:
        if index % stripe != position:
            continue
        cut = max(0, length - index * chunk_size)
        if cut < chunk_length:
            steps.append(TruncateStep(index, cut))
    return steps


def plan_forwarded_cut(meta: ChunkMetaLike | None, step: data_pb2.TruncateStep) -> str:
    """How a replica applies one step of a forwarded truncation (one of :class:`Apply`).

    ``ALREADY`` when its committed version is the step's or newer, ``PARTIAL``
    (cut its committed content) when that version is the step's base, else
    ``NEED_FULL``: its content is not the head's, so the head sends the cut
    chunk whole before the truncation comes again.
    """
    return _apply(meta, step.version, step.base_version, False)


def forward_truncate(
    req: data_pb2.ChunkTruncateRequest,
    successor: TargetView,
    steps: Iterable[data_pb2.TruncateStep],
) -> data_pb2.ChunkTruncateRequest:
    """The truncation a replica sends its successor: the head's ``steps``, numbered by it."""
    out = data_pb2.ChunkTruncateRequest()
    out.CopyFrom(req)
    out.target_id = successor.target_id
    del out.steps[:]
    out.steps.extend(steps)
    return out


def cut_chunk_request(
    req: data_pb2.ChunkTruncateRequest,
    successor: TargetView,
    chain_version: int,
    step: data_pb2.TruncateStep,
) -> data_pb2.ChunkWriteRequest:
    """A forwarded full-chunk write that gives a successor the cut content of ``step``."""
    return data_pb2.ChunkWriteRequest(
        chain_id=req.chain_id,
        chain_version=chain_version,
        target_id=successor.target_id,
        chunk=data_pb2.ChunkId(inode=req.inode, index=step.index),
        offset=0,
        chunk_size=req.chunk_size,
        update_version=step.version,
        base_version=step.base_version,
        full_chunk=True,
    )


# ----------------------------------------------------------------------------
# resync


@dataclass(frozen=True, slots=True)
class SyncTask:
    """A local SERVING target must copy its chunks to its SYNCING successor."""

    chain_id: int
    chain_version: int
    target_id: int
    successor: TargetView


def sync_tasks(view: RoutingView, local: Iterable[int]) -> list[SyncTask]:
    """The resyncs this node must run: for each local SERVING target whose successor syncs."""
    tasks = []
    for target_id in local:
        chain_id = view.chain_of(target_id)
        if not chain_id or view.state(target_id) != SERVING:
            continue
        succ = view.successor(chain_id, target_id)
        if succ is not None and succ.state == SYNCING:
            tasks.append(SyncTask(chain_id, view.chains[chain_id].version, target_id, succ))
    return tasks


class Resync:
    """What a resync does with one chunk of the successor."""

    KEEP = "keep"  # the successor holds the local committed content
    COPY = "copy"  # send the local content; applied if newer (or the same version, other bytes)
    REPLACE = "replace"  # the successor is ahead with a version given up here: overwrite it
    REMOVE = "remove"  # nothing committed here: remove the successor's chunk (if still listed)


def resync_action(mine: ChunkMetaLike | None, theirs) -> str:
    """Decide one chunk of a resync, ``mine`` read while the local chunk is held.

    ``theirs`` is the successor's listed ``ChunkMeta`` (None: it has none). While
    the chunk is held no update of it is between staging and commit here, so
    what is committed here is what the chain acknowledged: a successor ahead of
    it holds a version its predecessor gave up after forwarding it.
    """
    if damaged(mine):
        return Resync.KEEP  # nothing to copy, and the successor's copy may be the one left
    committed = committed_version(mine)
    if not committed:
        return Resync.REMOVE if theirs is not None else Resync.KEEP
    if damaged(theirs):
        return Resync.REPLACE
    if theirs is None or committed > theirs.version:
        return Resync.COPY
    if committed < theirs.version:
        return Resync.REPLACE
    if (mine.length, mine.checksum) != (theirs.length, theirs.checksum):
        return Resync.COPY
    return Resync.KEEP


def sync_source(view: RoutingView, chain_id: int, syncing_target: int) -> int | None:
    """The target that copies chunks to ``syncing_target``: its SERVING predecessor."""
    if view.state(syncing_target) != SYNCING:
        return None
    pred = view.predecessor(chain_id, syncing_target)
    if pred is None or pred.state != SERVING:
        return None
    return pred.target_id
