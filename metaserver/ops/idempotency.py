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
  requests of that client; records per active client stay bounded;
- by age: :func:`prune_expired` deletes records older than
  :data:`MAX_AGE_NS` (the namespace runs it in bounded slices every
  minute), which covers clients that went away.
"""

from __future__ import annotations

from google.protobuf.message import Message

from emberfs.common.errors import InvalidArgument
from emberfs.metaserver import keys, schema
from emberfs.metaserver.kv import KVEngine, Transaction, prefix_end

WINDOW = 65536
RETRY_HORIZON_NS = 120 * 10**9
PRUNE_PER_STORE = 8
MAX_AGE_NS = 600 * 10**9


def client_prefix(client_id: str) -> bytes:
    return keys.IDEMPOTENT + client_id.encode() + b"\x00"


def _request_id(key: bytes, prefix: bytes) -> int:
    return int.from_bytes(key[len(prefix) : len(prefix) + 8], "big")


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
    record = schema.decode_idempotent(raw)
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
) -> None:
    """Record ``response`` as the result of the request, and prune the client's window."""
    txn.put(
        keys.idempotent_key(client_id, request_id),
        schema.encode_idempotent(method, now, response.SerializeToString()),
    )
    prefix = client_prefix(client_id)
    for key, raw in txn.engine.scan(prefix, prefix_end(prefix), PRUNE_PER_STORE):
        behind = _request_id(key, prefix) <= request_id - WINDOW
        if not behind and now - schema.decode_idempotent(raw).stored_ns <= RETRY_HORIZON_NS:
            break
        txn.delete(key)


def prune_expired(
    engine: KVEngine,
    now: int,
    *,
    max_age_ns: int = MAX_AGE_NS,
    start: bytes | None = None,
    limit: int = 10000,
) -> bytes | None:
    """Delete records older than ``max_age_ns`` among ``limit`` records from ``start``.

    Returns the key to resume from, or None once the end of the table was reached.
    """
    begin = start or keys.IDEMPOTENT
    doomed: set[bytes] = set()
    last = None
    seen = 0
    for key, raw in engine.scan(begin, prefix_end(keys.IDEMPOTENT), limit):
        seen += 1
        last = key
        if now - schema.decode_idempotent(raw).stored_ns > max_age_ns:
            doomed.add(key)
    if doomed:
        engine.write({}, doomed)
    if seen < limit or last is None:
        return None
    return last + b"\x00"
