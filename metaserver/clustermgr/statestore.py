"""The cluster state in the store and in memory: loading it (at one revision of the store),
writing each call's changes as one batch (with the leadership's fence), and the usage figures
heartbeats bring, which a shared store gets from a thread of their own.
"""

from __future__ import annotations

import json
import logging
import threading

from emberfs.common import errors
from emberfs.metaserver.clustermgr.chainstate import Chain
from emberfs.metaserver.clustermgr.state import (
    U64,
    Changes,
    Node,
)
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict
from emberfs.proto import common_pb2

log = logging.getLogger(__name__)


class StoredState:
    """The stored-state part of :class:`~emberfs.metaserver.clustermgr.manager.ClusterManager`
    (its state, lock and leadership are the manager's)."""

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
            return default if raw is None else U64.unpack(raw)[0]

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

    def _flush(self, changes: Changes) -> None:
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
            keys.config_key(keys.NEXT_TARGET): U64.pack(self._next_target),
            keys.config_key(keys.NEXT_CHAIN): U64.pack(self._next_chain),
            keys.config_key(keys.ROUTING_VERSION): U64.pack(version),
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
            stored = U64.pack(self._routing_version) if self._routing_version else None
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
