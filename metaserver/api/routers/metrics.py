"""``/metrics``: Prometheus exposition of the metaserver's metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Request counters and latencies, targets by state, chains by health, ..."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
