"""SetAttr: change mode, owner, group or mtime."""

from __future__ import annotations

import stat

from emberfs.common.errors import NotPermitted
from emberfs.metaserver.fs import access, lookup
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.proto import meta_pb2


def setattr_(op: OpContext, req: meta_pb2.SetAttrRequest) -> meta_pb2.SetAttrResponse:
    """Change the attributes set in the request on ``path``.

    A final symlink is followed, unless ``no_follow`` asks to change the symlink
    itself (``lchown``, ``utimensat`` with ``AT_SYMLINK_NOFOLLOW``, a FUSE mount).

    Rules as in POSIX: only the owner or uid 0 may change the mode (bits
    beyond 0o7777 are ignored; a non-root owner outside the file's group
    loses the set-group-id bit) or the mtime; only uid 0 may give a file to
    another uid; the owner may change the group to one of their own groups.
    Refusals raise NotPermitted; nothing is applied unless every change is
    allowed.
    """
    attr = lookup.resolve(op, req.path, follow=not req.no_follow).require(req.path)
    creds = op.creds
    if req.HasField("uid") and req.uid != attr.uid and not creds.is_root:
        raise NotPermitted("only uid 0 may change the owner")
    if req.HasField("gid") and req.gid != attr.gid:
        access.check_owner(attr, creds, "change the group")
        if not creds.is_root and not creds.in_group(req.gid):
            raise NotPermitted(f"not a member of group {req.gid}")
    if req.HasField("mode"):
        access.check_owner(attr, creds, "change the mode")
    if req.HasField("mtime_ns"):
        access.check_owner(attr, creds, "set the modification time")
    if req.HasField("uid"):
        attr.uid = req.uid
    if req.HasField("gid"):
        attr.gid = req.gid
    if req.HasField("mode"):
        mode = req.mode & 0o7777
        if not creds.is_root and not creds.in_group(attr.gid):
            mode &= ~stat.S_ISGID
        attr.mode = mode
    if req.HasField("mtime_ns"):
        attr.mtime_ns = req.mtime_ns
    attr.ctime_ns = op.now
    op.put_inode(attr)
    return meta_pb2.SetAttrResponse(attr=attr)
