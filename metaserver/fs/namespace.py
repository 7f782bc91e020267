"""The namespace facade: one method per MetaService call, each one transaction.

:class:`Namespace` owns the metadata store's namespace part (inodes,
directory entries, write sessions, stored request results) and runs every
operation of :mod:`emberfs.metaserver.fs.ops` inside
:func:`~emberfs.metaserver.store.kv.run_transaction`, so the store never holds
half an operation. Mutating requests that carry a client id and request id
are deduplicated (:mod:`emberfs.metaserver.fs.idempotency`).

On first start the root directory (inode 1) is created with mode 0o777,
owned by uid 0, so that any uid can create entries in it; tighten it with
SetAttr. Inode ids come from a ``CONF`` counter and are never reused.

Directory entries are added and removed without writing the parent
directory's inode, so creates in one directory never conflict with each
other: a directory's mtime and ctime change only with its own attributes,
and its nlink stays 2. Emptiness checks use the directory's entry guard
instead (see :mod:`emberfs.metaserver.fs.records`).

The inode counts behind :meth:`Namespace.counts` are kept in memory: one
scan of the inodes at start-up, then adjusted after each commit; on a store
that several metaservers share they are kept in the store instead, with every
operation (:mod:`emberfs.metaserver.fs.inodecounts`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from emberfs.common import layout as layouts
from emberfs.common.errors import EmberError, InvalidArgument, Unavailable
from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.fs import cuts, dirlayout, idempotency, inodecounts, lookup, records
from emberfs.metaserver.fs.leases import Leases
from emberfs.metaserver.fs.opcontext import Credentials, IdAllocator, NamespaceEnv, OpContext
from emberfs.metaserver.fs.ops import (
    create,
    links,
    listing,
    mkdir,
    remove,
    rename,
    sessions,
    setlayout,
    stat,
    statfs,
    truncate,
)
from emberfs.metaserver.fs.ops import setattr as setattr_op
from emberfs.metaserver.kvcache.index import KVIndex
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict, KVEngine, Transaction, run_transaction
from emberfs.proto import common_pb2, meta_pb2

ROOT_MODE = 0o777
DEFAULT_SESSION_TIMEOUT = 300.0
MAX_CUT_WAITS = 4  # runs of one operation that may each find a new chunk cut pending

log = logging.getLogger(__name__)

Op = Callable[[OpContext, Any], Message]


class Namespace:
    """The file system namespace over a :class:`~emberfs.metaserver.store.kv.KVEngine`.

    Parameters
    ----------
    engine : KVEngine
        The metadata store.
    chain_table : callable
        Returns the ids of the chains new files may use (empty while no
        chain exists; creating a file then fails with Unavailable).
    truncate_chunks : callable, optional
        ``truncate_chunks(attr, new_length, request_id)`` cuts a file's
        chunks on storage and raises Unavailable on failure; called once a
        shrinking truncate or an OPEN_TRUNCATE of a non-empty file has
        committed, and for every retry of the cut (:mod:`.cuts`). None (the
        default) skips the storage side, for a namespace without storage.
    usage : callable, optional
        Returns ``(capacity, used)`` bytes of storage, for StatFs. Default ``(0, 0)``.
    default_layout : common_pb2.Layout, optional
        The layout of directories that set none (default: 4 MiB chunks,
        stripe 4, all chains).
    clock : callable, optional
        Wall-clock time in nanoseconds (default ``time.time_ns``): the times
        stored in inodes and records.
    session_timeout : float, optional
        Seconds a write session lives without a renewal before
        :meth:`Namespace.expire_sessions` ends it (default 300), judged on the
        monotonic clock of ``grace`` (see :mod:`emberfs.metaserver.fs.leases`).
    grace : Grace, optional
        The monotonic clock sessions are judged by, and since when the
        metaserver has heard without a break; default one over
        ``time.monotonic`` that notices no stall.
    gc_queued : callable, optional
        ``gc_queued(gc_ids)`` is told the GC items an operation queued, after
        its commit (:meth:`GCQueue.queued
        <emberfs.metaserver.clustermgr.gcqueue.GCQueue.queued>`, so that
        ``FetchGC`` scans need not start at the front of the queue).

    Every method takes a MetaService request message and returns its
    response message, raising :class:`emberfs.common.errors.EmberError`
    subclasses on failure.
    """

    def __init__(
        self,
        engine: KVEngine,
        *,
        chain_table: Callable[[], list[int]],
        truncate_chunks: cuts.TruncateChunks | None = None,
        usage: Callable[[], tuple[int, int]] = lambda: (0, 0),
        default_layout: common_pb2.Layout | None = None,
        clock: Callable[[], int] = time.time_ns,
        session_timeout: float = DEFAULT_SESSION_TIMEOUT,
        gc_queued: Callable[[list[int]], None] = lambda gc_ids: None,
        grace: Grace | None = None,
    ):
        if not session_timeout > 0:
            raise ValueError(f"session timeout {session_timeout} is not positive")
        if default_layout is None:
            default_layout = common_pb2.Layout(
                chunk_size=layouts.DEFAULT_CHUNK_SIZE, stripe=layouts.DEFAULT_STRIPE
            )
        layouts.validate_chunk_size(default_layout.chunk_size)
        if not 1 <= default_layout.stripe <= layouts.MAX_STRIPE:
            raise ValueError(f"stripe {default_layout.stripe} is outside 1..{layouts.MAX_STRIPE}")
        self.engine = engine
        self._clock = clock
        self._gc_queued = gc_queued
        self._usage = usage
        self._grace = grace if grace is not None else Grace()
        self._leases = Leases(self._grace, session_timeout)
        self._env = NamespaceEnv(
            clock=clock,
            chain_table=chain_table,
            truncate_chunks=truncate_chunks,
            default_layout=dirlayout.dir_layout(default_layout),
            inode_ids=IdAllocator(engine, keys.NEXT_INODE, first=records.ROOT_INODE + 1),
            seeds=IdAllocator(engine, keys.NEXT_SEED, first=0),
            session_ids=IdAllocator(engine, keys.NEXT_SESSION, first=1),
            leases=self._leases,
            shared_counts=engine.shared,
            paths=lookup.PathCache() if engine.shared else None,
        )
        self._cuts = None if truncate_chunks is None else cuts.PendingCuts(engine, truncate_chunks)
        # the index of the KV caches whose directories this namespace holds
        self.kvcaches = KVIndex(engine, clock)
        self._counts_lock = threading.Lock()
        self._prune_lock = threading.Lock()
        self._hints = idempotency.PruneHints()
        self._inflight = idempotency.InFlight()
        self._purge_lock = threading.Lock()
        self._purge_queue: list[int] = []
        self._purger: threading.Thread | None = None
        run_transaction(engine, self._make_root)
        self._by_type = {} if engine.shared else self._scan_counts()

    # set-up ---------------------------------------------------------------

    def _make_root(self, txn: Transaction) -> None:
        key = keys.inode_key(records.ROOT_INODE)
        if txn.get(key) is not None:
            return
        now = self._clock()
        root = common_pb2.InodeAttr(
            inode=records.ROOT_INODE,
            type=common_pb2.DIRECTORY,
            mode=ROOT_MODE,
            nlink=2,
            mtime_ns=now,
            ctime_ns=now,
            crtime_ns=now,
        )
        txn.put(key, records.encode_inode(root))
        if self.engine.shared:
            inodecounts.add(txn, 0, {common_pb2.DIRECTORY: 1})

    def _scan_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for _, raw in self.engine.scan_prefix(keys.INODE):
            file_type = records.decode_inode(raw).type
            counts[file_type] = counts.get(file_type, 0) + 1
        return counts

    # running operations -----------------------------------------------------

    def _run(self, fn: Op, req: Any, method: str | None, *, sync: bool = True) -> Message:
        """Run ``fn(op, req)`` in one transaction; ``method`` set: deduplicate by request id.

        ``sync=False`` leaves the WAL sync of the commit to a later ``engine.sync()``.
        """
        ctx = req.ctx
        dedup = method is not None and bool(ctx.client_id) and ctx.request_id != 0
        if not dedup:
            return self._run_cutting(fn, req, None, sync=sync)
        with self._inflight.running((ctx.client_id, ctx.request_id)):
            return self._run_cutting(fn, req, method, sync=sync)

    def _run_cutting(self, fn: Op, req: Any, method: str | None, *, sync: bool) -> Message:
        """:meth:`_run_once`, first finishing the chunk cut a file's growth waits for."""
        for _ in range(MAX_CUT_WAITS):
            try:
                return self._run_once(fn, req, method, sync=sync)
            except cuts.CutPending as pending:
                self._finish_cut(pending.inode)
        raise Unavailable("a file's chunk cut keeps being replaced; retry")

    def _finish_cut(self, inode: int) -> None:
        if self._cuts is not None:
            self._cuts.finish(inode)

    def _run_once(self, fn: Op, req: Any, method: str | None, *, sync: bool) -> Message:
        ctx = req.ctx
        creds = Credentials.from_request(ctx)
        dedup = method is not None
        last: list[OpContext] = []
        replayed = [False]

        def attempt(txn: Transaction) -> Message:
            op = OpContext(txn, creds, self._env, self._clock(), client_id=ctx.client_id)
            last[:] = [op]
            replayed[0] = False
            if self._env.paths is not None:
                self._prefetch(op, req, dedup)
            if dedup:
                prior = idempotency.find(
                    txn, ctx.client_id, ctx.request_id, method, _RESPONSES[method]
                )
                if prior is not None:
                    replayed[0] = True
                    return prior
            response = fn(op, req)
            if dedup:
                idempotency.store(
                    txn, ctx.client_id, ctx.request_id, method, response, op.now, self._hints
                )
            return response

        try:
            response = run_transaction(self.engine, attempt, sync=sync)
        except Conflict:
            raise Unavailable("the namespace is too busy; retry") from None
        finally:
            self._report_gc(last)
        if replayed[0] and sync:
            # The first attempt's batch is visible before its WAL sync ends, and
            # a transaction that only read commits without a sync: answer the
            # retry only once what it reports is durable.
            self.engine.sync()
        if last:
            self._count(last[0])
            if last[0].detached and not replayed[0]:
                self._purge_soon(last[0].detached)
        # Answer a truncation once storage holds its cut (a retry's too, whose
        # first attempt may have stopped waiting for it).
        if replayed[0]:
            attr = getattr(response, "attr", None)
            if attr is not None and attr.type == common_pb2.FILE:
                self._finish_cut(attr.inode)
        elif last:
            for inode in last[0].cuts:
                self._finish_cut(inode)
        return response

    @staticmethod
    def _prefetch(op: OpContext, req: Any, dedup: bool) -> None:
        """Fetch at once what the operation is expected to read (see :mod:`.lookup`)."""
        fields = req.DESCRIPTOR.fields_by_name
        wanted = [getattr(req, f) for f in ("path", "src", "dst") if f in fields]
        extra = []
        if dedup:
            extra = [
                keys.idempotent_key(req.ctx.client_id, req.ctx.request_id),
                inodecounts.shard_key(op.shard),
            ]
        lookup.prefetch_paths(op, [p for p in wanted if p], extra)

    def _run_each(
        self,
        fn: Op,
        method: str,
        ctx: common_pb2.RequestContext,
        items: list[Message],
        put: Callable[[Any, Message], None],
        results,
    ) -> None:
        """Run ``fn`` on each of ``items`` as the call ``method`` would run it, one WAL sync in all.

        Item i runs in a transaction of its own with ``ctx`` and request id
        ``ctx.request_id + i`` (deduplicated as ``method``), so items before
        a failed one stay done and a retried batch replays the ones it did.
        Each adds a result to ``results``: ``put(result, response)`` stores the response,
        or the result's ``errno`` is set. A retryable failure (Unavailable)
        fails the whole call, as it would fail the single call, and the
        client's retry of the same request picks up where it stopped.
        """
        if len(items) > stat.MAX_BATCH:
            raise InvalidArgument(f"more than {stat.MAX_BATCH} items in one batch")
        Credentials.from_request(ctx)  # a malformed context fails the whole call
        base = ctx.request_id
        if base and base + len(items) - 1 > idempotency.MAX_REQUEST_ID:
            raise InvalidArgument("the batch's request ids run past 2**64 - 1")
        try:
            for i, item in enumerate(items):
                item.ctx.CopyFrom(ctx)
                if base:
                    item.ctx.request_id = base + i
                result = results.add()
                try:
                    put(result, self._run(fn, item, method, sync=False))
                except EmberError as exc:
                    if exc.retryable:
                        raise
                    result.errno = exc.errno
        finally:
            self.engine.sync()

    def _report_gc(self, last: list[OpContext]) -> None:
        """Hand the GC items the last attempt queued to ``gc_queued``.

        Called once the commit is over, whatever its outcome: reporting an
        item that was not committed costs a scan a few more keys, while an
        unreported one would be skipped by ``FetchGC`` until the next sweep.
        """
        if last and last[0].gc_queued:
            self._gc_queued(list(last[0].gc_queued))

    def _count(self, op: OpContext) -> None:
        """Apply the inode count changes of a committed operation (memory counts only)."""
        if op.delta and not self.engine.shared:
            with self._counts_lock:
                for file_type, n in op.delta.items():
                    self._by_type[file_type] = self._by_type.get(file_type, 0) + n

    def prune_retry_records(self, *, slice_records: int = 10000) -> int:
        """Delete the retry records older than ``idempotency.MAX_AGE_NS``; the records seen.

        Goes through the whole table in slices of ``slice_records``, each
        deleted in its own batch. The metaserver calls it from its background
        loop, off the request path (a slice over a table that per-client
        pruning has filled with tombstones takes tens of milliseconds).
        """
        with self._prune_lock:
            now = self._clock()
            cursor = None
            seen = 0
            while True:
                cursor, n = idempotency.prune_expired(
                    self.engine, now, start=cursor, limit=slice_records
                )
                seen += n
                if cursor is None:
                    return seen

    # detached trees -----------------------------------------------------------

    def _purge_soon(self, inodes: list[int]) -> None:
        """Delete detached trees in the background, starting now."""
        with self._purge_lock:
            self._purge_queue.extend(inodes)
            if self._purger is None or not self._purger.is_alive():
                self._purger = threading.Thread(
                    target=self._purge_queued, name="purge-detached", daemon=True
                )
                self._purger.start()

    def _purge_queued(self) -> None:
        while True:
            with self._purge_lock:
                if not self._purge_queue:
                    self._purger = None
                    return
                top = self._purge_queue.pop(0)
            try:
                self.purge_tree(top)
            except Exception as exc:  # the sweep takes it up again
                log.warning("deleting detached tree %d stopped: %s", top, exc)

    def purge_tree(self, top: int) -> int:
        """Delete the detached tree under directory ``top`` slice by slice; the slices committed."""
        slices = 0
        last: list[OpContext] = []

        def attempt(txn: Transaction) -> bool:
            op = OpContext(txn, Credentials(0, 0, frozenset()), self._env, self._clock())
            last[:] = [op]
            return remove.purge_slice(op, top)

        while True:
            last.clear()
            try:
                done = run_transaction(self.engine, attempt)
            finally:
                self._report_gc(last)
            slices += 1
            if last:
                self._count(last[0])
            if done:
                return slices

    def purge_detached(self) -> int:
        """Finish every detached tree left in the store (the sweep); the trees finished."""
        tops = [keys.trash_inode(k) for k, _ in self.engine.scan_prefix(keys.TRASH)]
        for top in tops:
            self.purge_tree(top)
        return len(tops)

    def detached(self) -> int:
        """How many detached trees wait to be deleted."""
        return self.engine.count_prefix(keys.TRASH)

    # read-only calls --------------------------------------------------------

    def stat(self, req: meta_pb2.StatRequest) -> meta_pb2.StatResponse:
        """Attributes of a path or inode id."""
        return self._run(stat.stat, req, None)

    def batch_stat(self, req: meta_pb2.BatchStatRequest) -> meta_pb2.BatchStatResponse:
        """Attributes of many paths, with an errno per failed path."""
        return self._run(stat.batch_stat, req, None)

    def list(self, req: meta_pb2.ListRequest) -> meta_pb2.ListResponse:
        """A page of a directory's entries with their attributes."""
        return self._run(listing.list_dir, req, None)

    def readlink(self, req: meta_pb2.ReadlinkRequest) -> meta_pb2.ReadlinkResponse:
        """The target of a symlink."""
        return self._run(links.readlink, req, None)

    def statfs(self, req: meta_pb2.StatFsRequest) -> meta_pb2.StatFsResponse:
        """Storage capacity and usage, and inode counts."""
        Credentials.from_request(req.ctx)
        return statfs.statfs(self._usage(), self.counts())

    # mutating calls ---------------------------------------------------------

    def mkdir(self, req: meta_pb2.MkdirRequest) -> meta_pb2.MkdirResponse:
        """Make a directory (with ``parents``, the missing path)."""
        return self._run(mkdir.mkdir, req, "Mkdir")

    def create(self, req: meta_pb2.CreateRequest) -> meta_pb2.CreateResponse:
        """Create a regular file."""
        return self._run(create.create, req, "Create")

    def batch_create(self, req: meta_pb2.BatchCreateRequest) -> meta_pb2.BatchCreateResponse:
        """Create many files, each a ``Create`` of its own; one WAL sync."""
        out = meta_pb2.BatchCreateResponse()
        items = [
            meta_pb2.CreateRequest(path=c.path, mode=c.mode, exclusive=c.exclusive)
            for c in req.items
        ]
        self._run_each(
            create.create,
            "Create",
            req.ctx,
            items,
            lambda result, resp: result.attr.CopyFrom(resp.attr),
            out.results,
        )
        return out

    def open(self, req: meta_pb2.OpenRequest) -> meta_pb2.OpenResponse:
        """Open a file; write opens start a write session."""
        method = "Open" if sessions.is_mutating_open(req.flags) else None
        return self._run(sessions.open_file, req, method)

    def batch_open(self, req: meta_pb2.BatchOpenRequest) -> meta_pb2.BatchOpenResponse:
        """Read-only opens of many paths, with an errno per failed path."""
        return self._run(sessions.batch_open, req, None)

    def batch_write_open(
        self, req: meta_pb2.BatchWriteOpenRequest
    ) -> meta_pb2.BatchWriteOpenResponse:
        """Write opens of many paths, each an ``Open`` of its own; one WAL sync."""
        sessions.check_flags(req.flags)
        if not sessions.is_write_open(req.flags):
            raise InvalidArgument("BatchWriteOpen needs OPEN_WRITE (read-only opens: BatchOpen)")
        out = meta_pb2.BatchWriteOpenResponse()
        items = [meta_pb2.OpenRequest(path=p, flags=req.flags, mode=req.mode) for p in req.paths]
        self._run_each(
            sessions.open_file,
            "Open",
            req.ctx,
            items,
            lambda result, resp: result.opened.CopyFrom(resp),
            out.results,
        )
        return out

    def sync(self, req: meta_pb2.SyncRequest) -> meta_pb2.SyncResponse:
        """Set the exact length of a file open for write."""
        return self._run(sessions.sync, req, "Sync")

    def close(self, req: meta_pb2.CloseRequest) -> meta_pb2.CloseResponse:
        """End a write session."""
        return self._run(sessions.close, req, "Close")

    def batch_close(self, req: meta_pb2.BatchCloseRequest) -> meta_pb2.BatchCloseResponse:
        """End many write sessions, each a ``Close`` of its own; one WAL sync."""
        out = meta_pb2.BatchCloseResponse()
        items = [
            meta_pb2.CloseRequest(
                inode=c.inode, session_id=c.session_id, length=c.length, wrote=c.wrote
            )
            for c in req.items
        ]
        self._run_each(
            sessions.close,
            "Close",
            req.ctx,
            items,
            lambda result, resp: result.attr.CopyFrom(resp.attr),
            out.results,
        )
        return out

    def authorize(self, req: meta_pb2.AuthorizeRequest) -> common_pb2.InodeAttr:
        """The file a chunk capability is asked for, once the caller may have it."""
        return self._run(sessions.authorize, req, None)

    def renew_sessions(self, req: meta_pb2.RenewSessionsRequest) -> meta_pb2.RenewSessionsResponse:
        """Renew write-session leases; the response lists sessions that are gone.

        Not deduplicated: renewing twice is harmless.
        """
        return self._run(sessions.renew, req, None)

    def expire_sessions(self) -> list[records.Session]:
        """End the write sessions not renewed within the session timeout.

        A judging round of the grace (:meth:`Grace.check`: after a stall of
        the metaserver every session is judged from now). Each session ends
        in a transaction of its own, like a Close without a length
        (:func:`emberfs.metaserver.fs.ops.sessions.expire`). Returns the ended
        sessions.
        """
        now = self._grace.check()
        stored = sessions.stored(self.engine)
        self._leases.retain((s.inode, s.session_id) for s in stored)
        ended = []
        for candidate in stored:
            silence = self._leases.silence(
                candidate.inode, candidate.session_id, now, candidate.renewed_ns
            )
            if silence < self._leases.timeout:
                continue
            session = self._expire_one(candidate)
            if session is None:
                continue
            ended.append(session)
            log.warning(
                "write session %d of inode %d (client %r) expired: not renewed for %.1f s",
                session.session_id,
                session.inode,
                session.client_id,
                silence,
            )
        return ended

    def _expire_one(self, candidate: records.Session) -> records.Session | None:
        last: list[OpContext] = []

        def lapsed(session: records.Session) -> bool:
            return self._leases.lapsed(session.inode, session.session_id, session.renewed_ns)

        def attempt(txn: Transaction) -> records.Session | None:
            op = OpContext(txn, Credentials(0, 0, frozenset()), self._env, self._clock())
            last[:] = [op]
            return sessions.expire(op, candidate.inode, candidate.session_id, lapsed)

        try:
            session = run_transaction(self.engine, attempt)
        except Conflict:
            log.warning(
                "session %d of inode %d: expiry conflicted; retrying later",
                candidate.session_id,
                candidate.inode,
            )
            return None
        finally:
            self._report_gc(last)
        if session is not None and last:
            self._count(last[0])
        return session

    def remove(self, req: meta_pb2.RemoveRequest) -> meta_pb2.RemoveResponse:
        """Remove a file, symlink, directory or (``recursive``) tree."""
        return self._run(remove.remove, req, "Remove")

    def batch_remove(self, req: meta_pb2.BatchRemoveRequest) -> meta_pb2.BatchRemoveResponse:
        """Remove many paths, each a ``Remove`` of its own (in the given order); one WAL sync."""
        out = meta_pb2.BatchRemoveResponse()
        if req.inodes and len(req.inodes) != len(req.paths):
            raise InvalidArgument("BatchRemove takes no inodes or one per path")
        inodes = req.inodes or [0] * len(req.paths)
        items = [
            meta_pb2.RemoveRequest(path=p, recursive=req.recursive, inode=i)
            for p, i in zip(req.paths, inodes, strict=True)
        ]
        self._run_each(
            remove.remove,
            "Remove",
            req.ctx,
            items,
            lambda result, resp: setattr(result, "removed", resp.removed),
            out.results,
        )
        return out

    def rename(self, req: meta_pb2.RenameRequest) -> meta_pb2.RenameResponse:
        """Move an entry atomically."""
        return self._run(rename.rename, req, "Rename")

    def symlink(self, req: meta_pb2.SymlinkRequest) -> meta_pb2.SymlinkResponse:
        """Make a symlink."""
        return self._run(links.symlink, req, "Symlink")

    def hardlink(self, req: meta_pb2.HardlinkRequest) -> meta_pb2.HardlinkResponse:
        """Add another entry for a file."""
        return self._run(links.hardlink, req, "Hardlink")

    def truncate(self, req: meta_pb2.TruncateRequest) -> meta_pb2.TruncateResponse:
        """Set a file's length."""
        return self._run(truncate.truncate, req, "Truncate")

    def setattr(self, req: meta_pb2.SetAttrRequest) -> meta_pb2.SetAttrResponse:
        """Change mode, owner, group or mtime."""
        return self._run(setattr_op.setattr_, req, "SetAttr")

    def set_layout(self, req: meta_pb2.SetLayoutRequest) -> meta_pb2.SetLayoutResponse:
        """Set the layout of a directory."""
        return self._run(setlayout.set_layout, req, "SetLayout")

    # state for StatFs and the admin API -------------------------------------

    @property
    def cuts(self) -> cuts.PendingCuts | None:
        """The pending chunk cuts (None without storage)."""
        return self._cuts

    def counts(self) -> dict[str, int]:
        """Inode counts (``inodes``, ``files``, ``directories``, ``symlinks``), open write
        ``sessions``, and ``pending_cuts`` (files whose chunk cut storage may not hold yet)."""
        if self.engine.shared:
            by_type = inodecounts.totals(self.engine)
        else:
            with self._counts_lock:
                by_type = dict(self._by_type)
        return {
            "inodes": sum(by_type.values()),
            "files": by_type.get(common_pb2.FILE, 0),
            "directories": by_type.get(common_pb2.DIRECTORY, 0),
            "symlinks": by_type.get(common_pb2.SYMLINK, 0),
            "sessions": sum(
                1 for key, _ in self.engine.scan_prefix(keys.SESSION) if keys.is_session_key(key)
            ),
            "pending_cuts": self.engine.count_prefix(keys.CUT),
        }

    def sessions(self) -> list[dict[str, Any]]:
        """Open write sessions: ``inode``, ``session_id``, ``client_id``, and wall-clock
        nanoseconds ``since`` (opened), ``renewed`` (last lease renewal as stored)
        and ``expires`` (when the session ends unless renewed: the session timeout
        after the last renewal this metaserver saw, or after its start or last
        stall when later)."""
        wall = self._clock()
        now = self._grace.clock()
        out = []
        for s in sessions.stored(self.engine):
            left = self._leases.timeout - self._leases.silence(
                s.inode, s.session_id, now, s.renewed_ns
            )
            out.append(
                {
                    "inode": s.inode,
                    "session_id": s.session_id,
                    "client_id": s.client_id,
                    "since": s.since_ns,
                    "renewed": s.renewed_ns,
                    "expires": wall + int(left * 1e9),
                }
            )
        return out


_RESPONSES: dict[str, type[Message]] = {
    "Mkdir": meta_pb2.MkdirResponse,
    "Create": meta_pb2.CreateResponse,
    "Open": meta_pb2.OpenResponse,
    "Sync": meta_pb2.SyncResponse,
    "Close": meta_pb2.CloseResponse,
    "Remove": meta_pb2.RemoveResponse,
    "Rename": meta_pb2.RenameResponse,
    "Symlink": meta_pb2.SymlinkResponse,
    "Hardlink": meta_pb2.HardlinkResponse,
    "Truncate": meta_pb2.TruncateResponse,
    "SetAttr": meta_pb2.SetAttrResponse,
    "SetLayout": meta_pb2.SetLayoutResponse,
}
