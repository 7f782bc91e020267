"""GetXattr, ListXattr, SetXattr and RemoveXattr: extended attributes of an inode.

An inode's attributes are one record (``XATR`` + inode id, see
:mod:`emberfs.metaserver.fs.records`), absent while it has none and deleted
with the inode, so they follow the inode through renames and hard links and
go with its last link. Every change reads the record, so two changes of one
inode's attributes conflict and the later one is retried; a change sets the
inode's ctime.

The rules are Linux's (``fs/xattr.c`` and the capability module):

- names are ``user.*``, ``trusted.*`` or ``security.*`` with something after
  the dot (EINVAL for ``user.`` alone); ``system.*`` (POSIX ACLs) and every
  other namespace are not supported (EOPNOTSUPP);
- ``trusted.*``: uid 0 only (a change EPERM, a read ENODATA, hidden from the
  listing of anyone else); ``security.*``: read by anyone, changed by uid 0;
- ``user.*``: files and directories only (a change of a symlink's EPERM, a
  read ENODATA); a read needs read permission, a change write permission
  (EACCES), and on a sticky directory ownership (EPERM);
- a name is 1 to :data:`MAX_NAME` bytes (ERANGE), a value at most
  :data:`MAX_VALUE` bytes (E2BIG), an inode holds at most :data:`MAX_COUNT`
  attributes and :data:`MAX_TOTAL` bytes of names and values (ENOSPC);
- ``XATTR_CREATE`` of a name that is set: EEXIST; ``XATTR_REPLACE`` or a
  read or removal of a name that is not set: ENODATA.
"""

from __future__ import annotations

import errno
import stat as stat_mod

from emberfs.common.errors import (
    AlreadyExists,
    EmberError,
    InvalidArgument,
    NoSpace,
    NotFound,
    NotPermitted,
)
from emberfs.metaserver.fs import access, lookup, records
from emberfs.metaserver.fs.opcontext import Credentials, OpContext
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2, meta_pb2

MAX_NAME = 255  # bytes of a name (Linux's XATTR_NAME_MAX)
MAX_VALUE = 65536  # bytes of a value (Linux's XATTR_SIZE_MAX)
MAX_COUNT = 256  # attributes of one inode: their names always fit Linux's 64 KiB listxattr
MAX_TOTAL = 131072  # bytes of names and values of one inode
NAMESPACES = ("user.", "trusted.", "security.")
FLAGS = meta_pb2.XATTR_CREATE | meta_pb2.XATTR_REPLACE


def no_data(name: str) -> NotFound:
    """The error of a name that is not set (ENODATA)."""
    return NotFound(f"no extended attribute {name}", errno=errno.ENODATA)


def validate_name(name: str) -> str:
    """``name`` when it is a supported attribute name; its namespace's prefix."""
    raw = name.encode("utf-8")
    if not raw:
        raise InvalidArgument("empty extended attribute name", errno=errno.ERANGE)
    if len(raw) > MAX_NAME:
        raise InvalidArgument(
            f"extended attribute name longer than {MAX_NAME} bytes", errno=errno.ERANGE
        )
    if "\0" in name:
        raise InvalidArgument("NUL in extended attribute name")
    for prefix in NAMESPACES:
        if name.startswith(prefix):
            if len(name) == len(prefix):
                raise InvalidArgument(f"extended attribute name {name!r} names no attribute")
            return prefix
    raise InvalidArgument(
        f"extended attribute namespace of {name!r} is not supported "
        "(user.*, trusted.* and security.* are)",
        errno=errno.EOPNOTSUPP,
    )


def check_access(
    attr: common_pb2.InodeAttr, creds: Credentials, name: str, *, write: bool, path: str
) -> None:
    """Raise what Linux answers when ``creds`` may not read (or change) ``name`` on ``attr``."""
    prefix = validate_name(name)
    if prefix == "trusted.":
        if not creds.is_root:
            if write:
                raise NotPermitted(f"only uid 0 may change {name}")
            raise no_data(name)
        return
    if prefix == "security.":
        if write and not creds.is_root:
            raise NotPermitted(f"only uid 0 may change {name}")
        return
    if attr.type not in (common_pb2.FILE, common_pb2.DIRECTORY):
        if write:
            raise NotPermitted(f"user.* attributes are for files and directories: {path}")
        raise no_data(name)
    if write and attr.type == common_pb2.DIRECTORY and attr.mode & stat_mod.S_ISVTX:
        access.check_owner(attr, creds, "change user.* attributes of a sticky directory")
    access.check(attr, creds, access.WRITE if write else access.READ, path)


