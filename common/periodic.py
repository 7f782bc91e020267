"""A daemon thread that does one thing every few seconds, started on first need.

The client renews its write sessions' leases this way, and the stall watch
checks the routing of stalled transfers. Neither should cost a thread before
it has work, nor outlive :meth:`Periodic.stop`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """Calls ``fn()`` every ``interval`` seconds in a daemon thread, from :meth:`start` on.

    Parameters
    ----------
    fn : callable
        The work of one round. An exception is logged (``what`` says what
        failed) and the next round runs as usual.
    interval : float
        Seconds between rounds (the first round runs one interval after start).
    name : str
        The thread's name.
    what : str
        Names the work in the log line of a failed round.
    level : int, default logging.WARNING
        Level of that log line.
    """

    def __init__(
        self,
        fn: Callable[[], object],
        interval: float,
        name: str,
        what: str,
        level: int = logging.WARNING,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"{what}: interval {interval} is not positive")
        self._fn = fn
        self.interval = interval
        self._name = name
        self._what = what
        self._level = level
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread unless it runs already or was stopped."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._fn()
            except Exception as exc:
                log.log(self._level, "%s failed: %s", self._what, exc)

    def stop(self) -> None:
        """Stop the thread (waiting a second for a round in progress); it never starts again."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
