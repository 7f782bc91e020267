"""Leaving a server that stopped answering, as soon as the cluster says it is gone.

A storage server that hangs, or whose host drops off the network, neither
answers nor closes its connections: the kernel of a frozen process still takes
requests in, and packets to a vanished host are simply lost. A transfer to it
would wait out its whole socket timeout (tens of seconds), although the
metaserver declares the server offline after its heartbeat timeout.

:class:`StallWatch` closes that gap. Transfers in progress are registered
with the connection they wait on. While any is older than ``interval``, a
daemon thread asks ``live()`` (every ``interval / 2`` seconds) for the data
addresses whose server the cluster still counts as up (it has a target that is
serving, syncing or waiting: :func:`live_addresses`), and shuts down the
connection of each such transfer whose server is not among them. That wakes
the receive or send blocked on it with an error, and its caller fails over to
another replica as after a reset connection. A slow server that the cluster still
counts as up is never left on this account; the socket timeout still bounds
the wait for it.

A server that went away with its host (a killed container) closes the
connections it had, but new ones to its address wait for the connect timeout.
A caller whose transfer to an address failed calls
:meth:`StallWatch.suspect`: the thread then asks ``live()`` at every check for
up to ``horizon`` seconds, so that the routing it refreshes leaves the server
out as soon as the cluster declares it down, and until then ``on_suspect``
(the client marks the address bad: tried last) is called again at each check.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from emberfs.common.periodic import Periodic
from emberfs.proto import common_pb2

log = logging.getLogger(__name__)

# States of a target whose node still heartbeats. A node whose heartbeats stop
# has its targets made OFFLINE, or LASTSRV where one was its chain's last
# serving target.
LIVE_STATES = frozenset({common_pb2.SERVING, common_pb2.SYNCING, common_pb2.WAITING})


def live_addresses(targets: Iterable) -> set[str]:
    """The data addresses of the ``targets`` (with ``data_address`` and ``state``) that are up."""
    return {t.data_address for t in targets if t.state in LIVE_STATES}


class Watched:
    """What became of a transfer watched with :meth:`StallWatch.watching`."""

    __slots__ = ("cut",)

    def __init__(self) -> None:
        self.cut = False  # the watch shut its connection down (its server is down)


class StallWatch:
    """Shuts down the connections of transfers that wait on a server the cluster has left.

    Parameters
    ----------
    live : callable
        Returns the data addresses (``host:port``) of the servers the cluster
        counts as up now (:func:`live_addresses` of the routing's targets).
        Called from the watch thread only, only while a transfer has waited
        ``interval`` or an address is suspected; it may ask the metaserver
        (the client) or read the routing a server already holds (a storage
        server).
    interval : float
        Seconds a transfer runs before its server is checked, and then
        between checks.
    on_abandon : callable, optional
        ``on_abandon(address)`` just before the transfers to ``address`` are
        cut (the client marks the address bad, so that the woken caller does
        not try that server again at once).
    horizon : float, default 10.0
        Seconds an address stays suspected after :meth:`suspect` while the
        cluster still counts it as up.
    on_suspect : callable, optional
        ``on_suspect(address)`` at each check while a suspected address is
        still counted as up.
    """

    def __init__(
        self,
        live: Callable[[], set[str]],
        interval: float,
        on_abandon: Callable[[str], None] = lambda address: None,
        *,
        horizon: float = 10.0,
        on_suspect: Callable[[str], None] = lambda address: None,
    ) -> None:
        self._live = live
        self.interval = interval
        self._on_abandon = on_abandon
        self.horizon = horizon
        self._on_suspect = on_suspect
        self._suspects: dict[str, float] = {}  # address -> when suspicion ends
        self._lock = threading.Lock()
        self._active: dict[int, tuple[str, socket.socket, float]] = {}
        self._keys = itertools.count()
        # checks every interval / 2, from the first transfer or suspicion on
        self._ticker = Periodic(
            self.check, interval / 2, "emberfs-stalls", "stall check", logging.DEBUG
        )
        self.abandoned = 0  # transfers cut so far

    def add(self, address: str, sock: socket.socket) -> int:
        """Watch a transfer on ``sock`` to ``address`` from now; the key for :meth:`remove`."""
        key = next(self._keys)
        with self._lock:
            self._active[key] = (address, sock, time.monotonic())
            self._ticker.start()
        return key

    def suspect(self, address: str) -> None:
        """A transfer to ``address`` failed: follow the routing for it for ``horizon`` seconds."""
        with self._lock:
            self._suspects[address] = time.monotonic() + self.horizon
            self._ticker.start()

    def remove(self, key: int) -> bool:
        """The transfer is over: its connection is never touched from here on.

        Returns whether the watch had cut it (its server is down: no
        point in trying that server again at once).
        """
        with self._lock:
            return self._active.pop(key, None) is None

    @contextlib.contextmanager
    def watching(self, address: str, sock: socket.socket) -> Iterator[Watched]:
        """Watch the transfer on ``sock`` for the duration of the block.

        Yields a :class:`Watched` whose ``cut`` tells, once the block is left,
        whether the watch cut the transfer.
        """
        watched = Watched()
        key = self.add(address, sock)
        try:
            yield watched
        finally:
            watched.cut = self.remove(key)

    def check(self, now: float | None = None) -> int:
        """Cut the transfers older than ``interval`` whose server the cluster has left.

        Returns how many were cut. ``live()`` is called only when some
        transfer is that old or some address is suspected; its errors
        propagate. A suspected address that ``live()`` leaves out is no longer
        suspected; one it still names gets ``on_suspect``. ``now``
        (``time.monotonic()`` by default) is the time ages are taken at.
        """
        now = time.monotonic() if now is None else now
        with self._lock:
            waiting = [
                k for k, (_, _, since) in self._active.items() if now - since >= self.interval
            ]
            for address in [a for a, until in self._suspects.items() if until <= now]:
                del self._suspects[address]
            suspects = list(self._suspects)
        if not waiting and not suspects:
            return 0
        live = self._live()
        still = [a for a in suspects if a in live]
        with self._lock:
            for address in suspects:
                if address not in live:  # declared down: the routing now leaves it out
                    self._suspects.pop(address, None)
        for address in still:
            self._on_suspect(address)
        if not waiting:
            return 0
        with self._lock:
            gone = {
                entry[0]
                for entry in map(self._active.get, waiting)
                if entry is not None and entry[0] not in live
            }
        # told before the cut, so that a caller woken by it already sees the server left
        for address in sorted(gone):
            self._on_abandon(address)
        cut: list[str] = []
        with self._lock:  # a transfer removed meanwhile may have handed its socket on
            for key in waiting:
                entry = self._active.get(key)
                if entry is None or entry[0] not in gone:
                    continue
                del self._active[key]  # cut once
                address, sock, _ = entry
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                cut.append(address)
            self.abandoned += len(cut)
        for address in sorted(set(cut)):
            log.warning(
                "left %d transfer(s) to %s: the cluster has declared it offline",
                cut.count(address),
                address,
            )
        return len(cut)

    def stop(self) -> None:
        """Stop the watch thread (transfers then wait out their socket timeouts)."""
        self._ticker.stop()
