"""The metadata store on etcd: one :class:`~emberfs.metaserver.store.kv.KVEngine` that many metaservers share.

``emberfs metaserver --kv etcd://h1:2379,h2:2379,h3:2379[/prefix]`` keeps the
whole keyspace of :mod:`emberfs.metaserver.store.keys` in an etcd cluster, every key
behind the prefix (default ``/emberfs/``), so that any number of metaservers
serve one namespace and a metaserver can die without taking the file system
with it. The etcd v3 API is called through the gRPC bindings the ``aetcd``
package carries (generated from etcd's own ``.proto`` files), on synchronous
channels: the metaserver serves its calls on threads.

Transactions (:class:`EtcdTransaction`) are optimistic like the local
engines': the first read fixes a revision and every later read of the
transaction is made at that revision, so a transaction sees one state of the
store (a read-only one needs no commit at all); each read records the key's
``mod_revision`` (0 when absent); writes are buffered; the commit is one etcd
transaction whose compares are the read set and whose success branch is the
writes. A failed compare is a :class:`~emberfs.metaserver.store.kv.Conflict`, which
:func:`~emberfs.metaserver.store.kv.run_transaction` retries. Range reads that a
decision depends on are guarded by keys that every change of the range
writes (a directory's entry guard, see :mod:`emberfs.metaserver.fs.records`),
and each directory's entries are one contiguous range (``DENT`` + parent id),
so a listing is one paged range read.

etcd bounds a transaction (``--max-txn-ops``, 128 by default, counted for the
compares and the writes separately; ``--max-request-bytes``, 1.5 MiB): a
transaction that would exceed either raises
:class:`~emberfs.metaserver.store.kv.TransactionTooLarge` before anything is sent,
at its 129th write or, for its reads, at the commit (one that only reads
commits nothing and is not bounded). The URL's ``max_txn_ops`` parameter tells the engine
a cluster's own limit (``etcd://h:2379/?max_txn_ops=1024``).

Failures: a call goes to one endpoint and moves to the next when that one is
down, has no leader or times out, within one deadline for the whole call
(``timeout`` in the URL, seconds, default 5). When no endpoint answers in time
(etcd has lost its quorum) the call raises
:class:`~emberfs.common.errors.Unavailable` naming the store, which clients
retry and finally see as ``EAGAIN``. A compacted or future revision is a
conflict (the transaction runs again); a full database (etcd's space quota) is
:class:`~emberfs.common.errors.NoSpace`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import grpc

from emberfs.metaserver.store.etcdclient import REQUEST_MARGIN, EtcdClient, EtcdSettings, etcd_rpc
from emberfs.metaserver.store.kv import (
    Conflict,
    KVEngine,
    Transaction,
    TransactionTooLarge,
    prefix_end,
)

log = logging.getLogger(__name__)

PAGE = 1000  # keys a range read asks for at once


class EtcdEngine(KVEngine):
    """The KV interface on an etcd cluster, every key behind ``settings.prefix``.

    Parameters
    ----------
    settings : EtcdSettings or str
        Where the cluster is and how to talk to it (an ``etcd://`` URL is parsed).
    """

    shared = True

    def __init__(self, settings: EtcdSettings | str) -> None:
        if isinstance(settings, str):
            settings = EtcdSettings.parse(settings)
        self.settings = settings
        self.prefix = settings.prefix
        self.max_txn_ops = settings.max_txn_ops
        self.max_request_bytes = settings.max_request_bytes
        self.client = EtcdClient(settings.endpoints, settings.timeout)
        self._end = prefix_end(self.prefix)

    def __repr__(self) -> str:
        return f"EtcdEngine({self.settings.url!r})"

    @property
    def name(self) -> str:
        return self.settings.url

    # keys ------------------------------------------------------------------
    def full_key(self, key: bytes) -> bytes:
        """The etcd key of a metadata key."""
        return self.prefix + key

    def _strip(self, key: bytes) -> bytes:
        return key[len(self.prefix) :]

    # calls -----------------------------------------------------------------
    def call(self, service: str, method: str, request, **options):
        """One etcd call (see :meth:`EtcdClient.call`; its failures typed)."""
        return self.client.call(service, method, request, **options)

    def read(self, key: bytes, revision: int = 0):
        """``(value or None, mod_revision, store revision)`` of ``key`` (at ``revision``, 0: now).

        A read at a given revision is served by the member without a round of
        its leader's (``serializable``): the member served the read that fixed
        the revision, so it holds it; one that does not (a call moved to
        another member) answers "future revision", a conflict.
        """
        rpc, _ = etcd_rpc()
        resp = self.call(
            "KV",
            "Range",
            rpc.RangeRequest(key=self.full_key(key), revision=revision, serializable=revision != 0),
        )
        if resp.kvs:
            kv = resp.kvs[0]
            return kv.value, kv.mod_revision, resp.header.revision
        return None, 0, resp.header.revision

    def read_many(self, keys: list[bytes], revision: int = 0):
        """``([(value or None, mod_revision) per key], store revision)``, in one round trip
        per :attr:`max_txn_ops` keys (a transaction of range reads), at ``revision`` (0: now)."""
        rpc, _ = etcd_rpc()
        out: list[tuple[bytes | None, int]] = []
        for i in range(0, len(keys), self.max_txn_ops):
            part = keys[i : i + self.max_txn_ops]
            resp = self.call(
                "KV",
                "Txn",
                rpc.TxnRequest(
                    success=[
                        rpc.RequestOp(
                            request_range=rpc.RangeRequest(key=self.full_key(k), revision=revision)
                        )
                        for k in part
                    ]
                ),
            )
            revision = revision or resp.header.revision
            for answer in resp.responses:
                kvs = answer.response_range.kvs
                out.append((kvs[0].value, kvs[0].mod_revision) if kvs else (None, 0))
        return out, revision

    def get(self, key: bytes) -> bytes | None:
        return self.read(key)[0]

    def scan(
        self,
        start: bytes,
        end: bytes | None,
        limit: int | None = None,
        *,
        revision: int = 0,
        on_revision: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs in ``[start, end)`` at one revision (``revision``, or the first page's).

        ``on_revision(r)`` is told the revision once the first page fixed it.
        """
        rpc, _ = etcd_rpc()
        begin = self.full_key(start)
        stop = self._end if end is None else self.full_key(end)
        left = limit
        while left is None or left > 0:
            page = PAGE if left is None else min(PAGE, left)
            resp = self.call(
                "KV",
                "Range",
                rpc.RangeRequest(
                    key=begin,
                    range_end=stop,
                    limit=page,
                    revision=revision,
                    serializable=revision != 0,
                ),
            )
            if not revision:
                revision = resp.header.revision
                if on_revision is not None:
                    on_revision(revision)
            for kv in resp.kvs:
                yield self._strip(kv.key), kv.value
            if left is not None:
                left -= len(resp.kvs)
            if not resp.more or not resp.kvs:
                return
            begin = resp.kvs[-1].key + b"\x00"

    def count_prefix(self, prefix: bytes) -> int:
        rpc, _ = etcd_rpc()
        end = prefix_end(prefix)
        resp = self.call(
            "KV",
            "Range",
            rpc.RangeRequest(
                key=self.full_key(prefix),
                range_end=self._end if end is None else self.full_key(end),
                count_only=True,
            ),
        )
        return resp.count

    def transaction(self) -> EtcdTransaction:
        return EtcdTransaction(self)

    # writes ----------------------------------------------------------------
    def _ops(self, puts: dict[bytes, bytes], deletes: set[bytes]) -> list:
        rpc, _ = etcd_rpc()
        ops = [
            rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self.full_key(k)))
            for k in sorted(deletes)
        ]
        ops += [
            rpc.RequestOp(request_put=rpc.PutRequest(key=self.full_key(k), value=v))
            for k, v in sorted(puts.items())
        ]
        return ops

    def check_size(self, reads: int, writes: int, nbytes: int = 0) -> None:
        """Raise :class:`TransactionTooLarge` for a transaction etcd would refuse."""
        if reads > self.max_txn_ops or writes > self.max_txn_ops:
            raise TransactionTooLarge(
                f"the operation reads {reads} and writes {writes} keys; the metadata store "
                f"(etcd) takes at most {self.max_txn_ops} of each in one transaction"
            )
        if nbytes > self.max_request_bytes - REQUEST_MARGIN:
            raise TransactionTooLarge(
                f"the operation writes {nbytes} bytes; the metadata store (etcd) takes at "
                f"most {self.max_request_bytes - REQUEST_MARGIN} in one transaction"
            )

    def txn(
        self,
        compares: list,
        puts: dict[bytes, bytes],
        deletes: set[bytes],
        *,
        timeout: float | None = None,
    ) -> bool:
        """One etcd transaction: the writes if every compare holds; whether they were applied."""
        rpc, _ = etcd_rpc()
        nbytes = sum(len(k) + len(v) for k, v in puts.items()) + sum(len(k) for k in deletes)
        self.check_size(len(compares), len(puts) + len(deletes), nbytes)
        resp = self.call(
            "KV",
            "Txn",
            rpc.TxnRequest(compare=compares, success=self._ops(puts, deletes)),
            timeout=timeout,
        )
        return resp.succeeded

    def write(
        self, puts: dict[bytes, bytes], deletes: set[bytes] | None = None, *, sync: bool = True
    ) -> None:
        """A blind atomic batch (etcd makes every commit durable: ``sync`` is moot)."""
        deletes = set(deletes or ())
        if puts or deletes:
            self.txn([], puts, deletes - set(puts))

    def value_compares(self, reads: dict[bytes, bytes | None]) -> list:
        """Compares that hold while every key of ``reads`` has the value given (None: absent)."""
        rpc, _ = etcd_rpc()
        out = []
        for key, value in reads.items():
            if value is None:
                out.append(
                    rpc.Compare(
                        key=self.full_key(key),
                        target=rpc.Compare.VERSION,
                        result=rpc.Compare.EQUAL,
                        version=0,
                    )
                )
            else:
                out.append(
                    rpc.Compare(
                        key=self.full_key(key),
                        target=rpc.Compare.VALUE,
                        result=rpc.Compare.EQUAL,
                        value=value,
                    )
                )
        return out

    def commit(
        self,
        reads: dict[bytes, bytes | None],
        puts: dict[bytes, bytes],
        deletes: set[bytes],
        sync: bool = True,
        *,
        version: int | None = None,
        mods: dict[bytes, int] | None = None,
    ) -> None:
        """Apply the writes if each key read still holds what was read (:class:`Conflict` if not).

        ``mods`` (a transaction's read set): each key's ``mod_revision`` when it
        was read, compared instead of the values of ``reads``.
        """
        compares = self.value_compares(reads) if mods is None else self.mod_compares(mods)
        if not self.txn(compares, puts, set(deletes) - set(puts)):
            raise Conflict(next(iter(reads), b""))

    def mod_compares(self, mods: dict[bytes, int]) -> list:
        """Compares that hold while no key of ``mods`` changed since its ``mod_revision``."""
        rpc, _ = etcd_rpc()
        return [
            rpc.Compare(
                key=self.full_key(key),
                target=rpc.Compare.MOD,
                result=rpc.Compare.EQUAL,
                mod_revision=mod,
            )
            for key, mod in mods.items()
        ]

    def status(self) -> list[dict]:
        """Each endpoint's member status: ``endpoint``, ``db_size``, ``leader``, ``version``
        (``error`` instead for one that does not answer)."""
        rpc, _ = etcd_rpc()
        out = []
        for index, endpoint in enumerate(self.endpoints):
            try:
                resp = self.client.stub(index, "Maintenance").Status(
                    rpc.StatusRequest(), timeout=self.settings.timeout
                )
            except grpc.RpcError as exc:
                out.append({"endpoint": endpoint, "error": f"{exc.code().name}: {exc.details()}"})
                continue
            out.append(
                {
                    "endpoint": endpoint,
                    "db_size": resp.dbSize,
                    "leader": resp.leader == resp.header.member_id,
                    "version": resp.version,
                }
            )
        return out

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self.settings.endpoints

    def close(self) -> None:
        self.client.close()


