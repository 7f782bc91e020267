"""QuotaSet, QuotaGet, QuotaList, QuotaRemove and QuotaReserve (:mod:`emberfs.metaserver.fs.quota`).

Setting a quota on a directory that has none counts its subtree in the same
transaction: every inode below it, down to the next quota directory, is
relabelled into the new realm, and a nested quota's usage is taken whole.
Removing a quota relabels them into the realm above (the entries in the trash
and the trees being deleted that still name it included), so usage above
stays exact. Both walk the subtree once; on a store that bounds its
transactions (etcd) a subtree too large for one fails with a clear error and
changes nothing.

Only root (the admin token) sets and removes quotas; anyone may read them.
A limit below the current usage is applied as asked: nothing is removed,
and every growth is refused until usage drops below it (the answer's
``over`` tells).
"""

from __future__ import annotations

from emberfs.common import paths
from emberfs.common.errors import InvalidArgument, NotADirectory, NotFound, PermissionDenied
from emberfs.metaserver.fs import access, lookup, quota
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.fs.ops import sessions
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2, meta_pb2

MAX_LIMIT = (1 << 63) - 1


def _directory(op: OpContext, path: str) -> common_pb2.InodeAttr:
    attr = lookup.resolve(op, path, follow=True).require(path)
    if attr.type != common_pb2.DIRECTORY:
        raise NotADirectory(f"not a directory: {path}")
    return attr


def _root_only(op: OpContext, what: str) -> None:
    if not op.creds.is_root:
        raise PermissionDenied(f"only root {what} quotas")


def info(op: OpContext, q: quota.Quota) -> meta_pb2.QuotaInfo:
    used_bytes, used_inodes = quota.usage(op, q.directory)
    return meta_pb2.QuotaInfo(
        path=q.path,
        inode=q.directory,
        max_bytes=q.max_bytes,
        max_inodes=q.max_inodes,
        used_bytes=max(used_bytes, 0),
        used_inodes=max(used_inodes, 0),
    )


def relabel(op: OpContext, top: int, old: int, new: int) -> tuple[int, int]:
    """Move every inode below directory ``top`` that is in realm ``old`` into realm ``new``
    (nested quotas are re-parented, not entered); their (bytes, inodes)."""
    total_bytes = total_inodes = 0
    stack = [top]
    while stack:
        for _, entry in list(op.entries(stack.pop())):
            b, i = _relabel_one(op, op.load_inode(entry.inode), old, new, stack)
            total_bytes += b
            total_inodes += i
    return total_bytes, total_inodes


def _relabel_one(
    op: OpContext, attr: common_pb2.InodeAttr, old: int, new: int, stack: list[int]
) -> tuple[int, int]:
    if attr.quota_realm != old:
        return 0, 0  # another link of a file met already
    attr.quota_realm = new
    if not new:
        attr.quota_charged = 0
    elif not old:
        attr.quota_charged = quota.file_bytes(attr)
    op.put_inode(attr)
    if attr.has_quota:
        q = quota.get(op, attr.inode)
        if q is not None:
            q.parent = new
            quota.put(op, q)
        used_bytes, used_inodes = quota.usage(op, attr.inode)
        return attr.quota_charged + used_bytes, 1 + used_inodes
    if attr.type == common_pb2.DIRECTORY:
        stack.append(attr.inode)
    return attr.quota_charged, 1


def _limit(value: int, what: str) -> int:
    if value > MAX_LIMIT:
        raise InvalidArgument(f"{what} limit {value} is too large")
    return value


def set_quota(op: OpContext, req: meta_pb2.QuotaSetRequest) -> meta_pb2.QuotaSetResponse:
    """Set or change the limits of ``path``'s quota (a new one counts its subtree first)."""
    _root_only(op, "sets")
    attr = _directory(op, req.path)
    q = quota.get(op, attr.inode) if attr.has_quota else None
    if q is None:
        q = quota.Quota(attr.inode, 0, 0, attr.quota_realm, paths.join(paths.split_path(req.path)))
        used_bytes, used_inodes = relabel(op, attr.inode, attr.quota_realm, attr.inode)
        quota.set_usage(op, attr.inode, used_bytes, used_inodes)
        attr.has_quota = True
        attr.ctime_ns = op.now
        op.put_inode(attr)
    if req.HasField("max_bytes"):
        q.max_bytes = _limit(req.max_bytes, "byte")
    if req.HasField("max_inodes"):
        q.max_inodes = _limit(req.max_inodes, "inode")
    quota.put(op, q)
    shown = info(op, q)
    over = bool(
        (q.max_bytes and shown.used_bytes > q.max_bytes)
        or (q.max_inodes and shown.used_inodes > q.max_inodes)
    )
    return meta_pb2.QuotaSetResponse(quota=shown, over=over)


