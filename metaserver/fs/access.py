"""Permission checks against POSIX mode bits.

The caller's uid picks the owner class, a matching gid or supplementary
group the group class, anyone else the other class; uid 0 passes every
check. Directories need search (x) on every component walked, write and
search on a parent to add or remove entries, read to list. A directory with
the sticky bit lets only the owner of an entry, the owner of the directory
or uid 0 remove or rename the entry.
"""

from __future__ import annotations

import stat

from emberfs.common.errors import NotPermitted, PermissionDenied
from emberfs.metaserver.fs.opcontext import Credentials
from emberfs.proto import common_pb2

READ = 4
WRITE = 2
SEARCH = 1


def allowed(attr: common_pb2.InodeAttr, creds: Credentials, want: int) -> bool:
    """True when ``creds`` hold every permission in ``want`` (READ|WRITE|SEARCH) on ``attr``."""
    if creds.is_root:
        return True
    if creds.uid == attr.uid:
        bits = (attr.mode >> 6) & 7
    elif creds.in_group(attr.gid):
        bits = (attr.mode >> 3) & 7
    else:
        bits = attr.mode & 7
    return bits & want == want


def check(attr: common_pb2.InodeAttr, creds: Credentials, want: int, what: str = "") -> None:
    """Raise PermissionDenied unless ``creds`` hold ``want`` on ``attr``."""
    if not allowed(attr, creds, want):
        raise PermissionDenied(f"permission denied{': ' + what if what else ''}")


def check_owner(attr: common_pb2.InodeAttr, creds: Credentials, what: str) -> None:
    """Raise NotPermitted unless the caller owns ``attr`` or is uid 0."""
    if not (creds.is_root or creds.uid == attr.uid):
        raise NotPermitted(f"only the owner may {what}")


def check_sticky(
    parent: common_pb2.InodeAttr, child: common_pb2.InodeAttr, creds: Credentials
) -> None:
    """Enforce the sticky bit of ``parent`` for removing or renaming ``child``."""
    if not parent.mode & stat.S_ISVTX or creds.is_root:
        return
    if creds.uid not in (parent.uid, child.uid):
        raise NotPermitted("the directory is sticky and the entry is not yours")
