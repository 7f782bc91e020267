"""The trash: removed entries kept for ``--trash-days``, restorable whole, then purged.

With a trash (``NamespaceEnv.trash_days`` above 0) a removal that would drop
the last link of a file or symlink, or remove a directory (empty, or a whole
tree with ``recursive``), keeps the inode instead: the entry leaves its parent
and a ``RBIN`` record (:func:`keep`) remembers the inode, the path it had,
the time and the uid of the remover, in the same transaction. A tree keeps
all its entries below its top directory, so it comes back whole with one
:func:`restore`. The trash is outside the namespace: no path reaches it, a
listing of ``/`` never shows it, and only the remover (or root) lists,
restores or purges an entry.

Removing one link of a file that has others only drops that link (nothing
is lost, so nothing is kept). A rename that replaces a file or symlink keeps
the replaced one (a replaced directory is empty and goes). A remove by inode
(a writer taking back a file it created) deletes as without a trash, and so
does a remove or rename that asks for it (``skip_trash``: anyone may, for the
removals their permissions allow; the client's own replaced checkpoints and
temporary files do).

:func:`purge` deletes entries for real: a file's chunks are queued for
garbage collection as by any remove (unless a write session still holds it);
a directory is detached (:func:`emberfs.metaserver.fs.ops.remove.detach_tree`'s
record) and deleted in slices in the background. The metaserver purges the
entries older than ``trash_days`` itself (:func:`expired`).
"""

from __future__ import annotations

import json

from emberfs.common import paths
from emberfs.common.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from emberfs.metaserver.fs import access, lookup, quota
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2, meta_pb2

NS_PER_DAY = 86400 * 10**9
PURGE_SLICE = 1000  # entries purged in one transaction where the store sets no bound
PURGE_OPS = 16  # store operations one purged entry may take


def enabled(op: OpContext) -> bool:
    """True when removals go to the trash."""
    return op.env.trash_days > 0


def keep(op: OpContext, attr: common_pb2.InodeAttr, path: str, entries: int = 1) -> None:
    """Record ``attr`` (whose entry at ``path`` the caller deletes) as a trash entry."""
    record = {
        "path": paths.join(paths.split_path(path)),
        "uid": op.creds.uid,
        "removed_ns": op.now,
        "type": attr.type,
        "entries": entries,
    }
    op.txn.put(keys.recycled_key(attr.inode), json.dumps(record).encode())


def _entry(inode: int, raw: bytes) -> meta_pb2.TrashEntry:
    record = json.loads(raw)
    return meta_pb2.TrashEntry(
        entry=inode,
        path=record["path"],
        uid=record["uid"],
        removed_ns=record["removed_ns"],
        type=record["type"],
        entries=record["entries"],
    )


def _visible_to(op: OpContext, entry: meta_pb2.TrashEntry) -> bool:
    return op.creds.is_root or entry.uid == op.creds.uid


def _stored(op: OpContext):
    for key, raw in op.txn.scan_prefix(keys.RECYCLED):
        yield _entry(keys.recycled_inode(key), raw)


def list_entries(op: OpContext, req: meta_pb2.TrashListRequest) -> meta_pb2.TrashListResponse:
    """The caller's trash entries, oldest first; root may ask for ``user``'s or all users'."""
    if (req.all_users or req.HasField("user")) and not op.creds.is_root:
        if req.all_users or req.user != op.creds.uid:
            raise PermissionDenied("only root lists another user's trash")
    found = [
        e
        for e in _stored(op)
        if req.all_users or e.uid == (req.user if req.HasField("user") else op.creds.uid)
    ]
    found.sort(key=lambda e: (e.removed_ns, e.entry))
    return meta_pb2.TrashListResponse(entries=found)


def _chosen(op: OpContext, ids, every: bool) -> list[meta_pb2.TrashEntry]:
    """The entries ``ids`` (NotFound for one that is not the caller's), or all the caller's."""
    if every == bool(ids):
        raise InvalidArgument("name entries or ask for all of them, not both or neither")
    if every:
        return [e for e in _stored(op) if e.uid == op.creds.uid]
    chosen = []
    for inode in ids:
        raw = op.txn.get(keys.recycled_key(inode))
        entry = None if raw is None else _entry(inode, raw)
        if entry is None or not _visible_to(op, entry):
            raise NotFound(f"no trash entry {inode}")
        chosen.append(entry)
    return chosen


