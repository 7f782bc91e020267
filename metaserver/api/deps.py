"""Dependencies of the admin API routes, as ``Annotated`` aliases.

``ClusterDep``, ``GCQueueDep``, ``NamespaceDep`` and ``TokensDep`` hand a
route the metaserver's cluster manager, GC queue, namespace and token store
(``NamespaceDep`` and ``TokensDep`` answer 503 when the metaserver runs
without one); ``AdminDep`` guards steering routes with the bearer token.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.tokens import TokenStore

_bearer = HTTPBearer(
    auto_error=False,
    description="The admin token (metaserver --admin-token or EMBERFS_ADMIN_TOKEN).",
)


def get_cluster(request: Request) -> ClusterManager:
    """The cluster manager of the app."""
    return request.app.state.cluster


def get_gc(request: Request) -> GCQueue:
    """The GC queue of the app."""
    return request.app.state.gc


def get_namespace(request: Request) -> Any:
    """The namespace of the app; 503 when the metaserver runs without one."""
    namespace = request.app.state.namespace
    if namespace is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the namespace is not available")
    return namespace


def get_tokens(request: Request) -> TokenStore:
    """The token store of the app; 503 when the metaserver runs without one."""
    tokens = request.app.state.tokens
    if tokens is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "token store not available")
    return tokens


def require_admin(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Allow the request only with ``Authorization: Bearer <admin token>``.

    Raises
    ------
    HTTPException
        403 when no admin token is configured, 401 without a bearer token,
        403 with a wrong one.
    """
    expected: str | None = request.app.state.admin_token
    if not expected:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "no admin token configured")
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "steering needs an 'Authorization: Bearer <token>' header",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong admin token")


ClusterDep = Annotated[ClusterManager, Depends(get_cluster)]
GCQueueDep = Annotated[GCQueue, Depends(get_gc)]
NamespaceDep = Annotated[Any, Depends(get_namespace)]
TokensDep = Annotated[TokenStore, Depends(get_tokens)]
AdminDep = Annotated[None, Depends(require_admin)]
