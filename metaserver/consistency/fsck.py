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
and entry types are rewritten; entries naming no inode are removed. It cannot
bring back a chunk that no replica holds, nor name an inode that no entry
names: those it reports as not repaired.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from emberfs.common import errors, extents, grpcauth
from emberfs.common.layout import chunk_chain
from emberfs.common.routing import RoutingView, TargetView
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.clustermgr.repair import list_chunk
from emberfs.metaserver.fs import cuts, records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine, Transaction, run_transaction
from emberfs.proto import cluster_pb2, common_pb2, storage_pb2, storage_pb2_grpc

log = logging.getLogger(__name__)

KINDS = {
    "dangling_entry": "a directory entry names an inode that does not exist",
    "wrong_entry_type": "a directory entry gives its inode another type than the inode has",
    "wrong_link_count": "a file's link count is not the number of entries naming it",
    "unreachable_inode": "no directory entry names this inode",
    "lost_chunk": "no serving replica holds chunk data the file needs",
    "missing_replica": "a serving replica lacks chunk data that another holds",
    "replicas_disagree": "serving replicas hold one chunk at different versions, lengths or bytes",
    "chunk_past_end": "a replica holds bytes past the file's length",
    "orphan_chunk": "chunks of an inode no file owns and no GC item covers",
}

LIST_PAGE = 1000  # chunks a ListChunks page holds when only metadata and files are checked
DEEP_PAGE = 32  # chunks a page holds when every block is read
LIST_TIMEOUT = 120.0  # seconds for one page
REPAIR_WAIT = 120.0  # seconds a repair waits for the resyncs it started
CONFIRM_LOOKS = 5  # looks at a chunk found wrong, until two in a row agree
CONFIRM_PAUSE = 0.05  # seconds between two looks


class FsckError(Exception):
    """The check could not run to its end (a serving target did not answer)."""


def _unanswered(target: TargetView, inode: int, exc: grpc.RpcError) -> FsckError:
    return FsckError(
        f"target {target.target_id} ({target.grpc_address}) did not list chunks of inode "
        f"{inode}: {exc.code().name}: {exc.details()}"
    )


@dataclass
class Finding:
    kind: str
    inode: int
    index: int | None = None
    targets: list[int] = field(default_factory=list)
    detail: str = ""
    path: str = ""
    repair: str = ""  # with repair: "done", or why not
    entry: tuple[int, str] | None = None  # (directory, name) of the entry it is about

    def public(self) -> dict:
        out = {"kind": self.kind, "inode": self.inode, "path": self.path, "detail": self.detail}
        if self.index is not None:
            out["index"] = self.index
        if self.targets:
            out["targets"] = self.targets
        if self.repair:
            out["repair"] = self.repair
        return out


@dataclass
class _Inodes:
    """Every inode's id, link count and type, sorted by id (compact arrays)."""

    ids: array
    nlinks: array
    types: array

    def find(self, inode: int) -> int:
        """The position of ``inode``, or -1."""
        pos = bisect.bisect_left(self.ids, inode)
        return pos if pos < len(self.ids) and self.ids[pos] == inode else -1


