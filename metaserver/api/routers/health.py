"""Liveness and readiness probes: ``/healthz`` and ``/readyz``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from emberfs.metaserver.api import views
from emberfs.metaserver.api.deps import ClusterDep
from emberfs.metaserver.api.schemas import Health, ReadyPublic
from emberfs.metaserver.store import keys

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process is alive and answers HTTP."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=ReadyPublic,
    responses={503: {"model": ReadyPublic, "description": "Not ready, with the reason"}},
)
def readyz(cluster: ClusterDep):
    """Ready when the metadata store answers and at least one chain has every target serving."""
    try:
        cluster.engine.get(keys.config_key(keys.ROUTING_VERSION))
    except Exception as exc:
        return _unready(f"the metadata store does not answer: {exc}")
    healths = views.chain_healths(cluster.routing())
    if not healths:
        return _unready("no chains yet (too few storage targets have registered)")
    if "healthy" not in healths.values():
        return _unready("no chain has every target serving")
    return ReadyPublic(status="ready")


def _unready(reason: str) -> JSONResponse:
    body = ReadyPublic(status="unavailable", reason=reason)
    return JSONResponse(body.model_dump(), status_code=503)
