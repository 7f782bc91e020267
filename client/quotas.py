"""Directory quotas through the metaserver: ``QuotaSet``, ``QuotaGet``, ``QuotaList``,
``QuotaRemove``, and the reservations a writer makes (``QuotaReserve``).

A quota limits the bytes and the inodes below a directory (docs/quotas.md).
Quotas are plain dicts: ``path``, ``inode``, ``max_bytes`` and ``max_inodes``
(0: no limit), ``used_bytes`` and ``used_inodes``. Only root (the admin
token) sets and removes them (``PermissionError`` otherwise); a directory
without one is ``FileNotFoundError`` for :func:`get` and :func:`remove`.
A write or create that would pass a limit raises ``OSError(EDQUOT)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from emberfs.proto import common_pb2, meta_pb2

if TYPE_CHECKING:
    from emberfs.client.meta import MetaClient


def as_dict(q: meta_pb2.QuotaInfo) -> dict:
    """A quota as the dict the functions here return."""
    return {
        "path": q.path,
        "inode": q.inode,
        "max_bytes": q.max_bytes,
        "max_inodes": q.max_inodes,
        "used_bytes": q.used_bytes,
        "used_inodes": q.used_inodes,
    }


def set_quota(
    meta: MetaClient, path: str, max_bytes: int | None = None, max_inodes: int | None = None
) -> tuple[dict, bool]:
    """Set or change ``path``'s limits (None: keep; 0: none); the quota, and whether its
    usage is above a limit now (applied all the same: further growth is refused)."""
    req = meta_pb2.QuotaSetRequest(ctx=meta.context(), path=path)
    for name, value in (("max_bytes", max_bytes), ("max_inodes", max_inodes)):
        if value is not None:
            if value < 0:
                raise ValueError(f"{name} must not be negative")
            setattr(req, name, value)
    resp = meta.meta("QuotaSet", req, path)
    return as_dict(resp.quota), resp.over


def get(meta: MetaClient, path: str) -> dict:
    """The quota of directory ``path`` and its usage."""
    return as_dict(
        meta.meta("QuotaGet", meta_pb2.QuotaGetRequest(ctx=meta.context(), path=path), path)
    )


def list_quotas(meta: MetaClient) -> list[dict]:
    """Every quota, by path."""
    resp = meta.meta("QuotaList", meta_pb2.QuotaListRequest(ctx=meta.context()))
    return [as_dict(q) for q in resp.quotas]


def remove(meta: MetaClient, path: str) -> dict:
    """Remove ``path``'s quota; the quota as it was."""
    req = meta_pb2.QuotaRemoveRequest(ctx=meta.context(), path=path)
    return as_dict(meta.meta("QuotaRemove", req, path).quota)


def reserve(
    meta: MetaClient, inode: int, session_id: int, end: int, path: str | None = None
) -> common_pb2.InodeAttr:
    """Reserve room up to byte ``end`` of a file open for write in a quota (EDQUOT when it
    does not fit); the file's attributes, ``quota_charged`` the room it holds now."""
    req = meta_pb2.QuotaReserveRequest(
        ctx=meta.context(), inode=inode, session_id=session_id, end=end
    )
    return meta.meta("QuotaReserve", req, path).attr
