"""Running namespace operations: each one transaction, deduplicated by request id, with what
follows its commit (inode counts, queued GC items, chunk cuts, detached trees).

:class:`OpRunner` runs an operation of :mod:`emberfs.metaserver.fs.ops` inside
:func:`~emberfs.metaserver.store.kv.run_transaction`, so the store never holds half an operation.
A mutating request that carries a client id and request id runs once: a retry is answered with
the stored result (:mod:`emberfs.metaserver.fs.idempotency`). A batch runs its items each in a
transaction of its own, with one WAL sync in all. Trees a recursive remove detached are deleted
in the background, slice by slice.
"""

import logging
import threading
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from emberfs.common.errors import EmberError, InvalidArgument, Unavailable
from emberfs.metaserver.fs import cuts, idempotency, inodecounts, lookup
from emberfs.metaserver.fs.opcontext import Credentials, NamespaceEnv, OpContext
from emberfs.metaserver.fs.ops import (
    remove,
    stat,
)
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict, KVEngine, Transaction, run_transaction
from emberfs.proto import common_pb2, meta_pb2

MAX_CUT_WAITS = 4  # runs of one operation that may each find a new chunk cut pending

log = logging.getLogger(__name__)

Op = Callable[[OpContext, Any], Message]


class OpRunner:
    """Runs operations on ``engine`` with ``env``; ``clock`` gives wall-clock nanoseconds.

    ``gc_queued(gc_ids)`` is told the GC items an operation queued; ``pending_cuts`` finishes
    the chunk cuts a truncation left (None: no storage); ``by_type`` are the inode counts kept
    in memory (not on a shared store), adjusted after each commit.
    """

    def __init__(
        self,
        engine: KVEngine,
        env: NamespaceEnv,
        clock: Callable[[], int],
        *,
        gc_queued: Callable[[list[int]], None],
        pending_cuts: cuts.PendingCuts | None,
        by_type: dict[int, int],
    ) -> None:
        self.engine = engine
        self.env = env
        self.clock = clock
        self.gc_queued = gc_queued
        self.pending_cuts = pending_cuts
        self.by_type = by_type
        self.hints = idempotency.PruneHints()
        self._inflight = idempotency.InFlight()
        self._counts_lock = threading.Lock()
        self._purge_lock = threading.Lock()
        self._purge_queue: list[int] = []
        self._purger: threading.Thread | None = None

    def run(self, fn: Op, req: Any, method: str | None, *, sync: bool = True) -> Message:
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
                self.finish_cut(pending.inode)
        raise Unavailable("a file's chunk cut keeps being replaced; retry")

    def finish_cut(self, inode: int) -> None:
        if self.pending_cuts is not None:
            self.pending_cuts.finish(inode)

    def _run_once(self, fn: Op, req: Any, method: str | None, *, sync: bool) -> Message:
        ctx = req.ctx
        creds = Credentials.from_request(ctx)
        dedup = method is not None
        last: list[OpContext] = []
        replayed = [False]

        def attempt(txn: Transaction) -> Message:
            op = OpContext(txn, creds, self.env, self.clock(), client_id=ctx.client_id)
            last[:] = [op]
            replayed[0] = False
            if self.env.paths is not None:
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
                    txn, ctx.client_id, ctx.request_id, method, response, op.now, self.hints
                )
            return response

        try:
            response = run_transaction(self.engine, attempt, sync=sync)
        except Conflict:
            raise Unavailable("the namespace is too busy; retry") from None
        finally:
            self.report_gc(last)
        if replayed[0] and sync:
            # The first attempt's batch is visible before its WAL sync ends, and
            # a transaction that only read commits without a sync: answer the
            # retry only once what it reports is durable.
            self.engine.sync()
        if last:
            self.count(last[0])
            if last[0].detached and not replayed[0]:
                self.purge_soon(last[0].detached)
        # Answer a truncation once storage holds its cut (a retry's too, whose
        # first attempt may have stopped waiting for it).
        if replayed[0]:
            attr = getattr(response, "attr", None)
            if attr is not None and attr.type == common_pb2.FILE:
                self.finish_cut(attr.inode)
        elif last:
            for inode in last[0].cuts:
                self.finish_cut(inode)
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
        if req.DESCRIPTOR.name in _XATTR_REQUESTS or getattr(req, "xattrs", False):
            inode = getattr(req, "inode", 0) or lookup.predicted_inode(op, req.path)
            if inode:  # the inode's extended attributes, with the walk
                extra.append(keys.xattr_key(inode))
        lookup.prefetch_paths(op, [p for p in wanted if p], extra)

    def run_each(
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
                    put(result, self.run(fn, item, method, sync=False))
                except EmberError as exc:
                    if exc.retryable:
                        raise
                    result.errno = exc.errno
        finally:
            self.engine.sync()

    def report_gc(self, last: list[OpContext]) -> None:
        """Hand the GC items the last attempt queued to ``gc_queued``.

        Called once the commit is over, whatever its outcome: reporting an
        item that was not committed costs a scan a few more keys, while an
        unreported one would be skipped by ``FetchGC`` until the next sweep.
        """
        if last and last[0].gc_queued:
            self.gc_queued(list(last[0].gc_queued))

    def count(self, op: OpContext) -> None:
        """Apply the inode count and quota usage changes of a committed operation (memory
        counts only)."""
        if op.quota_added and self.env.quota_cache is not None:
            self.env.quota_cache.applied(op.quota_added)
        if op.delta and not self.engine.shared:
            with self._counts_lock:
                for file_type, n in op.delta.items():
                    self.by_type[file_type] = self.by_type.get(file_type, 0) + n

    # detached trees -----------------------------------------------------------

    def purge_soon(self, inodes: list[int]) -> None:
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
            op = OpContext(txn, Credentials(0, 0, frozenset()), self.env, self.clock())
            last[:] = [op]
            return remove.purge_slice(op, top)

        while True:
            last.clear()
            try:
                done = run_transaction(self.engine, attempt)
            finally:
                self.report_gc(last)
            slices += 1
            if last:
                self.count(last[0])
            if done:
                return slices

    def run_as_root(self, fn: Callable[[OpContext], Any]) -> Any:
        """Run ``fn(op)`` as uid 0 in one transaction, with what follows a commit."""
        last: list[OpContext] = []

        def attempt(txn: Transaction) -> Any:
            op = OpContext(txn, Credentials(0, 0, frozenset()), self.env, self.clock())
            last[:] = [op]
            return fn(op)

        try:
            result = run_transaction(self.engine, attempt)
        finally:
            self.report_gc(last)
        if last:
            self.count(last[0])
            if last[0].detached:
                self.purge_soon(last[0].detached)
        return result

    def purge_detached(self) -> int:
        """Finish every detached tree left in the store (the sweep); the trees finished."""
        tops = [keys.trash_inode(k) for k, _ in self.engine.scan_prefix(keys.TRASH)]
        for top in tops:
            self.purge_tree(top)
        return len(tops)

    def detached(self) -> int:
        """How many detached trees wait to be deleted."""
        return self.engine.count_prefix(keys.TRASH)

    def counts_by_type(self) -> dict[int, int]:
        """The inode counts kept in memory, by file type."""
        with self._counts_lock:
            return dict(self.by_type)


_XATTR_REQUESTS = frozenset(
    {"GetXattrRequest", "ListXattrRequest", "SetXattrRequest", "RemoveXattrRequest"}
)

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
    "SetXattr": meta_pb2.SetXattrResponse,
    "RemoveXattr": meta_pb2.RemoveXattrResponse,
    "SetLayout": meta_pb2.SetLayoutResponse,
    "TrashRestore": meta_pb2.TrashRestoreResponse,
    "TrashPurge": meta_pb2.TrashPurgeResponse,
    "QuotaSet": meta_pb2.QuotaSetResponse,
    "QuotaRemove": meta_pb2.QuotaRemoveResponse,
    "QuotaReserve": meta_pb2.QuotaReserveResponse,
}
