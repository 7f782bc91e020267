"""The metadata store: a small transactional key-value interface.

Everything the metaserver keeps (namespace, sessions, cluster state, GC queue)
goes through :class:`KVEngine`. Two engines implement it: :class:`RocksEngine`
(rocksdict, the durable default) and :class:`MemoryEngine` (tests, and the
model any future distributed engine must match).

Transactions are optimistic: reads made through a :class:`Transaction` are
remembered, writes are buffered, and :meth:`Transaction.commit` applies the
writes as one atomic batch only if no key it read has changed since
(:class:`Conflict` otherwise; callers retry with :func:`run_transaction`).
A commit is durable before it returns: the RocksDB engine syncs its WAL
(concurrent committers share the sync, RocksDB groups them).
"""

from __future__ import annotations

import bisect
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_MISSING = object()


class Conflict(Exception):
    """A key read by the transaction changed before it committed."""


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
    """A sorted byte-key store with atomic multi-key commits."""

    @abstractmethod
    def get(self, key: bytes) -> bytes | None: ...

    @abstractmethod
    def scan(
        self, start: bytes, end: bytes | None, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with ``start <= key < end`` (no upper bound when end is None), in key order."""

    @abstractmethod
    def _apply(self, puts: dict[bytes, bytes], deletes: set[bytes]) -> None:
        """Apply a batch atomically and durably (called under the commit lock)."""

    def __init__(self) -> None:
        self._commit_lock = threading.Lock()

    def scan_prefix(
        self, prefix: bytes, start_after: bytes | None = None, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        start = prefix if start_after is None else start_after + b"\x00"
        return self.scan(start, prefix_end(prefix), limit)

    def transaction(self) -> Transaction:
        return Transaction(self)

    def write(self, puts: dict[bytes, bytes], deletes: set[bytes] | None = None) -> None:
        """A blind atomic batch (no read-set check)."""
        with self._commit_lock:
            self._apply(puts, deletes or set())

    def commit(
        self,
        reads: dict[bytes, bytes | None],
        puts: dict[bytes, bytes],
        deletes: set[bytes],
    ) -> None:
        """Apply ``puts``/``deletes`` atomically if every key in ``reads`` still has the value read."""
        with self._commit_lock:
            for key, seen in reads.items():
                if self.get(key) != seen:
                    raise Conflict(key)
            if puts or deletes:
                self._apply(puts, deletes)

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class Transaction:
    """Reads through to the engine (seeing its own writes), buffers writes."""

    def __init__(self, engine: KVEngine):
        self.engine = engine
        self.reads: dict[bytes, bytes | None] = {}
        self.puts: dict[bytes, bytes] = {}
        self.deletes: set[bytes] = set()

    def get(self, key: bytes) -> bytes | None:
        if key in self.puts:
            return self.puts[key]
        if key in self.deletes:
            return None
        value = self.engine.get(key)
        self.reads.setdefault(key, value)
        return value

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
        stored = self.engine.scan(lo, end)
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

    def commit(self) -> None:
        self.engine.commit(self.reads, self.puts, self.deletes)


def run_transaction(engine: KVEngine, fn: Callable[[Transaction], T], attempts: int = 16) -> T:
    """Run ``fn`` in a fresh transaction and commit it, retrying on :class:`Conflict`."""
    for _ in range(attempts - 1):
        txn = engine.transaction()
        result = fn(txn)
        try:
            txn.commit()
            return result
        except Conflict:
            continue
    txn = engine.transaction()
    result = fn(txn)
    txn.commit()
    return result


class MemoryEngine(KVEngine):
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


class RocksEngine(KVEngine):
    """RocksDB through rocksdict; every commit syncs the WAL before returning."""

    def __init__(self, path: str | Path, *, sync: bool = True):
        super().__init__()
        from rocksdict import Options, Rdict, WriteOptions

        Path(path).mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db = Rdict(str(path), opts)
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def scan(self, start, end, limit=None):
        it = self._db.iter()
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
        self._db.write(batch, self._write_opts)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
