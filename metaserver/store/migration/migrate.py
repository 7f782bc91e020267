"""Moving a whole metadata store from one engine to another: ``emberfs migrate``.

A cluster's metadata (namespace, write sessions, retry records, cluster
state, GC queue, client tokens, counters) is one keyspace behind
:class:`~emberfs.metaserver.store.kv.KVEngine`, so moving a cluster from RocksDB to
etcd (to run several metaservers) or back is a copy of that keyspace, made
while the cluster is stopped. Storage servers keep their chunks: the target
and chain records move with the rest, and they register again with the same
target ids against the metaserver on the new store.

What is copied
    Every key of the keyspace, whatever its prefix, except what belongs to
    one engine: the leader key (``LEAD``, etcd only, bound to a running
    metaserver's lease) is never copied, and the inode counts of a shared
    store (``CONF`` ``inode_counts.NNN``, see
    :mod:`~emberfs.metaserver.fs.inodecounts`) are not copied but rebuilt with
    :func:`~emberfs.metaserver.fs.inodecounts.recount` once the copy is made on a
    shared destination; a local destination keeps its counts in memory and
    gets none. :func:`~.tally.copied` is that selection.

Refusals (:class:`~.errors.Refused`, nothing written)
    - a metaserver may run on either store: on etcd the leader key exists
      (a metaserver leads there, or one was killed less than its lease ttl
      ago); on RocksDB the database's lock is held (:class:`~.errors.StoreInUse`). The
      RocksDB stores stay open, and so locked, for the whole migration, so no
      metaserver can start on them meanwhile;
    - the destination is not empty: any key at all in its keyspace (its
      prefix, on etcd) (:class:`~.errors.NotEmpty`);
    - the source holds nothing to copy (:class:`~.errors.EmptySource`);
    - source and destination are one store, or one etcd prefix inside the
      other (:class:`~.errors.SameStore`);
    - a key and its value are larger than the destination takes in one
      request (etcd's ``--max-request-bytes``) (:class:`~.errors.TooLarge`).

How
    :func:`plan` checks the refusals and surveys the source: one pass that
    counts its keys and bytes (by prefix), hashes it and finds its largest
    pair. :func:`run` copies it in a second pass and verifies the copy in a
    third. Every pass streams the source in key order (RocksDB: one
    iterator; etcd: range reads of :data:`~emberfs.metaserver.store.etcd.PAGE` keys
    at one revision), so a store of any size goes through in bounded memory.
    Writes go in batches the destination takes: on etcd at most
    ``max_txn_ops`` keys and the request size (less a margin for etcd's
    framing) per transaction, :data:`~.writer.ETCD_IN_FLIGHT` transactions in flight
    (etcd commits concurrent transactions together); on RocksDB batches of
    :data:`~.writer.ROCKS_BATCH_KEYS` keys written unsynced, and one WAL sync at the
    end.

Verification
    The checksum of a store (:class:`~.tally.Tally`) is a SHA-256 over its copied
    pairs in key order, each fed as the key's and the value's lengths (two
    big-endian u64) then the key, then the value, so that no two different
    keyspaces hash alike. After the copy, the source and the destination are
    read back and hashed; the copy is verified when both checksums (and key
    and byte counts) equal the survey's, the inode counts rebuilt on a shared
    destination equal the source's inodes by type, and no leader key has
    appeared on either store. Anything else is a problem of the
    :class:`Result` (``emberfs migrate`` exits 1).

A copy that fails half-way (etcd unreachable, a disk full) leaves a partial
destination, which the next attempt refuses as not empty: empty it first
(``etcdctl del --prefix PREFIX``, or remove the RocksDB directory).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from emberfs.metaserver.fs import inodecounts
from emberfs.metaserver.store.kv import KVEngine
from emberfs.metaserver.store.migration.errors import (
    EmptySource,
    MigrationError,
    NotEmpty,
    SameStore,
    TooLarge,
)
from emberfs.metaserver.store.migration.stores import (
    StoreLocation,
    check_idle,
    describe,
    first_key,
    leader_on,
    missing_source,
    open_store,
)
from emberfs.metaserver.store.migration.tally import Tally, counts_text, pairs, survey
from emberfs.metaserver.store.migration.writer import BatchWriter, request_limit


@dataclass
class Result:
    """What a migration (or a dry run) found and did.

    Attributes
    ----------
    planned : Tally
        The source as surveyed before the copy (a dry run's whole answer).
    dry_run : bool
        Nothing was written.
    copied, source, destination : Tally or None
        What the copy read and wrote; the source and the destination read
        back after it (None in a dry run).
    inode_counts : dict or None
        File type -> inodes, as rebuilt on a shared destination (None otherwise).
    seconds : float
        How long the copy and its verification took.
    problems : list of str
        Why the copy is not verified (empty when it is).
    """

    planned: Tally
    dry_run: bool = False
    copied: Tally | None = None
    source: Tally | None = None
    destination: Tally | None = None
    inode_counts: dict[int, int] | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        """The copy was made and every check of the verification held."""
        return not self.dry_run and self.destination is not None and not self.problems


def plan(source: KVEngine, destination: KVEngine | None) -> Tally:
    """Check the refusals and survey the source; its :class:`~.tally.Tally`.

    ``destination`` None: a RocksDB store that does not exist yet (empty).
    Raises :class:`~.errors.StoreInUse`, :class:`~.errors.NotEmpty`, :class:`~.errors.EmptySource` or
    :class:`~.errors.TooLarge` (see the module docstring); writes nothing.
    """
    check_idle(source, "source")
    if destination is not None:
        check_idle(destination, "destination")
        first = first_key(destination)
        if first is not None:
            raise NotEmpty(
                f"the destination ({describe(destination)}) is not empty (its first key is "
                f"{first!r}); migrate into an empty store only"
            )
    planned = survey(source)
    if planned.keys == 0:
        raise EmptySource(f"the source ({describe(source)}) holds nothing to copy")
    limit = request_limit(destination) if destination is not None else None
    if limit is not None and planned.largest + limit[1] > limit[0]:
        raise TooLarge(
            f"key {planned.largest_key!r} and its value are {planned.largest} bytes; the "
            f"destination ({describe(destination)}) takes at most {limit[0] - limit[1]} in one "
            "request (raise etcd's --max-request-bytes and the URL's max_request_bytes)"
        )
    return planned


def run(
    source: KVEngine,
    destination: KVEngine,
    planned: Tally,
    *,
    progress: Callable[[int, int, int], None] | None = None,
) -> Result:
    """Copy ``source`` into the empty ``destination`` and verify the copy (after :func:`plan`).

    ``progress(keys, bytes, total keys)`` is told what has been written after each batch.
    Raises :class:`~.errors.MigrationError` when a write fails (the destination then
    holds a partial copy); a copy that is made but does not verify is a
    :class:`Result` with problems.
    """
    start = time.monotonic()
    result = Result(planned)
    writer = BatchWriter(destination, progress, planned.keys)
    copy = Tally()
    try:
        for key, value in pairs(source):
            copy.add(key, value)
            writer.add(key, value)
        writer.finish()
    except Exception as exc:
        detail = str(exc) if isinstance(exc, MigrationError) else f"{type(exc).__name__}: {exc}"
        raise MigrationError(
            f"the copy failed after {writer.keys_written} of {planned.keys} keys: {detail}; "
            f"the destination ({describe(destination)}) holds a partial copy: empty it "
            "before trying again"
        ) from exc
    finally:
        writer.close()
    result.copied = copy
    if destination.shared:
        result.inode_counts = inodecounts.recount(destination)
    result.source = survey(source)
    result.destination = survey(destination)
    result.seconds = time.monotonic() - start

    problems = result.problems
    if not (copy.same(planned) and result.source.same(planned)):
        problems.append(
            "the source changed during the migration (did a metaserver run on it?): the "
            "copy is of no one state of it"
        )
    if not result.destination.same(result.source):
        problems.append(
            f"the destination's checksum ({result.destination.sha256}, "
            f"{result.destination.keys} keys) differs from the source's "
            f"({result.source.sha256}, {result.source.keys} keys)"
        )
    if result.inode_counts is not None:
        expected = {t: result.source.inodes.get(t, 0) for t in inodecounts.TYPES}
        counted = {t: result.inode_counts.get(t, 0) for t in inodecounts.TYPES}
        if counted != expected:
            problems.append(
                f"the inode counts rebuilt on the destination ({counts_text(counted)}) differ "
                f"from the source's inodes ({counts_text(expected)})"
            )
    for engine, role in ((source, "source"), (destination, "destination")):
        if leader_on(engine) is not None:
            problems.append(f"a metaserver started on the {role} during the migration")
    return result


def migrate(
    source: KVEngine,
    destination: KVEngine | None,
    *,
    dry_run: bool = False,
    progress: Callable[[int, int, int], None] | None = None,
) -> Result:
    """:func:`plan`, then (unless ``dry_run``) :func:`run`, on open engines.

    ``destination`` may be None in a dry run only (a store that does not exist yet).
    """
    planned = plan(source, destination)
    if dry_run:
        return Result(planned, dry_run=True)
    if destination is None:
        raise ValueError("a migration that writes needs a destination engine")
    return run(source, destination, planned, progress=progress)


def migrate_stores(
    source: StoreLocation,
    destination: StoreLocation,
    *,
    dry_run: bool = False,
    progress: Callable[[int, int, int], None] | None = None,
) -> Result:
    """Open both stores, :func:`migrate`, close them.

    A RocksDB destination is made only once every refusal has been checked
    (and never by a dry run).
    """
    if source.overlaps(destination):
        raise SameStore(f"source and destination are the same store ({source})")
    engines: list[KVEngine] = []
    try:
        src = open_store(source, create=False)
        if src is None:
            raise missing_source(source)
        engines.append(src)
        dst = open_store(destination, create=False)
        if dst is not None:
            engines.append(dst)
        planned = plan(src, dst)
        if dry_run:
            return Result(planned, dry_run=True)
        if dst is None:
            dst = open_store(destination, create=True)
            engines.append(dst)
            if first_key(dst) is not None:  # made by someone else meanwhile
                raise NotEmpty(f"the destination ({destination}) is not empty")
        return run(src, dst, planned, progress=progress)
    finally:
        for engine in engines:
            engine.close()
