"""The scrubber: a storage server re-reads its committed chunks and checks every block's CRC32C.

Disks rot quietly, and a read only finds a bad block when a client asks for
it. :class:`Scrubber` walks every committed chunk of the node's targets in
(inode, index) order, reads its committed file and compares each block with
the CRC32C stored when the version committed, at most ``rate`` bytes a second
(it sleeps between chunks to keep to it). A chunk that does not match, or whose
file cannot be read, is marked damaged (:meth:`ChunkStore.mark_damaged`):
reads of it there answer ``NOT_FOUND`` and go to another replica, and
``on_damaged`` tells the metaserver, which has the target resynced from a
healthy replica of its chain (:mod:`emberfs.metaserver.clustermgr.repair`). A pass starts
``interval`` seconds after the previous one started (the first ``delay``
seconds after the node starts), or at once when the operator starts one.

It gives way to clients: before each chunk it waits while the node has client
requests in flight (``busy()``), at most :data:`YIELD_MAX` seconds a chunk, so a
busy node still scrubs, slowly. The operator's control (``emberfs admin scrub
start|pause``) arrives with heartbeat answers (:meth:`Scrubber.control`); its
progress per target goes back in heartbeats (:meth:`Scrubber.report`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from emberfs.common import framing
from emberfs.proto import cluster_pb2
from emberfs.storageserver import metrics
from emberfs.storageserver.chunkfiles import pread_all
from emberfs.storageserver.chunkstore import ChunkMeta, ChunkStore

log = logging.getLogger(__name__)

PAGE = 256  # chunk records listed at a time
TICK = 0.1  # seconds between looks at the clock, the control and the stop flag when idle
YIELD_MAX = 0.5  # seconds the scrub waits for clients before each chunk, at most


@dataclass
class PassStats:
    """What one pass over every target found."""

    chunks: int = 0
    bytes: int = 0
    damaged: int = 0


@dataclass
class TargetProgress:
    """The scrubber's progress on one target (wall-clock ns; counts since the node started)."""

    running: bool = False
    pass_started_ns: int = 0
    last_pass_ended_ns: int = 0
    bytes: int = 0
    chunks: int = 0
    errors: int = 0
    passes: int = 0


def check_chunk(
    store: ChunkStore, inode: int, index: int, *, blocks: bool
) -> tuple[ChunkMeta | None, int, str]:
    """Check the committed content of one chunk: ``(meta, bytes read, problem)``.

    ``blocks`` reads the file and checks every block against its stored
    CRC32C; otherwise only that the file opens and is long enough. The
    problem is "" when there is none; ``meta`` is None when the chunk has no
    committed, undamaged version (nothing to check).
    """
    try:
        with store.committed_file(inode, index) as (fd, committed):
            try:
                if not blocks:
                    size = os.fstat(fd).st_size
                    if size < committed.length:
                        return committed, 0, f"its file holds {size} of {committed.length} bytes"
                    return committed, 0, ""
                data = pread_all(fd, 0, committed.length)
                framing.verify(data, committed.crcs, store.block_size)
                return committed, committed.length, ""
            except framing.FrameError as exc:
                return committed, committed.length, f"block CRC32C mismatch: {exc}"
            except OSError as exc:
                return committed, 0, f"unreadable: {exc}"
    except KeyError:
        return None, 0, ""
    except OSError as exc:  # the file is gone or cannot be opened
        meta = store.meta(inode, index)
        if meta is None or not meta.version or meta.damaged:
            return None, 0, ""
        return meta, 0, f"its file cannot be opened: {exc}"


