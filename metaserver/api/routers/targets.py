"""``/api/v1/targets``: storage targets, and the steering of one (offline, drain)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from emberfs.metaserver.api import views
from emberfs.metaserver.api.deps import AdminDep, ClusterDep
from emberfs.metaserver.api.schemas import (
    ERROR_RESPONSES,
    STEERING_RESPONSES,
    DrainPublic,
    TargetPublic,
)
from emberfs.metaserver.clustermgr.chainstate import state_name

router = APIRouter(prefix="/api/v1/targets", tags=["targets"], responses=ERROR_RESPONSES)


@router.get("", response_model=list[TargetPublic])
def list_targets(cluster: ClusterDep) -> list[TargetPublic]:
    """Every storage target with its node, addresses, state, usage and chain."""
    return views.targets(cluster.routing())


@router.get("/{target_id}", response_model=TargetPublic)
def get_target(target_id: int, cluster: ClusterDep) -> TargetPublic:
    """One target; 404 when unknown."""
    for t in cluster.routing().targets:
        if t.target_id == target_id:
            return views.target_public(t)
    raise HTTPException(status.HTTP_404_NOT_FOUND, f"no target {target_id}")


@router.post("/{target_id}/offline", response_model=TargetPublic, responses=STEERING_RESPONSES)
def offline_target(_: AdminDep, target_id: int, cluster: ClusterDep) -> TargetPublic:
    """Take a target offline as a heartbeat timeout would.

    Its chain is reordered and its version bumps. The target stays offline,
    whatever its heartbeats say, until its storage server registers again
    (restarts); it then returns waiting and is resynced before it serves.
    """
    info = cluster.offline_target(target_id)
    routing = cluster.routing()
    for t in routing.targets:
        if t.target_id == target_id:
            return views.target_public(t)
    return views.target_public(info)  # pragma: no cover - targets are never removed


@router.post(
    "/{target_id}/drain",
    response_model=DrainPublic,
    status_code=status.HTTP_202_ACCEPTED,
    responses=STEERING_RESPONSES,
)
def drain_target(_: AdminDep, target_id: int, cluster: ClusterDep) -> DrainPublic:
    """Move the target's chain membership to a free target on a node outside the chain.

    The replacement joins the chain's tail (waiting, then syncing from its
    serving predecessor); when it serves, the drained target leaves the chain
    and stays offline until its storage server registers again. 409 when the
    target is in no chain or no free target can replace it. Repeating the
    call while the drain runs returns the same drain.
    """
    chain_id, replacement = cluster.drain_target(target_id)
    states = {t.target_id: t.state for t in cluster.routing().targets}
    return DrainPublic(
        target=target_id,
        chain=chain_id,
        replacement=replacement,
        replacement_state=state_name(states[replacement]),
    )
