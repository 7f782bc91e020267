"""Directory quotas: realms, usage counted in the operation's own transaction, limits checked.

A directory carries a quota when it has a ``QUOT`` record (its limits, the
quota directory above it, the path it was set on) and ``has_quota`` in its
inode. Every inode below it, down to the next quota directory, names it as
its ``quota_realm``; the realm of a quota directory's own inode is the quota
above it, so realms nest and a quota counts everything below it, nested
quotas included.

Usage (bytes, inodes) lives in :data:`SHARDS` counter records per quota
(``QUSE``), like the stored inode counts (:mod:`.inodecounts`): an operation
adds its change to one shard in its own commit, so usage is exact and
durable with the operation, and two creates in one quota conflict only when
they pick the same shard. A limit is checked against the sum of the shards
as committed (read from the store by a read that an optimistic transaction
does not track, or kept in memory by a metaserver that owns its store:
:class:`UsageCache`), with the operation's own changes added. Within the last
quarter of a limit the shards are read again one by one through the
transaction, tracked, so that operations racing one another there conflict
and retry: none can pass a limit because another did not see it.

Bytes are the lengths of regular files, or more while a write session holds
space it reserved (``quota_charged``, :func:`grant`): a writer reserves
before its chunk writes go out, so a limit holds on what reaches storage, not
only on the lengths reported afterwards. Inodes are files, directories and
symlinks. An entry in the trash still counts until it is purged.

Moves keep usage exact by rule rather than by walking trees: a file (one
link) or symlink that is renamed or restored into another realm takes its
usage with it; a directory, a file with several links, or a hard link across
realms gives EXDEV, as CephFS does (``mv`` then copies). So the links of a
file are always in one realm.
"""

from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emberfs.common.errors import CrossDevice, QuotaExceeded
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2

if TYPE_CHECKING:
    from emberfs.metaserver.fs.opcontext import OpContext

SHARDS = 8
_RECORD = struct.Struct("<QQQ")  # max bytes, max inodes, the quota directory above (0: none)
USAGE_FORMAT = struct.Struct("<qq")  # a usage shard: bytes, inodes
#: a write open in a realm reserves up to this much (one chunk at most) of the room left ...
OPEN_SHARE = 16  # ... divided by this, so many concurrent opens never take it all
#: within the last 1/NEAR of a limit its usage is read so that racing changes conflict
NEAR = 4
#: seconds a metaserver trusts the quota usage it keeps in memory before it reads it again
USAGE_TTL = 5.0
#: a reservation past what is asked grows with the file, up to this much
MAX_AHEAD = 256 << 20


@dataclass
class Quota:
    """One quota's record: limits (0: none), the quota above it, the path it was set on."""

    directory: int
    max_bytes: int
    max_inodes: int
    parent: int
    path: str


def encode(q: Quota) -> bytes:
    return _RECORD.pack(q.max_bytes, q.max_inodes, q.parent) + q.path.encode(
        "utf-8", "surrogateescape"
    )


def decode(directory: int, raw: bytes) -> Quota:
    max_bytes, max_inodes, parent = _RECORD.unpack_from(raw)
    path = raw[_RECORD.size :].decode("utf-8", "surrogateescape")
    return Quota(directory, max_bytes, max_inodes, parent, path)


class UsageCache:
    """Each quota's committed usage, kept by a metaserver that owns its store (as it keeps its
    inode counts): read from the store when first needed, then moved by the changes of every
    operation it commits, and read again after :data:`USAGE_TTL` seconds (so that a repair by
    ``emberfs fsck`` shows). Like a read of the store, it lags the operations in flight."""

    def __init__(self, ttl: float | None = None) -> None:
        self._ttl = USAGE_TTL if ttl is None else ttl
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[list[int], float]] = {}

    def get(self, directory: int) -> tuple[int, int] | None:
        with self._lock:
            entry = self._entries.get(directory)
            if entry is None or time.monotonic() - entry[1] > self._ttl:
                return None
            return entry[0][0], entry[0][1]

    def put(self, directory: int, used: tuple[int, int]) -> None:
        with self._lock:
            self._entries[directory] = ([used[0], used[1]], time.monotonic())

    def applied(self, added: dict[int, list[int]]) -> None:
        """A committed operation changed these quotas' usage."""
        with self._lock:
            for directory, (d_bytes, d_inodes) in added.items():
                entry = self._entries.get(directory)
                if entry is not None:
                    entry[0][0] += d_bytes
                    entry[0][1] += d_inodes

    def forget(self, directory: int) -> None:
        with self._lock:
            self._entries.pop(directory, None)


