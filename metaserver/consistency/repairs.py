"""``emberfs fsck --repair``: what can be fixed, fixed.

A replica that lacks, lost or holds other bytes is resynced from its chain (its target taken out
of service, as read repair does); orphan chunks are queued for garbage collection; bytes past a
file's length are cut (a pending cut); link counts and entry types are rewritten; entries naming
no inode are removed. A chunk that no replica holds, or an inode that no entry names, is reported
as not repaired.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from emberfs.common import errors
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.consistency.chunks import ChunkCheck
from emberfs.metaserver.consistency.findings import Finding
from emberfs.metaserver.consistency.quotacheck import QuotaCheck
from emberfs.metaserver.fs import cuts, records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine, Transaction, run_transaction
from emberfs.proto import cluster_pb2, common_pb2

log = logging.getLogger(__name__)

REPAIR_WAIT = 120.0  # seconds a repair waits for the resyncs it started


class Repairs:
    """Repairs of one check's findings.

    ``links`` are the wrong link counts the namespace pass found; ``chunks`` is the chunk
    pass (its routing names an orphan's chains). :attr:`resync` holds the targets sent to
    resync.
    """

    def __init__(
        self,
        engine: KVEngine,
        cluster: ClusterManager,
        *,
        queued: Callable[[list[int]], None],
        pending_cuts: cuts.PendingCuts | None,
        links: dict[int, tuple[int, int]],
        chunks: ChunkCheck,
        quotas: QuotaCheck,
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.queued = queued
        self.pending_cuts = pending_cuts
        self.links = links
        self.chunks = chunks
        self.quotas = quotas
        self.resync: set[int] = set()

    def repair(self, f: Finding) -> str:
        """Repair what ``f`` found: \"done\", or why not."""
        try:
            if f.kind in ("missing_replica", "replicas_disagree"):
                for t in f.targets:
                    if t not in self.resync:
                        if not self.cluster.resync_target(t):
                            return f"target {t} could not be taken out of service to resync"
                        self.resync.add(t)
                return "done"
            if f.kind == "orphan_chunk":
                return self._queue_orphan(f)
            if f.kind == "chunk_past_end":
                return self._cut_past_end(f)
            if f.kind == "wrong_link_count":
                return self._fix_links(f)
            if f.kind == "dangling_entry":
                return self._drop_entry(f)
            if f.kind == "wrong_entry_type":
                return self._fix_entry_type(f)
            if f.kind == "quota_usage":
                return self.quotas.repair(f)
            if f.kind == "lost_chunk":
                return "not repaired: no replica holds the data"
            return "not repaired: no entry to attach it to"
        except errors.EmberError as exc:
            return f"not repaired: {exc}"

    def _queue_orphan(self, f: Finding) -> str:
        chains = sorted({self.chunks.routing.chain_of(t) for t in f.targets} - {0})

        def queue(txn: Transaction) -> bool:
            if txn.get(keys.inode_key(f.inode)) is not None or txn.get(keys.gc_key(f.inode)):
                return False
            item = cluster_pb2.GCItem(gc_id=f.inode, inode=f.inode, chains=chains)
            txn.put(keys.gc_key(f.inode), item.SerializeToString())
            return True

        if not run_transaction(self.engine, queue):
            return "not repaired: the inode exists again, or is queued already"
        self.queued([f.inode])
        return "done"

    def _cut_past_end(self, f: Finding) -> str:
        if self.pending_cuts is None:
            return "not repaired: this metaserver has no storage to cut"

        def record(txn: Transaction) -> bool:
            raw = txn.get(keys.inode_key(f.inode))
            if raw is None:
                return False
            cuts.put(txn, f.inode, records.decode_inode(raw).size)
            return True

        if not run_transaction(self.engine, record):
            return "not repaired: the file is gone"
        self.pending_cuts.finish(f.inode)
        return "done"

    def _fix_links(self, f: Finding) -> str:
        was, named = self.links[f.inode]

        def fix(txn: Transaction) -> bool:
            raw = txn.get(keys.inode_key(f.inode))
            if raw is None:
                return False
            attr = records.decode_inode(raw)
            if attr.nlink != was:
                return False  # linked or unlinked since: the count seen is stale
            attr.nlink = named
            txn.put(keys.inode_key(f.inode), records.encode_inode(attr))
            return True

        return "done" if run_transaction(self.engine, fix) else "not repaired: it changed meanwhile"

    def _drop_entry(self, f: Finding) -> str:
        parent, name = f.entry
        key = keys.dentry_key(parent, name)

        def drop(txn: Transaction) -> bool:
            raw = txn.get(key)
            if raw is None or records.decode_dentry(raw).inode != f.inode:
                return False
            if txn.get(keys.inode_key(f.inode)) is not None:
                return False
            txn.delete(key)
            txn.put(keys.dir_guard_key(parent), records.new_guard_value())
            return True

        return (
            "done" if run_transaction(self.engine, drop) else "not repaired: it changed meanwhile"
        )

    def _fix_entry_type(self, f: Finding) -> str:
        parent, name = f.entry
        key = keys.dentry_key(parent, name)

        def fix(txn: Transaction) -> bool:
            raw, inode_raw = txn.get(key), txn.get(keys.inode_key(f.inode))
            if raw is None or inode_raw is None or records.decode_dentry(raw).inode != f.inode:
                return False
            txn.put(key, records.encode_dentry(f.inode, records.decode_inode(inode_raw).type))
            return True

        return "done" if run_transaction(self.engine, fix) else "not repaired: it changed meanwhile"

    def wait_resyncs(self, started: float) -> None:
        """Wait (a while) until every target sent to resync serves again."""
        deadline = time.monotonic() + REPAIR_WAIT
        while time.monotonic() < deadline:
            states = {t.target_id: t.state for t in self.cluster.routing().targets}
            if all(states.get(t) == common_pb2.SERVING for t in self.resync):
                return
            time.sleep(0.2)
        log.warning(
            "fsck: targets %s still resyncing after %.0f s", sorted(self.resync), REPAIR_WAIT
        )
