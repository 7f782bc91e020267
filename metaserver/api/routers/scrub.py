"""``/api/v1/scrub``: the storage servers' scrubbers, and pausing or starting them.

Each storage server reports its scrubber's progress per target in its
heartbeats; the control set here reaches the servers with their next heartbeat
answers (within a second or two).
"""

from __future__ import annotations

from fastapi import APIRouter

from emberfs.metaserver.api import views
from emberfs.metaserver.api.deps import AdminDep, ClusterDep
from emberfs.metaserver.api.schemas import ERROR_RESPONSES, STEERING_RESPONSES, ScrubPublic

router = APIRouter(prefix="/api/v1/scrub", tags=["scrub"], responses=ERROR_RESPONSES)


@router.get("", response_model=ScrubPublic)
def get_scrub(cluster: ClusterDep) -> ScrubPublic:
    """Whether scrubbing is paused, and each target's last full pass, errors and repairs."""
    return views.scrub(cluster)


@router.post("/start", response_model=ScrubPublic, responses=STEERING_RESPONSES)
def start_scrub(_: AdminDep, cluster: ClusterDep) -> ScrubPublic:
    """Unpause, and have every scrubber that is not in a pass begin one now."""
    cluster.scrub.start()
    return views.scrub(cluster)


@router.post("/pause", response_model=ScrubPublic, responses=STEERING_RESPONSES)
def pause_scrub(_: AdminDep, cluster: ClusterDep) -> ScrubPublic:
    """Stop every scrubber between two chunks until the next start."""
    cluster.scrub.pause()
    return views.scrub(cluster)
