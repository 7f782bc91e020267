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

from emberfs.common import layout as layouts
from emberfs.common.errors import InvalidArgument
from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.fs import (
    cuts,
    dirlayout,
    idempotency,
    inodecounts,
    lookup,
    quota,
    records,
)
from emberfs.metaserver.fs.leases import Leases
from emberfs.metaserver.fs.locking import DEFAULT_LEASE_TIMEOUT, Locking
from emberfs.metaserver.fs.opcontext import Credentials, IdAllocator, NamespaceEnv, OpContext
from emberfs.metaserver.fs.oprunner import OpRunner
from emberfs.metaserver.fs.ops import (
    create,
    links,
    listing,
    mkdir,
    quotas,
    remove,
    rename,
    sessions,
    setlayout,
    stat,
    statfs,
    trash,
    truncate,
    xattrs,
)
from emberfs.metaserver.fs.ops import setattr as setattr_op
from emberfs.metaserver.kvcache.index import KVIndex
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict, KVEngine, Transaction, run_transaction
from emberfs.proto import common_pb2, meta_pb2

ROOT_MODE = 0o777
DEFAULT_SESSION_TIMEOUT = 300.0

log = logging.getLogger(__name__)


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
    trash_days : float, optional
        Days a removed entry stays in the trash before the sweep
        (:meth:`Namespace.expire_trash`) purges it; 0 (the default) keeps no
        trash: removal deletes (:mod:`emberfs.metaserver.fs.ops.trash`).
    lock_lease_timeout : float, optional
        Seconds a client's lock lease lives without a renewal (default 15);
        its locks go with it (:attr:`Namespace.locks`,
        :mod:`emberfs.metaserver.fs.locking`).

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
        trash_days: float = 0.0,
        lock_lease_timeout: float = DEFAULT_LEASE_TIMEOUT,
    ):
        if not session_timeout > 0:
            raise ValueError(f"session timeout {session_timeout} is not positive")
        if not trash_days >= 0:
            raise ValueError(f"trash days {trash_days} is negative")
        if default_layout is None:
            default_layout = common_pb2.Layout(
                chunk_size=layouts.DEFAULT_CHUNK_SIZE, stripe=layouts.DEFAULT_STRIPE
            )
        layouts.validate_chunk_size(default_layout.chunk_size)
        if not 1 <= default_layout.stripe <= layouts.MAX_STRIPE:
            raise ValueError(f"stripe {default_layout.stripe} is outside 1..{layouts.MAX_STRIPE}")
        self.engine = engine
        self.clock = clock
        self._usage = usage
        self._grace = grace if grace is not None else Grace()
        self.leases = Leases(self._grace, session_timeout)
        self.env = NamespaceEnv(
            clock=clock,
            chain_table=chain_table,
            truncate_chunks=truncate_chunks,
            default_layout=dirlayout.dir_layout(default_layout),
            inode_ids=IdAllocator(engine, keys.NEXT_INODE, first=records.ROOT_INODE + 1),
            seeds=IdAllocator(engine, keys.NEXT_SEED, first=0),
            session_ids=IdAllocator(engine, keys.NEXT_SESSION, first=1),
            leases=self.leases,
            shared_counts=engine.shared,
            paths=lookup.PathCache() if engine.shared else None,
            trash_days=trash_days,
            quota_cache=None if engine.shared else quota.UsageCache(),
        )
        self._cuts = None if truncate_chunks is None else cuts.PendingCuts(engine, truncate_chunks)
        # the index of the KV caches whose directories this namespace holds
        self.kvcaches = KVIndex(engine, clock)
        self._prune_lock = threading.Lock()
        run_transaction(engine, self._make_root)
        self.runner = OpRunner(
            engine,
            self.env,
            clock,
            gc_queued=gc_queued,
            pending_cuts=self._cuts,
            by_type={} if engine.shared else self._scan_counts(),
        )
        # POSIX locks and their leases
        self.locks = Locking(engine, self.runner, self._grace, lock_lease_timeout, clock)

    # set-up ---------------------------------------------------------------

    def _make_root(self, txn: Transaction) -> None:
        key = keys.inode_key(records.ROOT_INODE)
        if txn.get(key) is not None:
            return
        now = self.clock()
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

    def prune_retry_records(self, *, slice_records: int = 10000) -> int:
        """Delete the retry records older than ``idempotency.MAX_AGE_NS``; the records seen.

        Goes through the whole table in slices of ``slice_records``, each
        deleted in its own batch. The metaserver calls it from its background
        loop, off the request path (a slice over a table that per-client
        pruning has filled with tombstones takes tens of milliseconds).
        """
        with self._prune_lock:
            now = self.clock()
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

    def purge_tree(self, top: int) -> int:
        """Delete the detached tree under directory ``top`` slice by slice; the slices committed."""
        return self.runner.purge_tree(top)

    def purge_detached(self) -> int:
        """Finish every detached tree left in the store (the sweep); the trees finished."""
        return self.runner.purge_detached()

    def detached(self) -> int:
        """How many detached trees wait to be deleted."""
        return self.runner.detached()

    # the trash -------------------------------------------------------------

    def trash_list(self, req: meta_pb2.TrashListRequest) -> meta_pb2.TrashListResponse:
        """The caller's trash entries (root: another user's, or all)."""
        return self.runner.run(trash.list_entries, req, None)

    def trash_restore(self, req: meta_pb2.TrashRestoreRequest) -> meta_pb2.TrashRestoreResponse:
        """Put trash entries back, all or none."""
        return self.runner.run(trash.restore, req, "TrashRestore")

    def trash_purge(self, req: meta_pb2.TrashPurgeRequest) -> meta_pb2.TrashPurgeResponse:
        """Delete trash entries for real."""
        return self.runner.run(trash.purge, req, "TrashPurge")

    def expire_trash(self) -> int:
        """Purge the trash entries older than the trash days (the sweep), a transaction per
        slice; the entries purged."""
        purged = 0
        while True:
            done = self.runner.run_as_root(trash.expired)
            purged += len(done)
            if not done:
                return purged

    # directory quotas --------------------------------------------------------

    def quota_set(self, req: meta_pb2.QuotaSetRequest) -> meta_pb2.QuotaSetResponse:
        """Set or change a directory's quota (root only)."""
        return self.runner.run(quotas.set_quota, req, "QuotaSet")

    def quota_get(self, req: meta_pb2.QuotaGetRequest) -> meta_pb2.QuotaInfo:
        """A directory's quota and usage."""
        return self.runner.run(quotas.get_quota, req, None)

    def quota_list(self, req: meta_pb2.QuotaListRequest) -> meta_pb2.QuotaListResponse:
        """Every quota and its usage."""
        return self.runner.run(quotas.list_quotas, req, None)

    def quota_remove(self, req: meta_pb2.QuotaRemoveRequest) -> meta_pb2.QuotaRemoveResponse:
        """Remove a directory's quota (root only)."""
        return self.runner.run(quotas.remove_quota, req, "QuotaRemove")

    def quota_reserve(self, req: meta_pb2.QuotaReserveRequest) -> meta_pb2.QuotaReserveResponse:
        """Reserve room in a file's quotas for its writer, without waiting for the WAL sync
        (:func:`~emberfs.metaserver.fs.ops.quotas.reserve` says why that is safe)."""
        return self.runner.run(quotas.reserve, req, "QuotaReserve", sync=False)

    # read-only calls --------------------------------------------------------

    def stat(self, req: meta_pb2.StatRequest) -> meta_pb2.StatResponse:
        """Attributes of a path or inode id."""
        return self.runner.run(stat.stat, req, None)

    def batch_stat(self, req: meta_pb2.BatchStatRequest) -> meta_pb2.BatchStatResponse:
        """Attributes of many paths, with an errno per failed path."""
        return self.runner.run(stat.batch_stat, req, None)

    def list(self, req: meta_pb2.ListRequest) -> meta_pb2.ListResponse:
        """A page of a directory's entries with their attributes."""
        return self.runner.run(listing.list_dir, req, None)

    def readlink(self, req: meta_pb2.ReadlinkRequest) -> meta_pb2.ReadlinkResponse:
        """The target of a symlink."""
        return self.runner.run(links.readlink, req, None)

    def get_xattr(self, req: meta_pb2.GetXattrRequest) -> meta_pb2.GetXattrResponse:
        """The value of an extended attribute."""
        return self.runner.run(xattrs.get_xattr, req, None)

    def list_xattr(self, req: meta_pb2.ListXattrRequest) -> meta_pb2.ListXattrResponse:
        """The names of an inode's extended attributes."""
        return self.runner.run(xattrs.list_xattr, req, None)

    def statfs(self, req: meta_pb2.StatFsRequest) -> meta_pb2.StatFsResponse:
        """Storage capacity and usage, and inode counts."""
        Credentials.from_request(req.ctx)
        out = statfs.statfs(self._usage(), self.counts())
        if req.path:
            found = self.runner.run(lambda op, r: quotas.statfs_quota(op, r.path), req, None)
            if found is not None:
                statfs.limited(out, *found)
        return out

    # mutating calls ---------------------------------------------------------

    def mkdir(self, req: meta_pb2.MkdirRequest) -> meta_pb2.MkdirResponse:
        """Make a directory (with ``parents``, the missing path)."""
        return self.runner.run(mkdir.mkdir, req, "Mkdir")

    def create(self, req: meta_pb2.CreateRequest) -> meta_pb2.CreateResponse:
        """Create a regular file."""
        return self.runner.run(create.create, req, "Create")

    def batch_create(self, req: meta_pb2.BatchCreateRequest) -> meta_pb2.BatchCreateResponse:
        """Create many files, each a ``Create`` of its own; one WAL sync."""
        out = meta_pb2.BatchCreateResponse()
        items = [
            meta_pb2.CreateRequest(path=c.path, mode=c.mode, exclusive=c.exclusive)
            for c in req.items
        ]
        self.runner.run_each(
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
        return self.runner.run(sessions.open_file, req, method)

    def batch_open(self, req: meta_pb2.BatchOpenRequest) -> meta_pb2.BatchOpenResponse:
        """Read-only opens of many paths, with an errno per failed path."""
        return self.runner.run(sessions.batch_open, req, None)

    def batch_write_open(
        self, req: meta_pb2.BatchWriteOpenRequest
    ) -> meta_pb2.BatchWriteOpenResponse:
        """Write opens of many paths, each an ``Open`` of its own; one WAL sync."""
        sessions.check_flags(req.flags)
        if not sessions.is_write_open(req.flags):
            raise InvalidArgument("BatchWriteOpen needs OPEN_WRITE (read-only opens: BatchOpen)")
        out = meta_pb2.BatchWriteOpenResponse()
        if req.reserve and len(req.reserve) != len(req.paths):
            raise InvalidArgument("BatchWriteOpen: reserve needs one length per path")
        items = [meta_pb2.OpenRequest(path=p, flags=req.flags, mode=req.mode) for p in req.paths]
        for item, length in zip(items, req.reserve, strict=False):
            item.reserve = length
        self.runner.run_each(
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
        return self.runner.run(sessions.sync, req, "Sync")

    def close(self, req: meta_pb2.CloseRequest) -> meta_pb2.CloseResponse:
        """End a write session."""
        return self.runner.run(sessions.close, req, "Close")

    def batch_close(self, req: meta_pb2.BatchCloseRequest) -> meta_pb2.BatchCloseResponse:
        """End many write sessions, each a ``Close`` of its own; one WAL sync."""
        out = meta_pb2.BatchCloseResponse()
        items = [
            meta_pb2.CloseRequest(
                inode=c.inode, session_id=c.session_id, length=c.length, wrote=c.wrote
            )
            for c in req.items
        ]
        self.runner.run_each(
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
        return self.runner.run(sessions.authorize, req, None)

    def renew_sessions(self, req: meta_pb2.RenewSessionsRequest) -> meta_pb2.RenewSessionsResponse:
        """Renew write-session leases; the response lists sessions that are gone.

        Not deduplicated: renewing twice is harmless.
        """
        return self.runner.run(sessions.renew, req, None)

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
        self.leases.retain((s.inode, s.session_id) for s in stored)
        ended = []
        for candidate in stored:
            silence = self.leases.silence(
                candidate.inode, candidate.session_id, now, candidate.renewed_ns
            )
            if silence < self.leases.timeout:
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
            return self.leases.lapsed(session.inode, session.session_id, session.renewed_ns)

        def attempt(txn: Transaction) -> records.Session | None:
            op = OpContext(txn, Credentials(0, 0, frozenset()), self.env, self.clock())
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
            self.runner.report_gc(last)
        if session is not None and last:
            self.runner.count(last[0])
        return session

    def remove(self, req: meta_pb2.RemoveRequest) -> meta_pb2.RemoveResponse:
        """Remove a file, symlink, directory or (``recursive``) tree."""
        return self.runner.run(remove.remove, req, "Remove")

    def batch_remove(self, req: meta_pb2.BatchRemoveRequest) -> meta_pb2.BatchRemoveResponse:
        """Remove many paths, each a ``Remove`` of its own (in the given order); one WAL sync."""
        out = meta_pb2.BatchRemoveResponse()
        if req.inodes and len(req.inodes) != len(req.paths):
            raise InvalidArgument("BatchRemove takes no inodes or one per path")
        inodes = req.inodes or [0] * len(req.paths)
        items = [
            meta_pb2.RemoveRequest(
                path=p, recursive=req.recursive, inode=i, skip_trash=req.skip_trash
            )
            for p, i in zip(req.paths, inodes, strict=True)
        ]
        self.runner.run_each(
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
        return self.runner.run(rename.rename, req, "Rename")

    def symlink(self, req: meta_pb2.SymlinkRequest) -> meta_pb2.SymlinkResponse:
        """Make a symlink."""
        return self.runner.run(links.symlink, req, "Symlink")

    def hardlink(self, req: meta_pb2.HardlinkRequest) -> meta_pb2.HardlinkResponse:
        """Add another entry for a file."""
        return self.runner.run(links.hardlink, req, "Hardlink")

    def truncate(self, req: meta_pb2.TruncateRequest) -> meta_pb2.TruncateResponse:
        """Set a file's length."""
        return self.runner.run(truncate.truncate, req, "Truncate")

    def setattr(self, req: meta_pb2.SetAttrRequest) -> meta_pb2.SetAttrResponse:
        """Change mode, owner, group or mtime."""
        return self.runner.run(setattr_op.setattr_, req, "SetAttr")

    def set_xattr(self, req: meta_pb2.SetXattrRequest) -> meta_pb2.SetXattrResponse:
        """Set an extended attribute."""
        return self.runner.run(xattrs.set_xattr, req, "SetXattr")

    def remove_xattr(self, req: meta_pb2.RemoveXattrRequest) -> meta_pb2.RemoveXattrResponse:
        """Remove an extended attribute."""
        return self.runner.run(xattrs.remove_xattr, req, "RemoveXattr")

    def set_layout(self, req: meta_pb2.SetLayoutRequest) -> meta_pb2.SetLayoutResponse:
        """Set the layout of a directory."""
        return self.runner.run(setlayout.set_layout, req, "SetLayout")

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
            by_type = self.runner.counts_by_type()
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
        wall = self.clock()
        now = self._grace.clock()
        out = []
        for s in sessions.stored(self.engine):
            left = self.leases.timeout - self.leases.silence(
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
