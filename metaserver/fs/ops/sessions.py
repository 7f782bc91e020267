"""Open, Sync and Close: write sessions and exact file lengths.

A write open (OPEN_WRITE, OPEN_APPEND or OPEN_TRUNCATE) records a session
(``SESS`` + inode + session id) and returns its id; the client writes chunks
to storage directly and reports the file's exact length with Sync (session
stays) or Close (session ends). While any session is open an unlinked file
keeps its inode; the Close that ends the last session of an unlinked file
queues its chunks for garbage collection and drops the inode.

Sessions are leases: the client renews the sessions of its open files with
RenewSessions, and a session not renewed for the metaserver's session
timeout is ended by :func:`expire` like a Close without a length. The file
keeps the length of its last Sync or Close: data a writer put on storage
after that is not counted, as a writer that dies before fsync or close
loses its unsynced length. Whether a lease ran out is judged on the
metaserver's monotonic clock (:mod:`emberfs.metaserver.fs.leases`); the wall
clock times in the session record are for people to read.
"""

from __future__ import annotations

from collections.abc import Callable

from emberfs.common import extents
from emberfs.common.errors import InvalidArgument, IsADirectory, NotFound, PermissionDenied
from emberfs.metaserver.fs import access, dataversion, lookup, quota, records
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.fs.ops import create, remove, stat
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine
from emberfs.proto import common_pb2, meta_pb2

ALL_FLAGS = (
    meta_pb2.OPEN_WRITE
    | meta_pb2.OPEN_CREATE
    | meta_pb2.OPEN_EXCLUSIVE
    | meta_pb2.OPEN_TRUNCATE
    | meta_pb2.OPEN_APPEND
)
WRITE_FLAGS = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_APPEND | meta_pb2.OPEN_TRUNCATE
MAX_LENGTH = (1 << 63) - 1
MAX_RENEW = 65536  # sessions in one RenewSessions call


def is_write_open(flags: int) -> bool:
    """True when an open with ``flags`` starts a write session."""
    return bool(flags & WRITE_FLAGS)


def is_mutating_open(flags: int) -> bool:
    """True when an open with ``flags`` may change the namespace."""
    return bool(flags & (WRITE_FLAGS | meta_pb2.OPEN_CREATE))


def check_flags(flags: int) -> None:
    """InvalidArgument for open flags no open accepts."""
    if flags & ~ALL_FLAGS:
        raise InvalidArgument(f"unknown open flags {flags & ~ALL_FLAGS:#x}")
    if flags & meta_pb2.OPEN_EXCLUSIVE and not flags & meta_pb2.OPEN_CREATE:
        raise InvalidArgument("OPEN_EXCLUSIVE needs OPEN_CREATE")


def validate_length(length: int) -> None:
    if length > MAX_LENGTH:
        raise InvalidArgument(f"length {length} is too large")