def restore(op: OpContext, req: meta_pb2.TrashRestoreRequest) -> meta_pb2.TrashRestoreResponse:
    """Put entries back where they were (or at ``to``); returns them with the paths they got.

    A name that exists gives AlreadyExists and restores nothing; a parent
    directory that is gone gives NotFound (``to`` picks another place).
    """
    chosen = _chosen(op, list(req.entries), req.all)
    if req.to and (req.all or len(chosen) != 1):
        raise InvalidArgument("a restore to another path takes exactly one entry")
    out = meta_pb2.TrashRestoreResponse()
    chosen.sort(key=lambda e: (e.path.count("/"), e.removed_ns))  # a directory before its files
    for entry in chosen:
        where = req.to or entry.path
        try:
            found = lookup.resolve_parent(op, where)
        except NotFound:
            raise NotFound(
                f"cannot restore entry {entry.entry} to {where}: its parent directory is gone "
                "(restore it to another path)"
            ) from None
        if found.attr is not None:
            raise AlreadyExists(f"cannot restore entry {entry.entry}: {where} exists")
        access.check(found.parent, op.creds, access.WRITE | access.SEARCH, where)
        attr = op.load_inode(entry.entry)
        quota.moved(op, attr, quota.realm_below(found.parent), where)
        if attr.type == common_pb2.DIRECTORY:
            quota.renamed(op, entry.path, where)
        attr.ctime_ns = op.now
        op.put_inode(attr)
        op.put_dentry(found.parent.inode, found.name, attr)
        op.txn.delete(keys.recycled_key(entry.entry))
        restored = out.restored.add()
        restored.CopyFrom(entry)
        restored.path = paths.join(paths.split_path(where))
    return out


def discard_entry(op: OpContext, entry: meta_pb2.TrashEntry) -> None:
    """Delete a trash entry for real (its chunks queued for GC, a tree detached)."""
    from emberfs.metaserver.fs.ops import remove

    op.txn.delete(keys.recycled_key(entry.entry))
    attr = op.get_inode(entry.entry)
    if attr is None:
        return
    if attr.type == common_pb2.DIRECTORY:
        if op.is_empty_dir(attr.inode):
            op.delete_inode(attr)
        else:
            op.txn.put(keys.trash_key(attr.inode), b"")
            op.detached.append(attr.inode)
    else:
        remove.drop_link(op, attr)


def purge(op: OpContext, req: meta_pb2.TrashPurgeRequest) -> meta_pb2.TrashPurgeResponse:
    """Delete entries for real: ``entries``, or ``all`` the caller's, each removed before
    ``before_ns`` when that is set; returns how many were purged."""
    chosen = _chosen(op, list(req.entries), req.all)
    if req.before_ns:
        chosen = [e for e in chosen if e.removed_ns < req.before_ns]
    more = req.all and len(chosen) > slice_size(op)
    if more:
        chosen = chosen[: slice_size(op)]
    for entry in chosen:
        discard_entry(op, entry)
    return meta_pb2.TrashPurgeResponse(purged=len(chosen), more=more)


def slice_size(op: OpContext) -> int:
    """How many entries one transaction purges (a store may bound its transactions)."""
    bound = op.txn.engine.max_txn_ops
    return PURGE_SLICE if bound is None else max(1, bound // PURGE_OPS)


def expired(op: OpContext) -> list[meta_pb2.TrashEntry]:
    """Purge the oldest entries older than ``trash_days`` that fit one transaction (the
    metaserver's sweep); the entries purged."""
    before = op.now - int(op.env.trash_days * NS_PER_DAY)
    old = [e for e in _stored(op) if e.removed_ns < before]
    old.sort(key=lambda e: e.removed_ns)
    old = old[: slice_size(op)]
    for entry in old:
        discard_entry(op, entry)
    return old
