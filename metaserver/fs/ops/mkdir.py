"""Mkdir: one directory, or a whole missing path with ``parents``."""

from __future__ import annotations

from emberfs.common import paths
from emberfs.common.errors import AlreadyExists, NotADirectory
from emberfs.metaserver.fs import dirlayout, lookup
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.fs.ops import create
from emberfs.proto import common_pb2, meta_pb2


def mkdir(op: OpContext, req: meta_pb2.MkdirRequest) -> meta_pb2.MkdirResponse:
    """Make a directory.

    Without ``parents`` the parent must exist and the name must be free
    (AlreadyExists otherwise). With ``parents`` missing directories on the
    way are made (with the same mode) and an existing directory at the path
    is returned as is. A layout with a chunk size applies to the last
    directory only, validated like SetLayout.
    """
    if req.layout.ByteSize():
        dirlayout.validate_dir_layout(req.layout, op.env.chain_table())
    if not req.parents:
        return meta_pb2.MkdirResponse(attr=_make(op, req.path, req.mode, req.layout))
    parts = paths.split_path(req.path)
    attr = None
    for depth in range(1, len(parts) + 1):
        sub = paths.join(parts[:depth])
        found = lookup.resolve(op, sub, follow=True)
        if found.attr is not None:
            if found.attr.type != common_pb2.DIRECTORY:
                raise NotADirectory(f"not a directory: {sub}")
            attr = found.attr
            continue
        last = depth == len(parts)
        attr = _insert(op, found, req.mode, req.layout if last else common_pb2.Layout())
    if attr is None:  # the root
        attr = lookup.root(op)
    return meta_pb2.MkdirResponse(attr=attr)


def _make(
    op: OpContext, path: str, mode: int, new_layout: common_pb2.Layout
) -> common_pb2.InodeAttr:
    found = lookup.resolve(op, path, follow=False)
    if found.attr is not None:
        raise AlreadyExists(f"file exists: {path or '/'}")
    return _insert(op, found, mode, new_layout)


def _insert(
    op: OpContext, found: lookup.Resolved, mode: int, new_layout: common_pb2.Layout
) -> common_pb2.InodeAttr:
    name = found.require_entry("")
    attr = create.insert(op, found.parents, name, common_pb2.DIRECTORY, mode)
    attr.layout.CopyFrom(dirlayout.dir_layout(new_layout))
    op.put_inode(attr)
    return attr