def open_file(op: OpContext, req: meta_pb2.OpenRequest) -> meta_pb2.OpenResponse:
    """Open a path: attributes, layout and size in one round trip.

    Read opens need read permission, write opens write permission (not
    checked on a file this call created). OPEN_TRUNCATE of a non-empty file
    commits the length 0 with a pending cut of its chunks (the namespace has
    storage cut them before it answers); any other write open waits for a
    cut still pending (:mod:`emberfs.metaserver.fs.cuts`). Opening a directory
    for write gives IsADirectory.
    """
    flags = req.flags
    check_flags(flags)
    write = is_write_open(flags)
    if not write and not flags & meta_pb2.OPEN_CREATE:
        return meta_pb2.OpenResponse(attr=_open_for_read(op, req.path))
    created = False
    if flags & meta_pb2.OPEN_CREATE:
        attr, created = create.create_file(
            op, req.path, req.mode, bool(flags & meta_pb2.OPEN_EXCLUSIVE), count_quota=not write
        )
    else:
        attr = lookup.resolve(op, req.path, follow=True).require(req.path)
    if attr.type == common_pb2.DIRECTORY:
        if write:
            raise IsADirectory(f"is a directory: {req.path}")
        access.check(attr, op.creds, access.READ, req.path)
        return meta_pb2.OpenResponse(attr=attr)
    if not created:
        access.check(attr, op.creds, access.WRITE if write else access.READ, req.path)
    if not write:
        return meta_pb2.OpenResponse(attr=attr)
    if flags & meta_pb2.OPEN_TRUNCATE and attr.size > 0:
        op.cut_chunks(attr, 0)
        extents.resize(attr, 0, hole=False)
        attr.mtime_ns = attr.ctime_ns = op.now
        quota.settled(op, attr, others=attr.writers > 0)
    elif not created:
        op.before_growth(attr.inode)  # its writes must not land before a pending cut
    quota.opened(op, attr, req.reserve if req.HasField("reserve") else None, created)
    session_id = op.add_session(attr.inode)
    dataversion.writer_opened(attr, op.now)  # readers' caches step aside until it ends
    op.put_inode(attr)
    return meta_pb2.OpenResponse(attr=attr, session_id=session_id, created=created)


def _open_for_read(op: OpContext, path: str) -> common_pb2.InodeAttr:
    """What a read-only open of ``path`` returns: its attributes, once read permission holds."""
    attr = lookup.resolve(op, path, follow=True).require(path)
    access.check(attr, op.creds, access.READ, path)
    return attr


def batch_open(op: OpContext, req: meta_pb2.BatchOpenRequest) -> meta_pb2.BatchOpenResponse:
    """Read-only opens of many paths in one call; each result has the attributes or an errno.

    A path gets what :func:`open_file` with flags 0 gives it (a directory
    included), so a client can open a list of files with one round trip.
    """
    out = meta_pb2.BatchOpenResponse()
    if len(req.paths) <= stat.MAX_BATCH:
        lookup.prefetch_paths(op, req.paths)
    stat.per_path(req.paths, lambda p: _open_for_read(op, p), out.results)
    return out


def session_file(op: OpContext, inode: int, session_id: int) -> common_pb2.InodeAttr:
    attr = op.get_inode(inode)
    if attr is None:
        raise NotFound(f"no inode {inode}")
    if op.get_session(inode, session_id) is None:
        raise InvalidArgument(f"no write session {session_id} on inode {inode}")
    return attr


def authorize(op: OpContext, req: meta_pb2.AuthorizeRequest) -> common_pb2.InodeAttr:
    """The file a fresh chunk capability is asked for, once the caller may have it.

    Read access (``session_id`` 0) needs read permission on the file; write
    access needs the caller's own open write session on it (the session's
    client id is the caller's) and write permission. The namespace's caller
    signs the capability (:class:`emberfs.metaserver.service.MetaServicer`).
    """
    attr = op.get_inode(req.inode)
    if attr is None:
        raise NotFound(f"no inode {req.inode}")
    if req.session_id:
        key = keys.session_key(req.inode, req.session_id)
        raw = op.get_session(req.inode, req.session_id)
        if raw is None:
            raise InvalidArgument(f"no write session {req.session_id} on inode {req.inode}")
        if records.decode_session(key, raw).client_id != op.client_id:
            raise PermissionDenied(f"write session {req.session_id} is another client's")
        access.check(attr, op.creds, access.WRITE, f"inode {req.inode}")
        return attr
    if attr.type != common_pb2.FILE:
        raise InvalidArgument(f"inode {req.inode} is not a file")
    access.check(attr, op.creds, access.READ, f"inode {req.inode}")
    return attr


def sync(op: OpContext, req: meta_pb2.SyncRequest) -> meta_pb2.SyncResponse:
    """Set the exact length and mtime (0: now) of a file open for write."""
    validate_length(req.length)
    attr = session_file(op, req.inode, req.session_id)
    if req.length > attr.size:
        op.before_growth(attr.inode)
    quota.recharge(op, attr, max(req.length, attr.quota_charged), check=True)
    extents.resize(attr, req.length, hole=False)
    attr.mtime_ns = req.mtime_ns or op.now
    attr.ctime_ns = op.now
    dataversion.changed(attr, op.now)
    op.put_inode(attr)
    return meta_pb2.SyncResponse(attr=attr)


