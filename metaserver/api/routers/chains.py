"""``/api/v1/chains``: replication chains."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from emberfs.metaserver.api import views
from emberfs.metaserver.api.deps import ClusterDep
from emberfs.metaserver.api.schemas import ERROR_RESPONSES, ChainPublic

router = APIRouter(prefix="/api/v1/chains", tags=["chains"], responses=ERROR_RESPONSES)


@router.get("", response_model=list[ChainPublic])
def list_chains(cluster: ClusterDep) -> list[ChainPublic]:
    """Every chain with its version and its targets (head first) and their states."""
    return views.chains(cluster.routing())


@router.get("/{chain_id}", response_model=ChainPublic)
def get_chain(chain_id: int, cluster: ClusterDep) -> ChainPublic:
    """One chain; 404 when unknown."""
    routing = cluster.routing()
    states = {t.target_id: t.state for t in routing.targets}
    for c in routing.chains:
        if c.chain_id == chain_id:
            return views.chain_public(c, states)
    raise HTTPException(status.HTTP_404_NOT_FOUND, f"no chain {chain_id}")
