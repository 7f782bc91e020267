"""The cluster manager: storage nodes, targets, chains, routing, heartbeats and failover.

:class:`ClusterManager` keeps the cluster state of the metaserver in the KV
store (``NODE``/``TRGT``/``CHAN``/``CONF`` keys, see
:mod:`emberfs.metaserver.store.keys`) with a copy in memory, serves the node calls
of ``ClusterService`` (``RegisterNode``, ``Heartbeat``, ``GetRouting``,
``SyncDone``) as plain methods (protobuf in, protobuf out) and decides state
changes with the pure rules of :mod:`emberfs.metaserver.clustermgr.chainstate`. The GC
calls are served by :class:`~emberfs.metaserver.clustermgr.gcqueue.GCQueue`.
Every change is written (one atomic, durable batch) before a call returns, so
a restarted metaserver resumes with the same targets, chains and versions.

Liveness is per node and lives only in memory, on the metaserver's monotonic
clock: a heartbeat refreshes every target of its node (noted as soon as its
handler runs, before it waits for the cluster lock), and
:meth:`ClusterManager.check_timeouts` (called periodically) applies the
timeout rule to targets whose node has been silent for longer than the
heartbeat timeout. Silence is counted from the later of a node's last
heartbeat and :attr:`Grace.since <emberfs.metaserver.clustermgr.grace.Grace.since>`, so
every node gets a full timeout after the metaserver is up (listening) and
after a stall of the metaserver itself (see :mod:`emberfs.metaserver.clustermgr.grace`).

With several metaservers on one shared store, the manager's work runs on the
one that leads (:mod:`emberfs.metaserver.clustermgr.leadership`): every change asks
:meth:`Leadership.require <emberfs.metaserver.clustermgr.leadership.Leadership.require>`
first (:class:`~emberfs.common.errors.NotLeader` points elsewhere) and commits
with the leadership's fence, so a metaserver that lost the lead changes
nothing. A metaserver that starts to lead reloads the state from the store
(:meth:`ClusterManager.take_over`) and judges every node from then on; the
others keep a copy of the stored state for reading (:meth:`ClusterManager.follow`:
routing, chains for new files, capacity).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from emberfs.common import errors
from emberfs.metaserver.clustermgr import chainstate
from emberfs.metaserver.clustermgr.chainstate import OFFLINE, SERVING, Chain
from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.clustermgr.leadership import Leadership
from emberfs.metaserver.clustermgr.nodecalls import NodeCalls
from emberfs.metaserver.clustermgr.scrubboard import ScrubBoard
from emberfs.metaserver.clustermgr.state import (
    U64,
    Changes,
    Node,
)
from emberfs.metaserver.clustermgr.statestore import StoredState
from emberfs.metaserver.clustermgr.steering import Steering
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine
from emberfs.proto import common_pb2


class ClusterManager(StoredState, NodeCalls, Steering):
    """Persistent cluster state and the rules that change it.

    The state in the store is :class:`~.statestore.StoredState`'s part, the storage nodes'
    calls :class:`~.nodecalls.NodeCalls`', the operator's steering :class:`~.steering.Steering`'s;
    this class holds the state, the leadership and the chain rules they share.

    Parameters
    ----------
    engine : KVEngine
        The metadata store (shared with the namespace and the GC queue; the
        manager uses the ``NODE``, ``TRGT``, ``CHAN`` and ``CONF`` keys).
    replicas : int, default 3
        Targets per new chain, each on a distinct node.
    heartbeat_timeout : float, default 5.0
        Seconds of silence after which a node's targets time out.
    clock : callable, default time.monotonic
        Monotonic seconds; tests inject their own. Ignored when ``grace`` is given.
    grace : Grace, optional
        Since when the metaserver has heard without a break, and the stalls
        it notices at each :meth:`check_timeouts`; default one over ``clock``
        that notices none.
    leadership : Leadership, optional
        Whether this metaserver leads (default: it always does, the store is
        its own).
    """

    FOLLOW_INTERVAL = 2.0  # seconds a follower's copy of the state may age unchanged

    def __init__(
        self,
        engine: KVEngine,
        *,
        replicas: int = 3,
        heartbeat_timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        grace: Grace | None = None,
        leadership: Leadership | None = None,
    ):
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        if heartbeat_timeout <= 0:
            raise ValueError("heartbeat timeout must be positive")
        self.engine = engine
        self.replicas = replicas
        self.heartbeat_timeout = heartbeat_timeout
        # the metaserver's ClusterService for storage nodes, told to them in answers
        # (empty: they keep the address they registered with)
        self.cluster_address = ""
        # the cluster's keys, for the calls it and its helpers make to storage servers
        # (None: the cluster runs without authentication)
        self.keys = None
        self.tls = None  # and the TLS files of those calls (None: plaintext)
        self.grace = grace if grace is not None else Grace(clock=clock)
        self.clock = self.grace.clock
        self.leadership = leadership if leadership is not None else Leadership()
        self._lock = threading.RLock()
        self._offline_listeners: list[Callable[[], None]] = []
        self._dirty = False  # memory may hold a change the store refused: reload before use
        self._loaded_at = -float("inf")
        self._usage_pending: set[int] = set()  # targets whose usage is not stored yet
        self._usage_wake = threading.Event()
        self._load()
        # node -> monotonic time of its last heartbeat or registration; registration adds
        # keys under both locks, a heartbeat refreshes one under this lock alone
        self._seen_lock = threading.Lock()
        since = self.grace.since
        self._last_seen: dict[str, float] = {node_id: since for node_id in self._nodes}
        self._absent: set[int] = set()  # targets their node left out of its last registration
        self._io: dict[int, tuple[int, int]] = {}  # target -> (bytes read, bytes written)
        self.scrub = ScrubBoard(engine)

    # ------------------------------------------------------------- leadership

    def take_over(self) -> None:
        """This metaserver starts to lead: reload the stored state and judge every node anew.

        Nodes are judged from now (and, after another metaserver led, from
        its outage grace later: it may still be granting leases while cut
        off from the store).
        """
        with self._lock:
            self._load()
            self.scrub.load()
            self.grace.begin(hold=self.leadership.outage_grace if self.leadership.shared else 0.0)
            since = self.grace.since
            with self._seen_lock:
                self._last_seen = {node_id: since for node_id in self._nodes}
            self._absent = set()
            self._io = {}

    def follow(self, *, force: bool = False) -> bool:
        """A metaserver that does not lead: bring the copy of the state up to date.

        Reloads when the stored routing version moved, or when the copy is
        older than :attr:`FOLLOW_INTERVAL` (usage figures change without
        one), or with ``force``. Returns whether it reloaded. A store that
        cannot be read leaves the copy as it was.
        """
        if self.leadership.granting():
            return False  # it leads (or is frozen, cut off from the store): memory is the truth
        stale = self.clock() - self._loaded_at >= self.FOLLOW_INTERVAL
        if not (force or stale):
            raw = self.engine.get(keys.config_key(keys.ROUTING_VERSION))
            stored = 0 if raw is None else U64.unpack(raw)[0]
            if stored == self._routing_version:
                return False
        state = self._read_stored()  # outside the lock: the store may take its time
        with self._lock:
            if self.leadership.granting():
                return False  # it took the lead meanwhile (and loaded itself)
            self._adopt(state)
            return True

    def _set_chain(self, new: Chain, changes: Changes) -> None:
        old = self._chains.get(new.chain_id)
        if old is new:
            return
        self._chains[new.chain_id] = new
        changes.chains.add(new.chain_id)
        for tid, state in zip(new.targets, new.states, strict=True):
            info = self._targets[tid]
            if info.state != state or info.chain_id != new.chain_id:
                info.state = state
                info.chain_id = new.chain_id
                changes.targets.add(tid)

    def _set_free_state(self, tid: int, state: int, changes: Changes) -> None:
        info = self._targets[tid]
        if info.state != state:
            info.state = state
            changes.targets.add(tid)

    def _timeout_target(self, tid: int, changes: Changes) -> None:
        info = self._targets[tid]
        if info.chain_id:
            self._set_chain(chainstate.on_timeout(self._chains[info.chain_id], tid), changes)
        else:
            self._set_free_state(tid, OFFLINE, changes)

    def _return_target(self, tid: int, restarted: bool, changes: Changes) -> None:
        info = self._targets[tid]
        if info.chain_id:
            chain = self._chains[info.chain_id]
            self._set_chain(chainstate.on_return(chain, tid, restarted=restarted), changes)
        else:
            self._set_free_state(tid, SERVING, changes)  # holds no data yet

    def _form_chains(self, changes: Changes) -> None:
        free = [
            (tid, info.node_id)
            for tid, info in sorted(self._targets.items())
            if info.chain_id == 0 and info.state == SERVING and tid not in self._absent
        ]
        for chain in chainstate.form_chains(free, self.replicas, self._next_chain):
            self._set_chain(chain, changes)
            self._next_chain = chain.chain_id + 1

    def _node_targets(self, node_id: str) -> list[int]:
        return sorted(t for t, info in self._targets.items() if info.node_id == node_id)

    # ---------------------------------------------------------------- reading

    @property
    def lease_seconds(self) -> float:
        """How long a node may serve after sending a heartbeat that is answered.

        Half the heartbeat timeout, as 3FS does: a node that cannot reach the
        metaserver stops serving (it is fenced) well before the metaserver
        declares its targets offline and the chain moves on without them, with
        margin for the two clocks running at slightly different rates.
        """
        return self.heartbeat_timeout / 2

    @property
    def store_name(self) -> str:
        """The metadata store, as an operator names it: ``rocksdb`` or its etcd URL."""
        return self.engine.name

    @property
    def routing_version(self) -> int:
        return self._routing_cache.version

    def chain_table(self) -> list[int]:
        """Ids of all chains, ascending (new files spread over them)."""
        with self._lock:
            return sorted(self._chains)

    def usage(self) -> tuple[int, int]:
        """``(capacity, used)`` in bytes, summed over all targets."""
        with self._lock:
            capacity = sum(t.capacity for t in self._targets.values())
            used = sum(t.used for t in self._targets.values())
            return capacity, used

    def _rebuild_routing(self) -> None:
        """The routing info of the state in memory (made once it is the stored state)."""
        info = common_pb2.RoutingInfo(version=self._routing_version)
        for tid in sorted(self._targets):
            t = info.targets.add()
            t.CopyFrom(self._targets[tid])
            node = self._nodes.get(t.node_id)
            if node is not None:
                t.data_address = node.data_address
                t.grpc_address = node.grpc_address
        for cid in sorted(self._chains):
            c = self._chains[cid]
            info.chains.add(chain_id=cid, version=c.version, targets=c.targets)
        self._routing_cache = info
        self._routing_position = {t.target_id: i for i, t in enumerate(info.targets)}

    def _routing_usage(self, target_ids: set[int]) -> None:
        """Bring the usage figures of ``target_ids`` in the routing info up to memory's."""
        for tid in target_ids:
            i = self._routing_position.get(tid)
            if i is None:  # a target the routing does not show yet: the whole of it anew
                self._rebuild_routing()
                return
            shown, info = self._routing_cache.targets[i], self._targets[tid]
            shown.capacity, shown.used = info.capacity, info.used
            shown.chunks, shown.full = info.chunks, info.full

    def routing(self) -> common_pb2.RoutingInfo:
        """A copy of the routing info as last stored: every target and chain, and the version."""
        with self._lock:
            out = common_pb2.RoutingInfo()
            out.CopyFrom(self._routing_cache)
            return out

    def chain(self, chain_id: int) -> Chain:
        """One chain; :class:`errors.NotFound` when there is no such chain."""
        with self._lock:
            try:
                return self._chains[chain_id]
            except KeyError:
                raise errors.NotFound(f"no chain {chain_id}") from None

    def chains_of(self, target_ids: Iterable[int]) -> dict[int, int]:
        """Target id -> chain id (0: in no chain); InvalidArgument for an unknown target."""
        out = {}
        with self._lock:
            for tid in target_ids:
                info = self._targets.get(tid)
                if info is None:
                    raise errors.InvalidArgument(f"unknown target {tid}")
                out[tid] = info.chain_id
        return out

    def live_members(self, chain_ids: Iterable[int]) -> set[int]:
        """The targets of these chains that are not offline (an unknown chain has none)."""
        members = set()
        with self._lock:
            for cid in chain_ids:
                chain = self._chains.get(cid)
                if chain is None:
                    continue
                for tid, state in zip(chain.targets, chain.states, strict=True):
                    if state != OFFLINE:
                        members.add(tid)
        return members

    def nodes(self) -> list[Node]:
        with self._lock:
            return [self._nodes[n] for n in sorted(self._nodes)]

    def heartbeat_ages(self) -> dict[str, float]:
        """Each node's silence as the heartbeat timeout judges it, in seconds.

        Seconds since its last heartbeat or registration, counted from the
        metaserver's start or its last stall at the earliest.
        """
        with self._seen_lock:
            seen = dict(self._last_seen)
        now = self.clock()
        return {node_id: self.grace.silence(last, now) for node_id, last in seen.items()}

    def _note_seen(self, node_id: str, now: float, *, new: bool = False) -> None:
        """The node was heard from at ``now`` (``new``: add it when unknown)."""
        with self._seen_lock:
            last = self._last_seen.get(node_id)
            if last is not None:
                self._last_seen[node_id] = max(last, now)
            elif new:
                self._last_seen[node_id] = now

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cluster lock for the block: no change of the cluster runs meanwhile.

        Every call that changes the state (registration, heartbeats, timeout
        checks, steering) takes this lock; heartbeats are noted as heard
        before they wait for it. The lock is reentrant.
        """
        with self._lock:
            yield

    # ---------------------------------------------------------------- events

    def on_offline(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` each time a call took targets offline (outside the cluster lock).

        The GC queue sweeps then: an offline target no longer holds up its items.
        """
        self._offline_listeners.append(callback)

    def _tell_offline(self) -> None:
        for callback in self._offline_listeners:
            callback()
