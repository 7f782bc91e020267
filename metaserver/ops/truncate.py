"""Truncate: set a file's length, cutting its chunks on storage when it shrinks."""

from __future__ import annotations

from emberfs.common import extents
from emberfs.common.errors import InvalidArgument, IsADirectory
from emberfs.metaserver import access, lookup
from emberfs.metaserver.opcontext import OpContext
from emberfs.metaserver.ops import sessions
from emberfs.proto import common_pb2, meta_pb2


def truncate(op: OpContext, req: meta_pb2.TruncateRequest) -> meta_pb2.TruncateResponse:
    """Grow or shrink the file at ``path`` (a final symlink is followed) to ``length``.

    Needs write permission. When the file holds data beyond the new length,
    ``truncate_chunks`` cuts it on storage first (and its Unavailable aborts
    the truncate, nothing committed); growing only records the new length
    (the gap reads as zeros).
    """
    sessions.validate_length(req.length)
    attr = lookup.resolve(op, req.path, follow=True).require(req.path)
    if attr.type == common_pb2.DIRECTORY:
        raise IsADirectory(f"is a directory: {req.path}")
    if attr.type != common_pb2.FILE:
        raise InvalidArgument(f"not a regular file: {req.path}")
    access.check(attr, op.creds, access.WRITE, req.path)
    if req.length < attr.size and op.env.truncate_chunks is not None:
        op.env.truncate_chunks(attr, req.length)
    extents.resize(attr, req.length, hole=True)  # growing leaves a hole that reads as zeros
    attr.mtime_ns = attr.ctime_ns = op.now
    op.put_inode(attr)
    return meta_pb2.TruncateResponse(attr=attr)
