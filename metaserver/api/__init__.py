"""The admin REST API of the metaserver (FastAPI), its metrics and its dashboard.

:func:`create_app` builds the application around the metaserver's
:class:`~emberfs.metaserver.clustermgr.manager.ClusterManager`,
:class:`~emberfs.metaserver.clustermgr.gcqueue.GCQueue` and namespace. Routes:

* ``/healthz``, ``/readyz``: probes;
* ``/api/v1/cluster``, ``/nodes``, ``/targets[/{id}]``, ``/chains[/{id}]``,
  ``/sessions``, ``/gc``, ``/layouts``, ``/scrub``, ``/fsck``: read the cluster (no token
  needed);
* ``POST /api/v1/targets/{id}/offline``, ``POST /api/v1/targets/{id}/drain``,
  ``POST /api/v1/gc/run``, ``PUT /api/v1/layouts``, ``POST /api/v1/scrub/start|pause``,
  ``POST /api/v1/fsck/repair``:
  steer it, with
  ``Authorization: Bearer <admin token>``;
* ``GET /api/v1/quotas[/{directory}]``: directory quotas and their usage (no token needed);
  ``PUT`` and ``DELETE /api/v1/quotas/{directory}`` set and remove one, with the admin token;
* ``POST /api/v1/tokens``, ``GET /api/v1/tokens``, ``DELETE /api/v1/tokens/{id or name}``:
  create, list and revoke client tokens (identities for the permission checks), with the
  admin token, listing too;
* ``/metrics`` (Prometheus), ``/docs`` and ``/openapi.json``, and the
  dashboard at ``/`` (static HTML and JavaScript polling the API);
* ``/api/v1/leader``: which metaserver leads the cluster, and whether this one does.

With several metaservers on one store, the ``/api/v1`` routes are answered by
the one that leads (it alone knows the nodes' heartbeats and steers the
cluster): the others pass each such request on to the leader's admin API and
its answer back (:func:`forward_to_leader`), so any metaserver's admin address
serves the whole API. The probes, ``/metrics`` and ``/api/v1/leader`` are each
process's own.

Every error is JSON ``{"detail": "..."}``: typed errors of
:mod:`emberfs.common.errors` map to 400/403/404/409/503, invalid parameters
to 422.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.background import BackgroundTask

from emberfs.common import errors
from emberfs.common.version import __version__
from emberfs.metaserver.api.routers import chains as _chains
from emberfs.metaserver.api.routers import cluster as _cluster
from emberfs.metaserver.api.routers import fsck as _fsck
from emberfs.metaserver.api.routers import gc as _gc
from emberfs.metaserver.api.routers import health as _health
from emberfs.metaserver.api.routers import layouts as _layouts
from emberfs.metaserver.api.routers import leader as _leader
from emberfs.metaserver.api.routers import metrics as _metrics
from emberfs.metaserver.api.routers import nodes as _nodes
from emberfs.metaserver.api.routers import quotas as _quotas
from emberfs.metaserver.api.routers import scrub as _scrub
from emberfs.metaserver.api.routers import sessions as _sessions
from emberfs.metaserver.api.routers import targets as _targets
from emberfs.metaserver.api.routers import tokens as _tokens
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.consistency.fsck import Fsck
from emberfs.metaserver.metrics import registry_for
from emberfs.metaserver.tokens import TokenStore

STATIC_DIR = Path(__file__).parent / "static"
ROUTERS = (
    _health,
    _leader,
    _cluster,
    _nodes,
    _targets,
    _chains,
    _sessions,
    _gc,
    _scrub,
    _fsck,
    _layouts,
    _quotas,
    _tokens,
    _metrics,
)
"""The router modules, in the order the app includes them."""

_STATUS_OF_ERROR: list[tuple[type[errors.EmberError], int]] = [
    (errors.NotFound, status.HTTP_404_NOT_FOUND),
    (errors.Busy, status.HTTP_409_CONFLICT),
    (errors.AlreadyExists, status.HTTP_409_CONFLICT),
    (errors.PermissionDenied, status.HTTP_403_FORBIDDEN),
    (errors.NotPermitted, status.HTTP_403_FORBIDDEN),
    (errors.Unavailable, status.HTTP_503_SERVICE_UNAVAILABLE),
    (errors.Internal, status.HTTP_500_INTERNAL_SERVER_ERROR),
]


def http_status(exc: errors.EmberError) -> int:
    """The HTTP status of a typed error (400 for bad input of any kind)."""
    for cls, code in _STATUS_OF_ERROR:
        if isinstance(exc, cls):
            return code
    return status.HTTP_400_BAD_REQUEST


def _validation_detail(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


LOCAL_PATHS = frozenset({"/api/v1/leader"})
"""``/api/v1`` routes every metaserver answers itself."""

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}
)


async def forward_to_leader(request: Request, admin_url: str, client) -> StreamingResponse:
    """Send ``request`` to the leader's admin API at ``admin_url``; its answer, streamed back."""
    import httpx

    url = admin_url.rstrip("/") + request.url.path
    if request.url.query:
        url += "?" + request.url.query
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
    outgoing = client.build_request(
        request.method, url, headers=headers, content=await request.body()
    )
    try:
        answer = await client.send(outgoing, stream=True)
    except httpx.HTTPError as exc:
        return JSONResponse(
            {"detail": f"the leading metaserver's admin API ({admin_url}) did not answer: {exc}"},
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        )
    kept = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
    kept.pop("content-length", None)
    return StreamingResponse(
        answer.aiter_raw(),
        status_code=answer.status_code,
        headers=kept,
        background=BackgroundTask(answer.aclose),
    )


