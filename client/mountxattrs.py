"""Extended attributes on a FUSE mount: ``getxattr``, ``listxattr``, ``setxattr``,
``removexattr``.

The kernel checks each caller (namespaces, ``trusted.*`` and ``security.*``
privileges, and with ``default_permissions`` the mode bits for ``user.*``);
the metaserver checks the mount's identity and the rules and limits of
:mod:`emberfs.metaserver.fs.ops.xattrs`. libfuse's size protocol (a size 0
query answers the length, a buffer too small ERANGE) is mfusepy's. A path
names the object itself: a symlink's own attributes, as the kernel resolved it.
A listing shows ``trusted.*`` names to callers of uid 0 only, as Linux does.

Values read are remembered per inode with the ctime they were read at
(:class:`XattrCache`); every change of an inode's attributes changes its ctime,
so a value is used again only while the inode's attributes are unchanged as
far as the mount knows (its attribute cache, ``attr_timeout``). The kernel
asks for ``security.capability`` before every write to a file, and this keeps
that from costing a metaserver call each time.
"""

from __future__ import annotations

import errno
import threading
from collections import OrderedDict

from emberfs.client import xattrs
from emberfs.client.fusebind import caller_uid, fuse_errors

REMEMBERED_INODES = 4096


class XattrCache:
    """Per inode: the ctime its values were read at, and the values (None: not set)."""

    def __init__(self, limit: int = REMEMBERED_INODES) -> None:
        self._map: OrderedDict[int, tuple[int, dict[str, bytes | None]]] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, inode: int, ctime_ns: int, name: str) -> tuple[bool, bytes | None]:
        """``(True, value)`` when ``name``'s value at ``ctime_ns`` (or later) is known."""
        with self._lock:
            hit = self._map.get(inode)
            if hit is None or hit[0] < ctime_ns or name not in hit[1]:
                return False, None
            self._map.move_to_end(inode)
            return True, hit[1][name]

    def put(self, inode: int, ctime_ns: int, name: str, value: bytes | None) -> None:
        """Remember what the metaserver answered for an inode whose ctime was ``ctime_ns``."""
        with self._lock:
            hit = self._map.get(inode)
            if hit is None or hit[0] < ctime_ns:
                hit = (ctime_ns, {})
            hit[1][name] = value
            self._store(inode, hit)

    def changed(self, inode: int, ctime_ns: int, name: str, value: bytes | None) -> None:
        """This mount set (or removed) ``name``; the inode's new ctime is ``ctime_ns``."""
        with self._lock:
            self._store(inode, (ctime_ns, {name: value}))

    def _store(self, inode: int, entry: tuple[int, dict[str, bytes | None]]) -> None:
        self._map[inode] = entry
        self._map.move_to_end(inode)
        while len(self._map) > self._limit:
            self._map.popitem(last=False)


class XattrOps:
    """The extended attribute operations of :class:`~emberfs.client.mount.EmberFuse`.

    A mixin: it uses the mount's metaserver client (``meta``), its attribute
    lookup (``_lookup``), its record of changes (``_changed``) and its
    read-only check (``_writable``).
    """

    xattr_cache: XattrCache

    @fuse_errors
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        attr = self._lookup(path)
        known, value = self.xattr_cache.get(attr.inode, attr.ctime_ns, name)
        if not known:
            try:
                value = xattrs.getxattr(self.meta, path, name, follow=False)
            except OSError as exc:
                if exc.errno != errno.ENODATA:
                    raise
                value = None
            self.xattr_cache.put(attr.inode, attr.ctime_ns, name, value)
        if value is None:
            raise OSError(errno.ENODATA, f"no extended attribute {name}", path)
        return value

    @fuse_errors
    def listxattr(self, path: str) -> list[str]:
        names = xattrs.listxattr(self.meta, path, follow=False)
        if caller_uid() != 0:  # trusted.* is root's, whoever the mount acts as (as Linux lists)
            names = [n for n in names if not n.startswith("trusted.")]
        return names

    @fuse_errors
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        self._writable()
        attr = xattrs.setxattr(self.meta, path, name, value, options, follow=False)
        self._changed(path, attr)
        self.xattr_cache.changed(attr.inode, attr.ctime_ns, name, bytes(value))
        return 0

    @fuse_errors
    def removexattr(self, path: str, name: str) -> int:
        self._writable()
        attr = xattrs.removexattr(self.meta, path, name, follow=False)
        self._changed(path, attr)
        self.xattr_cache.changed(attr.inode, attr.ctime_ns, name, None)
        return 0
