"""Remove: unlink a file or symlink, remove a directory, or a whole tree at once.

Dropping the last link of a file queues its chunks for garbage collection
in the same transaction, unless a write session still holds the file: then
the inode stays (with nlink 0, visible by id only) and the last Close queues
it. A recursive remove walks the tree inside the one transaction, so it
either removes everything or nothing, and reads every directory's entry
guard, so an entry created in the tree meanwhile makes it retry.
"""

from __future__ import annotations

from emberfs.common.errors import NotADirectory, NotEmpty
from emberfs.metaserver import access, lookup
from emberfs.metaserver.opcontext import OpContext
from emberfs.proto import common_pb2, meta_pb2


def discard(op: OpContext, attr: common_pb2.InodeAttr) -> None:
    """Delete an inode that nothing refers to any more (queueing a file's chunks for GC)."""
    if attr.type == common_pb2.FILE:
        op.queue_gc(attr)
    op.delete_inode(attr)


def drop_link(op: OpContext, attr: common_pb2.InodeAttr) -> None:
    """Account for one removed entry of ``attr`` (the entry itself is deleted by the caller)."""
    if attr.type == common_pb2.DIRECTORY:
        op.delete_inode(attr)
        return
    attr.nlink = max(attr.nlink, 1) - 1
    attr.ctime_ns = op.now
    if attr.nlink == 0 and not (attr.type == common_pb2.FILE and op.sessions_of(attr.inode)):
        discard(op, attr)
    else:
        op.put_inode(attr)


def remove(op: OpContext, req: meta_pb2.RemoveRequest) -> meta_pb2.RemoveResponse:
    """Remove the entry at ``req.path`` (a final symlink itself, never its target).

    Directories go only when empty (NotEmpty otherwise) unless ``recursive``;
    ``directory`` refuses anything but a directory (NotADirectory). The root
    cannot be removed (Busy). Returns the number of entries removed.
    """
    found = lookup.resolve_parent(op, req.path)
    attr = found.require(req.path)
    parent = found.parent
    access.check(parent, op.creds, access.WRITE | access.SEARCH, req.path)
    access.check_sticky(parent, attr, op.creds)
    if attr.type == common_pb2.DIRECTORY:
        if req.recursive:
            removed = _remove_tree(op, attr)
        elif not op.is_empty_dir(attr.inode):
            raise NotEmpty(f"directory not empty: {req.path}")
        else:
            op.delete_inode(attr)
            removed = 1
    else:
        if req.directory:
            raise NotADirectory(f"not a directory: {req.path}")
        drop_link(op, attr)
        removed = 1
    op.delete_dentry(parent.inode, found.name)
    return meta_pb2.RemoveResponse(removed=removed)


def _remove_tree(op: OpContext, top: common_pb2.InodeAttr) -> int:
    """Remove a directory and everything below it; returns the number of entries removed."""
    removed = 0
    pending = [top]
    while pending:
        directory = pending.pop()
        access.check(directory, op.creds, access.READ | access.WRITE | access.SEARCH)
        op.is_empty_dir(directory.inode)  # reads the entry guard
        for name, entry in list(op.entries(directory.inode)):
            child = op.load_inode(entry.inode)
            access.check_sticky(directory, child, op.creds)
            if child.type == common_pb2.DIRECTORY:
                pending.append(child)
            else:
                drop_link(op, child)
                removed += 1
            op.delete_dentry(directory.inode, name)
        op.delete_inode(directory)
        removed += 1
    return removed
