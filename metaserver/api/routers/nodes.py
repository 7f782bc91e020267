"""``/api/v1/nodes``: the storage nodes."""

from __future__ import annotations

from fastapi import APIRouter

from emberfs.metaserver.api import views
from emberfs.metaserver.api.deps import ClusterDep
from emberfs.metaserver.api.schemas import ERROR_RESPONSES, NodePublic

router = APIRouter(prefix="/api/v1", tags=["nodes"], responses=ERROR_RESPONSES)


@router.get("/nodes", response_model=list[NodePublic])
def list_nodes(cluster: ClusterDep) -> list[NodePublic]:
    """Every registered storage node with its addresses, targets and last heartbeat."""
    return views.nodes(cluster, cluster.routing())
