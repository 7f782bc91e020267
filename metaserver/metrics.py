"""Prometheus metrics of the metaserver.

Two kinds of metrics, both exposed on the admin API's ``/metrics``:

* counters and histograms of the gRPC calls served (``MetaService`` and
  ``ClusterService``), kept in :data:`REGISTRY` and fed by
  :class:`MetricsInterceptor`, which the gRPC server installs;
* gauges of the cluster and namespace state (targets by state, full
  targets, chains by health, capacity, inode counts, GC queue, storage I/O
  totals, the metaserver's own stalls, directory quotas), read at scrape time
  by :class:`ClusterCollector`.

Quotas are exported per directory (label ``path``), at most
:data:`MAX_QUOTA_SERIES` of them: the fullest first (the highest ratio of
usage to a limit), so the ones an alert is about are always among them;
``emberfs_quotas`` counts them all.

:func:`registry_for` combines both (plus the process and Python runtime
collectors) into the registry one admin app serves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from emberfs.common.grpcauth import MethodWrapper
from emberfs.metaserver.clustermgr import chainstate
from emberfs.proto import meta_pb2

REGISTRY = CollectorRegistry(auto_describe=True)
"""The metaserver's own request metrics (one per process)."""

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

RPC_REQUESTS = Counter(
    "emberfs_meta_requests",
    "gRPC requests served by the metaserver, by service, method and status code.",
    ["service", "method", "code"],
    registry=REGISTRY,
)
RPC_LATENCY = Histogram(
    "emberfs_meta_request_duration_seconds",
    "Time to serve a gRPC request in the metaserver, by service and method.",
    ["service", "method"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
MAX_QUOTA_SERIES = 256
"""Most quotas exported per scrape (the fullest)."""
STATES = ("serving", "syncing", "waiting", "lastsrv", "offline")
HEALTHS = ("healthy", "degraded", "unavailable")


def _split_method(full: str) -> tuple[str, str]:
    """``"/emberfs.MetaService/Stat"`` to ``("MetaService", "Stat")``."""
    _, _, rest = full.partition("/")
    service, _, method = rest.rpartition("/")
    return service.rpartition(".")[2] or "unknown", method or "unknown"


class MetricsInterceptor(MethodWrapper):
    """Counts and times every unary-unary call of a gRPC server.

    The status code is the one the handler set (``context.abort`` or
    ``set_code``), ``OK`` when it returned normally without one, and
    ``UNKNOWN`` for an exception that set none.
    """

    def wrap(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        service, method = _split_method(full_method)
        behavior = handler.unary_unary

        def timed(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            code: grpc.StatusCode | None = None
            try:
                response = behavior(request, context)
                code = context.code() or grpc.StatusCode.OK
                return response
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            finally:
                RPC_LATENCY.labels(service, method).observe(time.perf_counter() - start)
                name = code.name if isinstance(code, grpc.StatusCode) else str(code)
                RPC_REQUESTS.labels(service, method, name).inc()

        return grpc.unary_unary_rpc_method_handler(
            timed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class ClusterCollector(Collector):
    """Gauges of the cluster (and namespace) state, read at every scrape.

    Parameters
    ----------
    cluster : ClusterManager
        The cluster manager to read.
    gc : GCQueue
        The garbage-collection queue, for its length.
    namespace : Namespace or None, default None
        The namespace, for inode and session counts (left out when None).
    """

    def __init__(self, cluster: Any, gc: Any, namespace: Any = None):
        self.cluster = cluster
        self.gc = gc
        self.namespace = namespace

    def collect(self) -> Iterator[Metric]:
        routing = self.cluster.routing()
        state_of = {t.target_id: t.state for t in routing.targets}
        by_state = dict.fromkeys(STATES, 0)
        for t in routing.targets:
            by_state[chainstate.state_name(t.state)] += 1
        targets = GaugeMetricFamily(
            "emberfs_targets", "Storage targets by public state.", labels=["state"]
        )
        for state in STATES:
            targets.add_metric([state], by_state[state])
        yield targets
        yield GaugeMetricFamily(
            "emberfs_targets_full",
            "Storage targets whose file system is full: their chains answer writes NO_SPACE.",
            value=sum(t.full for t in routing.targets),
        )

        by_health = dict.fromkeys(HEALTHS, 0)
        for c in routing.chains:
            by_health[chainstate.chain_health(state_of[t] for t in c.targets)] += 1
        chains = GaugeMetricFamily(
            "emberfs_chains",
            "Replication chains by health (healthy: all serving, degraded: some, "
            "unavailable: none).",
            labels=["health"],
        )
        for health in HEALTHS:
            chains.add_metric([health], by_health[health])
        yield chains

        yield GaugeMetricFamily(
            "emberfs_nodes",
            "Registered storage nodes.",
            value=len({t.node_id for t in routing.targets}),
        )
        capacity, used = self.cluster.usage()
        yield GaugeMetricFamily(
            "emberfs_capacity_bytes", "Capacity of all targets, in bytes.", value=capacity
        )
        yield GaugeMetricFamily("emberfs_used_bytes", "Bytes used on all targets.", value=used)
        yield GaugeMetricFamily(
            "emberfs_routing_version", "Version of the routing info.", value=routing.version
        )
        yield GaugeMetricFamily(
            "emberfs_drains", "Target drains under way.", value=len(self.cluster.drains())
        )
        pending = self.gc.count()
        yield GaugeMetricFamily(
            "emberfs_gc_pending_items", "Removed files whose chunks await GC.", value=pending
        )
        grace = self.cluster.grace
        yield CounterMetricFamily(
            "emberfs_meta_stalls",
            "Stalls of the metaserver itself that it noticed (a gap between two of its "
            "timeout checks of more than half the shorter of the heartbeat and session "
            "timeouts); after each, every node and write session gets a full timeout.",
            value=grace.stalls,
        )
        yield CounterMetricFamily(
            "emberfs_meta_stalled_seconds",
            "Seconds the noticed stalls of the metaserver lasted, summed.",
            value=grace.stalled_seconds,
        )
        read, written = self.cluster.io_totals()
        yield CounterMetricFamily(
            "emberfs_storage_read_bytes",
            "Bytes read from storage targets, as the nodes last reported.",
            value=read,
        )
        yield CounterMetricFamily(
            "emberfs_storage_written_bytes",
            "Bytes written to storage targets, as the nodes last reported.",
            value=written,
        )
        if self.namespace is not None:
            counts = self.namespace.counts()
            inodes = GaugeMetricFamily("emberfs_inodes", "Inodes by type.", labels=["type"])
            for kind in ("files", "directories", "symlinks"):
                inodes.add_metric([kind], counts[kind])
            yield inodes
            yield GaugeMetricFamily(
                "emberfs_write_sessions", "Open write sessions.", value=counts["sessions"]
            )
            yield GaugeMetricFamily(
                "emberfs_pending_chunk_cuts",
                "Files whose shrinking truncation storage may not have cut yet.",
                value=counts["pending_cuts"],
            )
            yield from _kvcache_metrics(self.namespace.kvcaches.totals())
            yield from quota_metrics(self.namespace.quota_list(meta_pb2.QuotaListRequest()).quotas)


def _fill(q: meta_pb2.QuotaInfo) -> float:
    """The highest ratio of a quota's usage to one of its limits (0 without limits)."""
    ratios = [
        used / limit
        for used, limit in ((q.used_bytes, q.max_bytes), (q.used_inodes, q.max_inodes))
        if limit
    ]
    return max(ratios, default=0.0)


def quota_metrics(quotas) -> Iterator[Metric]:
    """Usage and limits of the :data:`MAX_QUOTA_SERIES` fullest quotas, by directory; a limit
    series only where the limit is set (0: none), so ``used / limit`` is over set limits."""
    yield GaugeMetricFamily("emberfs_quotas", "Directory quotas set.", value=len(quotas))
    shown = sorted(quotas, key=lambda q: (-_fill(q), q.path))[:MAX_QUOTA_SERIES]
    labels = ["path"]
    used_bytes = GaugeMetricFamily(
        "emberfs_quota_used_bytes",
        "Bytes counted below a quota directory: file lengths and open writers' reservations.",
        labels=labels,
    )
    limit_bytes = GaugeMetricFamily(
        "emberfs_quota_limit_bytes", "Byte limit of a quota directory (when set).", labels=labels
    )
    used_inodes = GaugeMetricFamily(
        "emberfs_quota_used_inodes",
        "Files, directories and symlinks below a quota directory.",
        labels=labels,
    )
    limit_inodes = GaugeMetricFamily(
        "emberfs_quota_limit_inodes", "Inode limit of a quota directory (when set).", labels=labels
    )
    for q in shown:
        used_bytes.add_metric([q.path], q.used_bytes)
        used_inodes.add_metric([q.path], q.used_inodes)
        if q.max_bytes:
            limit_bytes.add_metric([q.path], q.max_bytes)
        if q.max_inodes:
            limit_inodes.add_metric([q.path], q.max_inodes)
    yield from (used_bytes, limit_bytes, used_inodes, limit_inodes)


def _kvcache_metrics(totals) -> Iterator[Metric]:
    """The counters and use of every KV cache (:mod:`emberfs.metaserver.kvcache.index`), by path."""
    labels = ["cache"]
    counters = {
        "hits": CounterMetricFamily(
            "emberfs_kvcache_hits", "KV cache blocks found by gets.", labels=labels
        ),
        "misses": CounterMetricFamily(
            "emberfs_kvcache_misses", "KV cache keys gets did not find.", labels=labels
        ),
        "hit_bytes": CounterMetricFamily(
            "emberfs_kvcache_hit_bytes", "Bytes of the KV cache blocks found.", labels=labels
        ),
        "puts": CounterMetricFamily(
            "emberfs_kvcache_puts", "Blocks stored in a KV cache.", labels=labels
        ),
        "put_bytes": CounterMetricFamily(
            "emberfs_kvcache_put_bytes", "Bytes of the blocks stored.", labels=labels
        ),
        "evictions": CounterMetricFamily(
            "emberfs_kvcache_evictions",
            "Blocks evicted (least recently used first) to make room.",
            labels=labels,
        ),
    }
    used = GaugeMetricFamily(
        "emberfs_kvcache_used_blocks", "Blocks a KV cache holds.", labels=labels
    )
    used_bytes = GaugeMetricFamily(
        "emberfs_kvcache_used_bytes", "Bytes of the blocks a KV cache holds.", labels=labels
    )
    capacity = GaugeMetricFamily(
        "emberfs_kvcache_capacity_blocks", "Blocks a KV cache can hold.", labels=labels
    )
    hit_ratio = GaugeMetricFamily(
        "emberfs_kvcache_hit_ratio",
        "Hits over the keys gets asked for, since the cache was made.",
        labels=labels,
    )
    for rec, c in totals:
        name = [rec.path or str(rec.cache_id)]
        for field, family in counters.items():
            family.add_metric(name, getattr(c, field))
        used.add_metric(name, max(0, c.blocks))
        used_bytes.add_metric(name, max(0, c.bytes))
        capacity.add_metric(name, rec.geometry.capacity_slots)
        asked = c.hits + c.misses
        hit_ratio.add_metric(name, c.hits / asked if asked else 0.0)
    yield from counters.values()
    yield from (used, used_bytes, capacity, hit_ratio)


class _Forward(Collector):
    """Collects what another registry or collector holds (so one registry can serve several)."""

    def __init__(self, source: Any):
        self.source = source

    def collect(self) -> Iterator[Metric]:
        yield from self.source.collect()


def registry_for(cluster: Any, gc: Any, namespace: Any = None) -> CollectorRegistry:
    """The registry an admin app serves: request metrics, cluster gauges, process metrics.

    Parameters
    ----------
    cluster : ClusterManager
    gc : GCQueue
    namespace : Namespace or None, default None

    Returns
    -------
    prometheus_client.CollectorRegistry
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Forward(REGISTRY))
    registry.register(ClusterCollector(cluster, gc, namespace))
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(_Forward(collector))
    return registry
