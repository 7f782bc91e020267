"""The metadata store: a small transactional key-value interface.

Everything the metaserver keeps (namespace, sessions, cluster state, GC queue)
goes through :class:`KVEngine`. Three engines implement it: :class:`RocksEngine`
(rocksdict, the durable default), :class:`MemoryEngine` (tests, and the model
every other engine must match), both :class:`LocalEngine` subclasses that one
process owns, and :class:`~emberfs.metaserver.store.etcd.EtcdEngine`, a store that
several metaservers share (:attr:`KVEngine.shared`), whose transactions have
limits of their own (:attr:`KVEngine.max_txn_ops`, :class:`TransactionTooLarge`).

Transactions are optimistic: reads made through a :class:`Transaction` are
remembered, writes are buffered, and :meth:`Transaction.commit` applies the
writes as one atomic batch only if no key it read has changed since
(:class:`Conflict` otherwise; callers retry with :func:`run_transaction`).
A commit is durable before it returns: the RocksDB engine syncs its WAL.
(Its batch is visible to readers a moment before the sync completes; a
commit that read it and wrote syncs the same WAL, which holds it, before
returning. A transaction that only read does not wait for that sync.)

On the local engines commits are grouped: concurrent committers queue their transactions, and one
of them (the leader) validates every queued read set in arrival order -
against the store and the writes of the transactions accepted before it in
the same group - then writes all accepted transactions as one atomic batch
with one WAL sync, and wakes the others. Under load a sync is shared by many
commits; a lone committer leads its own group of one.

The engine's :attr:`~KVEngine.version` is bumped before and after every
batch, so it is odd while one is being applied. A transaction notes it when
it is made. While it is unchanged (and even), every key the transaction read
still holds the value it read, and all of them are one state of the store:
a transaction that wrote nothing is then done without validation (and
without the commit lock), and a writer's reads are checked only against the
commits grouped before it, not read again. Otherwise reads are validated
against the store as above.

A caller that commits many transactions in a row before it answers (one call
of a batch RPC) can defer the sync: ``commit(sync=False)`` writes the batch to
the WAL without syncing it (it survives the process's death, not a power
loss), and one :meth:`KVEngine.sync` afterwards makes all of them durable. A
group syncs when any of its commits asked for it.
"""

from __future__ import annotations

import bisect
import errno as _errno
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc

from emberfs.common.errors import EmberError

T = TypeVar("T")

_MISSING = object()


class Conflict(Exception):
    """A key read by the transaction changed before it committed."""


class TransactionTooLarge(EmberError):
    """A transaction touches more keys, or more bytes, than the store takes in one commit.

    Only stores with limits raise it (etcd: 128 operations and 1.5 MiB a
    transaction by default). Operations that may grow without bound split
    themselves before they reach it (a recursive remove of a large tree);
    any other reaches the client as ``E2BIG`` with what was too large.
    """

    errno = _errno.E2BIG
    code = grpc.StatusCode.FAILED_PRECONDITION


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix``."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None


