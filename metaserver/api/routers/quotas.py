"""``/api/v1/quotas``: directory quotas, listed, read, set and removed (docs/quotas.md).

The directory is the rest of the URL: ``/api/v1/quotas/data/team`` is the quota
of ``/data/team`` (``/api/v1/quotas/`` that of the root). Reading needs no
token, like the other reading routes; setting and removing need the admin
token and act as root. A limit below the usage is applied (``over`` tells).
Errors: 404 no such directory or no quota on it, 400 not a directory or a bad
path, 422 a body out of range.
"""

from __future__ import annotations

from fastapi import APIRouter

from emberfs.metaserver.api.deps import AdminDep, NamespaceDep
from emberfs.metaserver.api.schemas import (
    ERROR_RESPONSES,
    STEERING_RESPONSES,
    QuotaIn,
    QuotaListPublic,
    QuotaPublic,
    QuotaSetPublic,
)
from emberfs.proto import meta_pb2

router = APIRouter(prefix="/api/v1/quotas", tags=["quotas"], responses=ERROR_RESPONSES)


def _public(q: meta_pb2.QuotaInfo) -> QuotaPublic:
    return QuotaPublic(
        path=q.path,
        inode=q.inode,
        max_bytes=q.max_bytes,
        max_inodes=q.max_inodes,
        used_bytes=q.used_bytes,
        used_inodes=q.used_inodes,
    )


def _directory(path: str) -> str:
    return "/" + path.lstrip("/")


@router.get("", response_model=QuotaListPublic)
def list_quotas(namespace: NamespaceDep) -> QuotaListPublic:
    """Every quota with its usage, by path."""
    found = namespace.quota_list(meta_pb2.QuotaListRequest()).quotas
    return QuotaListPublic(quotas=[_public(q) for q in found])


@router.get("/{path:path}", response_model=QuotaPublic)
def get_quota(path: str, namespace: NamespaceDep) -> QuotaPublic:
    """The quota of a directory and its usage (404 when it has none)."""
    return _public(namespace.quota_get(meta_pb2.QuotaGetRequest(path=_directory(path))))


@router.put("/{path:path}", response_model=QuotaSetPublic, responses=STEERING_RESPONSES)
def put_quota(_: AdminDep, path: str, body: QuotaIn, namespace: NamespaceDep) -> QuotaSetPublic:
    """Set or change a directory's limits (a new quota counts the directory's tree first)."""
    req = meta_pb2.QuotaSetRequest(path=_directory(path))
    if body.max_bytes is not None:
        req.max_bytes = body.max_bytes
    if body.max_inodes is not None:
        req.max_inodes = body.max_inodes
    resp = namespace.quota_set(req)
    return QuotaSetPublic(**_public(resp.quota).model_dump(), over=resp.over)


@router.delete("/{path:path}", response_model=QuotaPublic, responses=STEERING_RESPONSES)
def delete_quota(_: AdminDep, path: str, namespace: NamespaceDep) -> QuotaPublic:
    """Remove a directory's quota; the quota as it was. What it counted moves to the quota
    above it, if any."""
    req = meta_pb2.QuotaRemoveRequest(path=_directory(path))
    return _public(namespace.quota_remove(req).quota)