def create_app(
    cluster: ClusterManager,
    gc: GCQueue,
    namespace: Any = None,
    *,
    admin_token: str | None = None,
    tokens: TokenStore | None = None,
    tls: Any = None,
) -> FastAPI:
    """The admin application.

    Parameters
    ----------
    cluster : ClusterManager
        The cluster state to show and steer.
    gc : GCQueue
        The garbage-collection queue to show and sweep.
    namespace : Namespace or None, default None
        The metaserver's namespace (sessions, layouts and inode counts);
        routes that need it answer 503 without one.
    admin_token : str or None, default None
        The bearer token of the steering routes; with None (or empty) they
        answer 403 "no admin token configured".
    tokens : TokenStore or None, default None
        The client tokens to create, list and revoke; the token routes
        answer 503 without one.
    tls : TLSFiles or None, default None
        The CA that a leader's admin API is checked against when requests are
        passed on to it over https.

    Returns
    -------
    fastapi.FastAPI
    """
    app = FastAPI(
        title="EmberFS admin API",
        version=__version__,
        description="Show and steer an EmberFS cluster: targets, chains, drains, GC, layouts, "
        "client tokens.",
    )
    app.state.cluster = cluster
    app.state.gc = gc
    app.state.namespace = namespace
    app.state.fsck = Fsck(
        cluster.engine,
        cluster,
        queued=gc.queued,
        pending_cuts=namespace.cuts if namespace is not None else None,
    )
    app.state.admin_token = admin_token or None
    app.state.tokens = tokens
    app.state.registry = registry_for(cluster, gc, namespace)

    @app.exception_handler(errors.EmberError)
    async def _ember_error(request: Request, exc: errors.EmberError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=http_status(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {"detail": _validation_detail(exc)},
            status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
        )

    forwarding: dict[str, Any] = {}

    @app.middleware("http")
    async def _to_leader(request: Request, call_next):
        path = request.url.path
        leadership = cluster.leadership
        if not path.startswith("/api/v1/") or path in LOCAL_PATHS or leadership.leading():
            return await call_next(request)
        leader = leadership.leader()
        if leader is not None and leader.id == leadership.me.id:
            return await call_next(request)  # a leader cut off from the store answers itself
        if leader is None or not leader.admin_url:
            return JSONResponse(
                {"detail": "no metaserver leads the cluster now; retry in a few seconds"},
                status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            )
        client = forwarding.get("client")
        if client is None:
            import httpx

            verify: Any = True
            if tls is not None and getattr(tls, "ca", None):
                verify = ssl.create_default_context(cafile=tls.ca)
            client = forwarding["client"] = httpx.AsyncClient(timeout=60.0, verify=verify)
        return await forward_to_leader(request, leader.admin_url, client)

    for module in ROUTERS:
        app.include_router(module.router)

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    return app
