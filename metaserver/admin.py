"""The admin REST API of the metaserver (FastAPI).

:func:`create_app` builds the application around a running
:class:`~emberfs.metaserver.cluster.ClusterManager` (and, once wired, the
namespace). Routes live under ``/api/v1``; ``/healthz`` answers liveness
probes. The response schemas are the pydantic models below.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from pydantic import BaseModel

from emberfs.common.version import __version__
from emberfs.metaserver.chainstate import state_name
from emberfs.metaserver.cluster import ClusterManager


class Health(BaseModel):
    status: str


class TargetPublic(BaseModel):
    """A storage target as the admin API shows it."""

    id: int
    node: str
    address: str
    grpc_address: str
    state: str
    capacity: int
    used: int
    chunks: int
    chain: int


class ChainMemberPublic(BaseModel):
    id: int
    state: str


class ChainPublic(BaseModel):
    """A replication chain: its version and its targets, head first."""

    id: int
    version: int
    targets: list[ChainMemberPublic]


def get_cluster(request: Request) -> ClusterManager:
    return request.app.state.cluster


ClusterDep = Annotated[ClusterManager, Depends(get_cluster)]

cluster_router = APIRouter(prefix="/api/v1", tags=["cluster"])


@cluster_router.get("/targets", response_model=list[TargetPublic])
def list_targets(cluster: ClusterDep) -> list[TargetPublic]:
    """Every storage target with its node, addresses, state, usage and chain."""
    routing = cluster.routing()
    return [
        TargetPublic(
            id=t.target_id,
            node=t.node_id,
            address=t.data_address,
            grpc_address=t.grpc_address,
            state=state_name(t.state),
            capacity=t.capacity,
            used=t.used,
            chunks=t.chunks,
            chain=t.chain_id,
        )
        for t in routing.targets
    ]


@cluster_router.get("/chains", response_model=list[ChainPublic])
def list_chains(cluster: ClusterDep) -> list[ChainPublic]:
    """Every chain with its version and its targets (head first) and their states."""
    routing = cluster.routing()
    states = {t.target_id: t.state for t in routing.targets}
    return [
        ChainPublic(
            id=c.chain_id,
            version=c.version,
            targets=[ChainMemberPublic(id=t, state=state_name(states[t])) for t in c.targets],
        )
        for c in routing.chains
    ]


def create_app(cluster: ClusterManager, namespace: Any = None) -> FastAPI:
    """The admin application.

    Parameters
    ----------
    cluster : ClusterManager
        The cluster state to show and steer.
    namespace : optional
        The metaserver's namespace (kept on ``app.state.namespace`` for
        routes that need it).

    Returns
    -------
    fastapi.FastAPI
    """
    app = FastAPI(title="EmberFS admin API", version=__version__)
    app.state.cluster = cluster
    app.state.namespace = namespace

    @app.get("/healthz", response_model=Health, tags=["health"])
    def healthz() -> Health:
        return Health(status="ok")

    app.include_router(cluster_router)
    return app
