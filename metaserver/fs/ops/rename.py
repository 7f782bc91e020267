"""Rename: move an entry atomically, replacing the destination like rename(2)."""

from __future__ import annotations

from emberfs.common.errors import (
    AlreadyExists,
    InvalidArgument,
    IsADirectory,
    NotADirectory,
    NotEmpty,
)
from emberfs.metaserver.fs import access, lookup, quota
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.fs.ops import remove, trash
from emberfs.proto import common_pb2, meta_pb2


def rename(op: OpContext, req: meta_pb2.RenameRequest) -> meta_pb2.RenameResponse:
    """Move the entry ``src`` to ``dst`` in one transaction.

    Neither final symlink is followed. Both parents need write and search
    permission (and the sticky-bit rule). Renaming onto itself (or onto
    another link of the same inode) changes nothing. An existing ``dst`` is
    replaced when the types agree: a file (or symlink) replaces a file, a
    directory replaces an empty directory (NotEmpty otherwise); a directory
    over a file gives NotADirectory, a file over a directory IsADirectory,
    and ``no_replace`` gives AlreadyExists. With a trash, a replaced file or
    symlink (its last link) is kept there (:mod:`.trash`) unless ``skip_trash``
    asks to delete it as without a trash. A directory cannot move into its
    own subtree (InvalidArgument); the root cannot move at all (Busy).

    With ``exchange`` both names must exist and they swap (renameat2's
    RENAME_EXCHANGE), whatever their types: one transaction, so a reader
    sees either both old entries or both new ones. Neither may be an
    ancestor of the other.
    """
    src = lookup.resolve_parent(op, req.src)
    attr = src.require(req.src)
    dst = lookup.resolve_parent(op, req.dst)
    src_parent, dst_parent = src.parent, dst.parent
    access.check(src_parent, op.creds, access.WRITE | access.SEARCH, req.src)
    access.check_sticky(src_parent, attr, op.creds)
    access.check(dst_parent, op.creds, access.WRITE | access.SEARCH, req.dst)
    if src_parent.inode == dst_parent.inode and src.name == dst.name:
        return meta_pb2.RenameResponse(attr=attr)
    is_dir = attr.type == common_pb2.DIRECTORY
    if is_dir and any(a.inode == attr.inode for a in dst.parents):
        raise InvalidArgument(f"cannot move {req.src} into its own subtree {req.dst}")
    target = dst.attr
    if req.exchange:
        return exchange(op, src, dst, attr, req)
    if target is not None:
        if target.inode == attr.inode:
            return meta_pb2.RenameResponse(attr=attr)
        if req.no_replace:
            raise AlreadyExists(f"file exists: {req.dst}")
        access.check_sticky(dst_parent, target, op.creds)
        target_is_dir = target.type == common_pb2.DIRECTORY
        if is_dir and not target_is_dir:
            raise NotADirectory(f"not a directory: {req.dst}")
        if not is_dir and target_is_dir:
            raise IsADirectory(f"is a directory: {req.dst}")
        if target_is_dir and not op.is_empty_dir(target.inode):
            raise NotEmpty(f"directory not empty: {req.dst}")
        keep = trash.enabled(op) and not req.skip_trash
        if keep and not target_is_dir and target.nlink <= 1:
            trash.keep(op, target, req.dst)  # the replaced file waits in the trash
        else:
            remove.drop_link(op, target)
    quota.moved(op, attr, quota.realm_below(dst_parent), req.src)
    if is_dir:
        quota.renamed(op, req.src, req.dst)
    op.delete_dentry(src_parent.inode, src.name)
    op.put_dentry(dst_parent.inode, dst.name, attr)
    attr.ctime_ns = op.now
    op.put_inode(attr)
    return meta_pb2.RenameResponse(attr=attr)


def exchange(op: OpContext, src, dst, attr, req: meta_pb2.RenameRequest) -> meta_pb2.RenameResponse:
    """Swap the entries ``src`` and ``dst`` of :func:`rename` (both checked for access)."""
    target = dst.require(req.dst)
    if req.no_replace:
        raise InvalidArgument("exchange and no_replace exclude each other")
    if target.inode == attr.inode:
        return meta_pb2.RenameResponse(attr=attr)
    access.check_sticky(dst.parent, target, op.creds)
    if target.type == common_pb2.DIRECTORY and any(a.inode == target.inode for a in src.parents):
        raise InvalidArgument(f"cannot move {req.dst} into its own subtree {req.src}")
    quota.same_realm(quota.realm_below(src.parent), quota.realm_below(dst.parent), req.dst)
    if common_pb2.DIRECTORY in (attr.type, target.type):
        quota.renamed(op, req.src, req.dst, swapped=True)
    op.put_dentry(src.parent.inode, src.name, target)
    op.put_dentry(dst.parent.inode, dst.name, attr)
    for moved in (attr, target):
        moved.ctime_ns = op.now
        op.put_inode(moved)
    return meta_pb2.RenameResponse(attr=attr)