class Scrubber:
    """Verifies the committed chunks of a node's targets against their block CRC32Cs.

    Parameters
    ----------
    stores : callable
        ``stores()`` -> ``{target id: ChunkStore}`` of the node now.
    rate : float
        Bytes a second a pass reads at most (> 0).
    on_damaged : callable
        ``on_damaged(target_id, meta)`` for each chunk a pass marked damaged.
    stop : threading.Event
        Ends a pass between chunks, and :meth:`run`.
    busy : callable, optional
        ``busy()`` is true while clients have requests in flight on the node.
    """

    def __init__(
        self,
        stores: Callable[[], dict[int, ChunkStore]],
        rate: float,
        on_damaged: Callable[[int, ChunkMeta], None],
        stop: threading.Event,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        if not rate > 0:
            raise ValueError("the scrub rate must be positive")
        self.stores = stores
        self.rate = rate
        self.on_damaged = on_damaged
        self.stop = stop
        self.busy = busy
        self.paused = False
        self._kick = threading.Event()
        self._start_seen: int | None = None
        self._due = 0.0  # monotonic time by which the bytes read so far may have been read
        self._lock = threading.Lock()
        self._progress: dict[int, TargetProgress] = {}

    # control and progress -------------------------------------------------------

    def control(self, paused: bool, start: int) -> None:
        """Apply the operator's control: pause, or begin a pass now when ``start`` rose.

        The first ``start`` seen is only noted (it was raised before this node heard).
        """
        self.paused = paused
        if self._start_seen is not None and start > self._start_seen:
            self._kick.set()
        self._start_seen = start

    def report(self, target_id: int, repairs: int) -> cluster_pb2.ScrubReport:
        """The progress on ``target_id`` for a heartbeat; ``repairs`` as its store counts them."""
        metrics.SCRUB_REPAIRED.labels(str(target_id)).set(repairs)
        with self._lock:
            p = self._progress.get(target_id) or TargetProgress()
            return cluster_pb2.ScrubReport(
                running=p.running,
                paused=self.paused,
                pass_started_ns=p.pass_started_ns,
                last_pass_ended_ns=p.last_pass_ended_ns,
                bytes_verified=p.bytes,
                chunks_verified=p.chunks,
                errors=p.errors,
                repairs=repairs,
                passes=p.passes,
            )

    def _update(self, target_id: int, **changes) -> TargetProgress:
        with self._lock:
            p = self._progress.setdefault(target_id, TargetProgress())
            for name, value in changes.items():
                setattr(p, name, value)
            return p

    # passes ---------------------------------------------------------------------

    def run(self, interval: float, delay: float) -> None:
        """Run a pass every ``interval`` seconds, the first after ``delay``, until stopped.

        A start from the operator begins one at once; while paused none begins.
        """
        next_at = time.monotonic() + delay
        while not self.stop.wait(TICK):
            if self.paused or (not self._kick.is_set() and time.monotonic() < next_at):
                continue
            self._kick.clear()
            next_at = time.monotonic() + interval
            try:
                self.scrub_pass()
            except Exception:  # a bug: log it, try again at the next pass
                log.exception("scrub pass failed")

    def _give_way(self) -> None:
        """Before a chunk: wait while paused, and while clients are busy (a while at most)."""
        while self.paused and not self.stop.wait(TICK):
            pass
        until = time.monotonic() + YIELD_MAX
        while self.busy() and time.monotonic() < until and not self.stop.wait(0.005):
            pass

    def _keep_to_rate(self, n: int) -> None:
        """Sleep so that reading ``n`` more bytes keeps the pass at its rate (pauses not made up)."""
        self._due = max(self._due, time.monotonic()) + n / self.rate
        wait = self._due - time.monotonic()
        if wait > 0:
            self.stop.wait(wait)

    def scrub_pass(self) -> PassStats:
        """One pass over every committed chunk of every target; its figures."""
        stats = PassStats()
        for target_id, store in sorted(self.stores().items()):
            started = time.time_ns()
            self._update(target_id, running=True, pass_started_ns=started, bytes=0, chunks=0)
            metrics.SCRUB_PASS_START.labels(str(target_id)).set(started / 1e9)
            walked = self._scrub_target(target_id, store, stats)
            with self._lock:
                p = self._progress[target_id]
                p.running = False
                if walked:
                    p.last_pass_ended_ns = time.time_ns()
                    p.passes += 1
                    metrics.SCRUB_PASS_END.labels(str(target_id)).set(p.last_pass_ended_ns / 1e9)
            if not walked:
                return stats
        log.info(
            "scrub pass: %d chunks, %d bytes verified, %d damaged",
            stats.chunks,
            stats.bytes,
            stats.damaged,
        )
        return stats

    def _scrub_target(self, target_id: int, store: ChunkStore, stats: PassStats) -> bool:
        """Verify every committed chunk of one target; False when stopped before the end."""
        after = None
        while True:
            page = store.list(after=after, limit=PAGE)
            for meta in page:
                self._give_way()
                if self.stop.is_set():
                    return False
                before = stats.chunks
                n = self._verify(target_id, store, meta, stats)
                stats.bytes += n
                with self._lock:
                    p = self._progress[target_id]
                    p.bytes += n
                    p.chunks += stats.chunks - before
                self._keep_to_rate(n)
            if len(page) < PAGE:
                return True
            after = (page[-1].inode, page[-1].index)

    def _verify(self, target_id: int, store: ChunkStore, meta: ChunkMeta, stats: PassStats) -> int:
        """Check one chunk; bytes read."""
        if meta.damaged or not meta.version:
            return 0
        committed, read, why = check_chunk(store, meta.inode, meta.index, blocks=True)
        if committed is None:
            return 0  # removed, or damaged, since it was listed
        stats.chunks += 1
        metrics.SCRUB_BYTES.labels(str(target_id)).inc(read)
        if not why:
            return read
        if store.mark_damaged(committed.inode, committed.index, committed.version):
            stats.damaged += 1
            with self._lock:
                self._progress[target_id].errors += 1
            metrics.SCRUB_DAMAGED.labels(str(target_id)).inc()
            log.warning(
                "target %d: chunk %d:%d version %d is damaged (%s): marked, reported",
                target_id,
                committed.inode,
                committed.index,
                committed.version,
                why,
            )
            self.on_damaged(target_id, committed)
        return read