def close(op: OpContext, req: meta_pb2.CloseRequest) -> meta_pb2.CloseResponse:
    """End a write session; with ``wrote`` set the exact length and mtime first."""
    validate_length(req.length)
    attr = session_file(op, req.inode, req.session_id)
    others = [s for s in op.sessions_of(req.inode) if s.session_id != req.session_id]
    op.end_session(req.inode, req.session_id)
    if req.wrote:
        if req.length > attr.size:
            op.before_growth(attr.inode)
        quota.recharge(op, attr, max(req.length, attr.quota_charged), check=True)
        extents.resize(attr, req.length, hole=False)
        attr.mtime_ns = attr.ctime_ns = op.now
    quota.settled(op, attr, others=bool(others))
    # even a session that reports no write may have sent chunks (a writer that died)
    dataversion.writer_closed(attr, op.now)
    if attr.nlink == 0 and not others:
        remove.discard(op, attr)
    else:
        op.put_inode(attr)
    return meta_pb2.CloseResponse(attr=attr)


def renew(op: OpContext, req: meta_pb2.RenewSessionsRequest) -> meta_pb2.RenewSessionsResponse:
    """Renew the leases of write sessions; report those that no longer exist.

    Touches only the session records themselves (not the session guards),
    so renewing never conflicts with opens, creates or other renewals. The
    lease of each session found is renewed before the commit, and the
    record's rewrite makes an expiry that read it before conflict.
    """
    if len(req.sessions) > MAX_RENEW:
        raise InvalidArgument(f"more than {MAX_RENEW} sessions in one renewal")
    expired = []
    seen: set[tuple[int, int]] = set()
    for ref in req.sessions:
        ident = (ref.inode, ref.session_id)
        if ident in seen:
            continue
        seen.add(ident)
        key = keys.session_key(ref.inode, ref.session_id)
        raw = op.txn.get(key)
        if raw is None:
            expired.append(meta_pb2.SessionRef(inode=ref.inode, session_id=ref.session_id))
            continue
        session = records.decode_session(key, raw)
        op.env.leases.renewed(ref.inode, ref.session_id)
        # the record always changes (a metaserver that judges leases sees a renewal so)
        renewed = max(op.now, session.renewed_ns + 1)
        op.txn.put(key, records.encode_session(session.client_id, session.since_ns, renewed))
    return meta_pb2.RenewSessionsResponse(expired=expired)


def stored(engine: KVEngine) -> list[records.Session]:
    """Every open write session in the store (a snapshot scan)."""
    return [
        records.decode_session(key, raw)
        for key, raw in engine.scan_prefix(keys.SESSION)
        if keys.is_session_key(key)
    ]


def expire(
    op: OpContext, inode: int, session_id: int, lapsed: Callable[[records.Session], bool]
) -> records.Session | None:
    """End one session if its lease ran out: a Close without a length.

    ``lapsed(session)`` tells whether the lease ran out; it is asked once the
    session's record has been read (see :mod:`emberfs.metaserver.fs.leases`).
    Returns the ended session, or None when it was closed or renewed in the
    meantime. The file keeps its recorded length; the last session of an
    unlinked file queues its chunks for garbage collection and drops the
    inode, as :func:`close` does.
    """
    key = keys.session_key(inode, session_id)
    raw = op.txn.get(key)
    if raw is None:
        return None
    session = records.decode_session(key, raw)
    if not lapsed(session):
        return None
    attr = op.get_inode(inode)
    if attr is None:
        op.end_session(inode, session_id)
        return session
    close(op, meta_pb2.CloseRequest(inode=inode, session_id=session_id, wrote=False))
    return session
