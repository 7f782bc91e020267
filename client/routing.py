"""The client's cached view of the cluster: which targets hold which chain, and where.

:class:`RoutingCache` fetches ``ClusterService.GetRouting`` once and keeps the
answer as an immutable :class:`~emberfs.common.routing.RoutingView`; the data
path asks for a refresh when a storage server says the chain version is stale,
a target is not serving, or a connection fails. Concurrent refresh requests for the same
stale view are coalesced into one call.
"""

from __future__ import annotations

import threading
import time

from emberfs.common.routing import ChainView, RoutingView


class RoutingCache:
    """The routing info of one cluster, fetched on first use and refreshed on demand.

    Parameters
    ----------
    fetch : callable
        Returns a ``common_pb2.RoutingInfo`` (``MetaClient.routing``).
    min_interval : float, default 0.02
        Refreshes closer together than this reuse the last answer.
    """

    def __init__(self, fetch, min_interval: float = 0.02) -> None:
        self._fetch = fetch
        self._min_interval = min_interval
        self._info: RoutingView | None = None
        self._lock = threading.Lock()

    def get(self) -> RoutingView:
        """The cached routing (fetched if there is none yet)."""
        info = self._info
        if info is None:
            return self.refresh(None)
        return info

    def refresh(self, seen: RoutingView | None) -> RoutingView:
        """A newer routing than ``seen`` (the view the caller found stale).

        If another thread refreshed since ``seen`` was taken, its answer is
        returned without another call.
        """
        with self._lock:
            info = self._info
            if info is not None and info is not seen:
                return info
            if (
                info is not None
                and seen is not None
                and time.monotonic() - info.fetched_at < self._min_interval
            ):
                return info
            fresh = RoutingView.from_proto(self._fetch())
            self._info = fresh
            return fresh

    def chain(self, chain_id: int) -> tuple[RoutingView, ChainView]:
        """The routing snapshot and chain ``chain_id`` (refreshing once if unknown)."""
        info = self.get()
        chain = info.chains.get(chain_id)
        if chain is None:
            info = self.refresh(info)
            chain = info.chains.get(chain_id)
            if chain is None:
                raise KeyError(chain_id)
        return info, chain
