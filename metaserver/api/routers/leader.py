"""``/api/v1/leader``: which metaserver runs the cluster manager (each metaserver answers itself)."""

from __future__ import annotations

from fastapi import APIRouter

from emberfs.metaserver.api.deps import ClusterDep
from emberfs.metaserver.api.schemas import LeaderPublic, LeadershipPublic

router = APIRouter(prefix="/api/v1", tags=["cluster"])


@router.get("/leader", response_model=LeadershipPublic)
def get_leader(cluster: ClusterDep) -> LeadershipPublic:
    """This metaserver's id, whether it leads (or is frozen: cut off from the store), and the leader."""
    d = cluster.leadership.describe()
    leader = d["leader"]
    return LeadershipPublic(
        id=d["id"],
        leading=d["leading"],
        frozen=d["frozen"],
        term=d["term"],
        store=cluster.store_name,
        leader=LeaderPublic(**leader) if leader is not None else None,
    )
