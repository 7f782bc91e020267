"""Truncate: set a file's length, cutting its chunks on storage when it shrinks."""

from __future__ import annotations

from emberfs.common import extents
from emberfs.common.errors import InvalidArgument, IsADirectory, NotFound
from emberfs.metaserver.fs import access, dataversion, lookup, quota
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.fs.ops import sessions
from emberfs.proto import common_pb2, meta_pb2


def truncate(op: OpContext, req: meta_pb2.TruncateRequest) -> meta_pb2.TruncateResponse:
    """Grow or shrink the file at ``path`` (a final symlink is followed) to ``length``.

    With ``inode`` set the file is that inode (an open file that may have been
    renamed or unlinked since; ``path`` only names it in errors).

    Needs write permission. Shrinking commits the new length with a pending
    cut of the chunks, which the namespace has storage make once this has
    committed (:mod:`emberfs.metaserver.fs.cuts`); growing records the new length
    with a hole that reads as zeros, once no cut is pending.
    """
    sessions.validate_length(req.length)
    if req.inode:
        attr = op.get_inode(req.inode)
        if attr is None:
            raise NotFound(f"no inode {req.inode}")
    else:
        attr = lookup.resolve(op, req.path, follow=True).require(req.path)
    if attr.type == common_pb2.DIRECTORY:
        raise IsADirectory(f"is a directory: {req.path}")
    if attr.type != common_pb2.FILE:
        raise InvalidArgument(f"not a regular file: {req.path}")
    access.check(attr, op.creds, access.WRITE, req.path)
    if req.length < attr.size:
        op.cut_chunks(attr, req.length)
    elif req.length > attr.size:
        op.before_growth(attr.inode)
    held = attr.quota_charged if attr.writers else 0  # what open writers reserved stays theirs
    quota.recharge(op, attr, max(req.length, held), check=req.length > attr.size)
    extents.resize(attr, req.length, hole=True)  # growing leaves a hole that reads as zeros
    attr.mtime_ns = attr.ctime_ns = op.now
    dataversion.changed(attr, op.now)
    op.put_inode(attr)
    return meta_pb2.TruncateResponse(attr=attr)
