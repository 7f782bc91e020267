"""``/api/v1/gc``: the garbage-collection queue.

Storage nodes poll the queue continuously (every second) and drop the chunks
of removed files; the metaserver deletes an item once every required target
has acknowledged it, in a sweep every few seconds. ``POST /api/v1/gc/run``
runs that sweep now: it cannot make a node drop chunks sooner.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from emberfs.metaserver.api.deps import AdminDep, GCQueueDep
from emberfs.metaserver.api.schemas import (
    ERROR_RESPONSES,
    STEERING_RESPONSES,
    GCItemPublic,
    GCRunPublic,
)

router = APIRouter(prefix="/api/v1/gc", tags=["gc"], responses=ERROR_RESPONSES)


@router.get("", response_model=list[GCItemPublic])
def list_gc(
    gc: GCQueueDep,
    limit: Annotated[int, Query(ge=1, le=10000, description="most items listed")] = 1000,
) -> list[GCItemPublic]:
    """Pending GC items with the targets that dropped their chunks and those still to."""
    return [
        GCItemPublic(
            gc_id=p.item.gc_id,
            inode=p.item.inode,
            chains=list(p.item.chains),
            acked=p.acked,
            waiting=p.waiting,
        )
        for p in gc.pending(limit=limit)
    ]


@router.post("/run", response_model=GCRunPublic, responses=STEERING_RESPONSES)
def run_gc(_: AdminDep, gc: GCQueueDep) -> GCRunPublic:
    """Delete now every item all its required targets have acknowledged; counts."""
    removed = gc.collect()
    return GCRunPublic(removed=removed, pending=gc.count())
