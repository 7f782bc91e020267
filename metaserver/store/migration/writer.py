"""Writing copied pairs to the destination store in batches it takes: as many keys and bytes as
one request holds (etcd's ``--max-txn-ops`` and ``--max-request-bytes``), several in flight on etcd.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from emberfs.metaserver.store.etcd import EtcdEngine
from emberfs.metaserver.store.etcdclient import REQUEST_MARGIN
from emberfs.metaserver.store.kv import KVEngine
from emberfs.metaserver.store.migration.errors import (
    TooLarge,
)

ROCKS_BATCH_KEYS = 10_000
ROCKS_BATCH_BYTES = 8 * 1024 * 1024
ETCD_OP_OVERHEAD = 32  # bytes of one put's framing in an etcd request, beyond key and value
ETCD_IN_FLIGHT = 4  # etcd transactions sent at once


class BatchWriter:
    """Puts copied pairs to the destination in batches it takes (see the module docstring)."""

    def __init__(
        self,
        engine: KVEngine,
        progress: Callable[[int, int, int], None] | None = None,
        total: int = 0,
    ) -> None:
        self.engine = engine
        self.progress = progress
        self.total = total
        if isinstance(engine, EtcdEngine):
            self.max_keys = engine.max_txn_ops
            self.max_bytes = engine.max_request_bytes - REQUEST_MARGIN
            self.overhead = len(engine.prefix) + ETCD_OP_OVERHEAD
            in_flight = ETCD_IN_FLIGHT
        else:
            self.max_keys = engine.max_txn_ops or ROCKS_BATCH_KEYS
            self.max_bytes = ROCKS_BATCH_BYTES
            self.overhead = 0
            in_flight = 1
        self.in_flight = in_flight
        self._pool = (
            ThreadPoolExecutor(in_flight, thread_name_prefix="migrate") if in_flight > 1 else None
        )
        self._pending: deque[tuple[Future, int, int]] = deque()
        self._puts: dict[bytes, bytes] = {}
        self._bytes = 0
        self.keys_written = 0
        self.bytes_written = 0

    def request_size(self, key: bytes, value: bytes) -> int:
        """What one pair counts against a batch's byte limit."""
        return len(key) + len(value) + self.overhead

    def add(self, key: bytes, value: bytes) -> None:
        size = self.request_size(key, value)
        if size > self.max_bytes:
            raise TooLarge(
                f"key {key!r} and its value are {size} bytes; the destination takes at most "
                f"{self.max_bytes} in one request"
            )
        if self._puts and (len(self._puts) >= self.max_keys or self._bytes + size > self.max_bytes):
            self._flush()
        self._puts[key] = value
        self._bytes += size

    def _flush(self) -> None:
        puts, self._puts = self._puts, {}
        nbytes = sum(len(k) + len(v) for k, v in puts.items())
        self._bytes = 0
        if self._pool is None:
            self.engine.write(puts, sync=False)
            self._done(len(puts), nbytes)
            return
        while len(self._pending) >= self.in_flight:
            self._wait_oldest()
        future = self._pool.submit(self.engine.write, puts, sync=False)
        self._pending.append((future, len(puts), nbytes))

    def _wait_oldest(self) -> None:
        future, n, nbytes = self._pending.popleft()
        future.result()
        self._done(n, nbytes)

    def _done(self, n: int, nbytes: int) -> None:
        self.keys_written += n
        self.bytes_written += nbytes
        if self.progress is not None:
            self.progress(self.keys_written, self.bytes_written, self.total)

    def finish(self) -> None:
        """Write what is left, wait for every batch, and make them durable."""
        if self._puts:
            self._flush()
        while self._pending:
            self._wait_oldest()
        self.engine.sync()
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            for future, _, _ in self._pending:
                future.cancel()
            self._pool.shutdown(wait=True)
            self._pool = None


def request_limit(engine: KVEngine) -> tuple[int, int] | None:
    """``(most bytes a request takes, framing bytes a pair adds)`` of a store with a limit."""
    if isinstance(engine, EtcdEngine):
        return engine.max_request_bytes - REQUEST_MARGIN, len(engine.prefix) + ETCD_OP_OVERHEAD
    return None
