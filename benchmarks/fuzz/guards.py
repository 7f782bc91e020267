"""Which inputs would change real state (and are replaced by others, counted as guarded)."""

from __future__ import annotations

import re
import urllib.parse
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError, Message

from emberfs.common.auth import SERVER
from emberfs.common.framing import Op

from .frames import REQUESTS, server_views
from .scratch import SCRATCH_DIR, SCRATCH_INODE

if TYPE_CHECKING:
    from .grpcinputs import Method


def changes_real_chunks(payload: bytes) -> bool:
    """Whether a frame of ``payload`` with a server credential writes or cuts a real chunk."""
    for op, auth, meta in server_views(payload):
        if auth[:1] != bytes([SERVER]) or op not in (Op.WRITE, Op.TRUNCATE, Op.WRITE_BATCH):
            continue
        try:
            req = REQUESTS[Op(op)].FromString(meta)
        except DecodeError:
            continue
        if op == Op.WRITE_BATCH:
            inodes = [w.chunk.inode for w in req.writes]
        else:
            inodes = [req.chunk.inode if op == Op.WRITE else req.inode]
        if any(inode < SCRATCH_INODE for inode in inodes):
            return True
    return False


META_READ_ONLY = frozenset(
    {
        "Stat",
        "BatchStat",
        "BatchOpen",
        "List",
        "Readlink",
        "StatFs",
        "Ping",
        "Authorize",
        # KV caches: a lookup changes a cache's recency and counters, never its blocks
        "KvOpen",
        "KvLookup",
        "KvList",
        "KvStats",
    }
)

KV_CHANGES = frozenset({"KvReserve", "KvCommit", "KvDelete", "KvClear"})  # by cache id
NO_SERVER_CREDENTIAL = frozenset({"RegisterNode", "Heartbeat", "SyncDone"})
PATH_FIELDS = frozenset({"path", "paths", "src", "dst"})


def scratch_path(path: str) -> bool:
    """Whether ``path`` names something strictly inside :data:`SCRATCH_DIR`."""
    parts = [p for p in path.split("/") if p]
    return len(parts) >= 2 and parts[0] == SCRATCH_DIR[1:]


def confined_target(target: str) -> bool:
    """Whether a symlink made in the scratch directory with ``target`` points inside it."""
    parts = target.split("/")
    if ".." in parts:
        return False
    if not target.startswith("/"):
        return True
    names = [p for p in parts if p and p != "."]
    return bool(names) and names[0] == SCRATCH_DIR[1:]


def grpc_safe(method: Method, msg: Message, protected: frozenset[int], credential: str) -> bool:
    """Whether ``msg``, sent with a credential that may change state, leaves real state alone.

    RegisterNode, Heartbeat and SyncDone are for no server credential at all (the admin
    token is refused them, as every token is).
    """
    name = method.name
    if method.service == "MetaService":
        if name in META_READ_ONLY or name == "RenewSessions":
            return True
        if name == "Open":
            return msg.flags == 0 or scratch_path(msg.path)
        if name in ("Sync", "Close"):
            return msg.inode not in protected
        if name == "BatchClose":
            return all(item.inode not in protected for item in msg.items)
        if name == "BatchCreate":
            return all(scratch_path(item.path) for item in msg.items)
        if name in KV_CHANGES:
            return msg.cache_id not in protected
        for fd in msg.DESCRIPTOR.fields:
            if fd.name in PATH_FIELDS:
                value = getattr(msg, fd.name)
                values = list(value) if fd.is_repeated else [value]
                if not all(scratch_path(v) for v in values):
                    return False
        return name != "Symlink" or confined_target(msg.target)
    if name in NO_SERVER_CREDENTIAL:
        return credential != "server"
    if name in ("RemoveChunks", "ReportLostChunk"):
        return msg.inode == 0 or msg.inode >= SCRATCH_INODE
    if name == "AckGC":
        return all(g >= SCRATCH_INODE for g in msg.gc_ids)
    return True


STEER_TARGET = re.compile(r"/targets/(.*)/(offline|drain)")


def harmless_target_id(segment: str) -> bool:
    """Whether a target id in a path can name no existing target, however it is parsed."""
    if not any(ch.isnumeric() for ch in segment):
        return True
    return re.fullmatch(r"-?[1-9][0-9]{6,30}", segment) is not None


def rest_safe(method: str, target: str, admin: bool) -> bool:
    """Whether a request with the admin token leaves the cluster working (see the module doc)."""
    if not admin:
        return True
    path, _, query = target.partition("?")
    decoded = urllib.parse.unquote(path)
    m = STEER_TARGET.search(decoded)
    if m is not None and not harmless_target_id(m.group(1)):
        return False
    if "layouts" in decoded and method not in ("GET", "HEAD", "OPTIONS"):
        values = [
            v for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True) if k == "path"
        ]
        names = [p for p in values[0].split("/") if p] if len(values) == 1 else []
        return bool(names) and names[0] == SCRATCH_DIR[1:]
    return True
