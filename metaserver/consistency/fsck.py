"""``emberfs fsck``: the namespace checked against itself and against the storage servers.

It runs in the metaserver, which reads the metadata store directly, and walks
it in two passes:

1. **The namespace.** Every inode, then every directory entry: an entry that
   names no inode or names it with the wrong type, a link count that is not
   the number of entries naming the file, a directory named by no entry or by
   several, an inode that no entry names (an unlinked file still open is fine).
2. **The chunks.** Every serving target lists its chunks in (inode, index)
   order (``ListChunks``, a page at a time, with the chunk file checked, or
   with ``deep`` every block read against its CRC32C); the lists are merged
   and joined with the files in inode order. For each chunk a file needs
   (below its length, outside its holes), the serving replicas of its chain
   must hold it, undamaged, with no problem found, at least as long as the
   file needs, and alike (version, length, checksum); no replica may hold
   bytes past the file's length; and chunks of inodes that no file owns and
   no GC item covers are orphans.

Between the two, each quota's recorded usage is checked against a count of the
inodes below it (:mod:`.quotacheck`).

It keeps in memory three compact arrays of the inode ids, link counts and
types (about 13 bytes an inode), the directories' names (to print paths), and
the chunks of one inode at a time; the findings are few. Files that change
while it runs can show passing differences (a write between two replicas'
lists, a collection after a list): a chunk found wrong is listed again and
judged with the file as it is then, orphans are listed again once their GC item
is found gone, chunks with an update pending are skipped, and bytes past the
length of a file open for writing are not counted.

With ``repair`` it fixes what it can: a replica that lacks, lost or holds
other bytes is marked damaged where its file is bad and its target is resynced
from its chain (as read repair does); orphan chunks are queued for garbage
collection; bytes past a file's length are cut (a pending cut); link counts
and entry types are rewritten; entries naming no inode are removed; a
quota's usage is rewritten to what was counted. It cannot
bring back a chunk that no replica holds, nor name an inode that no entry
names: those it reports as not repaired.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from emberfs.common import errors
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.consistency.chunks import ChunkCheck
from emberfs.metaserver.consistency.findings import Finding, FsckError, dentry_parent
from emberfs.metaserver.consistency.namespacecheck import NamespaceCheck
from emberfs.metaserver.consistency.quotacheck import QuotaCheck
from emberfs.metaserver.consistency.repairs import Repairs
from emberfs.metaserver.fs import cuts, records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine


class Fsck:
    """One check (and repair) of the namespace and the chunks.

    Parameters
    ----------
    engine : KVEngine
        The metadata store.
    cluster : ClusterManager
        Routing, and resyncs for repairs.
    queued : callable, optional
        ``queued(gc_ids)`` after orphan chunks were queued for GC
        (:meth:`GCQueue.queued <emberfs.metaserver.clustermgr.gcqueue.GCQueue.queued>`).
    pending_cuts : cuts.PendingCuts, optional
        Cuts bytes past a file's length on repair (without it they are reported only).
    """

    def __init__(
        self,
        engine: KVEngine,
        cluster: ClusterManager,
        *,
        queued: Callable[[list[int]], None] = lambda ids: None,
        pending_cuts: cuts.PendingCuts | None = None,
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.queued = queued
        self.pending_cuts = pending_cuts
        self.running = threading.Lock()

    # ------------------------------------------------------------------ the run

    def run(self, *, deep: bool = False, repair: bool = False) -> Iterator[dict]:
        """Check; yield each finding (``{"finding": ...}``) and last ``{"summary": ...}``.

        Raises :class:`errors.Busy` when another check runs, and yields
        ``{"error": ...}`` (then stops) when it cannot finish.
        """
        if not self.running.acquire(blocking=False):
            raise errors.Busy("another fsck is running")
        try:
            yield from self._run(deep, repair)
        finally:
            self.running.release()

    def _run(self, deep: bool, repair: bool) -> Iterator[dict]:
        started = time.monotonic()
        namespace = NamespaceCheck(self.engine)
        chunks = ChunkCheck(self.engine, self.cluster, deep=deep, mark=repair)
        quotas = QuotaCheck(self.engine)
        repairs = Repairs(
            self.engine,
            self.cluster,
            queued=self.queued,
            pending_cuts=self.pending_cuts,
            links=namespace.links,
            chunks=chunks,
            quotas=quotas,
        )
        counts: Counter = Counter()
        repaired = unrepaired = 0
        dirs: dict[int, tuple[int, str]] = {}
        pending: list[Finding] = []
        try:
            inodes = namespace.load_inodes()
            found = itertools.chain(
                namespace.check(inodes, dirs), quotas.check(), chunks.check_chunks(inodes)
            )
            for finding in found:
                counts[finding.kind] += 1
                if repair:
                    finding.repair = repairs.repair(finding)
                pending.append(finding)
        except FsckError as exc:
            yield {"error": str(exc)}
            return
        if repairs.resync:
            repairs.wait_resyncs(started)
        self._name(pending, dirs)
        for finding in pending:
            if finding.repair == "done":
                repaired += 1
            else:
                unrepaired += 1
            yield {"finding": finding.public()}
        yield {
            "summary": {
                "clean": not pending,
                "deep": deep,
                "repair": repair,
                "inodes": len(inodes.ids),
                "files": chunks.stats["files"],
                "chunks": chunks.stats["chunks"],
                "replicas": chunks.stats["replicas"],
                "bytes_verified": chunks.stats["bytes_verified"],
                "skipped_targets": sorted(chunks.skipped),
                "findings": dict(sorted(counts.items())),
                "repaired": repaired if repair else 0,
                "unrepaired": unrepaired if repair else len(pending),
                "seconds": round(time.monotonic() - started, 3),
            }
        }

    # ------------------------------------------------------------------ paths

    def _name(self, found: list[Finding], dirs: dict[int, tuple[int, str]]) -> None:
        """Fill in each finding's path (one more pass over the entries for the files)."""
        wanted = {f.inode for f in found if f.entry is None}
        names: dict[int, tuple[int, str]] = {i: dirs[i] for i in wanted if i in dirs}
        if wanted - names.keys():
            guard_len = len(keys.DENTRY) + 8
            for key, raw in self.engine.scan_prefix(keys.DENTRY):
                if len(key) == guard_len:
                    continue
                child = records.decode_dentry(raw).inode
                if child in wanted and child not in names:
                    names[child] = (dentry_parent(key), keys.dentry_name(key))

        def path_of(inode: int) -> str:
            parts: list[str] = []
            seen = set()
            while inode != records.ROOT_INODE:
                if inode in seen or inode not in names and inode not in dirs:
                    return ""
                seen.add(inode)
                parent, name = names.get(inode) or dirs[inode]
                parts.append(name)
                inode = parent
            return "/" + "/".join(reversed(parts))

        for f in found:
            if f.entry is not None:
                parent, name = f.entry
                base = "/" if parent == records.ROOT_INODE else path_of(parent)
                f.path = (base.rstrip("/") + "/" + name) if base else ""
            else:
                f.path = "/" if f.inode == records.ROOT_INODE else path_of(f.inode)
