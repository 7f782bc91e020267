"""Every key prefix of the metadata store, in one table.

All state lives in one keyspace; a 4-byte prefix says what a key holds.
Integer ids inside keys are big-endian where range scans must follow numeric
order, and little-endian where only point lookups happen and spreading
neighbouring ids across the keyspace is the goal (inode keys, as in 3FS).
"""

from __future__ import annotations

import struct

# namespace
INODE = b"INOD"  # INOD + inode id (u64 LE)            -> Inode record
DENTRY = b"DENT"  # DENT + parent id (u64 BE) + name    -> DirEntry record
#                  DENT + directory id (u64 BE)         -> entry guard (dir_guard_key)
XATTR = b"XATR"  # XATR + inode id (u64 BE)            -> the inode's extended attributes
# write sessions and idempotency
SESSION = b"SESS"  # SESS + inode id (u64 BE) + session id (u64 BE) -> Session record
#                   SESS + inode id (u64 BE)             -> session guard (session_guard_key)
IDEMPOTENT = b"IDEM"  # IDEM + client id + 0x00 + request id (u64 BE) -> cached result
# chunk cuts of shrinking truncations that storage may not hold yet
CUT = b"CUTS"  # CUTS + inode id (u64 BE)             -> PendingCut record
# garbage collection of removed files' chunks
GC = b"GCQU"  # GCQU + gc id (u64 BE)                -> GCItem (cluster.proto), gc id = inode id
GC_ACK = b"GCAK"  # GCAK + gc id (u64 BE) + target id (u32 BE) -> b"" (target dropped the chunks)
# cluster manager
NODE = b"NODE"  # NODE + node id (utf-8)              -> node record
TARGET = b"TRGT"  # TRGT + target id (u32 BE)         -> target record
CHAIN = b"CHAN"  # CHAN + chain id (u32 BE)           -> chain record
# client tokens (identities an administrator creates and revokes)
TOKEN = b"TOKN"  # TOKN + token id (utf-8)            -> token record (JSON)
#                 TOKN                                  -> token guard (token_guard_key)
# counters and settings
CONFIG = b"CONF"  # CONF + name                       -> value
# the cluster manager's leader (etcd: bound to the leading metaserver's lease)
LEADER = b"LEAD"  # LEAD                               -> LeaderInfo (JSON)
# subtrees a recursive remove detached, to be deleted in slices
TRASH = b"TRSH"  # TRSH + inode id (u64 BE)            -> b"" (the detached directory)
# removed entries kept in the users' trash (emberfs.metaserver.fs.ops.trash)
RECYCLED = b"RBIN"  # RBIN + inode id (u64 BE)         -> trash entry record (JSON)
# directory quotas (emberfs.metaserver.fs.quota); a quota's id is its directory's inode id
QUOTA = b"QUOT"  # QUOT + directory id (u64 BE)       -> quota record (limits, realm above, path)
QUOTA_USAGE = b"QUSE"  # QUSE + directory id (u64 BE) + shard (u8) -> bytes, inodes (two i64 LE)
# KV caches (emberfs.metaserver.kvcache.index); a cache id is its directory's inode id (u64 BE)
KV_CACHE = b"KVCC"  # KVCC + cache id                  -> KvCacheRecord (kvcache.proto)
KV_ENTRY = b"KVCE"  # KVCE + cache id + key            -> index entry (kvcache.entries.Entry)
KV_RECENT = b"KVCR"  # KVCR + cache id + stamp (u64 BE) + key -> b"" (least recently used first)
KV_FREE = b"KVCF"  # KVCF + cache id + slot (u64 BE)   -> b"" (a slot given back)
KV_FILL = b"KVCH"  # KVCH + cache id                   -> next untouched slab (u64 BE)
#                   KVCH + cache id + slab (u64 BE)    -> slots of that slab handed out (u64 BE)
#                   KVCH + cache id + "F"              -> b"" once every slot was handed out
KV_WRITER = b"KVCW"  # KVCW + cache id + client id      -> the writer's slab (u64 BE)
KV_STATS = b"KVCS"  # KVCS + cache id + shard (u8)     -> counters (kvcache.entries.Counters)
# POSIX locks (emberfs.metaserver.fs.locktable)
LOCK = b"LOCK"  # LOCK + inode id (u64 BE)             -> the file's locks (meta_pb2.FileLocks)
LOCK_LEASE = b"LKLS"  # LKLS + lease id (u64 BE)       -> lock lease record
LOCK_HELD = b"LKHD"  # LKHD + lease id (u64 BE) + inode id (u64 BE) -> b"" (the lease holds locks)

