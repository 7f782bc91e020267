"""The rules of target states and replication chains, as pure functions.

Nothing here does I/O or keeps time: each function takes a chain (its order,
version and the public state of every member) and an event, and returns the
chain that follows. :mod:`emberfs.metaserver.clustermgr.manager` feeds it events
(heartbeat timeouts, returns, finished resyncs) and persists the results.

The rules are those of 3FS:

* a serving target whose heartbeats stop goes ``OFFLINE``, or ``LASTSRV`` when
  it was the last serving one of its chain (it holds the newest data);
  a syncing or waiting target that stops goes ``OFFLINE``;
* a target that comes back (its heartbeats resume or its node registers
  again) waits (``WAITING``) while another target of the chain serves; the
  chain's ``LASTSRV`` serves again at once; a target that is neither never
  serves possibly stale data and waits;
* a serving target whose node registers again (a restart within the heartbeat
  timeout) may have missed writes: it waits if another target serves, else it
  keeps serving;
* at most one target per chain syncs: when a chain has a serving target and
  none syncing, its first waiting target starts syncing;
* a finished resync (``SyncDone`` under the current chain version) makes the
  syncing target serve;
* a serving target found to lack data that another serving target holds
  waits (and so is resynced from the chain); the last serving one keeps serving;
* every change orders the chain serving (keeping their relative order),
  lastsrv, syncing, waiting, offline, and bumps the chain version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from emberfs.common import errors
from emberfs.proto import common_pb2

SERVING = common_pb2.SERVING
SYNCING = common_pb2.SYNCING
WAITING = common_pb2.WAITING
LASTSRV = common_pb2.LASTSRV
OFFLINE = common_pb2.OFFLINE

# Position of each state in a chain, head first.
_RANK = {SERVING: 0, LASTSRV: 1, SYNCING: 2, WAITING: 3, OFFLINE: 4}


def state_name(state: int) -> str:
    """The lower-case public name of a target state (``"serving"``, ...)."""
    return common_pb2.TargetState.Name(state).lower()


@dataclass(frozen=True)
class Chain:
    """One replication chain: its members head first, their states and its version.

    Parameters
    ----------
    chain_id : int
        The chain's id (from 1).
    version : int
        Bumps on every change of order or of a member's state.
    targets : tuple of int
        Target ids, head first.
    states : tuple of int
        ``TargetState`` of each target, parallel to ``targets``.
    """

    chain_id: int
    version: int
    targets: tuple[int, ...]
    states: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.targets) != len(self.states):
            raise ValueError("targets and states differ in length")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"chain {self.chain_id} lists a target twice")

    @classmethod
    def new(cls, chain_id: int, targets: Iterable[int]) -> Chain:
        """A freshly formed chain: every target serving, version 1."""
        members = tuple(targets)
        return cls(chain_id, 1, members, (SERVING,) * len(members))

    def state_of(self, target_id: int) -> int:
        """The state of a member; KeyError for a target not in the chain."""
        try:
            return self.states[self.targets.index(target_id)]
        except ValueError:
            raise KeyError(target_id) from None

    def state_map(self) -> dict[int, int]:
        return dict(zip(self.targets, self.states, strict=True))

    @property
    def head(self) -> int | None:
        """The first serving target (writes enter here), or None."""
        for target, state in zip(self.targets, self.states, strict=True):
            if state == SERVING:
                return target
        return None

    def has(self, state: int, *, besides: int | None = None) -> bool:
        return any(
            s == state and t != besides for t, s in zip(self.targets, self.states, strict=True)
        )


def settle(chain: Chain, states: Mapping[int, int]) -> Chain:
    """Apply new member states: start a sync if one can start, reorder, bump the version.

    ``states`` maps every member of ``chain`` to its new state. The result has
    the version of ``chain`` when neither the order nor any state changed,
    else that version plus one.
    """
    new = dict(states)
    if set(new) != set(chain.targets):
        raise ValueError("states must cover exactly the chain's targets")
    order = list(chain.targets)
    if any(s == SERVING for s in new.values()) and not any(s == SYNCING for s in new.values()):
        # the first waiting target in the current order starts syncing
        for target in sorted(order, key=lambda t: _RANK[new[t]]):
            if new[target] == WAITING:
                new[target] = SYNCING
                break
    order.sort(key=lambda t: _RANK[new[t]])  # stable: relative order kept within a state
    targets = tuple(order)
    result_states = tuple(new[t] for t in targets)
    if targets == chain.targets and result_states == chain.states:
        return chain
    return Chain(chain.chain_id, chain.version + 1, targets, result_states)


def on_timeout(chain: Chain, target_id: int) -> Chain:
    """A member's heartbeats stopped.

    Serving goes offline, or lastsrv when no other member serves; syncing and
    waiting go offline; lastsrv and offline stay as they are.
    """
    states = chain.state_map()
    current = states[target_id]
    if current == SERVING:
        states[target_id] = OFFLINE if chain.has(SERVING, besides=target_id) else LASTSRV
    elif current in (SYNCING, WAITING):
        states[target_id] = OFFLINE
    return settle(chain, states)


def on_return(chain: Chain, target_id: int, *, restarted: bool) -> Chain:
    """A member is back: its heartbeats resumed, or (``restarted``) its node registered again.

    The chain's lastsrv serves again (the others keep waiting for a sync from
    it); any other returning member waits while another member serves, and
    waits too when none does (it never serves possibly stale data). A serving
    member whose node restarted waits if another member serves, else keeps
    serving. A syncing member whose node restarted lost its sync and waits
    (and, being first in line, starts again under a new version). Without
    ``restarted``, a member that is serving, syncing or waiting is unchanged.
    """
    states = chain.state_map()
    current = states[target_id]
    others_serve = chain.has(SERVING, besides=target_id)
    if current == LASTSRV:
        states[target_id] = SERVING
    elif current == OFFLINE:
        states[target_id] = WAITING
    elif restarted and current == SERVING:
        if others_serve:
            states[target_id] = WAITING
    elif restarted and current == SYNCING:
        states[target_id] = WAITING
        result = settle(chain, states)
        if result.version == chain.version:
            # it is first in line again: a new version marks the restarted sync
            result = Chain(chain.chain_id, chain.version + 1, result.targets, result.states)
        return result
    return settle(chain, states)


def on_lost_data(chain: Chain, target_id: int) -> Chain:
    """A serving member lacks data that another serving member holds.

    It waits, so that it leaves the readers' replicas at once and is resynced
    from the chain like a returning member. A member that is not serving, or
    the only serving one, is unchanged.
    """
    if chain.state_of(target_id) != SERVING or not chain.has(SERVING, besides=target_id):
        return chain
    states = chain.state_map()
    states[target_id] = WAITING
    return settle(chain, states)


def on_sync_done(chain: Chain, chain_version: int, target_id: int) -> Chain:
    """The sync source reports that ``target_id`` holds every chunk of the chain.

    Raises
    ------
    errors.NotFound
        ``target_id`` is not a member of the chain.
    errors.Busy
        ``chain_version`` is not the chain's version (the sync ran under a
        chain that has changed since), or the target is not syncing.
    """
    if target_id not in chain.targets:
        raise errors.NotFound(f"target {target_id} is not in chain {chain.chain_id}")
    if chain_version != chain.version:
        raise errors.Busy(
            f"chain {chain.chain_id} is at version {chain.version}, "
            f"the sync ran under version {chain_version}"
        )
    if chain.state_of(target_id) != SYNCING:
        raise errors.Busy(
            f"target {target_id} of chain {chain.chain_id} is "
            f"{state_name(chain.state_of(target_id))}, not syncing"
        )
    states = chain.state_map()
    states[target_id] = SERVING
    return settle(chain, states)


def form_chains(free: Iterable[tuple[int, str]], replicas: int, next_chain_id: int) -> list[Chain]:
    """New chains from targets that are in no chain yet.

    While at least ``replicas`` distinct nodes have a free target, a chain
    takes one target from each of the ``replicas`` nodes with the most free
    targets (ties by node id; each node's targets in id order). The head
    rotates with the chain id so chain heads spread over the nodes.

    Parameters
    ----------
    free : iterable of (target id, node id)
        Targets in no chain that can serve.
    replicas : int
        Targets per chain, each on a distinct node.
    next_chain_id : int
        The id of the first new chain; the following ones count up.

    Returns
    -------
    list of Chain
        The new chains, every member serving, version 1.
    """
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    by_node: dict[str, list[int]] = {}
    for target_id, node_id in free:
        by_node.setdefault(node_id, []).append(target_id)
    for targets in by_node.values():
        targets.sort()
    chains = []
    chain_id = next_chain_id
    while sum(1 for ts in by_node.values() if ts) >= replicas:
        nodes = sorted((n for n, ts in by_node.items() if ts), key=lambda n: (-len(by_node[n]), n))
        members = [by_node[n].pop(0) for n in nodes[:replicas]]
        shift = (chain_id - 1) % replicas
        members = members[shift:] + members[:shift]
        chains.append(Chain.new(chain_id, members))
        chain_id += 1
    return chains


# ------------------------------------------------------------------ draining
#
# Draining moves a chain's membership from one target to another without
# lowering the number of up-to-date copies: the replacement joins at the tail
# (waiting, so it syncs from its serving predecessor like a returning target)
# while the drained target keeps its place and state; once the replacement
# serves, the drained target leaves the chain.


def _bumped(before: Chain, after: Chain) -> Chain:
    """``after`` with a version above ``before``'s (a change of membership always bumps)."""
    if after.version > before.version:
        return after
    return Chain(after.chain_id, before.version + 1, after.targets, after.states)


def pick_replacement(
    chain: Chain, node_of: Mapping[int, str], free: Iterable[tuple[int, str]]
) -> int | None:
    """The free target that should take a drained member's place in ``chain``, or None.

    Parameters
    ----------
    chain : Chain
        The chain that loses a member.
    node_of : mapping of int to str
        Node id of (at least) every member of ``chain``.
    free : iterable of (target id, node id)
        Targets in no chain that can serve now.

    Returns
    -------
    int or None
        The lowest-id free target on a node that holds no member of ``chain``
        (the drained target's node included), or None when there is none.
    """
    taken = {node_of[t] for t in chain.targets}
    candidates = sorted(tid for tid, node in free if node not in taken)
    return candidates[0] if candidates else None


def drain_start(chain: Chain, target_id: int, replacement: int) -> Chain:
    """Add ``replacement`` at the tail of ``chain`` to take ``target_id``'s place.

    The replacement joins waiting (and starts syncing at once when the chain
    has a serving member and no sync runs); ``target_id`` keeps its place and
    state. The version always bumps.

    Raises
    ------
    errors.NotFound
        ``target_id`` is not a member of the chain.
    errors.Busy
        ``replacement`` is already a member.
    """
    if target_id not in chain.targets:
        raise errors.NotFound(f"target {target_id} is not in chain {chain.chain_id}")
    if replacement in chain.targets:
        raise errors.Busy(f"target {replacement} is already in chain {chain.chain_id}")
    grown = Chain(
        chain.chain_id,
        chain.version,
        chain.targets + (replacement,),
        chain.states + (WAITING,),
    )
    return _bumped(chain, settle(grown, grown.state_map()))


def drain_finish(chain: Chain, target_id: int, replacement: int) -> Chain:
    """Remove ``target_id`` from ``chain`` once ``replacement`` serves in it.

    Returns ``chain`` itself while the replacement does not serve yet (or when
    either target is no longer a member); else the chain without
    ``target_id``, settled, under a new version.
    """
    if target_id not in chain.targets or replacement not in chain.targets:
        return chain
    if chain.state_of(replacement) != SERVING:
        return chain
    kept = [(t, s) for t, s in zip(chain.targets, chain.states, strict=True) if t != target_id]
    shrunk = Chain(
        chain.chain_id,
        chain.version,
        tuple(t for t, _ in kept),
        tuple(s for _, s in kept),
    )
    return _bumped(chain, settle(shrunk, shrunk.state_map()))


def chain_health(states: Iterable[int]) -> str:
    """``"healthy"`` when every member serves, ``"degraded"`` when some do, else ``"unavailable"``."""
    states = list(states)
    serving = sum(1 for s in states if s == SERVING)
    if states and serving == len(states):
        return "healthy"
    return "degraded" if serving else "unavailable"
