"""The scrubber: a storage server re-reads its committed chunks and checks every block's CRC32C.

Disks rot quietly, and a read only finds a bad block when a client asks for
it. :class:`Scrubber` walks every committed chunk of the node's targets in
(inode, index) order, reads its committed file and compares each block with
the CRC32C stored when the version committed, at most ``rate`` bytes a second
(it sleeps between chunks to keep to it). A chunk that does not match, or whose
file cannot be read, is marked damaged (:meth:`ChunkStore.mark_damaged`):
reads of it there answer ``NOT_FOUND`` and go to another replica, and
``on_damaged`` tells the metaserver, which has the target resynced from a
healthy replica of its chain (:mod:`emberfs.metaserver.repair`). A pass starts
``interval`` seconds after the previous one started (the first ``delay``
seconds after the node starts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from emberfs.common import framing
from emberfs.storageserver import metrics
from emberfs.storageserver.chunkfiles import pread_all
from emberfs.storageserver.chunkstore import ChunkMeta, ChunkStore

log = logging.getLogger(__name__)

PAGE = 256  # chunk records listed at a time


@dataclass
class PassStats:
    """What one pass over every target found."""

    chunks: int = 0
    bytes: int = 0
    damaged: int = 0


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
    """

    def __init__(
        self,
        stores: Callable[[], dict[int, ChunkStore]],
        rate: float,
        on_damaged: Callable[[int, ChunkMeta], None],
        stop: threading.Event,
    ) -> None:
        if not rate > 0:
            raise ValueError("the scrub rate must be positive")
        self.stores = stores
        self.rate = rate
        self.on_damaged = on_damaged
        self.stop = stop

    def run(self, interval: float, delay: float) -> None:
        """Run a pass every ``interval`` seconds, the first after ``delay``, until stopped."""
        next_at = time.monotonic() + delay
        while not self.stop.wait(max(0.0, next_at - time.monotonic())):
            next_at = time.monotonic() + interval
            try:
                self.scrub_pass()
            except Exception:  # a bug: log it, try again at the next pass
                log.exception("scrub pass failed")

    def scrub_pass(self) -> PassStats:
        """One pass over every committed chunk of every target; its figures."""
        stats = PassStats()
        budget_start = time.monotonic()
        for target_id, store in sorted(self.stores().items()):
            after = None
            while not self.stop.is_set():
                page = store.list(after=after, limit=PAGE)
                for meta in page:
                    if self.stop.is_set():
                        return stats
                    n = self._verify(target_id, store, meta, stats)
                    stats.bytes += n
                    # keep to the rate: sleep until the bytes read so far are due
                    due = budget_start + stats.bytes / self.rate
                    if due > time.monotonic():
                        self.stop.wait(due - time.monotonic())
                if len(page) < PAGE:
                    break
                after = (page[-1].inode, page[-1].index)
        log.info(
            "scrub pass: %d chunks, %d bytes verified, %d damaged",
            stats.chunks,
            stats.bytes,
            stats.damaged,
        )
        return stats

    def _verify(self, target_id: int, store: ChunkStore, meta: ChunkMeta, stats: PassStats) -> int:
        """Check one chunk; bytes read."""
        if meta.damaged or not meta.version:
            return 0
        try:
            with store.committed_file(meta.inode, meta.index) as (fd, committed):
                try:
                    data = pread_all(fd, 0, committed.length)
                    framing.verify(data, committed.crcs, store.block_size)
                    bad, why = False, ""
                except framing.FrameError as exc:
                    bad, why = True, f"block CRC32C mismatch: {exc}"
                except OSError as exc:
                    bad, why = True, f"unreadable: {exc}"
        except KeyError:
            return 0  # removed, or damaged, since it was listed
        stats.chunks += 1
        metrics.SCRUB_BYTES.labels(str(target_id)).inc(committed.length)
        if not bad:
            return committed.length
        if store.mark_damaged(committed.inode, committed.index, committed.version):
            stats.damaged += 1
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
        return committed.length
