"""Which metaserver runs the cluster manager: exactly one at a time.

Any number of metaservers serve the namespace over one shared store, but the
cluster manager's work (heartbeats and target states, chain versions,
timeouts, GC, session expiry, read repair) must run on one of them only, or two
would bump the same chain version or declare the same node offline twice.

:class:`Leadership` is the trivial case: a metaserver that owns its store
alone (RocksDB) always leads. :class:`EtcdLeadership` elects one over etcd, as
etcd's own election recipe does:

- every metaserver holds an etcd lease (``ttl`` seconds, kept alive a few
  times per ttl) and, while no one leads, tries to create the leader key
  (``LEAD``) bound to it, in one transaction that succeeds only if the key does
  not exist. The winner leads; the key's value names it (:class:`LeaderInfo`)
  and the others point storage servers there;
- the leader fences every cluster-manager write with a compare on the leader
  key's value (:attr:`Leadership.fence`): a metaserver that lost the key can
  no longer change the cluster, so no chain version is ever given out twice;
- a leader whose keepalive fails stops leading once its lease may have run out
  (``ttl`` after the last keepalive that was answered, minus a margin for clock
  rates), before any other metaserver can win the key;
- when the key goes (the leader died, its lease expired) another wins it
  within about ``ttl`` plus one poll, reloads the cluster state from the store
  and continues from it (:meth:`~emberfs.metaserver.clustermgr.manager.ClusterManager.take_over`).

Storage nodes serve under short leases that the leader grants with every
heartbeat answer (fencing, :mod:`emberfs.storageserver.node`). Were a leader
to stop answering whenever etcd has no quorum, every storage node would stop
serving a few seconds later, and reads of open files with them. So a leader
cut off from etcd *freezes* instead: it changes nothing (it cannot), but keeps
answering heartbeats, with the routing it last stored, for ``outage_grace``
seconds after its last confirmed keepalive (:meth:`Leadership.granting`).
Should the outage be the leader's alone (a partition) while the others still
reach etcd, one of them wins the key once the lease expires; it then holds
back from declaring any node offline for ``outage_grace`` more seconds (its
:class:`~emberfs.metaserver.clustermgr.grace.Grace` begins that much later), so that no
node serving under the frozen leader's grants is taken out of a chain behind
its back.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from emberfs.common import errors
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict

log = logging.getLogger(__name__)

DEFAULT_TTL = 3.0
DEFAULT_OUTAGE_GRACE = 30.0
POLL_INTERVAL = 0.5
CLOCK_MARGIN = 0.5  # seconds a leader stops short of its lease's end


@dataclass(frozen=True)
class LeaderInfo:
    """A metaserver as the leader key names it: its id and where it serves."""

    id: str
    address: str  # MetaService and ClusterService (HOST:PORT)
    cluster_address: str = ""  # ClusterService for storage nodes
    admin_url: str = ""  # the admin API

    def encode(self, lease: int = 0) -> bytes:
        return json.dumps({**asdict(self), "lease": lease}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> LeaderInfo:
        d = json.loads(raw)
        return cls(
            str(d["id"]),
            str(d["address"]),
            str(d.get("cluster_address", "")),
            str(d.get("admin_url", "")),
        )


def new_id() -> str:
    """A metaserver's id for one run (a restarted one is a new candidate)."""
    return uuid.uuid4().hex[:16]


