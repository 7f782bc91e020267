"""The stores a migration moves between: where one is (:class:`StoreLocation`, a
``rocksdb:PATH`` or an ``etcd://`` URL), opening it, and the checks that no metaserver runs on it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path

from emberfs.metaserver.clustermgr.leadership import LeaderInfo
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.etcd import EtcdEngine
from emberfs.metaserver.store.etcdclient import EtcdSettings, is_etcd_url
from emberfs.metaserver.store.kv import KVEngine, RocksEngine
from emberfs.metaserver.store.migration.errors import (
    EmptySource,
    MigrationError,
    StoreInUse,
)

ROCKSDB_SCHEME = "rocksdb:"
STORE_DIR = "meta"  # the RocksDB store inside a metaserver's --data-dir


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

    Raises :class:`~.errors.StoreInUse` when the RocksDB database is locked (a
    metaserver seems to run on it) and :class:`~.errors.MigrationError` when it
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


def describe(engine: KVEngine) -> str:
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


def check_idle(engine: KVEngine, role: str) -> None:
    value = leader_on(engine)
    if value is None:
        return
    try:
        leader = LeaderInfo.decode(value)
        who = f"metaserver {leader.id} at {leader.address or '?'}"
    except (ValueError, KeyError, TypeError):
        who = "a metaserver"
    raise StoreInUse(
        f"a metaserver runs on the {role} ({describe(engine)}): {who} holds the leader key; "
        "stop every metaserver on it first (a killed one's key lapses with its lease, within "
        "seconds)"
    )


def first_key(engine: KVEngine) -> bytes | None:
    for key, _ in engine.scan(b"", None, limit=1):
        return key
    return None