class KVEngine(ABC):
    """A sorted byte-key store with atomic multi-key commits.

    Attributes
    ----------
    shared : bool
        Other processes (other metaservers) may write the store at any
        moment: nothing read outside a transaction may be cached as current,
        and memory-only shortcuts of one process do not hold.
    max_txn_ops : int or None
        Most keys one commit may write (and, separately, most keys it may
        have read); None when unbounded. A commit over it raises
        :class:`TransactionTooLarge`.
    """

    shared = False
    max_txn_ops: int | None = None
    name = "memory"  # as an operator names the store (rocksdb, or an etcd URL)

    @abstractmethod
    def get(self, key: bytes) -> bytes | None: ...

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` (None where absent), read together where the engine can."""
        return [self.get(k) for k in keys]

    @abstractmethod
    def scan(
        self, start: bytes, end: bytes | None, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with ``start <= key < end`` (no upper bound when end is None), in key order."""

    def scan_prefix(
        self, prefix: bytes, start_after: bytes | None = None, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        start = prefix if start_after is None else start_after + b"\x00"
        return self.scan(start, prefix_end(prefix), limit)

    def count_prefix(self, prefix: bytes) -> int:
        """How many keys start with ``prefix``."""
        return sum(1 for _ in self.scan_prefix(prefix))

    @abstractmethod
    def transaction(self) -> Transaction: ...

    @abstractmethod
    def write(
        self, puts: dict[bytes, bytes], deletes: set[bytes] | None = None, *, sync: bool = True
    ) -> None:
        """A blind atomic batch (no read-set check); ``sync=False`` as for :meth:`commit`."""

    @abstractmethod
    def commit(
        self,
        reads: dict[bytes, bytes | None],
        puts: dict[bytes, bytes],
        deletes: set[bytes],
        sync: bool = True,
        *,
        version: int | None = None,
    ) -> None:
        """Apply ``puts``/``deletes`` atomically if every key in ``reads`` still has the value read.

        Raises :class:`Conflict` (nothing applied) when a key read has changed.
        """

    def sync(self) -> None:  # noqa: B027 - optional hook
        """Make every commit so far durable (those made with ``sync=False`` too)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class LocalEngine(KVEngine):
    """An engine one process owns, whose concurrent commits are grouped (module docstring)."""

    @abstractmethod
    def _apply(self, puts: dict[bytes, bytes], deletes: set[bytes]) -> None:
        """Apply a batch atomically and visibly, durable at the next :meth:`sync`.

        Called by :meth:`_write` only, under the commit lock.
        """

    def __init__(self) -> None:
        self._commit_lock = threading.Lock()
        self._group_cond = threading.Condition()
        self._group_queue: list[_PendingCommit] = []
        self._group_leader = False
        # bumped before and after every batch: odd while one is being applied
        self.version = 0

    def _write(self, puts: dict[bytes, bytes], deletes: set[bytes], sync: bool) -> None:
        """Apply one batch under the commit lock; durably when ``sync``."""
        self.version += 1
        try:
            self._apply(puts, deletes)
        finally:
            self.version += 1
        if sync:
            self.sync()

    def transaction(self) -> Transaction:
        return Transaction(self)

    def write(
        self, puts: dict[bytes, bytes], deletes: set[bytes] | None = None, *, sync: bool = True
    ) -> None:
        """A blind atomic batch (no read-set check); ``sync=False`` as for :meth:`commit`."""
        with self._commit_lock:
            self._write(puts, deletes or set(), sync)

    def commit(
        self,
        reads: dict[bytes, bytes | None],
        puts: dict[bytes, bytes],
        deletes: set[bytes],
        sync: bool = True,
        *,
        version: int | None = None,
    ) -> None:
        """Apply ``puts``/``deletes`` atomically if every key in ``reads`` still has the value read.

        Raises :class:`Conflict` (nothing applied) when a key read has changed.
        Concurrent calls are grouped into one synced batch (see the module
        docstring); each still succeeds or fails on its own read set.
        ``sync=False``: durable only after a later :meth:`sync`. ``version``:
        :attr:`version` before the first read; while no batch has been applied
        since, the reads are checked only against the commits grouped before
        this one, not read again from the store.
        """
        mine = _PendingCommit(reads, puts, deletes, sync, version)
        with self._group_cond:
            self._group_queue.append(mine)
            while not mine.done and self._group_leader:
                self._group_cond.wait()
            if not mine.done:
                self._group_leader = True
                group, self._group_queue = self._group_queue, []
        if not mine.done:
            try:
                self._commit_group(group)
            except BaseException as exc:
                for pending in group:
                    if pending.error is None and not pending.applied:
                        pending.error = exc
                raise
            finally:
                with self._group_cond:
                    self._group_leader = False
                    for pending in group:
                        pending.done = True
                    self._group_cond.notify_all()
        if mine.error is not None:
            raise mine.error

    def _commit_group(self, group: list[_PendingCommit]) -> None:
        """Validate each commit of ``group`` in order and apply the accepted ones in one batch."""
        with self._commit_lock:
            puts: dict[bytes, bytes] = {}
            deletes: set[bytes] = set()
            accepted: list[_PendingCommit] = []
            # No batch is being applied under the commit lock (the version is
            # even): a transaction begun at this version read the store as it is.
            unchanged = self.version
            for pending in group:
                conflict = None
                stored = pending.version != unchanged
                for key, seen in pending.reads.items():
                    if key in puts:
                        current = puts[key]
                    elif key in deletes:
                        current = None
                    elif stored:
                        current = self.get(key)
                    else:
                        continue
                    if current != seen:
                        conflict = key
                        break
                if conflict is not None:
                    pending.error = Conflict(conflict)
                    continue
                for key in pending.deletes:
                    puts.pop(key, None)
                    deletes.add(key)
                for key, value in pending.puts.items():
                    deletes.discard(key)
                    puts[key] = value
                accepted.append(pending)
            if puts or deletes:
                try:
                    self._write(puts, deletes, any(p.sync for p in accepted))
                except Exception as exc:
                    for pending in accepted:
                        pending.error = exc
                    return
            for pending in accepted:
                pending.applied = True


class _PendingCommit:
    """One transaction waiting in a commit group."""

    __slots__ = ("reads", "puts", "deletes", "sync", "version", "done", "applied", "error")

    def __init__(self, reads, puts, deletes, sync: bool = True, version: int | None = None) -> None:
        self.reads: dict[bytes, bytes | None] = reads
        self.puts: dict[bytes, bytes] = puts
        self.deletes: set[bytes] = deletes
        self.sync = sync
        self.version = version
        self.done = False
        self.applied = False
        self.error: BaseException | None = None


class Transaction:
    """Reads through to the engine (seeing its own writes), buffers writes.

    This is the local engines' transaction; other engines subclass it and
    replace :meth:`_read`, :meth:`_stored_scan` and :meth:`commit`.
    """

    def __init__(self, engine: KVEngine):
        self.engine = engine
        self.version = getattr(engine, "version", None)  # before the first read
        self.reads: dict[bytes, bytes | None] = {}
        self.puts: dict[bytes, bytes] = {}
        self.deletes: set[bytes] = set()

    def get(self, key: bytes) -> bytes | None:
        if key in self.puts:
            return self.puts[key]
        if key in self.deletes:
            return None
        if key in self.reads:
            return self.reads[key]
        value = self._read(key)
        self.reads[key] = value
        return value

    def peek(self, key: bytes) -> bytes | None:
        """The value of ``key`` as this transaction sees it, without adding it to the read set.

        For reads no decision of the transaction rests on (a count, a
        permission walk whose subtree is detached in the same commit).
        """
        if key in self.puts:
            return self.puts[key]
        if key in self.deletes:
            return None
        if key in self.reads:
            return self.reads[key]
        return self._peek(key)

    def prefetch(self, keys: Iterable[bytes]) -> None:  # noqa: B027 - optional hook
        """Fetch ``keys`` ahead, in as few round trips as the store allows.

        A later :meth:`get` of one of them is answered from what was fetched
        (and only then enters the read set). The local engines read in
        microseconds and fetch nothing ahead.
        """

    def _read(self, key: bytes) -> bytes | None:
        """The stored value of ``key`` (recorded in the read set by :meth:`get`)."""
        return self.engine.get(key)

    def _peek(self, key: bytes) -> bytes | None:
        return self.engine.get(key)

    def _stored_scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """The stored pairs in ``[start, end)`` that :meth:`scan_prefix` merges its writes into."""
        return self.engine.scan(start, end)

    @property
    def size(self) -> tuple[int, int]:
        """``(keys read, keys written)`` so far."""
        return len(self.reads), len(self.puts) + len(self.deletes)

    def savepoint(self) -> tuple:
        """What :meth:`rollback` returns the transaction to: its reads and writes so far."""
        return dict(self.reads), dict(self.puts), set(self.deletes)

    def rollback(self, savepoint: tuple) -> None:
        """Forget every read and write made since ``savepoint``."""
        reads, puts, deletes = savepoint
        self.reads, self.puts, self.deletes = dict(reads), dict(puts), set(deletes)

    def put(self, key: bytes, value: bytes) -> None:
        self.deletes.discard(key)
        self.puts[key] = value

    def delete(self, key: bytes) -> None:
        self.puts.pop(key, None)
        self.deletes.add(key)

    def scan_prefix(
        self, prefix: bytes, start_after: bytes | None = None, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """A prefix scan merged with this transaction's own buffered writes.

        Scanned keys are not added to the read set (no phantom protection);
        callers that depend on a range being empty also ``get`` a guard key.
        """
        end = prefix_end(prefix)
        lo = prefix if start_after is None else start_after + b"\x00"
        local = sorted(k for k in self.puts if k >= lo and (end is None or k < end))
        stored = self._stored_scan(lo, end)
        count = 0
        li = 0
        for key, value in stored:
            while li < len(local) and local[li] < key:
                yield local[li], self.puts[local[li]]
                count += 1
                li += 1
                if limit is not None and count >= limit:
                    return
            if li < len(local) and local[li] == key:
                li += 1
                yield key, self.puts[key]
            elif key in self.deletes:
                continue
            else:
                yield key, value
            count += 1
            if limit is not None and count >= limit:
                return
        while li < len(local):
            yield local[li], self.puts[local[li]]
            count += 1
            li += 1
            if limit is not None and count >= limit:
                return

    def commit(self, sync: bool = True) -> None:
        """Commit (see :meth:`KVEngine.commit`); raises :class:`Conflict`.

        A transaction that wrote nothing, begun while no batch was being
        applied and with none applied since, read one state of the store:
        it is done without validating its reads.
        """
        if (
            not self.puts
            and not self.deletes
            and self.version % 2 == 0
            and self.engine.version == self.version
        ):
            return
        self.engine.commit(self.reads, self.puts, self.deletes, sync=sync, version=self.version)


def run_transaction(
    engine: KVEngine, fn: Callable[[Transaction], T], attempts: int = 16, *, sync: bool = True
) -> T:
    """Run ``fn`` in a fresh transaction and commit it, retrying on :class:`Conflict`.

    Retries wait a random moment that grows with each conflict (capped at
    20 ms), so transactions that collided in one commit group do not all
    collide again in the next. ``sync=False`` defers the WAL sync to a later
    :meth:`KVEngine.sync`.
    """
    for attempt in range(attempts - 1):
        txn = engine.transaction()
        result = fn(txn)
        try:
            txn.commit(sync)
            return result
        except Conflict:
            time.sleep(random.uniform(0, min(0.0005 * (2**attempt), 0.02)))
            continue
    txn = engine.transaction()
    result = fn(txn)
    txn.commit(sync)
    return result


class MemoryEngine(LocalEngine):
    """A sorted in-memory engine with the same semantics (not durable)."""

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        self._lock = threading.RLock()

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def scan(self, start, end, limit=None):
        with self._lock:
            i = bisect.bisect_left(self._keys, start)
            j = len(self._keys) if end is None else bisect.bisect_left(self._keys, end)
            if limit is not None:
                j = min(j, i + limit)
            items = [(k, self._data[k]) for k in self._keys[i:j]]
        return iter(items)

    def _apply(self, puts, deletes):
        with self._lock:
            for key in deletes:
                if self._data.pop(key, _MISSING) is not _MISSING:
                    del self._keys[bisect.bisect_left(self._keys, key)]
            for key, value in puts.items():
                if key not in self._data:
                    bisect.insort(self._keys, key)
                self._data[key] = value


class RocksEngine(LocalEngine):
    """RocksDB through rocksdict; every commit syncs the WAL before returning.

    Attribute ``db`` is the rocksdict ``Rdict`` the engine reads and writes
    through (None once closed).
    """

    name = "rocksdb"

    def __init__(self, path: str | Path, *, sync: bool = True):
        super().__init__()
        from rocksdict import Options, Rdict, ReadOptions, WriteOptions

        self._read_options = ReadOptions
        Path(path).mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.db = Rdict(str(path), opts)
        # The batch goes to the WAL file unsynced, then flush_wal(sync=True)
        # syncs it: rocksdict holds the GIL inside write() but not inside
        # flush_wal(), so the whole process is not stalled for every sync and
        # the next commit group forms while this one's sync runs.
        self._sync = sync
        self._write_opts = WriteOptions()
        self._write_opts.sync = False

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self.db.get(keys)  # one MultiGet

    def scan(self, start, end, limit=None):
        # Bounded at ``end``: otherwise the iterator's last step walks over every
        # deleted key after the range until it meets a live one (the acknowledgements
        # of a finished GC burst made each item's scan cost milliseconds).
        opts = self._read_options()
        if end is not None:
            opts.set_iterate_upper_bound(end)
        it = self.db.iter(opts)
        it.seek(start)
        n = 0
        while it.valid():
            key = it.key()
            if end is not None and key >= end:
                break
            yield key, it.value()
            n += 1
            if limit is not None and n >= limit:
                break
            it.next()

    def _apply(self, puts, deletes):
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for key in deletes:
            batch.delete(key)
        for key, value in puts.items():
            batch.put(key, value)
        self.db.write(batch, self._write_opts)

    def sync(self) -> None:
        if self._sync:
            self.db.flush_wal(True)

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
