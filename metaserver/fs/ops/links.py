"""Symlink, Readlink and Hardlink."""

from __future__ import annotations

from emberfs.common.errors import AlreadyExists, InvalidArgument, NotPermitted
from emberfs.metaserver.fs import access, lookup, quota
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.fs.ops import create
from emberfs.proto import common_pb2, meta_pb2

MAX_LINKS = 65000


def symlink(op: OpContext, req: meta_pb2.SymlinkRequest) -> meta_pb2.SymlinkResponse:
    """Make a symlink at ``path`` pointing to ``target`` (stored as given, not checked)."""
    lookup.validate_symlink_target(req.target)
    found = lookup.resolve_parent(op, req.path)
    if found.attr is not None:
        raise AlreadyExists(f"file exists: {req.path}")
    attr = create.insert(op, found.parents, found.name, common_pb2.SYMLINK, 0o777)
    attr.symlink_target = req.target
    attr.size = len(req.target.encode("utf-8", "surrogateescape"))
    op.put_inode(attr)
    return meta_pb2.SymlinkResponse(attr=attr)


def readlink(op: OpContext, req: meta_pb2.ReadlinkRequest) -> meta_pb2.ReadlinkResponse:
    """The target of the symlink at ``path`` (InvalidArgument for anything else)."""
    attr = lookup.resolve(op, req.path, follow=False).require(req.path)
    if attr.type != common_pb2.SYMLINK:
        raise InvalidArgument(f"not a symlink: {req.path}")
    return meta_pb2.ReadlinkResponse(target=attr.symlink_target)


def hardlink(op: OpContext, req: meta_pb2.HardlinkRequest) -> meta_pb2.HardlinkResponse:
    """Add the entry ``dst`` for the inode at ``src`` (a final symlink is not followed).

    Directories cannot be linked (NotPermitted); an existing ``dst`` gives
    AlreadyExists. The inode's nlink grows by one.
    """
    attr = lookup.resolve(op, req.src, follow=False).require(req.src)
    if attr.type == common_pb2.DIRECTORY:
        raise NotPermitted(f"cannot hard-link a directory: {req.src}")
    if attr.nlink >= MAX_LINKS:
        raise NotPermitted(f"too many links to {req.src}")
    found = lookup.resolve_parent(op, req.dst)
    if found.attr is not None:
        raise AlreadyExists(f"file exists: {req.dst}")
    access.check(found.parent, op.creds, access.WRITE | access.SEARCH, req.dst)
    quota.same_realm(attr.quota_realm, quota.realm_below(found.parent), req.dst)
    attr.nlink += 1
    attr.ctime_ns = op.now
    op.put_dentry(found.parent.inode, found.name, attr)
    op.put_inode(attr)
    return meta_pb2.HardlinkResponse(attr=attr)
