"""What every namespace operation runs against: one transaction and its caller.

An :class:`OpContext` lives for one attempt of one operation. It wraps the
:class:`~emberfs.metaserver.store.kv.Transaction`, the caller's credentials, the
time of the attempt and the namespace's environment (id allocators, chain
table, storage callbacks), and offers typed accessors for inodes, directory
entries, sessions and the GC queue. It also counts the inodes the attempt
creates and drops, which the namespace applies to its counters once the
transaction has committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from emberfs.common.errors import Internal, InvalidArgument
from emberfs.metaserver.clustermgr import gcqueue
from emberfs.metaserver.fs import cuts, inodecounts, quota, records
from emberfs.metaserver.fs.leases import Leases
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine, Transaction, run_transaction
from emberfs.proto import common_pb2

MAX_CLIENT_ID_BYTES = 256
MAX_GROUPS = 64


@dataclass(frozen=True)
class Credentials:
    """Who is asking: uid, primary gid and supplementary groups."""

    uid: int
    gid: int
    groups: frozenset[int]

    @classmethod
    def from_request(cls, ctx: common_pb2.RequestContext) -> Credentials:
        """The credentials of a request (uid 0 when the request carries none)."""
        if len(ctx.groups) > MAX_GROUPS:
            raise InvalidArgument(f"more than {MAX_GROUPS} supplementary groups")
        if len(ctx.client_id.encode("utf-8", "surrogateescape")) > MAX_CLIENT_ID_BYTES:
            raise InvalidArgument(f"client id longer than {MAX_CLIENT_ID_BYTES} bytes")
        if "\0" in ctx.client_id:
            raise InvalidArgument("NUL in client id")
        return cls(ctx.uid, ctx.gid, frozenset(ctx.groups))

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


class IdAllocator:
    """Hands out increasing 64-bit ids from a ``CONF`` counter, in reserved blocks.

    Each block of ``block`` ids is reserved by its own small transaction, so
    the operations that take ids never touch (and never conflict on) the
    counter. Ids are never reused; a restart skips the rest of a block.
    """

    def __init__(self, engine: KVEngine, name: str, *, first: int = 1, block: int = 1024):
        self._engine = engine
        self._key = keys.config_key(name)
        self._first = first
        self._block = block
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0

    def _reserve(self, txn: Transaction) -> int:
        start = max(records.decode_counter(txn.get(self._key)), self._first)
        txn.put(self._key, records.encode_counter(start + self._block))
        return start

    def next(self) -> int:
        """The next unused id."""
        with self._lock:
            if self._next >= self._end:
                start = run_transaction(self._engine, self._reserve)
                self._next, self._end = start, start + self._block
            value = self._next
            self._next += 1
            return value


@dataclass
class NamespaceEnv:
    """The parts of the namespace that operations use besides the transaction."""

    clock: Callable[[], int]
    chain_table: Callable[[], list[int]]
    truncate_chunks: Callable[[common_pb2.InodeAttr, int, int], None] | None
    default_layout: common_pb2.Layout
    inode_ids: IdAllocator
    seeds: IdAllocator
    session_ids: IdAllocator
    leases: Leases
    shared_counts: bool = False  # inode counts kept in the store (inodecounts), not in memory
    paths: object = None  # lookup.PathCache where reads are round trips, else None
    trash_days: float = 0.0  # days removed entries stay in the trash (0: removal deletes)
    quota_cache: object = None  # quota.UsageCache where this metaserver owns the store, else None


@dataclass
class OpContext:
    """One attempt of one operation: transaction, caller, time and environment."""

    txn: Transaction
    creds: Credentials
    env: NamespaceEnv
    now: int
    client_id: str = ""
    delta: dict[int, int] = field(default_factory=dict)  # FileType -> inodes added
    gc_queued: list[int] = field(default_factory=list)  # ids of the GC items queued
    cuts: list[int] = field(default_factory=list)  # inodes whose chunk cut was recorded
    detached: list[int] = field(default_factory=list)  # directories detached for slicing
    shard: int = field(default_factory=inodecounts.pick_shard)  # of the stored inode counts
    quota_seen: dict[int, tuple[int, int]] = field(default_factory=dict)  # quota.seen_usage
    quota_added: dict[int, list[int]] = field(default_factory=dict)  # quota usage it changed

    def _counted(self, file_type: int, n: int) -> None:
        self.delta[file_type] = self.delta.get(file_type, 0) + n
        if self.env.shared_counts:
            inodecounts.add(self.txn, self.shard, {file_type: n})

    # inodes -------------------------------------------------------------

    def get_inode(self, inode: int) -> common_pb2.InodeAttr | None:
        raw = self.txn.get(keys.inode_key(inode))
        return None if raw is None else records.decode_inode(raw)

    def load_inode(self, inode: int) -> common_pb2.InodeAttr:
        """An inode that a directory entry or session refers to (Internal if absent)."""
        attr = self.get_inode(inode)
        if attr is None:
            raise Internal(f"inode {inode} is referenced but missing")
        return attr

    def put_inode(self, attr: common_pb2.InodeAttr) -> None:
        self.txn.put(keys.inode_key(attr.inode), records.encode_inode(attr))

    def new_inode(self, file_type: int, mode: int) -> common_pb2.InodeAttr:
        """A fresh inode owned by the caller (not yet stored)."""
        attr = common_pb2.InodeAttr(
            inode=self.env.inode_ids.next(),
            type=file_type,
            mode=mode & 0o7777,
            uid=self.creds.uid,
            gid=self.creds.gid,
            mtime_ns=self.now,
            ctime_ns=self.now,
            crtime_ns=self.now,
            nlink=1,
        )
        self._counted(file_type, 1)
        return attr

    def delete_inode(self, attr: common_pb2.InodeAttr) -> None:
        self.txn.delete(keys.inode_key(attr.inode))
        self.txn.delete(keys.xattr_key(attr.inode))  # a blind delete: no read, no conflict
        self._counted(attr.type, -1)
        quota.deleted(self, attr)
        if attr.type == common_pb2.DIRECTORY:
            self.txn.delete(keys.dir_guard_key(attr.inode))
        elif attr.type == common_pb2.FILE:
            self.txn.delete(keys.session_guard_key(attr.inode))
            cuts.delete(self.txn, attr.inode)  # the GC queue takes all its chunks

    # directory entries ----------------------------------------------------

    def get_dentry(self, parent: int, name: str) -> records.Dentry | None:
        raw = self.txn.get(keys.dentry_key(parent, name))
        return None if raw is None else records.decode_dentry(raw)

    def put_dentry(self, parent: int, name: str, attr: common_pb2.InodeAttr) -> None:
        """Add or replace an entry, and move the directory's entry guard."""
        self.txn.put(keys.dentry_key(parent, name), records.encode_dentry(attr.inode, attr.type))
        self.txn.put(keys.dir_guard_key(parent), records.new_guard_value())
        if self.env.paths is not None:  # the next walk's guess (see lookup.PathCache)
            self.env.paths.found(parent, name, attr.inode)

    def delete_dentry(self, parent: int, name: str) -> None:
        self.txn.delete(keys.dentry_key(parent, name))
        if self.env.paths is not None:
            self.env.paths.found(parent, name, None)

    def entries(self, directory: int, start_after: str | None = None, limit: int | None = None):
        """(name, Dentry) pairs of a directory in name order."""
        prefix = keys.dentry_prefix(directory)
        after = prefix if start_after is None else keys.dentry_key(directory, start_after)
        for key, raw in self.txn.scan_prefix(prefix, start_after=after, limit=limit):
            yield keys.dentry_name(key), records.decode_dentry(raw)

    def is_empty_dir(self, directory: int) -> bool:
        """True when a directory has no entries; reads its guard, so a racing insert conflicts."""
        self.txn.get(keys.dir_guard_key(directory))
        return next(iter(self.entries(directory, limit=1)), None) is None

    # write sessions -------------------------------------------------------

    def sessions_of(self, inode: int) -> list[records.Session]:
        """The open write sessions of a file; reads its guard, so a racing open conflicts."""
        guard = keys.session_guard_key(inode)
        self.txn.get(guard)
        return [records.decode_session(key, raw) for key, raw in self.txn.scan_prefix(guard, guard)]

    def get_session(self, inode: int, session_id: int) -> bytes | None:
        return self.txn.get(keys.session_key(inode, session_id))

    def add_session(self, inode: int) -> int:
        """Open a write session on ``inode``; its lease starts now."""
        session_id = self.env.session_ids.next()
        self.txn.put(
            keys.session_key(inode, session_id),
            records.encode_session(self.client_id, self.now),
        )
        self.txn.put(keys.session_guard_key(inode), records.new_guard_value())
        self.env.leases.renewed(inode, session_id)
        return session_id

    def end_session(self, inode: int, session_id: int) -> None:
        self.txn.delete(keys.session_key(inode, session_id))
        self.txn.put(keys.session_guard_key(inode), records.new_guard_value())

    # chunk cuts -----------------------------------------------------------

    def cut_chunks(self, attr: common_pb2.InodeAttr, length: int) -> None:
        """Record that ``attr``'s chunks are to be cut to ``length`` (see :mod:`.cuts`).

        The namespace has storage cut them once the operation has committed.
        """
        if self.env.truncate_chunks is not None:
            cuts.put(self.txn, attr.inode, length)
            self.cuts.append(attr.inode)

    def before_growth(self, inode: int) -> None:
        """Raise :class:`~.cuts.CutPending` while ``inode``'s chunks wait for a cut."""
        cuts.require_none(self.txn, inode)

    # garbage collection ---------------------------------------------------

    def queue_gc(self, attr: common_pb2.InodeAttr) -> None:
        """Queue the chunks of a removed file for deletion on storage."""
        self.gc_queued.append(gcqueue.add(self.txn, attr))
