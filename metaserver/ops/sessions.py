"""Open, Sync and Close: write sessions and exact file lengths.

A write open (OPEN_WRITE, OPEN_APPEND or OPEN_TRUNCATE) records a session
(``SESS`` + inode + session id) and returns its id; the client writes chunks
to storage directly and reports the file's exact length with Sync (session
stays) or Close (session ends). While any session is open an unlinked file
keeps its inode; the Close that ends the last session of an unlinked file
queues its chunks for garbage collection and drops the inode.
"""

from __future__ import annotations

from emberfs.common.errors import InvalidArgument, IsADirectory, NotFound
from emberfs.metaserver.ops import access, create, lookup, remove
from emberfs.metaserver.ops.context import OpContext
from emberfs.proto import common_pb2, meta_pb2

ALL_FLAGS = (
    meta_pb2.OPEN_WRITE
    | meta_pb2.OPEN_CREATE
    | meta_pb2.OPEN_EXCLUSIVE
    | meta_pb2.OPEN_TRUNCATE
    | meta_pb2.OPEN_APPEND
)
WRITE_FLAGS = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_APPEND | meta_pb2.OPEN_TRUNCATE
MAX_LENGTH = (1 << 63) - 1


def is_write_open(flags: int) -> bool:
    """True when an open with ``flags`` starts a write session."""
    return bool(flags & WRITE_FLAGS)


def is_mutating_open(flags: int) -> bool:
    """True when an open with ``flags`` may change the namespace."""
    return bool(flags & (WRITE_FLAGS | meta_pb2.OPEN_CREATE))


def validate_length(length: int) -> None:
    if length > MAX_LENGTH:
        raise InvalidArgument(f"length {length} is too large")


def open_file(op: OpContext, req: meta_pb2.OpenRequest) -> meta_pb2.OpenResponse:
    """Open a path: attributes, layout and size in one round trip.

    Read opens need read permission, write opens write permission (not
    checked on a file this call created). OPEN_TRUNCATE of a non-empty file
    cuts its chunks on storage (``truncate_chunks``) before the length 0 is
    committed. Opening a directory for write gives IsADirectory.
    """
    flags = req.flags
    if flags & ~ALL_FLAGS:
        raise InvalidArgument(f"unknown open flags {flags & ~ALL_FLAGS:#x}")
    if flags & meta_pb2.OPEN_EXCLUSIVE and not flags & meta_pb2.OPEN_CREATE:
        raise InvalidArgument("OPEN_EXCLUSIVE needs OPEN_CREATE")
    write = is_write_open(flags)
    created = False
    if flags & meta_pb2.OPEN_CREATE:
        attr, created = create.create_file(
            op, req.path, req.mode, bool(flags & meta_pb2.OPEN_EXCLUSIVE)
        )
    else:
        attr = lookup.resolve(op, req.path, follow=True).require(req.path)
    if attr.type == common_pb2.DIRECTORY:
        if write:
            raise IsADirectory(f"is a directory: {req.path}")
        access.check(attr, op.creds, access.READ, req.path)
        return meta_pb2.OpenResponse(attr=attr)
    if not created:
        access.check(attr, op.creds, access.WRITE if write else access.READ, req.path)
    if not write:
        return meta_pb2.OpenResponse(attr=attr)
    if flags & meta_pb2.OPEN_TRUNCATE and attr.size > 0:
        if op.env.truncate_chunks is not None:
            op.env.truncate_chunks(attr, 0)
        attr.size = 0
        attr.mtime_ns = attr.ctime_ns = op.now
        op.put_inode(attr)
    session_id = op.add_session(attr.inode)
    return meta_pb2.OpenResponse(attr=attr, session_id=session_id)


def _session_file(op: OpContext, inode: int, session_id: int) -> common_pb2.InodeAttr:
    attr = op.get_inode(inode)
    if attr is None:
        raise NotFound(f"no inode {inode}")
    if op.get_session(inode, session_id) is None:
        raise InvalidArgument(f"no write session {session_id} on inode {inode}")
    return attr


def sync(op: OpContext, req: meta_pb2.SyncRequest) -> meta_pb2.SyncResponse:
    """Set the exact length and mtime (0: now) of a file open for write."""
    validate_length(req.length)
    attr = _session_file(op, req.inode, req.session_id)
    attr.size = req.length
    attr.mtime_ns = req.mtime_ns or op.now
    attr.ctime_ns = op.now
    op.put_inode(attr)
    return meta_pb2.SyncResponse(attr=attr)


def close(op: OpContext, req: meta_pb2.CloseRequest) -> meta_pb2.CloseResponse:
    """End a write session; with ``wrote`` set the exact length and mtime first."""
    validate_length(req.length)
    attr = _session_file(op, req.inode, req.session_id)
    others = [s for s in op.sessions_of(req.inode) if s.session_id != req.session_id]
    op.end_session(req.inode, req.session_id)
    if req.wrote:
        attr.size = req.length
        attr.mtime_ns = attr.ctime_ns = op.now
    if attr.nlink == 0 and not others:
        remove.discard(op, attr)
    elif req.wrote:
        op.put_inode(attr)
    return meta_pb2.CloseResponse(attr=attr)
