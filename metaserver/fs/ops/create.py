"""Creating entries: the shared insert step, and Create for regular files.

A new entry needs write and search permission on its parent directory. Its
owner is the caller; its group is the caller's gid, or the parent's gid when
the parent has the set-group-id bit (which new directories then inherit).
A mode of 0 means the usual default (0o644 for files, 0o755 for
directories); the client applies its umask before sending.
"""

from __future__ import annotations

import stat

from emberfs.common.errors import AlreadyExists, IsADirectory
from emberfs.metaserver.fs import access, dataversion, dirlayout, lookup, quota
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.proto import common_pb2, meta_pb2

DEFAULT_FILE_MODE = 0o644
DEFAULT_DIR_MODE = 0o755


def insert(
    op: OpContext,
    parents: list[common_pb2.InodeAttr],
    name: str,
    file_type: int,
    mode: int,
    count_quota: bool = True,
) -> common_pb2.InodeAttr:
    """Create a new inode of ``file_type`` as entry ``name`` of ``parents[-1]``.

    The caller has checked that the entry does not exist. Files get their
    layout here (which may raise Unavailable); the caller fills in anything
    else (directory layout, symlink target) before the inode is stored.
    ``count_quota`` False: the caller counts the new inode in its quotas itself.
    """
    parent = parents[-1]
    access.check(parent, op.creds, access.WRITE | access.SEARCH, name)
    if file_type == common_pb2.FILE:
        chosen = dirlayout.file_layout(op, parents)
    if mode == 0:
        mode = DEFAULT_DIR_MODE if file_type == common_pb2.DIRECTORY else DEFAULT_FILE_MODE
    attr = op.new_inode(file_type, mode)
    quota.inserted(op, parent, attr, count_quota)
    if parent.mode & stat.S_ISGID:
        attr.gid = parent.gid
        if file_type == common_pb2.DIRECTORY:
            attr.mode |= stat.S_ISGID
    elif attr.mode & stat.S_ISGID and not op.creds.is_root and not op.creds.in_group(attr.gid):
        attr.mode &= ~stat.S_ISGID
    if file_type == common_pb2.FILE:
        attr.layout.CopyFrom(chosen)
        dataversion.changed(attr, op.now)
    elif file_type == common_pb2.DIRECTORY:
        attr.nlink = 2
    op.put_dentry(parent.inode, name, attr)
    return attr


def create_file(
    op: OpContext, path: str, mode: int, exclusive: bool, count_quota: bool = True
) -> tuple[common_pb2.InodeAttr, bool]:
    """The file at ``path``, created when missing: (attr, created).

    A final symlink is followed (a dangling one creates its target), except
    that ``exclusive`` fails with AlreadyExists when anything, a symlink
    included, has the name. An existing directory gives IsADirectory.
    """
    if exclusive:
        found = lookup.resolve(op, path, follow=False)
        if found.attr is not None:
            raise AlreadyExists(f"file exists: {path}")
    else:
        found = lookup.resolve(op, path, follow=True)
    if found.attr is not None:
        if found.attr.type == common_pb2.DIRECTORY:
            raise IsADirectory(f"is a directory: {path}")
        return found.attr, False
    name = found.require_entry(path)
    attr = insert(op, found.parents, name, common_pb2.FILE, mode, count_quota)
    op.put_inode(attr)
    return attr, True


def create(op: OpContext, req: meta_pb2.CreateRequest) -> meta_pb2.CreateResponse:
    """Create a regular file; a non-exclusive create of an existing file returns it unchanged."""
    attr, _ = create_file(op, req.path, req.mode, req.exclusive)
    return meta_pb2.CreateResponse(attr=attr)
