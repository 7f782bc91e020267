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
# write sessions and idempotency
SESSION = b"SESS"  # SESS + inode id (u64 BE) + session id (u64 BE) -> Session record
IDEMPOTENT = b"IDEM"  # IDEM + client id + 0x00 + request id (u64 BE) -> cached result
# garbage collection of removed files' chunks
GC = b"GCQU"  # GCQU + gc id (u64 BE)                -> GCItem (cluster.proto), gc id = inode id
GC_ACK = b"GCAK"  # GCAK + gc id (u64 BE) + target id (u32 BE) -> b"" (target dropped the chunks)
# cluster manager
NODE = b"NODE"  # NODE + node id (utf-8)              -> node record
TARGET = b"TRGT"  # TRGT + target id (u32 BE)         -> target record
CHAIN = b"CHAN"  # CHAN + chain id (u32 BE)           -> chain record
# counters and settings
CONFIG = b"CONF"  # CONF + name                       -> value

ALL_PREFIXES = (INODE, DENTRY, SESSION, IDEMPOTENT, GC, GC_ACK, NODE, TARGET, CHAIN, CONFIG)

_U64_LE = struct.Struct("<Q")
_U64_BE = struct.Struct(">Q")
_U32_BE = struct.Struct(">I")


def inode_key(inode: int) -> bytes:
    return INODE + _U64_LE.pack(inode)


def dentry_prefix(parent: int) -> bytes:
    return DENTRY + _U64_BE.pack(parent)


def dentry_key(parent: int, name: str) -> bytes:
    return dentry_prefix(parent) + name.encode("utf-8", "surrogateescape")


def dentry_name(key: bytes) -> str:
    return key[len(DENTRY) + 8 :].decode("utf-8", "surrogateescape")


def session_prefix(inode: int) -> bytes:
    return SESSION + _U64_BE.pack(inode)


def session_key(inode: int, session_id: int) -> bytes:
    return session_prefix(inode) + _U64_BE.pack(session_id)


def idempotent_key(client_id: str, request_id: int) -> bytes:
    return IDEMPOTENT + client_id.encode() + b"\x00" + _U64_BE.pack(request_id)


def gc_key(gc_id: int) -> bytes:
    return GC + _U64_BE.pack(gc_id)


def gc_ack_key(gc_id: int, target_id: int) -> bytes:
    return GC_ACK + _U64_BE.pack(gc_id) + _U32_BE.pack(target_id)


def node_key(node_id: str) -> bytes:
    return NODE + node_id.encode()


def target_key(target_id: int) -> bytes:
    return TARGET + _U32_BE.pack(target_id)


def chain_key(chain_id: int) -> bytes:
    return CHAIN + _U32_BE.pack(chain_id)


def config_key(name: str) -> bytes:
    return CONFIG + name.encode()