def _uncache(op: OpContext, directory: int) -> None:
    if op.env.quota_cache is not None:
        op.env.quota_cache.forget(directory)


def realm_below(attr: common_pb2.InodeAttr) -> int:
    """The realm of entries made in directory ``attr``."""
    return attr.inode if attr.has_quota else attr.quota_realm


def get(op: OpContext, directory: int) -> Quota | None:
    raw = op.txn.get(keys.quota_key(directory))
    return None if raw is None else decode(directory, raw)


def put(op: OpContext, q: Quota) -> None:
    op.txn.put(keys.quota_key(q.directory), encode(q))


def stored(op: OpContext) -> list[Quota]:
    """Every quota record (a scan)."""
    return [decode(keys.quota_directory(k), raw) for k, raw in op.txn.scan_prefix(keys.QUOTA)]


def usage(op: OpContext, directory: int, tracked: bool = False) -> tuple[int, int]:
    """(bytes, inodes) below a quota directory: the sum of its shards (``tracked``: read one
    by one, so that a change of any of them before this commits makes it retry)."""
    if tracked:
        raws = (op.txn.get(keys.quota_usage_key(directory, s)) for s in range(SHARDS))
        return add_up(raw for raw in raws if raw is not None)
    return add_up(raw for _, raw in op.txn.scan_prefix(keys.quota_usage_prefix(directory)))


def seen_usage(op: OpContext, directory: int) -> tuple[int, int]:
    """:func:`usage` as committed, read once per operation, with the operation's own changes.

    Where this metaserver owns the store, from its :class:`UsageCache`; else from the store
    itself, by a read that the transaction does not track (and that does not merge its writes).
    """
    seen = op.quota_seen.get(directory)
    if seen is None:
        cache = op.env.quota_cache
        seen = None if cache is None else cache.get(directory)
        if seen is None:
            raws = op.txn.engine.get_many(
                [keys.quota_usage_key(directory, s) for s in range(SHARDS)]
            )
            seen = add_up(raw for raw in raws if raw is not None)
            if cache is not None:
                cache.put(directory, seen)
        op.quota_seen[directory] = seen
    added = op.quota_added.get(directory, (0, 0))
    return seen[0] + added[0], seen[1] + added[1]


def add_up(shards) -> tuple[int, int]:
    """The (bytes, inodes) that stored usage shards add up to."""
    total_bytes = total_inodes = 0
    for raw in shards:
        b, i = USAGE_FORMAT.unpack(raw)
        total_bytes += b
        total_inodes += i
    return total_bytes, total_inodes


def _add(op: OpContext, directory: int, d_bytes: int, d_inodes: int) -> None:
    added = op.quota_added.setdefault(directory, [0, 0])
    added[0] += d_bytes
    added[1] += d_inodes
    key = keys.quota_usage_key(directory, op.shard % SHARDS)
    raw = op.txn.get(key)
    b, i = (0, 0) if raw is None else USAGE_FORMAT.unpack(raw)
    op.txn.put(key, USAGE_FORMAT.pack(b + d_bytes, i + d_inodes))


def chain(op: OpContext, realm: int, stop: int = 0) -> list[Quota]:
    """The quotas over an inode of ``realm``, nearest first, up to (not including) ``stop``.

    Ends where a record is missing: a quota directory that was deleted took
    what was below it out of the quotas above (:func:`dropped`).
    """
    out = []
    while realm and realm != stop:
        q = get(op, realm)
        if q is None:
            break
        out.append(q)
        realm = q.parent
    return out