class Leadership:
    """The leadership of a metaserver that owns its store alone: it always leads.

    Subclasses elect one of several metaservers; the cluster manager asks
    :meth:`leading` before every change, :meth:`granting` before answering a
    heartbeat, adds :attr:`fence` to every commit, and calls :meth:`deposed`
    when a fenced commit fails.
    """

    shared = False
    outage_grace = 0.0

    def __init__(self, me: LeaderInfo | None = None) -> None:
        self.me = me or LeaderInfo(new_id(), "")
        self.fence: dict[bytes, bytes | None] = {}
        self.term = 1
        self._on_elected: Callable[[], None] = lambda: None
        self._on_deposed: Callable[[], None] = lambda: None

    def start(
        self,
        on_elected: Callable[[], None] = lambda: None,
        on_deposed: Callable[[], None] = lambda: None,
    ) -> None:
        """Begin: ``on_elected()`` runs each time this metaserver starts to lead, before
        :meth:`leading` says so; ``on_deposed()`` each time it stops."""
        self._on_elected, self._on_deposed = on_elected, on_deposed
        on_elected()

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Give the leadership up (at shutdown)."""

    def wait_known(self, timeout: float) -> bool:
        """Block until the leader is known (here: at once, this metaserver leads)."""
        return True

    def leading(self) -> bool:
        """This metaserver runs the cluster manager now and may change the cluster."""
        return True

    def granting(self) -> bool:
        """This metaserver may answer heartbeats (grant storage nodes their leases)."""
        return True

    def leader(self) -> LeaderInfo | None:
        """The metaserver that leads, as last seen (None: none known)."""
        return self.me

    def deposed(self) -> None:  # noqa: B027 - optional hook
        """A fenced commit failed: someone else holds the leader key."""

    def require(self) -> None:
        """Raise :class:`~emberfs.common.errors.NotLeader` (pointing at the leader) unless leading."""
        if not self.leading():
            leader = self.leader()
            raise errors.NotLeader(
                leader=leader.address if leader is not None and leader.id != self.me.id else ""
            )

    def describe(self) -> dict:
        """For the admin API: who leads, whether this metaserver does, and the term."""
        leader = self.leader()
        return {
            "id": self.me.id,
            "leading": self.leading(),
            "frozen": self.granting() and not self.leading(),
            "term": self.term,
            "leader": asdict(leader) if leader is not None else None,
        }


class EtcdLeadership(Leadership):
    """One leader among the metaservers of an etcd store (see the module docstring).

    Parameters
    ----------
    engine : EtcdEngine
        The shared store; the leader key is ``LEAD`` in its keyspace.
    me : LeaderInfo
        This metaserver.
    ttl : float, default 3
        Seconds of the lease that holds the leader key: a dead leader is
        replaced after about this long.
    outage_grace : float, default 30
        Seconds a leader cut off from etcd keeps answering heartbeats, and a
        new leader waits before it declares any node offline.
    poll : float, default 0.5
        Seconds between two rounds (keepalive, campaign or check of the key).
    """

    shared = True

    def __init__(
        self,
        engine,
        me: LeaderInfo,
        *,
        ttl: float = DEFAULT_TTL,
        outage_grace: float = DEFAULT_OUTAGE_GRACE,
        poll: float = POLL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(me)
        if ttl < 2:
            raise ValueError("the leader lease ttl must be at least 2 seconds (etcd's minimum)")
        self.engine = engine
        self.ttl = ttl
        self.outage_grace = max(outage_grace, ttl)
        self.poll = min(poll, ttl / 3)
        self.clock = clock
        self.term = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease = 0
        self._lease_ttl = 0.0
        self._confirmed = -float("inf")  # monotonic send time of the last answered keepalive
        self._leading = False  # holds the key (while confirmed; frozen past that)
        self._leader: LeaderInfo | None = None
        self._value = b""
        self._known = threading.Event()  # set once a round found the leader (or took the lead)

    # state -------------------------------------------------------------------
    def leading(self) -> bool:
        with self._lock:
            return self._leading and self.clock() < self._confirmed + self._lease_ttl - CLOCK_MARGIN

    def granting(self) -> bool:
        with self._lock:
            return self._leading and self.clock() < self._confirmed + self.outage_grace

    def leader(self) -> LeaderInfo | None:
        with self._lock:
            return self.me if self._leading else self._leader

    def deposed(self) -> None:
        self._step_down("a cluster change found the leader key held by another")

    # the election loop ---------------------------------------------------------
    def start(
        self,
        on_elected: Callable[[], None] = lambda: None,
        on_deposed: Callable[[], None] = lambda: None,
    ) -> None:
        self._on_elected, self._on_deposed = on_elected, on_deposed
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def halt(self) -> None:
        """Stop campaigning and keeping the lease alive, giving nothing up.

        What a killed metaserver leaves behind: its leader key (if it led)
        stays until its lease expires, about ``ttl`` later, and another
        metaserver can win the key only then. :meth:`stop` is the clean
        shutdown, which halts and then gives the key and the lease up.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def stop(self) -> None:
        """Stop campaigning; a leader gives the key up so another takes over at once."""
        self.halt()
        reachable = self.leading()  # else etcd did not answer lately: the lease lapses by itself
        was = self._leading
        self._step_down("shutting down")
        if was and self._value and reachable:
            try:
                self._delete_own_key(self._value)
            except errors.EmberError as exc:
                log.warning("could not give the leader key up: %s", exc)
        if self._lease and reachable:
            self._revoke(self._lease)

    def wait_known(self, timeout: float) -> bool:
        """Block until this metaserver leads or knows who does (at most ``timeout`` seconds).

        A metaserver that starts answers its first calls after this, so that
        they are not refused for want of a leader it would know a moment later.
        """
        return self._known.wait(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except errors.Unavailable as exc:
                self._unreachable(exc)
            except Exception:
                log.exception("leader election round failed")
            self._stop.wait(self.poll)

    def _round(self) -> None:
        sent = self.clock()
        if self._lease == 0:
            self._lease, ttl = self._grant()
            self._confirm(sent, ttl)
        else:
            ttl = self._keepalive(self._lease)
            if ttl <= 0:
                lost = self._lease
                self._lease = 0
                self._step_down(f"lease {lost:x} expired")
                return
            self._confirm(sent, ttl)
        won, value = self._campaign(self._lease)
        if won:
            if not self._leading:
                self._take_over(value)
            self._known.set()
            return
        current = LeaderInfo.decode(value) if value else None
        if self._leading:
            self._step_down("the leader key names another metaserver")
        with self._lock:
            self._leader = current
        if current is not None:
            self._known.set()
        if current is not None and current.id == self.me.id:
            # our own key of an earlier lease (a freeze outlived the lease here): give it up
            self._delete_own_key(value)

    def _confirm(self, sent: float, ttl: float) -> None:
        with self._lock:
            was_frozen = self._leading and self.clock() >= self._confirmed + self._lease_ttl
            self._confirmed = max(self._confirmed, sent)
            self._lease_ttl = ttl
        if was_frozen:
            log.warning("etcd answers again: leading the cluster again")
            self._on_elected()  # the state in the store is the truth again

    def _unreachable(self, exc: Exception) -> None:
        with self._lock:
            leading = self._leading
            past_grace = self.clock() >= self._confirmed + self.outage_grace
        if leading and past_grace:
            self._lease = 0
            self._step_down(f"etcd unreachable for longer than the outage grace: {exc}")
        elif leading:
            log.warning("etcd unreachable: the cluster manager is frozen (%s)", exc)

    def _take_over(self, value: bytes) -> None:
        log.warning("this metaserver (%s) leads the cluster from now", self.me.address)
        self.fence = {keys.LEADER: value}
        self._value = value
        self.term += 1
        try:
            self._on_elected()
        except Exception:
            log.exception("taking over the cluster failed; giving the leadership up")
            self._delete_own_key(value)
            return
        with self._lock:
            self._leading = True
            self._leader = self.me

    def _step_down(self, why: str) -> None:
        with self._lock:
            was = self._leading
            self._leading = False
        if was:
            log.warning("this metaserver no longer leads the cluster: %s", why)
            self._on_deposed()

    # etcd calls ----------------------------------------------------------------
    def _grant(self) -> tuple[int, float]:
        from aetcd.rpc import rpc_pb2 as rpc

        resp = self.engine.call(
            "Lease", "LeaseGrant", rpc.LeaseGrantRequest(TTL=int(round(self.ttl))), timeout=self.ttl
        )
        if resp.error:
            raise errors.Unavailable(f"etcd refused a lease: {resp.error}")
        return resp.ID, float(resp.TTL)

    def _keepalive(self, lease: int) -> float:
        from aetcd.rpc import rpc_pb2 as rpc

        resp = self.engine.call(
            "Lease",
            "LeaseKeepAlive",
            rpc.LeaseKeepAliveRequest(ID=lease),
            timeout=self.ttl / 2,
            stream=True,
        )
        return float(resp.TTL)

    def _revoke(self, lease: int) -> None:
        from aetcd.rpc import rpc_pb2 as rpc

        try:
            self.engine.call("Lease", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease), timeout=2)
        except errors.EmberError:
            pass

    def _campaign(self, lease: int) -> tuple[bool, bytes]:
        """Create the leader key with our lease if absent; ``(ours, its value)``."""
        from aetcd.rpc import rpc_pb2 as rpc

        key = self.engine.full_key(keys.LEADER)
        mine = self._value if self._leading else self.me.encode(lease)
        resp = self.engine.call(
            "KV",
            "Txn",
            rpc.TxnRequest(
                compare=[
                    rpc.Compare(
                        key=key,
                        target=rpc.Compare.CREATE,
                        result=rpc.Compare.EQUAL,
                        create_revision=0,
                    )
                ],
                success=[
                    rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=mine, lease=lease))
                ],
                failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))],
            ),
        )
        if resp.succeeded:
            return True, mine
        kvs = resp.responses[0].response_range.kvs
        value = kvs[0].value if kvs else b""
        return value == mine and kvs[0].lease == lease, value

    def _delete_own_key(self, value: bytes) -> None:
        """Delete the leader key if it still holds ``value``."""
        if not value:
            return
        try:
            self.engine.txn(
                self.engine.value_compares({keys.LEADER: value}), {}, {keys.LEADER}, timeout=2
            )
        except Conflict:
            pass  # compacted or the like: the lease takes it
