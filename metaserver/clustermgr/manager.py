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

import json
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from emberfs.common import errors
from emberfs.common.addresses import split_address
from emberfs.metaserver.clustermgr import chainstate
from emberfs.metaserver.clustermgr.chainstate import OFFLINE, SERVING, Chain
from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.clustermgr.leadership import Leadership
from emberfs.metaserver.clustermgr.scrubboard import ScrubBoard
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict, KVEngine
from emberfs.proto import cluster_pb2, common_pb2

_U64 = struct.Struct(">Q")
log = logging.getLogger(__name__)

MAX_NODE_ID = 255
MAX_TARGETS_PER_NODE = 1024


@dataclass
class Node:
    """A storage node as registered: its id and the addresses it serves on."""

    node_id: str
    data_address: str
    grpc_address: str

    def encode(self) -> bytes:
        return json.dumps(
            {
                "node_id": self.node_id,
                "data_address": self.data_address,
                "grpc_address": self.grpc_address,
            }
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Node:
        d = json.loads(raw)
        return cls(d["node_id"], d["data_address"], d["grpc_address"])


@dataclass
class _Changes:
    nodes: set[str] = field(default_factory=set)
    targets: set[int] = field(default_factory=set)  # state, chain or new target: bumps routing
    usage: set[int] = field(default_factory=set)  # capacity/used/chunks/full only
    chains: set[int] = field(default_factory=set)
    admin: bool = False  # drains or fenced targets changed

    @property
    def bumps_routing(self) -> bool:
        return bool(self.nodes or self.targets or self.chains)


def validate_address(address: str, what: str) -> None:
    """Raise InvalidArgument unless ``address`` is ``host:port`` with a valid port."""
    try:
        _, port = split_address(address)
    except ValueError:
        port = 0
    if not port:
        raise errors.InvalidArgument(f"{what} {address!r} is not host:port")
    if len(address) > 300 or any(c.isspace() for c in address):
        raise errors.InvalidArgument(f"{what} {address!r} is not host:port")


def _validate_node_id(node_id: str) -> None:
    if not node_id or len(node_id) > MAX_NODE_ID:
        raise errors.InvalidArgument("node id must have 1 to 255 characters")
    if not node_id.isprintable() or any(c.isspace() for c in node_id):
        raise errors.InvalidArgument(f"node id {node_id!r} has blank or control characters")


class ClusterManager:
    """Persistent cluster state and the rules that change it.

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

    # ------------------------------------------------------------------ state

    def _load(self) -> None:
        """Memory becomes the stored state (read at one revision of the store)."""
        self._adopt(self._read_stored())

    def _read_stored(self) -> dict:
        """The stored cluster state, every key read in one transaction (one state of the store)."""
        txn = self.engine.transaction()
        nodes: dict[str, Node] = {}
        targets: dict[int, common_pb2.TargetInfo] = {}
        chains: dict[int, Chain] = {}
        for _, raw in txn.scan_prefix(keys.NODE):
            node = Node.decode(raw)
            nodes[node.node_id] = node
        for _, raw in txn.scan_prefix(keys.TARGET):
            info = common_pb2.TargetInfo.FromString(raw)
            targets[info.target_id] = info
        for _, raw in txn.scan_prefix(keys.CHAIN):
            rec = common_pb2.ChainInfo.FromString(raw)
            members = tuple(rec.targets)
            states = tuple(targets[t].state for t in members)
            chains[rec.chain_id] = Chain(rec.chain_id, rec.version, members, states)

        def counter(name: str, default: int) -> int:
            raw = txn.get(keys.config_key(name))
            return default if raw is None else _U64.unpack(raw)[0]

        raw_drains = txn.get(keys.config_key(keys.DRAINS))
        raw_fenced = txn.get(keys.config_key(keys.FENCED))
        return {
            "_nodes": nodes,
            "_targets": targets,
            "_chains": chains,
            "_next_target": counter(keys.NEXT_TARGET, 1),
            "_next_chain": counter(keys.NEXT_CHAIN, 1),
            "_routing_version": counter(keys.ROUTING_VERSION, 0),
            "_drains": (
                {int(k): int(v) for k, v in json.loads(raw_drains).items()} if raw_drains else {}
            ),
            "_fenced": set(json.loads(raw_fenced)) if raw_fenced else set(),
        }

    def _adopt(self, state: dict) -> None:
        self._nodes: dict[str, Node] = state["_nodes"]
        self._targets: dict[int, common_pb2.TargetInfo] = state["_targets"]
        self._chains: dict[int, Chain] = state["_chains"]
        self._next_target: int = state["_next_target"]
        self._next_chain: int = state["_next_chain"]
        self._routing_version: int = state["_routing_version"]
        self._drains: dict[int, int] = state["_drains"]
        self._fenced: set[int] = state["_fenced"]
        self._rebuild_routing()
        self._dirty = False
        self._loaded_at = self.clock()
        self._usage_pending = set()  # memory holds the stored figures again

    def _flush(self, changes: _Changes) -> None:
        """Write what ``changes`` names as one batch (bumping the routing version if needed).

        A batch of usage figures alone (every heartbeat while data is written)
        skips the WAL sync: a killed metaserver keeps it, a power loss may take
        it, and the next heartbeat reports the figures again either way. So a
        heartbeat holding the cluster lock does not wait for a WAL sync of its
        own (on a disk that chunk writes share, a sync waits behind the writes
        queued on it). Changes of state, chains, nodes and admin steering are
        synced before the call returns.

        On a shared store (etcd, over the network) usage figures alone are not
        written by the call at all: they are left to :meth:`_write_usage`, a
        thread of their own, so that a heartbeat is answered (and its node's
        lease extended) without waiting for the store, which may be slow or
        gone for a while (see :mod:`emberfs.metaserver.clustermgr.leadership`).
        """
        self._finish_drains(changes)
        if not (changes.bumps_routing or changes.usage or changes.admin):
            return
        usage_only = not (changes.bumps_routing or changes.admin)
        if self.engine.shared and usage_only:
            self._usage_pending |= changes.usage
            self._routing_usage(changes.usage)
            self._usage_wake.set()
            return
        changes.usage |= self._usage_pending
        version = self._routing_version + 1 if changes.bumps_routing else self._routing_version
        puts: dict[bytes, bytes] = {
            keys.config_key(keys.NEXT_TARGET): _U64.pack(self._next_target),
            keys.config_key(keys.NEXT_CHAIN): _U64.pack(self._next_chain),
            keys.config_key(keys.ROUTING_VERSION): _U64.pack(version),
        }
        for node_id in changes.nodes:
            puts[keys.node_key(node_id)] = self._nodes[node_id].encode()
        for tid in changes.targets | changes.usage:
            puts[keys.target_key(tid)] = self._targets[tid].SerializeToString()
        for cid in changes.chains:
            c = self._chains[cid]
            rec = common_pb2.ChainInfo(chain_id=cid, version=c.version, targets=c.targets)
            puts[keys.chain_key(cid)] = rec.SerializeToString()
        if changes.admin:
            puts[keys.config_key(keys.DRAINS)] = json.dumps(
                {str(k): v for k, v in sorted(self._drains.items())}
            ).encode()
            puts[keys.config_key(keys.FENCED)] = json.dumps(sorted(self._fenced)).encode()
        try:
            self.engine.commit(
                self.leadership.fence, puts, set(), sync=changes.bumps_routing or changes.admin
            )
        except Conflict:
            # the leader key moved: another metaserver leads, and this change was not made
            self.leadership.deposed()
            self._reload_after_failure()
            self.leadership.require()
            raise errors.NotLeader() from None
        except BaseException:
            self._reload_after_failure()
            raise
        self._routing_version = version
        if usage_only:
            self._routing_usage(changes.usage)  # every heartbeat while data is written: no rebuild
        else:
            self._rebuild_routing()
        self._usage_pending -= changes.usage

    def _write_usage(self) -> None:
        """Store the usage figures heartbeats brought, outside the cluster lock (shared stores).

        The batch is what memory held at one routing version, and commits only
        while that version is still stored (and this metaserver leads): a
        change of state written meanwhile, which stores whole target records,
        makes it conflict, and it is made again from memory.
        """
        with self._lock:
            pending, self._usage_pending = self._usage_pending, set()
            if not pending or not self.leadership.leading() or self._dirty:
                self._usage_pending |= pending if self.leadership.leading() else set()
                return
            stored = _U64.pack(self._routing_version) if self._routing_version else None
            guard = {keys.config_key(keys.ROUTING_VERSION): stored}
            reads = {**self.leadership.fence, **guard}
            puts = {
                keys.target_key(tid): self._targets[tid].SerializeToString()
                for tid in pending
                if tid in self._targets
            }
        try:
            self.engine.commit(reads, puts, set(), sync=False)
        except Conflict:
            with self._lock:  # a change of state or of leader came first: from memory again
                self._usage_pending |= pending
        except errors.EmberError as exc:
            with self._lock:
                self._usage_pending |= pending
            raise errors.Unavailable(f"usage figures not stored: {exc}") from exc

    def run_usage_writer(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Store pending usage figures at most every ``interval`` seconds until ``stop``."""
        while not stop.is_set():
            self._usage_wake.wait(interval)
            self._usage_wake.clear()
            if stop.wait(interval):
                return
            try:
                self._write_usage()
            except errors.EmberError as exc:
                log.info("%s", exc)
            except Exception:
                log.exception("storing usage figures failed")

    def _reload_after_failure(self) -> None:
        """Memory follows what is stored; while the store cannot be read, it is marked dirty
        and answers keep the routing of the last state known to be stored."""
        try:
            self._load()
        except errors.EmberError:
            self._dirty = True

    def _current(self) -> None:
        """Before a change: this metaserver leads and its memory is the stored state."""
        self.leadership.require()
        if self._dirty:
            self._load()  # raises while the store cannot be read

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
            stored = 0 if raw is None else _U64.unpack(raw)[0]
            if stored == self._routing_version:
                return False
        state = self._read_stored()  # outside the lock: the store may take its time
        with self._lock:
            if self.leadership.granting():
                return False  # it took the lead meanwhile (and loaded itself)
            self._adopt(state)
            return True

    def _set_chain(self, new: Chain, changes: _Changes) -> None:
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

    def _set_free_state(self, tid: int, state: int, changes: _Changes) -> None:
        info = self._targets[tid]
        if info.state != state:
            info.state = state
            changes.targets.add(tid)

    def _timeout_target(self, tid: int, changes: _Changes) -> None:
        info = self._targets[tid]
        if info.chain_id:
            self._set_chain(chainstate.on_timeout(self._chains[info.chain_id], tid), changes)
        else:
            self._set_free_state(tid, OFFLINE, changes)

    def _return_target(self, tid: int, restarted: bool, changes: _Changes) -> None:
        info = self._targets[tid]
        if info.chain_id:
            chain = self._chains[info.chain_id]
            self._set_chain(chainstate.on_return(chain, tid, restarted=restarted), changes)
        else:
            self._set_free_state(tid, SERVING, changes)  # holds no data yet

    def _form_chains(self, changes: _Changes) -> None:
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

    # ---------------------------------------------------------------- events

    def on_offline(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` each time a call took targets offline (outside the cluster lock).

        The GC queue sweeps then: an offline target no longer holds up its items.
        """
        self._offline_listeners.append(callback)

    def _tell_offline(self) -> None:
        for callback in self._offline_listeners:
            callback()

    # ---------------------------------------------------------- node protocol

    def register_node(
        self, req: cluster_pb2.RegisterNodeRequest
    ) -> cluster_pb2.RegisterNodeResponse:
        """Register a node (first start or restart) and its targets.

        Targets reported with id 0 get the next id; known ids must belong to
        the node. Known targets of a node that registers again are treated as
        returning (see :func:`chainstate.on_return` with ``restarted``); its
        known targets that it no longer reports time out at once.
        """
        _validate_node_id(req.node_id)
        validate_address(req.data_address, "data address")
        validate_address(req.grpc_address, "gRPC address")
        if len(req.targets) > MAX_TARGETS_PER_NODE:
            raise errors.InvalidArgument(f"more than {MAX_TARGETS_PER_NODE} targets")
        with self._lock:
            self._current()
            seen: set[int] = set()
            for report in req.targets:
                tid = report.target_id
                if tid == 0:
                    continue
                if tid in seen:
                    raise errors.InvalidArgument(f"target {tid} is reported twice")
                seen.add(tid)
                info = self._targets.get(tid)
                if info is None:
                    raise errors.InvalidArgument(
                        f"target {tid} is unknown to this metaserver (report it with id 0 "
                        "to add it as a new, empty target)"
                    )
                if info.node_id != req.node_id:
                    raise errors.InvalidArgument(
                        f"target {tid} belongs to node {info.node_id!r}, not {req.node_id!r}"
                    )
            changes = _Changes()
            node = Node(req.node_id, req.data_address, req.grpc_address)
            if self._nodes.get(req.node_id) != node:
                self._nodes[req.node_id] = node
                changes.nodes.add(req.node_id)
            ids = []
            for report in req.targets:
                tid = report.target_id
                if tid == 0:
                    tid = self._next_target
                    self._next_target += 1
                    self._targets[tid] = common_pb2.TargetInfo(
                        target_id=tid, node_id=req.node_id, state=SERVING
                    )
                    changes.targets.add(tid)
                else:
                    self._absent.discard(tid)
                    if tid in self._fenced:
                        self._fenced.discard(tid)
                        changes.admin = True
                    self._return_target(tid, True, changes)
                self._set_usage(tid, report, changes)
                self._io[tid] = (report.bytes_read, report.bytes_written)
                ids.append(tid)
            for tid in self._node_targets(req.node_id):
                if tid not in ids:
                    self._absent.add(tid)
                    self._timeout_target(tid, changes)
            self._form_chains(changes)
            self._flush(changes)
            self._note_seen(req.node_id, self.clock(), new=True)
            return cluster_pb2.RegisterNodeResponse(
                target_ids=ids,
                routing=self.routing(),
                cluster_address=self.cluster_address,
                lease_seconds=self.lease_seconds,
            )

    def _set_usage(self, tid: int, report: cluster_pb2.TargetReport, changes: _Changes) -> None:
        info = self._targets[tid]
        reported = (report.capacity, report.used, report.chunks, report.full)
        if (info.capacity, info.used, info.chunks, info.full) != reported:
            info.capacity, info.used, info.chunks, info.full = reported
            changes.usage.add(tid)

    def heartbeat(self, req: cluster_pb2.HeartbeatRequest) -> cluster_pb2.HeartbeatResponse:
        """Refresh a node's liveness and its targets' usage (and whether each is full).

        Targets of the node that were offline (or lastsrv) come back. The
        response carries the routing info when the node's version is older,
        and ``reregister`` when the node is unknown. The node counts as heard
        from when the call arrives, before it waits for the cluster lock.
        """
        self._note_seen(req.node_id, self.clock())
        with self._lock:
            if not self.leadership.leading() and self.leadership.granting():
                return self._frozen_heartbeat(req)
            self._current()
            if req.node_id not in self._nodes:
                return cluster_pb2.HeartbeatResponse(
                    routing_version=self._routing_version,
                    reregister=True,
                    cluster_address=self.cluster_address,
                )
            own = set(self._node_targets(req.node_id))
            for report in req.targets:
                if report.target_id not in own:
                    raise errors.InvalidArgument(
                        f"target {report.target_id} does not belong to node {req.node_id!r}"
                    )
            changes = _Changes()
            for report in req.targets:
                self._set_usage(report.target_id, report, changes)
                self._io[report.target_id] = (report.bytes_read, report.bytes_written)
                if report.HasField("scrub"):
                    self.scrub.reported(report.target_id, report.scrub)
            for tid in sorted(own - self._absent - self._fenced):
                if self._targets[tid].state in (OFFLINE, chainstate.LASTSRV):
                    self._return_target(tid, False, changes)
            if changes.targets:
                self._form_chains(changes)
            self._flush(changes)
            resp = cluster_pb2.HeartbeatResponse(
                routing_version=self._routing_version,
                cluster_address=self.cluster_address,
                lease_seconds=self.lease_seconds,
                scrub=self.scrub.control(),
            )
            if req.routing_version < self._routing_version:
                resp.routing.CopyFrom(self.routing())
            return resp

    def _frozen_heartbeat(self, req: cluster_pb2.HeartbeatRequest) -> cluster_pb2.HeartbeatResponse:
        """A heartbeat answer of a leader cut off from the store: the lease, the last stored
        routing, no change (see :mod:`emberfs.metaserver.clustermgr.leadership`)."""
        routing = self._routing_cache
        resp = cluster_pb2.HeartbeatResponse(
            routing_version=routing.version,
            reregister=req.node_id not in self._nodes,
            cluster_address=self.cluster_address,
            lease_seconds=self.lease_seconds,
            scrub=self.scrub.control(),
        )
        if req.routing_version < routing.version:
            resp.routing.CopyFrom(routing)
        return resp

    def get_routing(self, req: cluster_pb2.GetRoutingRequest) -> cluster_pb2.GetRoutingResponse:
        """The routing info (always sent; ``known_version`` is advisory).

        A metaserver that does not lead first brings its copy up to date (it
        answers with the copy it has while the store cannot be read).
        """
        try:
            self.follow()
        except errors.EmberError:
            pass  # the store cannot be read: the copy as it is
        return cluster_pb2.GetRoutingResponse(routing=self.routing())

    def sync_done(self, req: cluster_pb2.SyncDoneRequest) -> cluster_pb2.SyncDoneResponse:
        """A syncing target caught up: it serves from now on.

        Raises :class:`errors.NotFound` for an unknown chain or a target not
        in it, and :class:`errors.Busy` (FAILED_PRECONDITION) for a stale
        chain version or a target that is not syncing.
        """
        with self._lock:
            self._current()
            chain = self.chain(req.chain_id)
            new = chainstate.on_sync_done(chain, req.chain_version, req.target_id)
            changes = _Changes()
            self._set_chain(new, changes)
            self._flush(changes)
            return cluster_pb2.SyncDoneResponse(routing=self.routing())

    def resync_target(self, target_id: int) -> bool:
        """Take a serving target that lost data out of service, to be resynced from its chain.

        See :func:`chainstate.on_lost_data`. True when the target's state
        changed (its chain's version bumped); False when it was not serving or
        no other member of its chain serves. Raises :class:`errors.NotFound`
        for an unknown target or one in no chain.
        """
        with self._lock:
            self._current()
            info = self._targets.get(target_id)
            if info is None or not info.chain_id:
                raise errors.NotFound(f"target {target_id} is in no chain")
            changes = _Changes()
            self._set_chain(
                chainstate.on_lost_data(self._chains[info.chain_id], target_id), changes
            )
            self._flush(changes)
            return bool(changes.targets)

    def check_timeouts(self) -> None:
        """Time out the targets of every node silent for longer than the heartbeat timeout.

        A judging round of :attr:`grace` (see :meth:`Grace.check`): after a gap
        since the previous round that shows the metaserver itself stalled,
        every node is judged from now. The round starts once the cluster lock
        is held; heartbeats are noted without it, so a heartbeat waiting for
        the lock has already counted.

        On a store that bounds its transactions (etcd), each silent node's
        change is committed on its own, as if the nodes had gone one after
        another: many nodes going at once (a rack) never make one change
        larger than the store takes.
        """
        went_offline = False
        with self._lock:
            if not self.leadership.leading():
                return  # the leader judges
            self._current()
            now = self.grace.check()
            with self._seen_lock:
                seen_at = sorted(self._last_seen.items())
            changes = _Changes()
            for node_id, seen in seen_at:
                if self.grace.silence(seen, now) > self.heartbeat_timeout:
                    for tid in self._node_targets(node_id):
                        self._timeout_target(tid, changes)
                    if self.engine.max_txn_ops is not None and changes.targets:
                        self._flush(changes)
                        went_offline = True
                        changes = _Changes()
            self._flush(changes)
            went_offline = went_offline or bool(changes.targets)
        if went_offline:
            self._tell_offline()

    # ---------------------------------------------------------- admin steering

    def _finish_drains(self, changes: _Changes) -> None:
        """Drop each drained target whose replacement serves from its chain (see drain_target)."""
        for drained, replacement in sorted(self._drains.items()):
            info = self._targets[replacement]
            chain = self._chains.get(info.chain_id)
            if chain is None:
                continue
            new = chainstate.drain_finish(chain, drained, replacement)
            if new is chain:
                continue
            self._set_chain(new, changes)
            left = self._targets[drained]
            left.chain_id = 0
            left.state = OFFLINE
            self._fenced.add(drained)
            del self._drains[drained]
            changes.targets.add(drained)
            changes.admin = True

    def offline_target(self, target_id: int) -> common_pb2.TargetInfo:
        """Take a target out of service as if its heartbeats had stopped.

        The target goes offline (lastsrv when it was its chain's last serving
        member), its chain is reordered and its version bumps. It stays
        offline (heartbeats do not bring it back) until its storage server
        registers again, i.e. restarts; then it returns like any restarted
        target (waiting, then syncing from its chain's serving predecessor).

        Raises
        ------
        errors.NotFound
            No such target.
        """
        with self._lock:
            self._current()
            if target_id not in self._targets:
                raise errors.NotFound(f"no target {target_id}")
            changes = _Changes(admin=target_id not in self._fenced)
            self._fenced.add(target_id)
            self._timeout_target(target_id, changes)
            self._flush(changes)
            out = common_pb2.TargetInfo()
            out.CopyFrom(self._targets[target_id])
        self._tell_offline()  # an offline target no longer holds up GC items
        return out

    def drain_target(self, target_id: int) -> tuple[int, int]:
        """Start moving a target's chain membership to a free target.

        A free target (in no chain, serving, on a node that holds no member of
        the chain) joins the chain at its tail as waiting and is resynced by
        its serving predecessor; the drained target keeps serving meanwhile.
        Once the replacement serves, the drained target leaves the chain and
        is held offline until its storage server registers again. Draining a
        target that is already draining returns the drain under way.

        Returns
        -------
        tuple of int
            ``(chain id, replacement target id)``.

        Raises
        ------
        errors.NotFound
            No such target.
        errors.Busy
            The target is in no chain, is itself the replacement of a drain,
            or no free target can replace it.
        """
        with self._lock:
            self._current()
            info = self._targets.get(target_id)
            if info is None:
                raise errors.NotFound(f"no target {target_id}")
            if target_id in self._drains:
                replacement = self._drains[target_id]
                return self._targets[replacement].chain_id, replacement
            if target_id in self._drains.values():
                raise errors.Busy(f"target {target_id} is replacing a drained target")
            if not info.chain_id:
                raise errors.Busy(f"target {target_id} is in no chain")
            chain = self._chains[info.chain_id]
            free = [
                (tid, t.node_id)
                for tid, t in self._targets.items()
                if t.chain_id == 0
                and t.state == SERVING
                and tid not in self._absent
                and tid not in self._fenced
            ]
            node_of = {tid: t.node_id for tid, t in self._targets.items()}
            replacement = chainstate.pick_replacement(chain, node_of, free)
            if replacement is None:
                raise errors.Busy(
                    f"no free target on a node outside chain {chain.chain_id} can replace "
                    f"target {target_id}"
                )
            changes = _Changes(admin=True)
            self._drains[target_id] = replacement
            self._set_chain(chainstate.drain_start(chain, target_id, replacement), changes)
            self._flush(changes)
            return chain.chain_id, replacement

    def drains(self) -> dict[int, int]:
        """Drains under way: ``{drained target id: replacement target id}``."""
        with self._lock:
            return dict(self._drains)

    def fenced(self) -> set[int]:
        """Targets held offline until their node registers again."""
        with self._lock:
            return set(self._fenced)

    def io_totals(self) -> tuple[int, int]:
        """``(bytes read, bytes written)`` summed over the counters nodes last reported.

        Each node counts from its own start, so the sum drops when a node
        restarts; rates are differences of successive readings, clamped at 0.
        """
        with self._lock:
            return (
                sum(r for r, _ in self._io.values()),
                sum(w for _, w in self._io.values()),
            )