ALL_PREFIXES = (
    INODE,
    DENTRY,
    XATTR,
    SESSION,
    IDEMPOTENT,
    CUT,
    GC,
    GC_ACK,
    NODE,
    TARGET,
    CHAIN,
    TOKEN,
    CONFIG,
    LEADER,
    TRASH,
    RECYCLED,
    QUOTA,
    QUOTA_USAGE,
    KV_CACHE,
    KV_ENTRY,
    KV_RECENT,
    KV_FREE,
    KV_FILL,
    KV_WRITER,
    KV_STATS,
    LOCK,
    LOCK_LEASE,
    LOCK_HELD,
)

# names of the CONF keys
NEXT_INODE = "next_inode"  # namespace id counters (u64 LE), reserved in blocks
NEXT_SEED = "next_seed"
NEXT_SESSION = "next_session"
NEXT_LOCK_LEASE = "next_lock_lease"
NEXT_TARGET = "cluster.next_target_id"  # cluster manager counters (u64 BE)
NEXT_CHAIN = "cluster.next_chain_id"
ROUTING_VERSION = "cluster.routing_version"
DRAINS = "cluster.drains"  # JSON {drained target id: replacement target id}
FENCED = "cluster.fenced"  # JSON [target ids held offline until their node registers again]
SCRUB = "cluster.scrub"  # JSON {"paused": bool, "start": int}: the operator's scrub control
INODE_COUNTS = "inode_counts."  # + shard (3 digits): inodes by type (shared stores only)

_U64_LE = struct.Struct("<Q")
_U64_BE = struct.Struct(">Q")
_U32_BE = struct.Struct(">I")
_U64_BE_PAIR = struct.Struct(">QQ")


def inode_key(inode: int) -> bytes:
    return INODE + _U64_LE.pack(inode)


def dentry_prefix(parent: int) -> bytes:
    return DENTRY + _U64_BE.pack(parent)


def dentry_key(parent: int, name: str) -> bytes:
    return dentry_prefix(parent) + name.encode("utf-8", "surrogateescape")


def dentry_name(key: bytes) -> str:
    return key[len(DENTRY) + 8 :].decode("utf-8", "surrogateescape")


def dir_guard_key(directory: int) -> bytes:
    """The entry guard of a directory: its entry prefix with an empty name.

    Names are never empty and never start with NUL, so the guard sorts
    before every entry of the directory.
    """
    return dentry_prefix(directory)


def xattr_key(inode: int) -> bytes:
    return XATTR + _U64_BE.pack(inode)


def session_prefix(inode: int) -> bytes:
    return SESSION + _U64_BE.pack(inode)


def session_key(inode: int, session_id: int) -> bytes:
    return session_prefix(inode) + _U64_BE.pack(session_id)


def session_guard_key(inode: int) -> bytes:
    """The session guard of a file: its session prefix alone."""
    return session_prefix(inode)


def is_session_key(key: bytes) -> bool:
    """True for the key of a session record, False for a session guard."""
    return len(key) == len(SESSION) + 16


def session_ids(key: bytes) -> tuple[int, int]:
    """``(inode id, session id)`` of a session record's key."""
    start = len(SESSION)
    return _U64_BE_PAIR.unpack(key[start : start + 16])


def idempotent_prefix(client_id: str) -> bytes:
    """The start of every key of ``client_id``'s stored results."""
    return IDEMPOTENT + client_id.encode() + b"\x00"


