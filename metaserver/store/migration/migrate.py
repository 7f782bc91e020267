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
    gets none. :func:`copied` is that selection.

Refusals (:class:`Refused`, nothing written)
    - a metaserver may run on either store: on etcd the leader key exists
      (a metaserver leads there, or one was killed less than its lease ttl
      ago); on RocksDB the database's lock is held (:class:`StoreInUse`). The
      RocksDB stores stay open, and so locked, for the whole migration, so no
      metaserver can start on them meanwhile;
    - the destination is not empty: any key at all in its keyspace (its
      prefix, on etcd) (:class:`NotEmpty`);
    - the source holds nothing to copy (:class:`EmptySource`);
    - source and destination are one store, or one etcd prefix inside the
      other (:class:`SameStore`);
    - a key and its value are larger than the destination takes in one
      request (etcd's ``--max-request-bytes``) (:class:`TooLarge`).

How
    :func:`plan` checks the refusals and surveys the source: one pass that
    counts its keys and bytes (by prefix), hashes it and finds its largest
    pair. :func:`run` copies it in a second pass and verifies the copy in a
    third. Every pass streams the source in key order (RocksDB: one
    iterator; etcd: range reads of :data:`~emberfs.metaserver.store.etcd.PAGE` keys
    at one revision), so a store of any size goes through in bounded memory.
    Writes go in batches the destination takes: on etcd at most
    ``max_txn_ops`` keys and the request size (less a margin for etcd's
    framing) per transaction, :data:`ETCD_IN_FLIGHT` transactions in flight
    (etcd commits concurrent transactions together); on RocksDB batches of
    :data:`ROCKS_BATCH_KEYS` keys written unsynced, and one WAL sync at the
    end.

Verification
    The checksum of a store (:class:`Tally`) is a SHA-256 over its copied
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

import hashlib
import struct
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emberfs.metaserver.clustermgr.leadership import LeaderInfo
from emberfs.metaserver.fs import inodecounts, records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.etcd import REQUEST_MARGIN, EtcdEngine, EtcdSettings, is_etcd_url
from emberfs.metaserver.store.kv import Conflict, KVEngine, RocksEngine
from emberfs.proto import common_pb2

ROCKSDB_SCHEME = "rocksdb:"
STORE_DIR = "meta"  # the RocksDB store inside a metaserver's --data-dir
ROCKS_BATCH_KEYS = 10_000
ROCKS_BATCH_BYTES = 8 * 1024 * 1024
ETCD_OP_OVERHEAD = 32  # bytes of one put's framing in an etcd request, beyond key and value
ETCD_IN_FLIGHT = 4  # etcd transactions sent at once
SCAN_RESUMES = 8  # times a pass over a store goes on after a conflict of its scan

EXCLUDED = (keys.LEADER, keys.config_key(keys.INODE_COUNTS))
_LENGTHS = struct.Struct(">QQ")


class MigrationError(Exception):
    """The migration could not run or failed; the message says why and what to do."""


class Refused(MigrationError):
    """A check before the copy failed: nothing was written."""


class StoreInUse(Refused):
    """A metaserver may run on the store."""


class NotEmpty(Refused):
    """The destination holds keys already."""


class EmptySource(Refused):
    """The source holds nothing to copy (or does not exist)."""


class SameStore(Refused):
    """Source and destination are one store, or overlap."""


class TooLarge(Refused):
    """A key and its value are larger than the destination takes in one request."""


def copied(key: bytes) -> bool:
    """Whether ``key`` is copied: every key but the leader key and a shared store's inode counts."""
    return not key.startswith(EXCLUDED)


def pairs(engine: KVEngine) -> Iterator[tuple[bytes, bytes]]:
    """The copied pairs of ``engine``'s whole keyspace, in key order, streamed.

    An etcd scan whose revision a member cannot serve (its call moved to a
    member behind the one that fixed the revision, or the revision was
    compacted) is a :class:`~emberfs.metaserver.store.kv.Conflict`: the scan goes on
    after the last key it gave, at a new revision, up to :data:`SCAN_RESUMES`
    times. (No metaserver writes the stores meanwhile; were one to, the
    verification would see it.)
    """
    start = b""
    for attempt in range(SCAN_RESUMES + 1):
        try:
            for key, value in engine.scan(start, None):
                start = key + b"\x00"
                if copied(key):
                    yield key, value
            return
        except Conflict:
            if attempt == SCAN_RESUMES:
                raise


@dataclass
class Tally:
    """Keys, bytes, checksum and inodes by type of a stream of pairs (see the module docstring).

    Attributes
    ----------
    keys, bytes : int
        Pairs added, and the bytes of their keys and values.
    prefixes : dict
        Key prefix (its first 4 bytes) -> ``[keys, bytes]``.
    inodes : dict
        File type -> inode records (``INOD`` keys) of that type.
    largest : int
        Bytes of the largest pair (key and value).
    largest_key : bytes
        Its key.
    """

    keys: int = 0
    bytes: int = 0
    prefixes: dict[bytes, list[int]] = field(default_factory=dict)
    inodes: dict[int, int] = field(default_factory=dict)
    largest: int = 0
    largest_key: bytes = b""
    _hash: Any = field(default_factory=hashlib.sha256, repr=False)

    def add(self, key: bytes, value: bytes) -> None:
        size = len(key) + len(value)
        self._hash.update(_LENGTHS.pack(len(key), len(value)))
        self._hash.update(key)
        self._hash.update(value)
        self.keys += 1
        self.bytes += size
        if size > self.largest:
            self.largest, self.largest_key = size, key
        by_prefix = self.prefixes.setdefault(key[:4], [0, 0])
        by_prefix[0] += 1
        by_prefix[1] += size
        if key.startswith(keys.INODE):
            try:
                file_type = records.decode_inode(value).type
            except Exception as exc:
                raise MigrationError(
                    f"the inode record at key {key!r} cannot be read ({exc}); check the "
                    "store with 'emberfs fsck' on the cluster before moving it"
                ) from None
            self.inodes[file_type] = self.inodes.get(file_type, 0) + 1

    @property
    def sha256(self) -> str:
        """The checksum of the pairs added so far (hex)."""
        return self._hash.hexdigest()

    def same(self, other: Tally) -> bool:
        """The same pairs: equal checksums, key and byte counts."""
        return (self.sha256, self.keys, self.bytes) == (other.sha256, other.keys, other.bytes)


def survey(engine: KVEngine) -> Tally:
    """The :class:`Tally` of ``engine``'s copied pairs (one streamed pass)."""
    tally = Tally()
    for key, value in pairs(engine):
        tally.add(key, value)
    return tally


# stores -------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreLocation:
    """A metadata store as ``emberfs migrate`` names it.

    ``rocksdb:PATH``, PATH a metaserver's ``--data-dir`` (the store is
    ``PATH/meta``), or an ``etcd://`` URL (endpoints, prefix and limits, as
    ``emberfs metaserver --kv`` takes it).
    """

    text: str
    path: Path | None = None
    etcd: EtcdSettings | None = None

    @classmethod
    def parse(cls, text: str) -> StoreLocation:
        """ValueError for anything but ``rocksdb:PATH`` or an ``etcd://`` URL."""
        if is_etcd_url(text):
            return cls(text, etcd=EtcdSettings.parse(text))
        if text.startswith(ROCKSDB_SCHEME):
            path = text[len(ROCKSDB_SCHEME) :]
            if not path:
                raise ValueError("rocksdb: needs the metaserver's data directory (rocksdb:PATH)")
            return cls(text, path=Path(path).expanduser().resolve())
        raise ValueError(f"{text!r} is neither rocksdb:PATH nor an etcd:// URL")

    @property
    def store_dir(self) -> Path:
        """The RocksDB database's directory (``PATH/meta``)."""
        assert self.path is not None
        return self.path / STORE_DIR

    def __str__(self) -> str:
        if self.etcd is not None:
            return f"etcd at {','.join(self.etcd.endpoints)}, prefix {self.etcd.prefix.decode()}"
        return f"RocksDB at {self.store_dir}"

    def overlaps(self, other: StoreLocation) -> bool:
        """One store, or (etcd) one prefix inside the other on a common endpoint."""
        if self.path is not None or other.path is not None:
            return self.path is not None and self.path == other.path
        mine, theirs = self.etcd.prefix, other.etcd.prefix
        return bool(set(self.etcd.endpoints) & set(other.etcd.endpoints)) and (
            mine.startswith(theirs) or theirs.startswith(mine)
        )


_names: weakref.WeakKeyDictionary[KVEngine, str] = weakref.WeakKeyDictionary()


def open_store(location: StoreLocation, *, create: bool) -> KVEngine | None:
    """The engine of ``location``; None for a RocksDB store that does not exist and not ``create``.

    Raises :class:`StoreInUse` when the RocksDB database is locked (a
    metaserver seems to run on it) and :class:`MigrationError` when it
    cannot be opened otherwise.
    """
    if location.etcd is not None:
        engine: KVEngine = EtcdEngine(location.etcd)
        _names[engine] = str(location)
        return engine
    db = location.store_dir
    if not create and not (db / "CURRENT").exists():
        return None
    try:
        engine = RocksEngine(db)
    except Exception as exc:  # rocksdict raises a bare Exception
        if "LOCK" in str(exc):
            raise StoreInUse(
                f"{db} is locked: a metaserver seems to run on it; stop it first ({exc})"
            ) from None
        raise MigrationError(f"cannot open the RocksDB store at {db}: {exc}") from None
    _names[engine] = str(location)
    return engine


def missing_source(location: StoreLocation) -> EmptySource:
    """The refusal of a RocksDB source that does not exist (with a hint when PATH is the store)."""
    hint = ""
    if location.path is not None and (location.path / "CURRENT").exists():
        hint = (
            f"; {location.path} is a RocksDB itself: give the metaserver's data directory "
            f"that holds it (rocksdb:{location.path.parent})"
        )
    return EmptySource(f"the source holds no metadata store: nothing at {location.store_dir}{hint}")


def _describe(engine: KVEngine) -> str:
    """Where a store is, for messages (as :class:`StoreLocation` says it, when it opened it)."""
    name = _names.get(engine)
    if name is not None:
        return name
    if isinstance(engine, EtcdEngine):
        return f"etcd at {','.join(engine.endpoints)}, prefix {engine.prefix.decode()}"
    return type(engine).__name__


def leader_on(engine: KVEngine) -> bytes | None:
    """The leader key's value on ``engine`` (None: no metaserver leads there)."""
    for _, value in engine.scan_prefix(keys.LEADER, limit=1):
        return value
    return None


def _check_idle(engine: KVEngine, role: str) -> None:
    value = leader_on(engine)
    if value is None:
        return
    try:
        leader = LeaderInfo.decode(value)
        who = f"metaserver {leader.id} at {leader.address or '?'}"
    except (ValueError, KeyError, TypeError):
        who = "a metaserver"
    raise StoreInUse(
        f"a metaserver runs on the {role} ({_describe(engine)}): {who} holds the leader key; "
        "stop every metaserver on it first (a killed one's key lapses with its lease, within "
        "seconds)"
    )


def _first_key(engine: KVEngine) -> bytes | None:
    for key, _ in engine.scan(b"", None, limit=1):
        return key
    return None


# batches -------------------------------------------------------------------------


class _Writer:
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


def _request_limit(engine: KVEngine) -> tuple[int, int] | None:
    """``(most bytes a request takes, framing bytes a pair adds)`` of a store with a limit."""
    if isinstance(engine, EtcdEngine):
        return engine.max_request_bytes - REQUEST_MARGIN, len(engine.prefix) + ETCD_OP_OVERHEAD
    return None


# the migration -------------------------------------------------------------------


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
    """Check the refusals and survey the source; its :class:`Tally`.

    ``destination`` None: a RocksDB store that does not exist yet (empty).
    Raises :class:`StoreInUse`, :class:`NotEmpty`, :class:`EmptySource` or
    :class:`TooLarge` (see the module docstring); writes nothing.
    """
    _check_idle(source, "source")
    if destination is not None:
        _check_idle(destination, "destination")
        first = _first_key(destination)
        if first is not None:
            raise NotEmpty(
                f"the destination ({_describe(destination)}) is not empty (its first key is "
                f"{first!r}); migrate into an empty store only"
            )
    planned = survey(source)
    if planned.keys == 0:
        raise EmptySource(f"the source ({_describe(source)}) holds nothing to copy")
    limit = _request_limit(destination) if destination is not None else None
    if limit is not None and planned.largest + limit[1] > limit[0]:
        raise TooLarge(
            f"key {planned.largest_key!r} and its value are {planned.largest} bytes; the "
            f"destination ({_describe(destination)}) takes at most {limit[0] - limit[1]} in one "
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
    Raises :class:`MigrationError` when a write fails (the destination then
    holds a partial copy); a copy that is made but does not verify is a
    :class:`Result` with problems.
    """
    start = time.monotonic()
    result = Result(planned)
    writer = _Writer(destination, progress, planned.keys)
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
            f"the destination ({_describe(destination)}) holds a partial copy: empty it "
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
            if _first_key(dst) is not None:  # made by someone else meanwhile
                raise NotEmpty(f"the destination ({destination}) is not empty")
        return run(src, dst, planned, progress=progress)
    finally:
        for engine in engines:
            engine.close()


def counts_text(by_type: dict[int, int]) -> str:
    """``N files, N directories, N symlinks`` of inodes by file type."""
    names = (
        (common_pb2.FILE, "files"),
        (common_pb2.DIRECTORY, "directories"),
        (common_pb2.SYMLINK, "symlinks"),
    )
    text = ", ".join(f"{by_type.get(t, 0)} {name}" for t, name in names)
    other = sum(n for t, n in by_type.items() if t not in dict(names))
    return text + (f", {other} others" if other else "")


def prefix_name(prefix: bytes) -> str:
    """A key prefix for people: its text when printable, else its repr."""
    try:
        text = prefix.decode("ascii")
    except UnicodeDecodeError:
        return repr(prefix)
    return text if text.isprintable() and text.strip() == text else repr(prefix)
