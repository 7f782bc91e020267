"""Results of mutating requests, kept so that a retry applies nothing twice.

A mutating request with a client id and a non-zero request id stores its
serialized response under ``keys.idempotent_key(client_id, request_id)`` in
the same transaction as its change. A retry finds the record and gets the
same response back without touching anything else. Failed requests store
nothing: nothing was applied, so a retry simply runs again.

Records are pruned two ways:

- per client, as it stores: the client's oldest records (a few per store)
  go once they are older than :data:`RETRY_HORIZON_NS` or more than
  :data:`WINDOW` request ids behind the new one. Clients number their
  requests with one increasing counter (reads included), so a retry is
  deduplicated as long as it comes within two minutes and within 65,536
  requests of that client; records per active client stay bounded. The scan
  starts at the client's oldest kept record (a :class:`PruneHints` entry), not
  at the start of its range: RocksDB keeps a deleted key as a tombstone until
  compaction, and a seek from the range's start would step over every record
  pruned since, making each store of a long-lived client slower than the last.
  On a shared store (etcd) the scan is a round trip of its own, so only every
  :data:`PRUNE_EVERY_SHARED`-th store prunes, that many times as many records,
  and never more than the commit has room for;
- by age: :func:`prune_expired` deletes records older than
  :data:`MAX_AGE_NS`, which covers clients that went away. The metaserver's
  background loop runs it over the whole table, in bounded slices, every
  minute (``Namespace.prune_retry_records``).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator

from google.protobuf.message import Message

from emberfs.common.errors import InvalidArgument
from emberfs.metaserver.fs import records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine, Transaction, prefix_end

WINDOW = 65536
RETRY_HORIZON_NS = 120 * 10**9
PRUNE_PER_STORE = 8
PRUNE_EVERY_SHARED = 8  # on a shared store, every 8th store prunes (8 times as many at most)
MAX_AGE_NS = 600 * 10**9
HINT_CLIENTS = 4096
MAX_REQUEST_ID = 2**64 - 1


class PruneHints:
    """Per client, the request id below which its records are known to be pruned.

    Only a hint, kept in memory for the :data:`HINT_CLIENTS` most recently
    active clients: a client without one is scanned from the start of its
    range once, and a record left below a hint (a retry of an old request
    stored after the window moved on) is removed by :func:`prune_expired`.
    """

    def __init__(self, capacity: int = HINT_CLIENTS) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._first: OrderedDict[str, int] = OrderedDict()

    def first(self, client_id: str) -> int:
        """The lowest request id of ``client_id`` that may still have a record."""
        with self._lock:
            return self._first.get(client_id, 0)

    def advance(self, client_id: str, request_id: int) -> None:
        """Note that ``client_id`` has no record below ``request_id``."""
        with self._lock:
            if request_id > self._first.get(client_id, 0):
                self._first[client_id] = request_id
            if client_id in self._first:
                self._first.move_to_end(client_id)
            while len(self._first) > self._capacity:
                self._first.popitem(last=False)


def find(
    txn: Transaction, client_id: str, request_id: int, method: str, response_type: type[Message]
) -> Message | None:
    """The stored response of an earlier attempt of this request, or None.

    The lookup is part of the transaction's read set, so two concurrent
    attempts of one request cannot both apply it. A request id reused for a
    different method gives InvalidArgument.
    """
    raw = txn.get(keys.idempotent_key(client_id, request_id))
    if raw is None:
        return None
    record = records.decode_idempotent(raw)
    if record.method != method:
        raise InvalidArgument(
            f"request id {request_id} of client {client_id!r} was used for {record.method}"
        )
    response = response_type()
    response.ParseFromString(record.response)
    return response


def store(
    txn: Transaction,
    client_id: str,
    request_id: int,
    method: str,
    response: Message,
    now: int,
    hints: PruneHints | None = None,
) -> None:
    """Record ``response`` as the result of the request, and prune the client's window.

    With ``hints`` the prune scan starts at the client's hinted first record
    and moves the hint past what it deletes (once the transaction is built,
    before it commits: a commit that fails leaves those records to
    :func:`prune_expired`).
    """
    txn.put(
        keys.idempotent_key(client_id, request_id),
        records.encode_idempotent(method, now, response.SerializeToString()),
    )
    per_store = PRUNE_PER_STORE
    if txn.engine.shared:
        # the prune scan is a round trip of its own there: one store in eight makes it
        if request_id % PRUNE_EVERY_SHARED:
            return
        per_store *= PRUNE_EVERY_SHARED
    if txn.engine.max_txn_ops is not None:  # never past what one commit takes
        per_store = min(per_store, txn.engine.max_txn_ops - txn.size[1])
        if per_store <= 0:
            return
    prefix = keys.idempotent_prefix(client_id)
    first = 0 if hints is None else hints.first(client_id)
    start = keys.idempotent_key(client_id, first) if first else prefix
    for key, raw in txn.engine.scan(start, prefix_end(prefix), per_store):
        first = keys.idempotent_request_id(key)
        behind = first <= request_id - WINDOW
        if not behind and now - records.decode_idempotent(raw).stored_ns <= RETRY_HORIZON_NS:
            break
        txn.delete(key)
        first = min(first + 1, MAX_REQUEST_ID)
    if hints is not None:
        hints.advance(client_id, first)


def prune_expired(
    engine: KVEngine,
    now: int,
    *,
    max_age_ns: int = MAX_AGE_NS,
    start: bytes | None = None,
    limit: int = 10000,
) -> tuple[bytes | None, int]:
    """Delete records older than ``max_age_ns`` among ``limit`` records from ``start``.

    Returns the key to resume from (None once the end of the table was
    reached) and the number of records looked at.
    """
    begin = start or keys.IDEMPOTENT
    doomed: set[bytes] = set()
    last = None
    seen = 0
    for key, raw in engine.scan(begin, prefix_end(keys.IDEMPOTENT), limit):
        seen += 1
        last = key
        if now - records.decode_idempotent(raw).stored_ns > max_age_ns:
            doomed.add(key)
    step = engine.max_txn_ops or len(doomed) or 1
    ordered = sorted(doomed)
    for i in range(0, len(ordered), step):  # each batch as large as the store takes
        engine.write({}, set(ordered[i : i + step]))
    if seen < limit or last is None:
        return None, seen
    return last + b"\x00", seen


class InFlight:
    """The mutating requests running now, so that a retry waits for its first attempt.

    A client retries a call whose answer it did not get in time while the
    first attempt may still be running here (a ``Truncate`` or an ``Open``
    that truncates waits for the storage chains). Run side by side, the two
    could both act on storage, the first after the client has moved on (a
    cut landing after the file's next write). :meth:`running` makes the
    retry wait until the first attempt ended; it then finds the first
    attempt's stored result (or, if that attempt failed, runs again).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[str, int], threading.Event] = {}  # set when the attempt ends

    @contextlib.contextmanager
    def running(self, key: tuple[str, int]) -> Iterator[None]:
        """Hold ``key`` (client id, request id) for the block, after any attempt holding it."""
        while True:
            with self._lock:
                done = self._running.get(key)
                if done is None:
                    done = self._running[key] = threading.Event()
                    break
            done.wait()
        try:
            yield
        finally:
            with self._lock:
                del self._running[key]
            done.set()