class EtcdTransaction(Transaction):
    """A transaction at one etcd revision: reads record ``mod_revision``, the commit compares them."""

    def __init__(self, engine: EtcdEngine) -> None:
        super().__init__(engine)
        self.engine: EtcdEngine = engine
        self.revision = 0  # fixed by the first read
        self.mods: dict[bytes, int] = {}
        self._ahead: dict[bytes, tuple[bytes | None, int]] = {}  # prefetched, not read yet

    def prefetch(self, keys) -> None:
        wanted = [
            k
            for k in dict.fromkeys(keys)
            if k not in self.reads
            and k not in self.puts
            and k not in self.deletes
            and k not in self._ahead
        ]
        if not wanted:
            return
        values, revision = self.engine.read_many(wanted, self.revision)
        self._fix(revision)
        self._ahead.update(zip(wanted, values, strict=True))

    def savepoint(self) -> tuple:
        return (*super().savepoint(), dict(self.mods))

    def rollback(self, savepoint: tuple) -> None:
        *base, mods = savepoint
        super().rollback(tuple(base))
        self.mods = dict(mods)

    def _read(self, key: bytes) -> bytes | None:
        # (no bound here: a transaction that only reads commits nothing, however much it read)
        ahead = self._ahead.pop(key, None)
        if ahead is not None:
            self.mods[key] = ahead[1]
            return ahead[0]
        value, mod, revision = self.engine.read(key, self.revision)
        self.revision = self.revision or revision
        self.mods[key] = mod
        return value

    def _peek(self, key: bytes) -> bytes | None:
        if key in self._ahead:
            return self._ahead[key][0]
        value, _, revision = self.engine.read(key, self.revision)
        self.revision = self.revision or revision
        return value

    def _stored_scan(self, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        return self.engine.scan(start, end, revision=self.revision, on_revision=self._fix)

    def _fix(self, revision: int) -> None:
        """The first read (here a scan's first page) fixes the transaction's revision."""
        self.revision = self.revision or revision

    def put(self, key: bytes, value: bytes) -> None:
        super().put(key, value)
        self._check_writes()

    def delete(self, key: bytes) -> None:
        super().delete(key)
        self._check_writes()

    def _check_writes(self) -> None:
        writes = len(self.puts) + len(self.deletes)
        if writes > self.engine.max_txn_ops:
            self.engine.check_size(len(self.reads), writes)

    def commit(self, sync: bool = True) -> None:
        """Apply the writes if no key read changed since (:class:`Conflict` otherwise)."""
        if not self.puts and not self.deletes:
            return  # every read was made at one revision
        self.engine.commit(self.reads, self.puts, self.deletes, mods=self.mods)


COMPACT_INTERVAL = 300.0  # seconds between two compactions (each keeps the last interval's history)


class Compactor:
    """Compacts the etcd history the metaservers no longer need.

    etcd keeps every version of every key until it is compacted; a
    metaserver's transactions read at one revision for milliseconds only. Each
    call compacts up to the revision the previous call saw, so at least one
    interval of history stays (the leader calls it every :data:`COMPACT_INTERVAL`).
    Compaction frees etcd's index and lets ``etcdctl defrag`` return the space.
    """

    def __init__(self, engine: EtcdEngine) -> None:
        self.engine = engine
        self._seen = 0
        self.compacted = 0

    def __call__(self) -> int:
        """Compact to the revision of the previous call; the revision compacted to (0: none)."""
        rpc, _ = etcd_rpc()
        revision = self.engine.read(b"")[2]
        target, self._seen = self._seen, revision
        if not target or target <= self.compacted:
            return 0
        try:
            self.engine.call("KV", "Compact", rpc.CompactionRequest(revision=target))
        except Conflict:
            pass  # compacted past it already (by another metaserver or an operator)
        self.compacted = target
        return target
