"""Turn the cluster manager's state into the API's public schemas.

Every function reads one routing snapshot (``ClusterManager.routing()``), so
a response never mixes two versions of the cluster.
"""

from __future__ import annotations

from typing import Any

from emberfs.common.version import __version__
from emberfs.metaserver.api import schemas
from emberfs.metaserver.clustermgr import chainstate
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.proto import common_pb2


def target_public(t: common_pb2.TargetInfo) -> schemas.TargetPublic:
    """The public view of one target of a routing snapshot."""
    return schemas.TargetPublic(
        id=t.target_id,
        node=t.node_id,
        address=t.data_address,
        grpc_address=t.grpc_address,
        state=chainstate.state_name(t.state),
        capacity=t.capacity,
        used=t.used,
        chunks=t.chunks,
        chain=t.chain_id,
        full=t.full,
    )


def chain_public(c: common_pb2.ChainInfo, states: dict[int, int]) -> schemas.ChainPublic:
    """The public view of one chain, given every target's state."""
    return schemas.ChainPublic(
        id=c.chain_id,
        version=c.version,
        targets=[
            schemas.ChainMemberPublic(id=t, state=chainstate.state_name(states[t]))
            for t in c.targets
        ],
    )


def targets(routing: common_pb2.RoutingInfo) -> list[schemas.TargetPublic]:
    return [target_public(t) for t in routing.targets]


def chains(routing: common_pb2.RoutingInfo) -> list[schemas.ChainPublic]:
    states = {t.target_id: t.state for t in routing.targets}
    return [chain_public(c, states) for c in routing.chains]


def chain_healths(routing: common_pb2.RoutingInfo) -> dict[int, str]:
    """Chain id -> ``healthy`` / ``degraded`` / ``unavailable``."""
    states = {t.target_id: t.state for t in routing.targets}
    return {
        c.chain_id: chainstate.chain_health(states[t] for t in c.targets) for c in routing.chains
    }


def nodes(cluster: ClusterManager, routing: common_pb2.RoutingInfo) -> list[schemas.NodePublic]:
    ages = cluster.heartbeat_ages()
    out = []
    for node in cluster.nodes():
        own = [t for t in routing.targets if t.node_id == node.node_id]
        out.append(
            schemas.NodePublic(
                id=node.node_id,
                address=node.data_address,
                grpc_address=node.grpc_address,
                targets=[t.target_id for t in own],
                up=any(t.state != chainstate.OFFLINE for t in own),
                last_heartbeat_seconds=ages.get(node.node_id),
            )
        )
    return out


def drains(cluster: ClusterManager, routing: common_pb2.RoutingInfo) -> list[schemas.DrainPublic]:
    by_id = {t.target_id: t for t in routing.targets}
    out = []
    for drained, replacement in sorted(cluster.drains().items()):
        rep = by_id[replacement]
        out.append(
            schemas.DrainPublic(
                target=drained,
                chain=rep.chain_id,
                replacement=replacement,
                replacement_state=chainstate.state_name(rep.state),
            )
        )
    return out


def cluster_summary(cluster: ClusterManager, gc: GCQueue, namespace: Any) -> schemas.ClusterPublic:
    """The ``/api/v1/cluster`` summary."""
    routing = cluster.routing()
    by_state = dict.fromkeys(("serving", "syncing", "waiting", "lastsrv", "offline"), 0)
    for t in routing.targets:
        by_state[chainstate.state_name(t.state)] += 1
    healths = list(chain_healths(routing).values())
    chain_counts = schemas.ChainCounts(
        total=len(healths),
        healthy=healths.count("healthy"),
        degraded=healths.count("degraded"),
        unavailable=healths.count("unavailable"),
    )
    if chain_counts.unavailable or not healths:
        health = "unavailable"
    elif chain_counts.degraded:
        health = "degraded"
    else:
        health = "healthy"
    capacity, used = cluster.usage()
    read, written = cluster.io_totals()
    counts = None
    if namespace is not None:
        counts = schemas.NamespaceCounts(**namespace.counts())
    return schemas.ClusterPublic(
        version=__version__,
        routing_version=routing.version,
        health=health,
        nodes=len(cluster.nodes()),
        targets=schemas.TargetCounts(
            total=len(routing.targets), full=sum(t.full for t in routing.targets), **by_state
        ),
        chains=chain_counts,
        capacity=capacity,
        used=used,
        bytes_read=read,
        bytes_written=written,
        namespace=counts,
        gc_pending=gc.count(),
        drains=drains(cluster, routing),
        store=cluster.store_name,
        leader=leader.address if (leader := cluster.leadership.leader()) is not None else "",
    )


def scrub(cluster: ClusterManager) -> schemas.ScrubPublic:
    """The scrub control and the last scrub report of every target."""
    control = cluster.scrub.control()
    reports = cluster.scrub.reports()
    nodes = {t.target_id: t.node_id for t in cluster.routing().targets}
    return schemas.ScrubPublic(
        paused=control.paused,
        starts=control.start,
        targets=[
            schemas.ScrubTargetPublic(
                id=tid,
                node=nodes.get(tid, ""),
                running=r.running,
                paused=r.paused,
                pass_started=r.pass_started_ns,
                last_full_pass=r.last_pass_ended_ns,
                bytes_verified=r.bytes_verified,
                chunks_verified=r.chunks_verified,
                errors=r.errors,
                repairs=r.repairs,
                passes=r.passes,
            )
            for tid, r in sorted(reports.items())
        ],
    )
