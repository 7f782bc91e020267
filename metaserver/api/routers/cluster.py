"""``/api/v1/cluster``: the summary of the whole cluster."""

from __future__ import annotations

from fastapi import APIRouter, Request

from emberfs.metaserver.api import views
from emberfs.metaserver.api.deps import ClusterDep, GCQueueDep
from emberfs.metaserver.api.schemas import ERROR_RESPONSES, ClusterPublic

router = APIRouter(prefix="/api/v1", tags=["cluster"], responses=ERROR_RESPONSES)


@router.get("/cluster", response_model=ClusterPublic)
def get_cluster_summary(cluster: ClusterDep, gc: GCQueueDep, request: Request) -> ClusterPublic:
    """Nodes, targets by state, chains by health, capacity, I/O totals, namespace counts."""
    return views.cluster_summary(cluster, gc, request.app.state.namespace)
