"""Prometheus metrics of a storage server.

The metric objects live in :data:`REGISTRY` (one per process, with the
process and Python runtime collectors); the data server, the replication
code and the resync worker bump them, and :func:`start_metrics_server` serves
them on ``/metrics`` (the ``--metrics-listen`` address, by default the data
port + 2).

Metrics
-------
``emberfs_storage_read_bytes_total{target}``
    Chunk data bytes sent to readers.
``emberfs_storage_written_bytes_total{target}``
    Chunk data bytes stored by writes (from clients, forwarded and resync copies).
``emberfs_storage_client_read_bytes_total{client}``, ``emberfs_storage_client_written_bytes_total{client}``
    Chunk data bytes sent to a client and received in its writes answered OK, by the
    client's address (servers' connections, and every connection when the cluster runs
    without authentication, are not counted; :data:`MAX_CLIENT_LABELS` addresses at
    most, later ones as ``other``).
``emberfs_storage_chunk_ops_total{op, status}``
    Chunk operations (``read``, ``write``, ``forward``, ``truncate``, ``remove``)
    by framing status name (``OK``, ``STALE_CHAIN``, ...).
``emberfs_storage_chunk_op_duration_seconds{op}``
    Time to serve one chunk operation.
``emberfs_storage_checksum_errors_total{target}``
    Blocks whose CRC32C did not match (received data or data on disk).
``emberfs_storage_resync_chunks_total{chain, action}``
    Chunks a resync ``copied`` to or ``removed`` from a syncing successor.
``emberfs_storage_resync_running{chain}``
    1 while this node resyncs the chain's successor.
``emberfs_storage_resyncs_total{result}``
    Finished resyncs: ``done`` or ``failed``.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

REGISTRY = CollectorRegistry(auto_describe=True)
"""Every metric of this storage server process."""

for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

BYTES_READ = Counter(
    "emberfs_storage_read_bytes",
    "Chunk data bytes sent to readers, by target.",
    ["target"],
    registry=REGISTRY,
)
BYTES_WRITTEN = Counter(
    "emberfs_storage_written_bytes",
    "Chunk data bytes stored by writes (client, forwarded, resync), by target.",
    ["target"],
    registry=REGISTRY,
)
CHUNK_OPS = Counter(
    "emberfs_storage_chunk_ops",
    "Chunk operations served, by operation and framing status.",
    ["op", "status"],
    registry=REGISTRY,
)
CHUNK_OP_LATENCY = Histogram(
    "emberfs_storage_chunk_op_duration_seconds",
    "Time to serve one chunk operation, by operation.",
    ["op"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
CHECKSUM_ERRORS = Counter(
    "emberfs_storage_checksum_errors",
    "Blocks whose CRC32C did not match, by target.",
    ["target"],
    registry=REGISTRY,
)
SCRUB_BYTES = Counter(
    "emberfs_storage_scrub_bytes",
    "Committed chunk bytes the scrubber read and checked against their block CRC32Cs, by target.",
    ["target"],
    registry=REGISTRY,
)
SCRUB_DAMAGED = Counter(
    "emberfs_storage_scrub_damaged",
    "Chunks the scrubber found damaged (a block CRC32C mismatch, an unreadable file), by target.",
    ["target"],
    registry=REGISTRY,
)
SCRUB_PASS_START = Gauge(
    "emberfs_storage_scrub_pass_start_seconds",
    "When the scrubber's pass under way (or its last) began on the target, Unix time.",
    ["target"],
    registry=REGISTRY,
)
SCRUB_PASS_END = Gauge(
    "emberfs_storage_scrub_last_full_pass_seconds",
    "When the scrubber last finished a pass over the whole target, Unix time.",
    ["target"],
    registry=REGISTRY,
)
SCRUB_REPAIRED = Gauge(
    "emberfs_storage_scrub_repaired",
    "Damaged chunks of the target that a whole copy (a resync) made whole again since the "
    "server started.",
    ["target"],
    registry=REGISTRY,
)
CLIENT_READ_BYTES = Counter(
    "emberfs_storage_client_read_bytes",
    "Chunk data bytes sent to clients, by client address.",
    ["client"],
    registry=REGISTRY,
)
CLIENT_WRITTEN_BYTES = Counter(
    "emberfs_storage_client_written_bytes",
    "Chunk data bytes of client writes answered OK, by client address.",
    ["client"],
    registry=REGISTRY,
)
MAX_CLIENT_LABELS = 64
"""Client addresses the client byte counters name; the ones after them count as ``other``."""
RESYNC_CHUNKS = Counter(
    "emberfs_storage_resync_chunks",
    "Chunks a resync copied to or removed from a syncing successor, by chain.",
    ["chain", "action"],
    registry=REGISTRY,
)
RESYNC_RUNNING = Gauge(
    "emberfs_storage_resync_running",
    "1 while this node resyncs the successor of the chain.",
    ["chain"],
    registry=REGISTRY,
)
RESYNCS = Counter(
    "emberfs_storage_resyncs",
    "Finished resyncs, by result (done or failed).",
    ["result"],
    registry=REGISTRY,
)

for _result in ("done", "failed"):
    RESYNCS.labels(_result)  # both series from the start, at 0


class ClientLabels:
    """The label of each client address: itself for the first ``limit`` seen, then ``other``.

    Keeps the number of series of the per-client counters bounded whatever the
    number of clients.
    """

    OTHER = "other"

    def __init__(self, limit: int = MAX_CLIENT_LABELS) -> None:
        self.limit = limit
        self._named: set[str] = set()
        self._lock = threading.Lock()

    def label(self, address: str) -> str:
        with self._lock:
            if address in self._named:
                return address
            if len(self._named) < self.limit:
                self._named.add(address)
                return address
            return self.OTHER


_client_labels = ClientLabels()


def count_client(peer, read: int = 0, written: int = 0) -> None:
    """Record chunk data bytes sent to (``read``) or written by a client at ``peer``.

    ``peer`` is the socket address of the client's connection (its host is the label).
    """
    host = peer[0] if isinstance(peer, tuple) else str(peer)
    label = _client_labels.label(str(host))
    if read:
        CLIENT_READ_BYTES.labels(label).inc(read)
    if written:
        CLIENT_WRITTEN_BYTES.labels(label).inc(written)


def export_target(target_id: int) -> None:
    """Export the per-target counters of ``target_id`` at 0 until they count something.

    An alert on the increase of, say, checksum errors then has a series to watch from
    the node's start, not only from its first error.
    """
    label = str(target_id)
    for counter in (BYTES_READ, BYTES_WRITTEN, CHECKSUM_ERRORS, SCRUB_BYTES, SCRUB_DAMAGED):
        counter.labels(label)


_totals_lock = threading.Lock()
_read_total: dict[int, int] = {}
_written_total: dict[int, int] = {}


def count_read(target_id: int, nbytes: int) -> None:
    """Record ``nbytes`` of chunk data sent to a reader from ``target_id``."""
    BYTES_READ.labels(str(target_id)).inc(nbytes)
    with _totals_lock:
        _read_total[target_id] = _read_total.get(target_id, 0) + nbytes


def count_written(target_id: int, nbytes: int) -> None:
    """Record ``nbytes`` of chunk data stored on ``target_id``."""
    BYTES_WRITTEN.labels(str(target_id)).inc(nbytes)
    with _totals_lock:
        _written_total[target_id] = _written_total.get(target_id, 0) + nbytes


def io_totals(target_id: int) -> tuple[int, int]:
    """``(bytes read, bytes written)`` of a target since this process started.

    What a heartbeat reports in ``TargetReport.bytes_read`` and
    ``bytes_written``, so the metaserver can show cluster throughput.
    """
    with _totals_lock:
        return _read_total.get(target_id, 0), _written_total.get(target_id, 0)


def start_metrics_server(
    host: str, port: int, registry: CollectorRegistry = REGISTRY
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` over HTTP on ``host:port`` (port 0: any) in a daemon thread.

    Parameters
    ----------
    host : str
        The address to bind (only this one).
    port : int
        The port; 0 picks a free one (read it from ``server.server_port``).
    registry : CollectorRegistry, default REGISTRY

    Returns
    -------
    (server, thread)
        Stop it with ``server.shutdown(); server.server_close()``.

    Raises
    ------
    OSError
        The address cannot be bound.
    """
    return start_http_server(port, addr=host, registry=registry)


class IoCounters:
    """Bytes each target of one data server sent to readers and stored by writes.

    Every count also goes to the process's metrics (:func:`count_read`,
    :func:`count_written`).
    """

    def __init__(self) -> None:
        self._io: dict[int, list[int]] = {}  # target id -> [bytes read, bytes written]
        self._lock = threading.Lock()

    def get(self, target_id: int) -> tuple[int, int]:
        """(bytes sent to readers, bytes stored by writes) of a target since start."""
        with self._lock:
            read, written = self._io.get(target_id, (0, 0))
            return read, written

    def count(self, target_id: int, read: int = 0, written: int = 0) -> None:
        with self._lock:
            counters = self._io.setdefault(target_id, [0, 0])
            counters[0] += read
            counters[1] += written
        if read:
            count_read(target_id, read)
        if written:
            count_written(target_id, written)
