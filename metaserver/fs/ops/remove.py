"""Remove: unlink a file or symlink, remove a directory, or a whole tree at once.

Dropping the last link of a file queues its chunks for garbage collection
in the same transaction, unless a write session still holds the file: then
the inode stays (with nlink 0, visible by id only) and the last Close queues
it. A recursive remove walks the tree inside the one transaction, so it
either removes everything or nothing, and reads every directory's entry
guard, so an entry created in the tree meanwhile makes it retry.

A store that bounds its transactions (etcd) cannot take a large tree in one:
once the walk would exceed the bound, the remove *detaches* the tree instead.
In one transaction it checks permissions over the whole tree, deletes the
tree's entry from its parent and records the tree's directory under
``TRSH`` (:func:`detach_tree`): the tree is gone from the namespace at once,
atomically, and the answer counts every entry in it. Its entries are then
deleted in slices that each fit a transaction (:func:`purge_slice`), bottom
up, files' chunks queued for GC as in any remove, until the directory itself
goes with its record. Nothing can reach a detached tree by path; operations
by inode (a writer's Sync and Close) conflict with a slice like any other.
A metaserver that dies between slices leaves the record, and the leader's
sweep finishes the tree. (An entry created in the tree while the detaching
remove walked it is detached with the tree without its own permission check.)
"""

from __future__ import annotations

import stat

from emberfs.common.errors import NotADirectory, NotEmpty, NotFound
from emberfs.metaserver.fs import access, lookup, records
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.fs.ops import trash
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import TransactionTooLarge
from emberfs.proto import common_pb2, meta_pb2

SLICE_MARGIN = 16  # reads and writes a slice keeps below the store's limit


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
    cannot be removed (Busy). A non-zero ``inode`` removes the entry only
    while it names that inode (NotFound otherwise): a writer taking back a
    file it created never removes one that replaced it. With a trash, what
    the removal takes is kept there unless ``skip_trash`` (or ``inode``) asks
    to delete it as without a trash. Returns the number of entries removed.
    """
    found = lookup.resolve_parent(op, req.path)
    attr = found.require(req.path)
    if req.inode and attr.inode != req.inode:
        raise NotFound(f"{req.path} names another file than inode {req.inode}")
    parent = found.parent
    access.check(parent, op.creds, access.WRITE | access.SEARCH, req.path)
    access.check_sticky(parent, attr, op.creds)
    keep = trash.enabled(op) and not req.inode and not req.skip_trash
    if attr.type == common_pb2.DIRECTORY:
        if req.recursive:
            if keep:
                removed = check_tree(op, attr)
                trash.keep(op, attr, req.path, removed)
            else:
                removed = _remove_tree_or_detach(op, attr)
        elif not op.is_empty_dir(attr.inode):
            raise NotEmpty(f"directory not empty: {req.path}")
        else:
            if keep:
                trash.keep(op, attr, req.path)
            else:
                op.delete_inode(attr)
            removed = 1
    else:
        if req.directory:
            raise NotADirectory(f"not a directory: {req.path}")
        if keep and attr.nlink <= 1:
            trash.keep(op, attr, req.path)
        else:
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


def _remove_tree_or_detach(op: OpContext, top: common_pb2.InodeAttr) -> int:
    """:func:`_remove_tree` in this transaction, or :func:`detach_tree` when it would not fit."""
    if op.txn.engine.max_txn_ops is None:
        return _remove_tree(op, top)
    saved = op.txn.savepoint()
    delta, gc, cuts = dict(op.delta), list(op.gc_queued), list(op.cuts)
    try:
        return _remove_tree(op, top)
    except TransactionTooLarge:
        op.txn.rollback(saved)
        op.delta, op.gc_queued, op.cuts = delta, gc, cuts
        return detach_tree(op, top)


def detach_tree(op: OpContext, top: common_pb2.InodeAttr) -> int:
    """Check that the caller may remove the tree under ``top``, record it as detached; its size.

    The caller deletes ``top``'s entry in the same transaction.
    """
    removed = check_tree(op, top)
    op.txn.put(keys.trash_key(top.inode), b"")
    op.detached.append(top.inode)
    return removed


def check_tree(op: OpContext, top: common_pb2.InodeAttr) -> int:
    """Check that the caller may remove the tree under ``top``; the entries in it.

    The walk reads directories (and, in sticky ones, their entries' inodes)
    without adding them to the read set, so the transaction stays small
    however large the tree.
    """
    removed = 1
    pending = [top]
    while pending:
        directory = pending.pop()
        access.check(directory, op.creds, access.READ | access.WRITE | access.SEARCH)
        sticky = bool(directory.mode & stat.S_ISVTX) and not op.creds.is_root
        for _, entry in op.entries(directory.inode):
            removed += 1
            if entry.type != common_pb2.DIRECTORY and not sticky:
                continue
            raw = op.txn.peek(keys.inode_key(entry.inode))
            if raw is None:
                continue
            child = records.decode_inode(raw)
            access.check_sticky(directory, child, op.creds)
            if child.type == common_pb2.DIRECTORY:
                pending.append(child)
    return removed


def purge_slice(op: OpContext, top: int) -> bool:
    """Delete as much of the detached tree ``top`` as fits one transaction; True once it is gone.

    Depth first: files and symlinks go with their entries (a file's last link
    queues its chunks, unless a write session holds it), then every directory
    found empty, and last ``top`` itself with its ``TRSH`` record.
    """
    if op.txn.get(keys.trash_key(top)) is None:
        return True
    limit = (op.txn.engine.max_txn_ops or 1 << 30) - SLICE_MARGIN

    def full() -> bool:
        reads, writes = op.txn.size
        return reads >= limit or writes >= limit

    root = op.get_inode(top)
    if root is None:  # the directory itself went already: only the record is left
        op.txn.delete(keys.trash_key(top))
        return True
    stack: list[tuple[common_pb2.InodeAttr, str | None]] = [(root, None)]
    while not full():
        directory, name_in_parent = stack[-1]
        descended = False
        for name, entry in list(op.entries(directory.inode, limit=limit)):
            if full():
                return False
            child = op.get_inode(entry.inode)
            if child is None:  # an entry that names nothing
                op.delete_dentry(directory.inode, name)
            elif child.type == common_pb2.DIRECTORY:
                stack.append((child, name))
                descended = True
                break
            else:
                drop_link(op, child)
                op.delete_dentry(directory.inode, name)
        if descended or full():
            continue
        if not op.is_empty_dir(directory.inode):
            continue  # more entries than one page held: the next page
        stack.pop()
        op.delete_inode(directory)
        if not stack:
            op.txn.delete(keys.trash_key(top))
            return True
        op.delete_dentry(stack[-1][0].inode, name_in_parent)
    return False