def room(op: OpContext, quotas: list[Quota]) -> tuple[int | None, int | None]:
    """The bytes and inodes that still fit under every quota of ``quotas`` (None: no limit)."""
    free_bytes = free_inodes = None
    for q in quotas:
        if not (q.max_bytes or q.max_inodes):
            continue
        used_bytes, used_inodes = seen_usage(op, q.directory)
        if _near(q.max_bytes, used_bytes) or _near(q.max_inodes, used_inodes):
            used_bytes, used_inodes = usage(op, q.directory, tracked=True)
        if q.max_bytes:
            left = q.max_bytes - used_bytes
            free_bytes = left if free_bytes is None else min(free_bytes, left)
        if q.max_inodes:
            left = q.max_inodes - used_inodes
            free_inodes = left if free_inodes is None else min(free_inodes, left)
    return free_bytes, free_inodes


def _near(limit: int, used: int) -> bool:
    return bool(limit) and limit - used < limit // NEAR


def charge(
    op: OpContext, realm: int, d_bytes: int, d_inodes: int, *, check: bool = True, stop: int = 0
) -> None:
    """Add usage to every quota over ``realm`` (up to ``stop``); QuotaExceeded (EDQUOT) when
    ``check`` and a growth would pass a limit."""
    _charge(op, chain(op, realm, stop), d_bytes, d_inodes, check=check)


def _charge(op: OpContext, quotas: list[Quota], d_bytes: int, d_inodes: int, *, check: bool):
    if check and (d_bytes > 0 or d_inodes > 0):
        free_bytes, free_inodes = room(op, quotas)
        if d_bytes > 0 and free_bytes is not None and d_bytes > free_bytes:
            raise QuotaExceeded(f"disk quota exceeded: {_over(op, quotas, 'bytes')}")
        if d_inodes > 0 and free_inodes is not None and d_inodes > free_inodes:
            raise QuotaExceeded(f"disk quota exceeded: {_over(op, quotas, 'inodes')}")
    for q in quotas:
        _add(op, q.directory, d_bytes, d_inodes)


def _over(op: OpContext, quotas: list[Quota], what: str) -> str:
    for q in quotas:
        limit = q.max_bytes if what == "bytes" else q.max_inodes
        used = usage(op, q.directory)[0 if what == "bytes" else 1]
        if limit:
            return f"{q.path} holds {used} of {limit} {what}"
    return what


def inserted(
    op: OpContext, parent: common_pb2.InodeAttr, attr: common_pb2.InodeAttr, count: bool = True
) -> None:
    """A new inode in directory ``parent``: it joins the parent's realm (one more inode, unless
    the caller counts it itself: a write open, :func:`opened`)."""
    realm = realm_below(parent)
    attr.quota_realm = realm
    if realm and count:
        charge(op, realm, 0, 1)


def deleted(op: OpContext, attr: common_pb2.InodeAttr) -> None:
    """An inode is deleted for good: its usage leaves its quotas (and a quota of its own goes)."""
    if attr.quota_realm:
        charge(op, attr.quota_realm, -attr.quota_charged, -1, check=False)
    if attr.has_quota:
        dropped(op, attr)


def dropped(op: OpContext, attr: common_pb2.InodeAttr) -> None:
    """Delete the quota of directory ``attr``; what is still counted below it leaves the
    quotas above it (entries of a tree being deleted in slices, for one)."""
    used_bytes, used_inodes = usage(op, attr.inode)
    if attr.quota_realm and (used_bytes or used_inodes):
        charge(op, attr.quota_realm, -used_bytes, -used_inodes, check=False)
    forget(op, attr)


def forget(op: OpContext, attr: common_pb2.InodeAttr) -> None:
    """Delete the quota record and usage of directory ``attr``."""
    _uncache(op, attr.inode)
    op.txn.delete(keys.quota_key(attr.inode))
    for key, _ in list(op.txn.scan_prefix(keys.quota_usage_prefix(attr.inode))):
        op.txn.delete(key)
    attr.has_quota = False


def set_usage(op: OpContext, directory: int, used_bytes: int, used_inodes: int) -> None:
    """Start a quota's usage at a count (its first shard)."""
    _uncache(op, directory)
    op.txn.put(keys.quota_usage_key(directory, 0), USAGE_FORMAT.pack(used_bytes, used_inodes))


def recharge(op: OpContext, attr: common_pb2.InodeAttr, charged: int, *, check: bool) -> None:
    """Set the bytes a file's realm counts for it to ``charged`` (QuotaExceeded when ``check``
    and it grows past a limit). Outside a realm nothing is counted."""
    if not attr.quota_realm:
        attr.quota_charged = 0
        return
    delta = charged - attr.quota_charged
    if delta:
        charge(op, attr.quota_realm, delta, 0, check=check and delta > 0)
    attr.quota_charged = charged


