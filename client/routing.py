"""The client's cached view of the cluster: which targets hold which chain, and where.

:class:`RoutingCache` fetches ``ClusterService.GetRouting`` once and keeps the
answer as an immutable :class:`RoutingInfo`; the data path asks for a refresh
when a storage server says the chain version is stale, a target is not
serving, or a connection fails. Concurrent refresh requests for the same
stale view are coalesced into one call.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from emberfs.proto import common_pb2

SERVING = common_pb2.SERVING


@dataclass(frozen=True, slots=True)
class Target:
    """One storage target as routing describes it."""

    target_id: int
    node_id: str
    data_address: str
    state: int

    @property
    def serving(self) -> bool:
        return self.state == SERVING


@dataclass(frozen=True, slots=True)
class Chain:
    """One replication chain: version and targets, head first."""

    chain_id: int
    version: int
    targets: tuple[Target, ...]

    @property
    def serving(self) -> tuple[Target, ...]:
        """The SERVING targets in chain order (head first, tail last)."""
        return tuple(t for t in self.targets if t.serving)

    @property
    def head(self) -> Target | None:
        """The target writes go to, or None while the chain's head is not serving."""
        if self.targets and self.targets[0].serving:
            return self.targets[0]
        return None

    @property
    def tail(self) -> Target | None:
        """The last SERVING target (it holds only committed data)."""
        serving = self.serving
        return serving[-1] if serving else None


@dataclass(frozen=True, slots=True)
class RoutingInfo:
    """An immutable snapshot of the cluster's routing."""

    version: int
    chains: dict[int, Chain]
    targets: dict[int, Target]
    fetched_at: float

    @classmethod
    def from_proto(cls, msg: common_pb2.RoutingInfo) -> RoutingInfo:
        targets = {
            t.target_id: Target(t.target_id, t.node_id, t.data_address, t.state)
            for t in msg.targets
        }
        chains = {}
        for c in msg.chains:
            members = tuple(
                targets.get(tid) or Target(tid, "", "", common_pb2.OFFLINE) for tid in c.targets
            )
            chains[c.chain_id] = Chain(c.chain_id, c.version, members)
        return cls(msg.version, chains, targets, time.monotonic())


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
        self._info: RoutingInfo | None = None
        self._lock = threading.Lock()

    def get(self) -> RoutingInfo:
        """The cached routing (fetched if there is none yet)."""
        info = self._info
        if info is None:
            return self.refresh(None)
        return info

    def refresh(self, seen: RoutingInfo | None) -> RoutingInfo:
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
            fresh = RoutingInfo.from_proto(self._fetch())
            self._info = fresh
            return fresh

    def chain(self, chain_id: int) -> tuple[RoutingInfo, Chain]:
        """The routing snapshot and chain ``chain_id`` (refreshing once if unknown)."""
        info = self.get()
        chain = info.chains.get(chain_id)
        if chain is None:
            info = self.refresh(info)
            chain = info.chains.get(chain_id)
            if chain is None:
                raise KeyError(chain_id)
        return info, chain