def _dentry_parent(key: bytes) -> int:
    return int.from_bytes(key[len(keys.DENTRY) : len(keys.DENTRY) + 8], "big")


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
        self.stats: Counter = Counter()
        self.stats_skipped: set[int] = set()
        self.resync: set[int] = set()
        self._links: dict[int, tuple[int, int]] = {}
        counts: Counter = Counter()
        repaired = unrepaired = 0
        dirs: dict[int, tuple[int, str]] = {}
        pending: list[Finding] = []
        try:
            inodes = self._load_inodes()
            found = itertools.chain(
                self._check_namespace(inodes, dirs), self._check_chunks(inodes, deep, repair)
            )
            for finding in found:
                counts[finding.kind] += 1
                if repair:
                    finding.repair = self._repair(finding)
                pending.append(finding)
        except FsckError as exc:
            yield {"error": str(exc)}
            return
        if self.resync:
            self._wait_resyncs(started)
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
                "files": self.stats["files"],
                "chunks": self.stats["chunks"],
                "replicas": self.stats["replicas"],
                "bytes_verified": self.stats["bytes_verified"],
                "skipped_targets": sorted(self.stats_skipped),
                "findings": dict(sorted(counts.items())),
                "repaired": repaired if repair else 0,
                "unrepaired": unrepaired if repair else len(pending),
                "seconds": round(time.monotonic() - started, 3),
            }
        }

    # ------------------------------------------------------------------ pass 1: the namespace

    def _load_inodes(self) -> _Inodes:
        ids, nlinks, types = array("Q"), array("I"), array("B")
        for key, raw in self.engine.scan_prefix(keys.INODE):
            attr = records.decode_inode(raw)
            ids.append(int.from_bytes(key[len(keys.INODE) :], "little"))
            nlinks.append(min(attr.nlink, 0xFFFFFFFF))
            types.append(attr.type)
        order = sorted(range(len(ids)), key=ids.__getitem__)
        return _Inodes(
            array("Q", (ids[i] for i in order)),
            array("I", (nlinks[i] for i in order)),
            array("B", (types[i] for i in order)),
        )

    def _check_namespace(
        self, inodes: _Inodes, dirs: dict[int, tuple[int, str]]
    ) -> Iterator[Finding]:
        named = array("I", bytes(4 * len(inodes.ids)))
        guard_len = len(keys.DENTRY) + 8
        for key, raw in self.engine.scan_prefix(keys.DENTRY):
            if len(key) == guard_len:
                continue  # a directory's entry guard
            parent, name = _dentry_parent(key), keys.dentry_name(key)
            entry = records.decode_dentry(raw)
            pos = inodes.find(entry.inode)
            if pos < 0:
                if self.engine.get(keys.inode_key(entry.inode)) is not None:
                    continue  # created after the inodes were read
                yield Finding(
                    "dangling_entry",
                    entry.inode,
                    detail=f"entry {name!r} of directory {parent}",
                    entry=(parent, name),
                )
                continue
            named[pos] += 1
            if inodes.types[pos] == common_pb2.DIRECTORY:
                dirs[entry.inode] = (parent, name)
            if entry.type != inodes.types[pos]:
                yield Finding(
                    "wrong_entry_type",
                    entry.inode,
                    detail=f"entry {name!r} of directory {parent} says type {entry.type}, "
                    f"the inode is {inodes.types[pos]}",
                    entry=(parent, name),
                )
        for pos, inode in enumerate(inodes.ids):
            n, nlink, kind = named[pos], inodes.nlinks[pos], inodes.types[pos]
            if kind == common_pb2.DIRECTORY:
                want = 0 if inode == records.ROOT_INODE else 1
                if n == want or not self._unchanged(inode, nlink):
                    continue  # fine, or removed while this ran
                if n == 0 and self.engine.get(keys.trash_key(inode)) is not None:
                    continue  # a removed tree whose entries are being deleted
                what = "unreachable_inode" if n == 0 else "wrong_link_count"
                yield Finding(what, inode, detail=f"a directory named by {n} entries")
            elif n != nlink and self._unchanged(inode, nlink):  # not linked or removed meanwhile
                if n == 0:
                    yield Finding("unreachable_inode", inode, detail=f"link count {nlink}")
                else:
                    self._links[inode] = (nlink, n)
                    yield Finding(
                        "wrong_link_count",
                        inode,
                        detail=f"link count {nlink}, named by {n} entries",
                    )

    def _unchanged(self, inode: int, nlink: int) -> bool:
        """The inode still exists with the link count read at the start."""
        raw = self.engine.get(keys.inode_key(inode))
        return raw is not None and records.decode_inode(raw).nlink == nlink

    # ------------------------------------------------------------------ pass 2: the chunks

    def _list(
        self, target: TargetView, check: int, mark: bool
    ) -> Iterator[tuple[int, int, int, storage_pb2.ChunkMeta]]:
        page = DEEP_PAGE if check == storage_pb2.CHUNK_CHECK_BLOCKS else LIST_PAGE
        after = None
        with grpcauth.channel(
            target.grpc_address, keys=self.cluster.keys, tls=self.cluster.tls
        ) as channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            while True:
                req = storage_pb2.ListChunksRequest(
                    target_id=target.target_id, limit=page, check=check, mark_damaged=mark
                )
                if after is not None:
                    req.has_after = True
                    req.after_inode, req.after_index = after
                try:
                    resp = stub.ListChunks(req, timeout=LIST_TIMEOUT)
                except grpc.RpcError as exc:
                    raise FsckError(
                        f"target {target.target_id} ({target.grpc_address}) did not list its "
                        f"chunks: {exc.code().name}: {exc.details()}"
                    ) from None
                for chunk in resp.chunks:
                    yield chunk.inode, chunk.index, target.target_id, chunk
                if not resp.more or not resp.chunks:
                    return
                after = (resp.chunks[-1].inode, resp.chunks[-1].index)

    def _check_chunks(self, inodes: _Inodes, deep: bool, repair: bool) -> Iterator[Finding]:
        routing = RoutingView.from_proto(self.cluster.routing())
        self.routing = routing
        serving = [t for t in routing.targets.values() if t.serving]
        self.stats_skipped = {t.target_id for t in routing.targets.values() if not t.serving}
        check = storage_pb2.CHUNK_CHECK_BLOCKS if deep else storage_pb2.CHUNK_CHECK_FILE
        self.check, self.mark = check, repair
        merged = heapq.merge(*(self._list(t, check, repair) for t in serving))
        groups = itertools.groupby(merged, key=lambda item: item[0])
        files = (
            inodes.ids[pos]
            for pos in range(len(inodes.ids))
            if inodes.types[pos] == common_pb2.FILE
        )
        next_file = next(files, None)
        for inode, items in itertools.chain(groups, [(None, iter(()))]):
            while next_file is not None and (inode is None or next_file < inode):
                yield from self._check_file(next_file, {})  # a file no target holds chunks of
                next_file = next(files, None)
            if inode is None:
                return
            chunks: dict[int, dict[int, storage_pb2.ChunkMeta]] = {}
            for _, index, target_id, meta in items:
                chunks.setdefault(index, {})[target_id] = meta
                self.stats["replicas"] += 1
                if deep and meta.version and not meta.problem:
                    self.stats["bytes_verified"] += meta.length
            self.stats["chunks"] += len(chunks)
            if next_file == inode:
                next_file = next(files, None)
                yield from self._check_file(inode, chunks)
            else:
                yield from self._check_orphan(inode, chunks)

    def _check_orphan(self, inode: int, chunks: dict) -> Iterator[Finding]:
        raw = self.engine.get(keys.inode_key(inode))
        if raw is not None and records.decode_inode(raw).type == common_pb2.FILE:
            yield from self._check_file(inode, chunks)  # created while this ran
            return
        if self.engine.get(keys.gc_key(inode)) is not None:
            return  # removed: its GC item is on the way
        # No GC item now: every replica that had to drop the chunks did before now. Those
        # still there are left over (a target's list may predate its collection).
        left = {}
        for t in sorted({t for replicas in chunks.values() for t in replicas}):
            target = self.routing.targets.get(t)
            if target is not None:
                n = sum(1 for m in self._list_inode(target, inode) if m.inode == inode)
                if n:
                    left[t] = n
        if left:
            yield Finding(
                "orphan_chunk",
                inode,
                targets=sorted(left),
                detail=f"{max(left.values())} chunk(s) of inode {inode}, which no file owns",
            )

    def _check_file(self, inode: int, chunks: dict) -> Iterator[Finding]:
        raw = self.engine.get(keys.inode_key(inode))
        if raw is None:
            if chunks:
                yield from self._check_orphan(inode, chunks)
            return
        attr = records.decode_inode(raw)
        if attr.type != common_pb2.FILE:
            return
        self.stats["files"] += 1
        layout, size = attr.layout, attr.size
        if not layout.chunk_size or not layout.chains:
            return
        count = -(-size // layout.chunk_size)
        for index in sorted(set(range(count)) | set(chunks)):
            chain = self.routing.chains.get(chunk_chain(list(layout.chains), index))
            if chain is None:
                continue
            found = self._judge(attr, index, chain.serving, chunks.get(index, {}))
            if found:  # the lists were taken at different times: look again
                found = self._confirm(inode, index, chain.serving)
            yield from found

    def _confirm(self, inode: int, index: int, serving) -> list[Finding]:
        """The findings on a chunk that hold in two looks in a row at the same replicas.

        One look lists the chunk on each replica in turn, so an update passing
        down the chain between two of them shows as a difference; a chunk that
        keeps changing is being written, not damaged, and is left alone.
        """
        before = None
        for _ in range(CONFIRM_LOOKS):
            raw = self.engine.get(keys.inode_key(inode))
            if raw is None:
                return []  # removed meanwhile: its GC item takes the chunks
            now = {t.target_id: m for t in serving if (m := self._list_one(t, inode, index))}
            found = self._judge(records.decode_inode(raw), index, serving, now)
            if not found:
                return []
            seen = {t: (m.version, m.pending_version, m.length, m.checksum) for t, m in now.items()}
            if seen == before:
                return found
            before = seen
            time.sleep(CONFIRM_PAUSE)
        return []

    def _judge(
        self, attr: common_pb2.InodeAttr, index: int, serving, replicas: dict
    ) -> list[Finding]:
        """The findings on chunk ``index`` of the file ``attr`` given what its replicas hold."""
        chunk_size, size = attr.layout.chunk_size, attr.size
        start = index * chunk_size
        need = max(
            0, extents.data_end(extents.holes_of(attr), size, start, start + chunk_size) - start
        )
        allowed = max(0, min(chunk_size, size - start))
        members = [t.target_id for t in serving]
        return list(self._check_chunk(attr.inode, index, need, allowed, members, replicas))

    def _past_end_expected(self, inode: int) -> bool:
        """Bytes past the length wait for their cut, or are a writer's not yet closed."""
        if self.engine.get(keys.cut_key(inode)) is not None:
            return True
        return any(
            keys.is_session_key(k) for k, _ in self.engine.scan_prefix(keys.session_prefix(inode))
        )

    def _list_inode(self, target: TargetView, inode: int) -> list:
        """The chunks of ``inode`` on ``target`` now (up to a page)."""
        req = storage_pb2.ListChunksRequest(
            target_id=target.target_id, inode=inode, limit=LIST_PAGE
        )
        try:
            with grpcauth.channel(
                target.grpc_address, keys=self.cluster.keys, tls=self.cluster.tls
            ) as channel:
                stub = storage_pb2_grpc.StorageServiceStub(channel)
                return list(stub.ListChunks(req, timeout=LIST_TIMEOUT).chunks)
        except grpc.RpcError as exc:
            raise _unanswered(target, inode, exc) from None

    def _list_one(self, target: TargetView, inode: int, index: int):
        """Chunk ``index`` of ``inode`` on ``target`` now, checked as the pass checks (None: absent)."""
        try:
            return list_chunk(
                target,
                inode,
                index,
                check=self.check,
                mark_damaged=self.mark,
                timeout=LIST_TIMEOUT,
                keys=self.cluster.keys,
                tls=self.cluster.tls,
            )
        except grpc.RpcError as exc:
            raise _unanswered(target, inode, exc) from None

    def _check_chunk(
        self,
        inode: int,
        index: int,
        need: int,
        allowed: int,
        members: list[int],
        replicas: dict[int, storage_pb2.ChunkMeta],
    ) -> Iterator[Finding]:
        if any(m.pending_version for m in replicas.values()):
            return  # an update is passing down the chain: not settled
        holders, lacking = [], []
        for t in members:
            m = replicas.get(t)
            if m is not None and m.version and not m.damaged and not m.problem and m.length >= need:
                holders.append(t)
            elif need:
                why = (
                    "no chunk"
                    if m is None or not m.version
                    else "damaged"
                    if m.damaged
                    else m.problem or f"{m.length} bytes, the file needs {need}"
                )
                lacking.append((t, why))
        if lacking and not holders:
            yield Finding(
                "lost_chunk",
                inode,
                index,
                [t for t, _ in lacking],
                "; ".join(f"target {t}: {why}" for t, why in lacking),
            )
            return
        for t, why in lacking:
            yield Finding("missing_replica", inode, index, [t], f"target {t}: {why}")
        alike = {(replicas[t].version, replicas[t].length, replicas[t].checksum) for t in holders}
        if len(alike) > 1:
            first = replicas[holders[0]]
            odd = [
                t
                for t in holders[1:]
                if (replicas[t].version, replicas[t].length, replicas[t].checksum)
                != (first.version, first.length, first.checksum)
            ]
            yield Finding(
                "replicas_disagree",
                inode,
                index,
                odd,
                ", ".join(
                    f"target {t}: v{replicas[t].version} {replicas[t].length} bytes "
                    f"crc {replicas[t].checksum:08x}"
                    for t in holders
                ),
            )
        long = [t for t in members if t in replicas and replicas[t].length > allowed]
        if long and not self._past_end_expected(inode):
            yield Finding(
                "chunk_past_end",
                inode,
                index,
                long,
                f"the file allows {allowed} bytes in this chunk; "
                + ", ".join(f"target {t} holds {replicas[t].length}" for t in long),
            )

    # ------------------------------------------------------------------ repair

    def _repair(self, f: Finding) -> str:
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
            if f.kind == "lost_chunk":
                return "not repaired: no replica holds the data"
            return "not repaired: no entry to attach it to"
        except errors.EmberError as exc:
            return f"not repaired: {exc}"

    def _queue_orphan(self, f: Finding) -> str:
        chains = sorted({self.routing.chain_of(t) for t in f.targets} - {0})

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
        was, named = self._links[f.inode]

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

    def _wait_resyncs(self, started: float) -> None:
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
                    names[child] = (_dentry_parent(key), keys.dentry_name(key))

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
