"""A storage node's replication state, and what each chunk update leads to.

:class:`Replica` owns what chain replication must remember between the
requests on a node's targets:

* the **version floor** of a chunk: a version its successor may hold although
  the update was aborted here (staging failed after the forward went out, or
  the successor's answer was lost); the next update goes above it, so a
  version number is never used for two contents;
* the **answers** to client writes and truncations by request id, so a retry
  (same client id and request id) is answered from here and applied once;
* the **locks**: one per chunk (its updates run one after the other) and one
  per inode, shared by chunk updates and held alone by a truncation.

Its methods decide, without I/O, with the rules of
:mod:`emberfs.storageserver.replication`: :meth:`Replica.plan_write` turns an
accepted write and the chunk's metadata into a :class:`WritePlan` (the
version, what to stage, what to send the successor) or an immediate answer;
:meth:`Replica.staging_failed`, :meth:`Replica.successor_answered`,
:meth:`Replica.aborted` and :meth:`Replica.committed` take what happened and
say what follows. The data server (:mod:`emberfs.storageserver.dataserver`)
receives the frames; its updates (:mod:`emberfs.storageserver.updates`) stage,
forward and commit them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from emberfs.common import wire
from emberfs.proto import data_pb2
from emberfs.storageserver import replication as rp
from emberfs.storageserver.chunkrecords import VersionConflict
from emberfs.storageserver.space import is_no_space

ChunkKey = tuple[int, int, int]  # (target id, inode, chunk index)


class ResultCache:
    """Bounded LRU of answers to mutating requests, each kept for ``ttl`` seconds.

    Parameters
    ----------
    max_entries : int, default 8192
        Entries beyond this evict the least recently used.
    ttl : float, default 300
        Seconds an answer stays valid.
    clock : callable, default time.monotonic
    """

    def __init__(
        self,
        max_entries: int = 8192,
        ttl: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._items: OrderedDict[tuple, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Any | None:
        """The cached answer for ``key``, or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            if self._clock() - item[0] > self.ttl:
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key: tuple, value: Any) -> None:
        with self._lock:
            self._items[key] = (self._clock(), value)
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def request_key(client_id: str, request_id: int, *parts: int) -> tuple | None:
    """The idempotency key of a request (None when the client sent no id)."""
    if not client_id or not request_id:
        return None
    return (client_id, request_id, *parts)


class _RWLock:
    """Shared/exclusive lock: chunk updates share an inode, truncation holds it alone."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writer:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._readers:
                self._cond.wait()
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class _LockTable:
    """Locks made on demand per key and dropped when nobody holds or waits for them."""

    def __init__(self, factory):
        self._factory = factory
        self._locks: dict[tuple, list] = {}
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def get(self, key: tuple) -> Iterator:
        with self._guard:
            entry = self._locks.get(key)
            if entry is None:
                entry = self._locks[key] = [self._factory(), 0]
            entry[1] += 1
        try:
            yield entry[0]
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)


@dataclass(slots=True)
class WritePlan:
    """An update this replica applies: stage ``version``, forward it, then commit.

    Attributes
    ----------
    key : ChunkKey
    req : ChunkWriteRequest
        The request as received.
    role : replication.WriteRole
        The replica's role (its successor, the chain version).
    version : int
        The version the update is staged and committed as.
    base_version : int
        The committed version the update applies on.
    full : bool
        The data is the chunk's whole new content (else a range at ``req.offset``).
    send_full : bool
        The successor gets the whole new content (else the same range); set
        when the successor asks for it.
    repair : bool
        The update puts the head's committed content back on the chain after
        it gave up an update it had forwarded (see :meth:`Replica.repair_plan`).
    """

    key: ChunkKey
    req: data_pb2.ChunkWriteRequest
    role: rp.WriteRole
    version: int
    base_version: int
    full: bool
    send_full: bool = False
    repair: bool = False

    @property
    def successor(self):
        return self.role.successor

    def forward(self) -> data_pb2.ChunkWriteRequest:
        """The request for the successor."""
        return rp.forward_request(
            self.req,
            self.role.successor,
            chain_version=self.role.chain_version,
            version=self.version,
            base_version=self.base_version,
            full_chunk=self.send_full,
        )


def written(meta) -> data_pb2.ChunkWriteResponse:
    """The answer to a write once the chunk's metadata ``meta`` holds it."""
    return data_pb2.ChunkWriteResponse(version=meta.version, chunk_length=meta.length)


# The head cannot update a chunk whose content it lost (ChunkRecords.recover marks it damaged)
# until a whole copy replaces it: the update is refused as retryable.
_DAMAGED = wire.NotServing("the chunk is damaged on the chain's head: its file was lost")


