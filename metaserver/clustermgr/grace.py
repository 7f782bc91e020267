"""Judging silence fairly: the metaserver's own stalls and restarts give grace.

The metaserver declares a storage node down when its heartbeats stop, and ends
a write session when its client stops renewing it. Both judge silence, and
silence the metaserver caused itself must not count: while it was stopped (a
GC pause, ``SIGSTOP``, a paused virtual machine) or not yet running (a
restart), nobody could reach it, and when it runs again every node and every
writer looks silent for the length of that gap.

:class:`Grace` keeps one monotonic time, :attr:`Grace.since`: the earliest the
metaserver has been able to hear from everyone without a break. Ages are
counted from the later of an item's last sign of life and that time
(:meth:`Grace.silence`), so everything gets at least a full timeout after

- the start: :meth:`Grace.begin` once all its servers listen (stored sessions and
  known nodes are judged from then, never by times stored before a restart);
- a stall: every judging round starts with :meth:`Grace.check`, which finds
  the gap since the previous round (of any judge). A gap longer than
  ``max_gap`` is a stall of the metaserver itself, and ``since`` moves to now.

The metaserver runs a round at least every ``max_gap / 2`` seconds (its
heartbeat timeout check), so a gap that is not counted as a stall is shorter
than ``max_gap``; with ``max_gap`` half the shortest timeout judged, a stall
that goes unnoticed can never by itself push an age past a timeout.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Grace:
    """The time since which the metaserver has heard without a break, on its monotonic clock.

    Parameters
    ----------
    max_gap : float, default math.inf
        Seconds between two judging rounds beyond which the metaserver itself
        was stalled (infinite: stalls are never noticed, for a judge driven by
        hand).
    clock : callable, default time.monotonic
        Monotonic seconds; tests inject their own.
    """

    def __init__(self, *, max_gap: float = math.inf, clock: Callable[[], float] = time.monotonic):
        if not max_gap > 0:
            raise ValueError("max_gap must be positive")
        self.max_gap = max_gap
        self.clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._since = now
        self._last_round = now
        self.stalls = 0  # stalls noticed since the start
        self.stalled_seconds = 0.0  # their gaps, summed

    @property
    def since(self) -> float:
        """Silence is counted from this monotonic time at the earliest."""
        with self._lock:
            return self._since

    def begin(self, hold: float = 0.0) -> float:
        """The metaserver hears from now on (all its servers listen): nothing is judged before now.

        ``hold``: nothing is judged before ``hold`` seconds from now either (a
        metaserver that takes the cluster over from another waits out the
        grants the other may still be making, see :mod:`emberfs.metaserver.clustermgr.leadership`).
        """
        with self._lock:
            now = self.clock()
            self._since = max(self._since, now + hold)
            self._last_round = max(self._last_round, now)
            return now

    def check(self) -> float:
        """Start a judging round: notice a stall of the metaserver since the last round; now.

        After a gap longer than ``max_gap`` since the previous round,
        :attr:`since` moves to now, so every age judged restarts from zero.
        """
        with self._lock:
            now = self.clock()
            gap = now - self._last_round
            self._last_round = max(self._last_round, now)
            if gap <= self.max_gap:
                return now
            self._since = max(self._since, now)
            self.stalls += 1
            self.stalled_seconds += gap
        log.warning(
            "the metaserver heard nothing for %.1f s (stopped or starved); "
            "every storage node and write session is judged from now",
            gap,
        )
        return now

    def silence(self, last: float, now: float) -> float:
        """Seconds of silence at ``now`` of an item last heard from at ``last``.

        Counted from :attr:`since` at the earliest; never negative.
        """
        with self._lock:
            since = self._since
        return max(0.0, now - max(last, since))