def readable(attr: common_pb2.InodeAttr, creds: Credentials, name: str) -> bool:
    """True when ``creds`` may read the value of ``name`` on ``attr``."""
    try:
        check_access(attr, creds, name, write=False, path="")
    except EmberError:
        return False
    return True


def stored(op: OpContext, inode: int) -> dict[str, bytes]:
    """The attributes of ``inode`` (read in the transaction: a change of them conflicts)."""
    return records.decode_xattrs(op.txn.get(keys.xattr_key(inode)))


def readable_xattrs(op: OpContext, attr: common_pb2.InodeAttr) -> list[meta_pb2.Xattr]:
    """The attributes of ``attr`` whose values the caller may read, in name order (Stat)."""
    held = stored(op, attr.inode)
    return [
        meta_pb2.Xattr(name=name, value=held[name])
        for name in sorted(held)
        if readable(attr, op.creds, name)
    ]


def get_xattr(op: OpContext, req: meta_pb2.GetXattrRequest) -> meta_pb2.GetXattrResponse:
    """The value of one attribute."""
    attr = lookup.resolve(op, req.path, follow=req.follow).require(req.path)
    check_access(attr, op.creds, req.name, write=False, path=req.path)
    value = stored(op, attr.inode).get(req.name)
    if value is None:
        raise no_data(req.name)
    return meta_pb2.GetXattrResponse(value=value)


def list_xattr(op: OpContext, req: meta_pb2.ListXattrRequest) -> meta_pb2.ListXattrResponse:
    """The names of an inode's attributes (``trusted.*`` for uid 0 only); no permission needed."""
    attr = lookup.resolve(op, req.path, follow=req.follow).require(req.path)
    names = sorted(stored(op, attr.inode))
    if not op.creds.is_root:
        names = [n for n in names if not n.startswith("trusted.")]
    return meta_pb2.ListXattrResponse(names=names)


def _save(op: OpContext, attr: common_pb2.InodeAttr, held: dict[str, bytes]) -> None:
    key = keys.xattr_key(attr.inode)
    if held:
        op.txn.put(key, records.encode_xattrs(held))
    else:
        op.txn.delete(key)
    attr.ctime_ns = op.now
    op.put_inode(attr)


def set_xattr(op: OpContext, req: meta_pb2.SetXattrRequest) -> meta_pb2.SetXattrResponse:
    """Set one attribute (``flags``: XATTR_CREATE, XATTR_REPLACE); nothing changes on refusal."""
    if req.flags & ~FLAGS:
        raise InvalidArgument(f"unknown extended attribute flags {req.flags:#x}")
    if len(req.value) > MAX_VALUE:
        raise InvalidArgument(
            f"extended attribute value longer than {MAX_VALUE} bytes", errno=errno.E2BIG
        )
    attr = lookup.resolve(op, req.path, follow=req.follow).require(req.path)
    check_access(attr, op.creds, req.name, write=True, path=req.path)
    held = stored(op, attr.inode)
    if req.flags & meta_pb2.XATTR_CREATE and req.name in held:
        raise AlreadyExists(f"extended attribute {req.name} exists on {req.path}")
    if req.flags & meta_pb2.XATTR_REPLACE and req.name not in held:
        raise no_data(req.name)
    held[req.name] = req.value
    if len(held) > MAX_COUNT:
        raise NoSpace(f"{req.path} has {MAX_COUNT} extended attributes, the most an inode holds")
    total = sum(len(n.encode("utf-8")) + len(v) for n, v in held.items())
    if total > MAX_TOTAL:
        raise NoSpace(
            f"the extended attributes of {req.path} would take {total} bytes "
            f"(at most {MAX_TOTAL} per inode)"
        )
    _save(op, attr, held)
    return meta_pb2.SetXattrResponse(attr=attr)


def remove_xattr(op: OpContext, req: meta_pb2.RemoveXattrRequest) -> meta_pb2.RemoveXattrResponse:
    """Remove one attribute (ENODATA when it is not set)."""
    attr = lookup.resolve(op, req.path, follow=req.follow).require(req.path)
    check_access(attr, op.creds, req.name, write=True, path=req.path)
    held = stored(op, attr.inode)
    if held.pop(req.name, None) is None:
        raise no_data(req.name)
    _save(op, attr, held)
    return meta_pb2.RemoveXattrResponse(attr=attr)
