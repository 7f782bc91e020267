"""SetLayout: set or clear the layout of a directory."""

from __future__ import annotations

from emberfs.common.errors import NotADirectory
from emberfs.metaserver.fs import access, dirlayout, lookup
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.proto import common_pb2, meta_pb2


def set_layout(op: OpContext, req: meta_pb2.SetLayoutRequest) -> meta_pb2.SetLayoutResponse:
    """Set (or with chunk size 0 clear) the layout of a directory; owner or uid 0 only."""
    dirlayout.validate_dir_layout(req.layout, op.env.chain_table())
    attr = lookup.resolve(op, req.path, follow=True).require(req.path)
    if attr.type != common_pb2.DIRECTORY:
        raise NotADirectory(f"not a directory: {req.path}")
    access.check_owner(attr, op.creds, "change the layout")
    attr.layout.CopyFrom(dirlayout.dir_layout(req.layout))
    attr.ctime_ns = op.now
    op.put_inode(attr)
    return meta_pb2.SetLayoutResponse(attr=attr)