def idempotent_key(client_id: str, request_id: int) -> bytes:
    return idempotent_prefix(client_id) + _U64_BE.pack(request_id)


def idempotent_request_id(key: bytes) -> int:
    """The request id of a stored result's key (client ids hold no NUL)."""
    return _U64_BE.unpack(key[-8:])[0]


def cut_key(inode: int) -> bytes:
    return CUT + _U64_BE.pack(inode)


def cut_inode(key: bytes) -> int:
    """The inode id of a pending cut's key."""
    return _U64_BE.unpack(key[len(CUT) :])[0]


def gc_key(gc_id: int) -> bytes:
    return GC + _U64_BE.pack(gc_id)


def gc_id(key: bytes) -> int:
    """The gc id of a GC item's key."""
    return _U64_BE.unpack(key[len(GC) :])[0]


def gc_ack_prefix(gc_id: int) -> bytes:
    """The start of every acknowledgement key of a GC item."""
    return GC_ACK + _U64_BE.pack(gc_id)


def gc_ack_key(gc_id: int, target_id: int) -> bytes:
    return gc_ack_prefix(gc_id) + _U32_BE.pack(target_id)


def gc_ack_target(key: bytes) -> int:
    """The target id of a GC acknowledgement's key."""
    return _U32_BE.unpack(key[len(GC_ACK) + 8 :])[0]


def node_key(node_id: str) -> bytes:
    return NODE + node_id.encode()


def target_key(target_id: int) -> bytes:
    return TARGET + _U32_BE.pack(target_id)


def chain_key(chain_id: int) -> bytes:
    return CHAIN + _U32_BE.pack(chain_id)


def token_key(token_id: str) -> bytes:
    return TOKEN + token_id.encode()


def token_guard_key() -> bytes:
    """The token guard: the prefix alone, before every token (token ids are never empty).

    Every token creation changes it, so two creations that both checked a
    name was free conflict instead of both committing.
    """
    return TOKEN


def token_id_of(key: bytes) -> str:
    """The token id of a token record's key."""
    return key[len(TOKEN) :].decode()


def config_key(name: str) -> bytes:
    return CONFIG + name.encode()


def trash_key(inode: int) -> bytes:
    return TRASH + _U64_BE.pack(inode)


def trash_inode(key: bytes) -> int:
    """The inode id of a detached subtree's key."""
    return _U64_BE.unpack(key[len(TRASH) :])[0]


def recycled_key(inode: int) -> bytes:
    return RECYCLED + _U64_BE.pack(inode)


def recycled_inode(key: bytes) -> int:
    """The inode id of a trash entry's key."""
    return _U64_BE.unpack(key[len(RECYCLED) :])[0]


def quota_key(directory: int) -> bytes:
    return QUOTA + _U64_BE.pack(directory)


def quota_directory(key: bytes) -> int:
    """The directory id of a quota record's key."""
    return _U64_BE.unpack(key[len(QUOTA) :])[0]


def quota_usage_prefix(directory: int) -> bytes:
    return QUOTA_USAGE + _U64_BE.pack(directory)


def quota_usage_key(directory: int, shard: int) -> bytes:
    return quota_usage_prefix(directory) + bytes([shard])


def lock_key(inode: int) -> bytes:
    return LOCK + _U64_BE.pack(inode)


def lock_lease_key(lease_id: int) -> bytes:
    return LOCK_LEASE + _U64_BE.pack(lease_id)


def lock_lease_id(key: bytes) -> int:
    """The lease id of a lock lease's key."""
    return _U64_BE.unpack(key[len(LOCK_LEASE) :])[0]


def lock_held_prefix(lease_id: int) -> bytes:
    return LOCK_HELD + _U64_BE.pack(lease_id)


def lock_held_key(lease_id: int, inode: int) -> bytes:
    return lock_held_prefix(lease_id) + _U64_BE.pack(inode)


def lock_held_inode(key: bytes) -> int:
    """The inode id of a lease's held-locks mark."""
    return _U64_BE.unpack(key[len(LOCK_HELD) + 8 :])[0]
