"""The routing view: which targets hold which chain, in what order, and where they listen.

The metaserver publishes the cluster's routing as a ``common_pb2.RoutingInfo``;
every process that moves chunk data (the client, the storage servers, the
metaserver when it cuts chunks) reads it through one immutable
:class:`RoutingView`, built in one place (:meth:`RoutingView.from_proto`).

A chain's targets are kept in chain order. The metaserver orders them serving,
lastsrv, syncing, waiting, offline, so:

* the **head** (where writes enter) is the first target, when it is SERVING;
* the **write chain** is the SERVING and SYNCING targets in order; each
  forwards an update to the next one (its **successor**), the last one is the
  tail of the write;
* reads go to any SERVING target; the **tail** of the read side is the last
  SERVING one (it holds only committed data).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from emberfs.proto import common_pb2

SERVING = common_pb2.SERVING
SYNCING = common_pb2.SYNCING
WRITABLE_STATES = frozenset({SERVING, SYNCING})


@dataclass(frozen=True, slots=True)
class TargetView:
    """One storage target as the routing describes it."""

    target_id: int
    node_id: str = ""
    data_address: str = ""
    grpc_address: str = ""
    state: int = SERVING
    chain_id: int = 0

    @property
    def serving(self) -> bool:
        return self.state == SERVING

    @property
    def writable(self) -> bool:
        """Whether the target takes writes (SERVING or SYNCING)."""
        return self.state in WRITABLE_STATES


@dataclass(frozen=True, slots=True)
class ChainView:
    """One chain: its version and its targets in chain order (head first)."""

    chain_id: int
    version: int
    targets: tuple[TargetView, ...] = ()

    @property
    def target_ids(self) -> tuple[int, ...]:
        return tuple(t.target_id for t in self.targets)

    @property
    def serving(self) -> tuple[TargetView, ...]:
        """The SERVING targets in chain order (head first, tail last)."""
        return tuple(t for t in self.targets if t.serving)

    @property
    def writable(self) -> tuple[TargetView, ...]:
        """The write chain: SERVING and SYNCING targets in chain order."""
        return tuple(t for t in self.targets if t.writable)

    @property
    def head(self) -> TargetView | None:
        """The target writes go to, or None while the chain's first target is not serving."""
        if self.targets and self.targets[0].serving:
            return self.targets[0]
        return None

    @property
    def tail(self) -> TargetView | None:
        """The last SERVING target (it holds only committed data)."""
        serving = self.serving
        return serving[-1] if serving else None

    def _neighbour(self, target_id: int, step: int) -> TargetView | None:
        writable = self.writable
        ids = [t.target_id for t in writable]
        if target_id not in ids:
            return None
        i = ids.index(target_id) + step
        return writable[i] if 0 <= i < len(ids) else None

    def successor(self, target_id: int) -> TargetView | None:
        """The next writable target after ``target_id`` (None at the tail or when not writable)."""
        return self._neighbour(target_id, 1)

    def predecessor(self, target_id: int) -> TargetView | None:
        """The writable target before ``target_id`` (None at the head or when not writable)."""
        return self._neighbour(target_id, -1)


@dataclass(frozen=True)
class RoutingView:
    """An immutable snapshot of the cluster's routing.

    Parameters
    ----------
    version : int
        Routing version (bumps on every change).
    targets : Mapping[int, TargetView]
        Every known target by id.
    chains : Mapping[int, ChainView]
        Every chain by id.
    fetched_at : float
        ``time.monotonic()`` when the snapshot was made.
    """

    version: int = 0
    targets: Mapping[int, TargetView] = field(default_factory=dict)
    chains: Mapping[int, ChainView] = field(default_factory=dict)
    fetched_at: float = 0.0

    @classmethod
    def from_proto(cls, routing: common_pb2.RoutingInfo) -> RoutingView:
        """Build a view from a ``RoutingInfo`` message.

        A chain member the message lists no target for stands in the chain
        with no address and state TARGET_STATE_UNSPECIFIED (never serving).
        """
        targets = {
            t.target_id: TargetView(
                t.target_id, t.node_id, t.data_address, t.grpc_address, t.state, t.chain_id
            )
            for t in routing.targets
        }
        chains = {}
        for c in routing.chains:
            members = tuple(
                targets.get(tid)
                or TargetView(tid, state=common_pb2.TARGET_STATE_UNSPECIFIED, chain_id=c.chain_id)
                for tid in c.targets
            )
            chains[c.chain_id] = ChainView(c.chain_id, c.version, members)
        return cls(routing.version, targets, chains, time.monotonic())

    def state(self, target_id: int) -> int:
        """The public state of a target (TARGET_STATE_UNSPECIFIED if unknown)."""
        t = self.targets.get(target_id)
        return t.state if t is not None else common_pb2.TARGET_STATE_UNSPECIFIED

    def chain_of(self, target_id: int) -> int:
        """The chain a target belongs to (0 if none)."""
        for chain in self.chains.values():
            if target_id in chain.target_ids:
                return chain.chain_id
        t = self.targets.get(target_id)
        return t.chain_id if t is not None else 0

    def write_chain(self, chain_id: int) -> list[int]:
        """The ids of a chain's targets that take writes (SERVING or SYNCING), in order."""
        chain = self.chains.get(chain_id)
        return [t.target_id for t in chain.writable] if chain is not None else []

    def head(self, chain_id: int) -> int | None:
        """The id of the chain's head, or None while it has none."""
        chain = self.chains.get(chain_id)
        head = chain.head if chain is not None else None
        return head.target_id if head is not None else None

    def successor(self, chain_id: int, target_id: int) -> TargetView | None:
        """The next writable target after ``target_id`` in chain ``chain_id``."""
        chain = self.chains.get(chain_id)
        return chain.successor(target_id) if chain is not None else None

    def predecessor(self, chain_id: int, target_id: int) -> TargetView | None:
        """The writable target before ``target_id`` in chain ``chain_id``."""
        chain = self.chains.get(chain_id)
        return chain.predecessor(target_id) if chain is not None else None