def grant(op: OpContext, attr: common_pb2.InodeAttr, end: int) -> None:
    """Reserve room for a write session's writes up to ``end`` (QuotaExceeded when it does not
    fit), and some more as the file grows (less as the quota fills)."""
    if not attr.quota_realm or end <= attr.quota_charged:
        return
    need = end - attr.quota_charged
    free_bytes, _ = room(op, chain(op, attr.quota_realm))
    if free_bytes is not None and need > free_bytes:
        raise QuotaExceeded(
            f"disk quota exceeded: {_over(op, chain(op, attr.quota_realm), 'bytes')}"
        )
    ahead = min(max(attr.layout.chunk_size, end), MAX_AHEAD)  # the file doubles, at most
    if free_bytes is not None:
        ahead = min(ahead, (free_bytes - need) // 2)
    recharge(op, attr, end + max(ahead, 0), check=False)


def opened(
    op: OpContext, attr: common_pb2.InodeAttr, reserve: int | None = None, created: bool = False
) -> None:
    """A write open: reserve ``reserve`` bytes past the length (checked), or, when None, a
    share of the room left, at most one chunk, so most small files need no reservation call.
    ``created``: the open made the file, whose inode is counted here (one charge for both)."""
    if not attr.quota_realm:
        return
    quotas = chain(op, attr.quota_realm)
    if reserve is not None:
        charged = max(attr.quota_charged, attr.size + reserve)
    else:
        free_bytes, _ = room(op, quotas)
        ahead = attr.layout.chunk_size
        if free_bytes is not None:
            ahead = min(ahead, max(free_bytes, 0) // OPEN_SHARE)
        charged = max(attr.quota_charged, attr.size + ahead)
    _charge(op, quotas, charged - attr.quota_charged, int(created), check=True)
    attr.quota_charged = charged


def settled(op: OpContext, attr: common_pb2.InodeAttr, others: bool) -> None:
    """A write session ended: with no ``others`` open, the file counts its length alone."""
    charged = max(attr.size, attr.quota_charged) if others else attr.size
    recharge(op, attr, charged, check=False)


def moved(op: OpContext, attr: common_pb2.InodeAttr, realm: int, what: str) -> None:
    """Entry ``attr`` moves into a directory of ``realm`` (rename, restore); its usage moves
    with a file or symlink of one link, anything else across realms is EXDEV."""
    if realm == attr.quota_realm:
        return
    if attr.type == common_pb2.DIRECTORY or attr.nlink > 1:
        kind = "a directory" if attr.type == common_pb2.DIRECTORY else "a file with hard links"
        raise CrossDevice(f"cannot move {kind} across quota directories: {what}")
    old = [q.directory for q in chain(op, attr.quota_realm)]
    new = [q.directory for q in chain(op, realm)]
    common = next((d for d in old if d in new), 0)
    if attr.quota_realm:
        charge(op, attr.quota_realm, -attr.quota_charged, -1, check=False, stop=common)
    attr.quota_realm = realm
    attr.quota_charged = file_bytes(attr) if realm else 0
    if realm:
        charge(op, realm, attr.quota_charged, 1, stop=common)


def same_realm(a: int, b: int, what: str) -> None:
    """EXDEV unless two directories' realms agree (hard links, exchanges)."""
    if a != b:
        raise CrossDevice(f"across quota directories: {what}")


def renamed(op: OpContext, src: str, dst: str, swapped: bool = False) -> None:
    """A directory moved from path ``src`` to ``dst`` (``swapped``: and the one at ``dst`` to
    ``src``): quotas set on it or below it follow."""
    moves = [(src.rstrip("/"), dst.rstrip("/"))]
    if swapped:
        moves.append(moves[0][::-1])
    for q in stored(op):
        for old, new in moves:
            if q.path == old or q.path.startswith(old + "/"):
                q.path = new + q.path[len(old) :]
                put(op, q)
                break


def file_bytes(attr: common_pb2.InodeAttr) -> int:
    """The bytes a file counts with when a realm starts counting it."""
    return attr.size if attr.type == common_pb2.FILE else 0
