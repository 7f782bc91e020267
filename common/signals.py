"""SIGTERM and SIGINT as a request to stop, handled so that no signal can deadlock the process.

A Python signal handler runs in the main thread between two of its bytecodes,
and may run while that thread holds the lock inside a ``threading.Event`` it
waits on or sets, including while an earlier handler is inside
``Event.set()`` (a second Ctrl-C, or a supervisor's SIGTERM right after an
interrupt). A handler that calls ``Event.set()`` then waits for a lock its own
thread holds, forever. :class:`StopSignals` keeps the handler to one
assignment; a watcher thread notices it and calls the stop function once.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable

POLL = 0.05  # seconds between two looks of the watcher


class StopSignals:
    """Call ``on_stop()`` (once, from a thread of its own) after SIGTERM or SIGINT.

    Parameters
    ----------
    on_stop : callable
        What a stop request does (typically ``event.set``).
    signals : iterable of int, default (SIGTERM, SIGINT)
        The signals that ask for a stop.
    install : bool, default True
        Install the handler (False: call :meth:`handler` yourself, as tests do).
    """

    def __init__(
        self,
        on_stop: Callable[[], object],
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
        *,
        install: bool = True,
    ) -> None:
        self._on_stop = on_stop
        self.requested = False
        self._thread = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
        self._thread.start()
        if install:
            for sig in signals:
                signal.signal(sig, self.handler)

    def handler(self, signum, frame) -> None:
        """The signal handler: it only notes the request (no lock, no call)."""
        self.requested = True

    def _watch(self) -> None:
        while not self.requested:
            time.sleep(POLL)
        self._on_stop()