class Replica:
    """The replication state of one node's targets (floors, answers, locks) and its decisions.

    Parameters
    ----------
    results : ResultCache, optional
        Answers of client requests (a new cache by default).
    """

    def __init__(self, results: ResultCache | None = None) -> None:
        self.results = results if results is not None else ResultCache()
        self._chunk_locks = _LockTable(threading.Lock)
        self._inode_locks = _LockTable(_RWLock)
        self._floors: dict[ChunkKey, int] = {}
        self._floors_lock = threading.Lock()

    # locks ---------------------------------------------------------------------

    @contextlib.contextmanager
    def updating(self, target_id: int, inode: int, index: int) -> Iterator[None]:
        """Hold the chunk for one update (its inode shared with other chunk updates)."""
        with self._inode_locks.get((target_id, inode)) as ilock, ilock.shared():
            with self.chunk(target_id, inode, index):
                yield

    @contextlib.contextmanager
    def truncating(self, target_id: int, inode: int) -> Iterator[None]:
        """Hold the inode alone (no chunk update of it runs meanwhile)."""
        with self._inode_locks.get((target_id, inode)) as ilock, ilock.exclusive():
            yield

    @contextlib.contextmanager
    def chunk(self, target_id: int, inode: int, index: int) -> Iterator[None]:
        """Hold one chunk's lock."""
        with self._chunk_locks.get((target_id, inode, index)) as lock, lock:
            yield

    # answers -------------------------------------------------------------------

    @staticmethod
    def write_key(req: data_pb2.ChunkWriteRequest, role: rp.WriteRole) -> tuple | None:
        """The key a client write's answer is kept under (None for others)."""
        if role.kind != rp.WriteKind.CLIENT:
            return None
        return request_key(
            req.client_id, req.request_id, req.target_id, req.chunk.inode, req.chunk.index
        )

    @staticmethod
    def truncate_key(req: data_pb2.ChunkTruncateRequest, role: rp.WriteRole) -> tuple | None:
        """The key a truncation's answer is kept under (None unless it came to the head)."""
        if role.kind != rp.WriteKind.CLIENT:
            return None
        return request_key(req.client_id, req.request_id, req.target_id, req.inode, -1)

    def answered(self, key: tuple | None):
        """The answer given to the request of ``key`` before, or None."""
        return self.results.get(key) if key is not None else None

    def answer(self, key: tuple | None, result) -> None:
        """Keep ``result`` as the answer to the request of ``key`` (refusals are not kept)."""
        if key is not None and not isinstance(result, wire.Refused):
            self.results.put(key, result)

    # versions ------------------------------------------------------------------

    def floor(self, key: ChunkKey) -> int:
        """The highest version of the chunk that may exist beyond this replica (0: none)."""
        with self._floors_lock:
            return self._floors.get(key, 0)

    def _raise_floor(self, key: ChunkKey, version: int) -> None:
        with self._floors_lock:
            self._floors[key] = max(version, self._floors.get(key, 0))

    def _clear_floor(self, key: ChunkKey, version: int) -> None:
        """Version ``version`` committed: a floor at or below it is passed."""
        with self._floors_lock:
            floor = self._floors.get(key, 0)
            if floor and floor <= version:
                del self._floors[key]

    def plan_write(
        self, req: data_pb2.ChunkWriteRequest, role: rp.WriteRole, meta
    ) -> WritePlan | wire.Refused | data_pb2.ChunkWriteResponse:
        """What a client or forwarded write leads to, given the chunk's ``meta`` (None: none).

        A client write at the head gets a version above everything used for
        the chunk; a forwarded one keeps its version and is applied as
        :func:`~emberfs.storageserver.replication.plan_forwarded` decides:
        answered at once when already held, refused with NEED_FULL_CHUNK when
        its base differs, else staged whole or as a range. The successor gets
        the whole chunk at once when the update is whole or it is syncing.
        """
        key = (req.target_id, req.chunk.inode, req.chunk.index)
        committed = rp.committed_version(meta)
        if role.kind == rp.WriteKind.CLIENT:
            if rp.damaged(meta):
                return _DAMAGED
            version, full = rp.next_version(meta, self.floor(key)), False
        else:
            action = rp.plan_forwarded(meta, req)
            if action == rp.Apply.ALREADY:
                return written(meta)
            if action == rp.Apply.NEED_FULL:
                return wire.NotCommitted(rp.NEED_FULL_CHUNK)
            version, full = req.update_version, action == rp.Apply.FULL
        plan = WritePlan(key, req, role, version, committed, full)
        if role.successor is not None:
            plan.send_full = full or rp.send_full_first(role.successor, req)
        return plan

    def staging_failed(
        self, plan: WritePlan, error: BaseException, forwarded: bool
    ) -> wire.Refused | None:
        """Staging ``plan`` raised ``error``: the refusal to answer, or None to let it propagate.

        When the update was already forwarded the successor may hold its
        version, so the version is never used again for this chunk. A file
        system without room (ENOSPC) is answered NO_SPACE.
        """
        if forwarded:
            self._raise_floor(plan.key, plan.version)
        if isinstance(error, VersionConflict):
            return wire.StaleChain(str(error))
        if isinstance(error, ValueError):
            return wire.BadRequest(str(error))
        if is_no_space(error):
            return wire.NoSpace(f"target {plan.key[0]}: {error}")
        return None

    def successor_answered(
        self, plan: WritePlan, status: int, message: str
    ) -> wire.Refused | None | str:
        """The successor answered the forward of ``plan``.

        Returns None once it holds the update, :data:`replication.Reply.RESEND_FULL`
        when it asks for the whole chunk (``plan.send_full`` is then set), or
        the refusal to answer upstream.
        """
        outcome, upstream = rp.interpret_reply(status, message, plan.send_full)
        if outcome == rp.Reply.OK:
            return None
        if outcome == rp.Reply.RESEND_FULL:
            plan.send_full = True
            return rp.Reply.RESEND_FULL
        return rp.upstream_refusal(plan.successor, upstream, status, message)

    def repair_plan(self, plan: WritePlan, meta) -> WritePlan | None:
        """After the head gave up ``plan`` once it was forwarded: put its content back.

        The successors may have committed ``plan``'s version, and would then
        serve bytes the chain gave up until the chunk's next write. The head,
        the only replica that numbers versions, sends its committed content
        (``meta``; empty when it has none) whole, above every version the chunk
        may have downstream. None for other replicas, for a repair itself, and
        for an update that was never forwarded.
        """
        if plan.role.kind != rp.WriteKind.CLIENT or plan.successor is None or plan.repair:
            return None
        req = data_pb2.ChunkWriteRequest()
        req.CopyFrom(plan.req)
        req.offset = 0
        version = rp.next_version(meta, self.floor(plan.key))
        committed = rp.committed_version(meta)
        return WritePlan(
            plan.key, req, plan.role, version, committed, full=True, send_full=True, repair=True
        )

    def aborted(self, plan: WritePlan) -> None:
        """``plan`` was staged and then aborted; its version may live on downstream."""
        self._raise_floor(plan.key, plan.version)

    def committed(self, plan: WritePlan) -> None:
        """``plan`` committed: a floor it reached is behind the chunk's version now."""
        self._clear_floor(plan.key, plan.version)

    # truncations -----------------------------------------------------------------

    def plan_cut(
        self, req: data_pb2.ChunkTruncateRequest, chunks: list
    ) -> list[data_pb2.TruncateStep] | wire.Refused:
        """The head's truncation: one step per chunk to cut, numbered above its floor.

        ``chunks`` are the metadata of the inode's chunks on this target. A
        damaged one (its content lost here) cannot be cut: refused.
        """
        metas = {m.index: m for m in chunks}
        steps = []
        cuts = rp.plan_truncate(
            [(m.index, m.length) for m in chunks],
            req.length,
            req.chunk_size,
            req.stripe,
            req.stripe_position,
        )
        for cut in cuts:
            meta = metas[cut.index]
            if rp.damaged(meta):
                return _DAMAGED
            key = (req.target_id, req.inode, cut.index)
            steps.append(
                data_pb2.TruncateStep(
                    index=cut.index,
                    length=cut.length,
                    version=rp.next_version(meta, self.floor(key)),
                    base_version=rp.committed_version(meta),
                )
            )
        return steps

    @staticmethod
    def forwarded_cut(
        req: data_pb2.ChunkTruncateRequest, meta_of: Callable[[int], Any]
    ) -> list[data_pb2.TruncateStep] | wire.Refused:
        """The steps of a forwarded truncation this replica applies, or NEED_FULL_CHUNK.

        Steps it holds already are left out; when any chunk is not at the step's
        base version, nothing is applied and the predecessor is asked for the
        cut chunks whole.
        """
        apply = []
        for step in req.steps:
            action = rp.plan_forwarded_cut(meta_of(step.index), step)
            if action == rp.Apply.NEED_FULL:
                return wire.NotCommitted(rp.NEED_FULL_CHUNK)
            if action == rp.Apply.PARTIAL:
                apply.append(step)
        return apply

    def cut_answered(
        self, role: rp.WriteRole, status: int, message: str, sent_full: bool
    ) -> wire.Refused | None | str:
        """The successor answered a forwarded truncation.

        None when it holds it, :data:`replication.Reply.RESEND_FULL` when it
        needs the cut chunks whole first (once), else the refusal to answer upstream.
        """
        outcome, upstream = rp.interpret_reply(status, message, sent_full)
        if outcome == rp.Reply.OK:
            return None
        if outcome == rp.Reply.RESEND_FULL:
            return rp.Reply.RESEND_FULL
        return rp.upstream_refusal(role.successor, upstream, status, message)

    def cut_aborted(
        self, req: data_pb2.ChunkTruncateRequest, steps: list[data_pb2.TruncateStep]
    ) -> None:
        """Staged cuts were aborted; their versions may live on downstream."""
        for step in steps:
            self._raise_floor((req.target_id, req.inode, step.index), step.version)

    def cut_committed(
        self, req: data_pb2.ChunkTruncateRequest, steps: list[data_pb2.TruncateStep]
    ) -> None:
        """Cuts committed: floors they reached are behind the chunks' versions now."""
        for step in steps:
            self._clear_floor((req.target_id, req.inode, step.index), step.version)
