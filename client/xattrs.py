"""Extended attributes through the metaserver: ``GetXattr``, ``ListXattr``, ``SetXattr``,
``RemoveXattr``, and ``Stat`` with the attributes.

Each function makes one call on a :class:`~emberfs.client.meta.MetaClient`,
with its retries, request ids (a retried change applies once) and error
mapping: a name that is not set raises ``OSError(ENODATA)``, an unsupported
namespace ``OSError(EOPNOTSUPP)``, a name too long ``OSError(ERANGE)``, a value
too large ``OSError(E2BIG)``, a full inode ``OSError(ENOSPC)``, a refusal
``PermissionError`` and ``XATTR_CREATE`` of a set name ``FileExistsError``.
Names are ``str`` (``bytes`` are taken as UTF-8); values are bytes.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

from emberfs.proto import common_pb2, meta_pb2

if TYPE_CHECKING:
    from emberfs.client.meta import MetaClient

XATTR_CREATE = meta_pb2.XATTR_CREATE  # the values of os.XATTR_CREATE and os.XATTR_REPLACE
XATTR_REPLACE = meta_pb2.XATTR_REPLACE


def attr_name(name: str | bytes, path: str) -> str:
    """``name`` as the ``str`` the metaserver takes (EINVAL for what is not UTF-8)."""
    if isinstance(name, bytes | bytearray):
        try:
            return bytes(name).decode("utf-8")
        except UnicodeDecodeError:
            raise _invalid("extended attribute names are UTF-8", path) from None
    if not isinstance(name, str):
        raise TypeError(f"an extended attribute name is str or bytes, not {type(name).__name__}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid("extended attribute names are UTF-8", path) from None
    return name


def _invalid(message: str, path: str) -> OSError:
    return OSError(errno.EINVAL, f"{os.strerror(errno.EINVAL)}: {message}", path)


def getxattr(meta: MetaClient, path: str, name: str | bytes, follow: bool = True) -> bytes:
    """The value of ``name`` on ``path`` (``follow``: of what a final symlink names)."""
    req = meta_pb2.GetXattrRequest(
        ctx=meta.context(), path=path, name=attr_name(name, path), follow=follow
    )
    return meta.meta("GetXattr", req, path).value


def listxattr(meta: MetaClient, path: str, follow: bool = True) -> list[str]:
    """The names of ``path``'s attributes the caller may see, in name order."""
    req = meta_pb2.ListXattrRequest(ctx=meta.context(), path=path, follow=follow)
    return list(meta.meta("ListXattr", req, path).names)


def setxattr(
    meta: MetaClient,
    path: str,
    name: str | bytes,
    value: bytes,
    flags: int = 0,
    follow: bool = True,
) -> common_pb2.InodeAttr:
    """Set ``name`` to ``value`` (``flags``: XATTR_CREATE, XATTR_REPLACE); the new attributes."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"an extended attribute value is bytes, not {type(value).__name__}")
    req = meta_pb2.SetXattrRequest(
        ctx=meta.context(),
        path=path,
        name=attr_name(name, path),
        value=bytes(value),
        flags=flags,
        follow=follow,
    )
    return meta.meta("SetXattr", req, path).attr


def removexattr(
    meta: MetaClient, path: str, name: str | bytes, follow: bool = True
) -> common_pb2.InodeAttr:
    """Remove ``name`` from ``path``; the new attributes."""
    req = meta_pb2.RemoveXattrRequest(
        ctx=meta.context(), path=path, name=attr_name(name, path), follow=follow
    )
    return meta.meta("RemoveXattr", req, path).attr


def stat_with_xattrs(
    meta: MetaClient, path: str, follow: bool = True
) -> tuple[common_pb2.InodeAttr, dict[str, bytes]]:
    """``path``'s attributes and the extended attributes whose values the caller may read."""
    req = meta_pb2.StatRequest(ctx=meta.context(), path=path, follow=follow, xattrs=True)
    resp = meta.meta("Stat", req, path)
    return resp.attr, {x.name: x.value for x in resp.xattrs}