def get_quota(op: OpContext, req: meta_pb2.QuotaGetRequest) -> meta_pb2.QuotaInfo:
    """The quota of directory ``path`` (NotFound when it has none)."""
    attr = _directory(op, req.path)
    access.check(attr, op.creds, access.SEARCH, req.path)
    q = quota.get(op, attr.inode) if attr.has_quota else None
    if q is None:
        raise NotFound("no quota on this directory")
    return info(op, q)


def list_quotas(op: OpContext, req: meta_pb2.QuotaListRequest) -> meta_pb2.QuotaListResponse:
    """Every quota, by path; for a caller other than root, those on directories it may search
    (as :func:`get_quota` asks)."""
    shown = [q for q in quota.stored(op) if op.creds.is_root or _searchable(op, q.directory)]
    found = sorted((info(op, q) for q in shown), key=lambda i: (i.path, i.inode))
    return meta_pb2.QuotaListResponse(quotas=found)


def _searchable(op: OpContext, directory: int) -> bool:
    attr = op.get_inode(directory)
    return attr is not None and access.allowed(attr, op.creds, access.SEARCH)


def remove_quota(op: OpContext, req: meta_pb2.QuotaRemoveRequest) -> meta_pb2.QuotaRemoveResponse:
    """Remove ``path``'s quota; what it counted moves to the realm above."""
    _root_only(op, "removes")
    attr = _directory(op, req.path)
    q = quota.get(op, attr.inode) if attr.has_quota else None
    if q is None:
        raise NotFound("no quota on this directory")
    shown = info(op, q)
    relabel(op, attr.inode, attr.inode, attr.quota_realm)
    stack: list[int] = []
    for prefix, inode_of in ((keys.RECYCLED, keys.recycled_inode), (keys.TRASH, keys.trash_inode)):
        for key, _ in list(op.txn.scan_prefix(prefix)):
            kept = op.get_inode(inode_of(key))
            if kept is not None:
                _relabel_one(op, kept, attr.inode, attr.quota_realm, stack)
    while stack:
        relabel(op, stack.pop(), attr.inode, attr.quota_realm)
    quota.forget(op, attr)
    attr.ctime_ns = op.now
    op.put_inode(attr)
    return meta_pb2.QuotaRemoveResponse(quota=shown)


def reserve(op: OpContext, req: meta_pb2.QuotaReserveRequest) -> meta_pb2.QuotaReserveResponse:
    """Reserve room in the file's quotas for its write session's writes up to ``end``.

    Its commit does not wait for the WAL sync (a write in flight would wait on the disk's
    flush): a reservation is a promise to one writer, whose bytes count with its Sync or
    Close, which are synced and check the limits again past what is reserved. A crash of the
    machine that loses it loses the usage and the file's charge together (one transaction).
    """
    sessions.validate_length(req.end)
    attr = sessions.session_file(op, req.inode, req.session_id)
    quota.grant(op, attr, req.end)
    op.put_inode(attr)
    return meta_pb2.QuotaReserveResponse(attr=attr)


def statfs_quota(op: OpContext, path: str) -> tuple[quota.Quota, int, int] | None:
    """The nearest quota with a limit over ``path``, with its (bytes, inodes) used."""
    attr = lookup.resolve(op, path, follow=True).require(path)
    for q in quota.chain(op, quota.realm_below(attr)):
        if q.max_bytes or q.max_inodes:
            used_bytes, used_inodes = quota.usage(op, q.directory)
            return q, max(used_bytes, 0), max(used_inodes, 0)
    return None
