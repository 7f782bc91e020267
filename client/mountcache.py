"""What a FUSE mount remembers of files between calls: attributes and page versions.

:class:`AttrCache` keeps the attributes a listing or lookup returned for
``attr_timeout`` seconds; :class:`Versions` keeps, per inode, the version
(:func:`content_version`: size, mtime, ctime) of the pages the kernel may hold and of
the attributes it was told, so an open can keep or drop the page cache.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from emberfs.proto import common_pb2

REMEMBERED_VERSIONS = 65536  # inodes whose cached pages and attributes are remembered


def content_version(attr: common_pb2.InodeAttr) -> tuple[int, int, int]:
    """What changes whenever a file's bytes may have: size, mtime and ctime."""
    return attr.size, attr.mtime_ns, attr.ctime_ns


class Versions:
    """The attributes last given out per inode, bounded (oldest forgotten first)."""

    def __init__(self, limit: int = REMEMBERED_VERSIONS) -> None:
        self._map: OrderedDict[int, tuple] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, inode: int):
        with self._lock:
            return self._map.get(inode)

    def put(self, inode: int, version: tuple) -> None:
        with self._lock:
            self._map[inode] = version
            self._map.move_to_end(inode)
            while len(self._map) > self._limit:
                self._map.popitem(last=False)

    def forget(self, inode: int) -> None:
        with self._lock:
            self._map.pop(inode, None)


class AttrCache:
    """Attributes by path for ``ttl`` seconds: what a listing or a lookup returned."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._map: dict[str, tuple[float, common_pb2.InodeAttr]] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> common_pb2.InodeAttr | None:
        if self.ttl <= 0:
            return None
        with self._lock:
            hit = self._map.get(path)
            if hit is None:
                return None
            if hit[0] < time.monotonic():
                del self._map[path]
                return None
            return hit[1]

    def put(self, path: str, attr: common_pb2.InodeAttr) -> None:
        if self.ttl <= 0:
            return
        with self._lock:
            if len(self._map) > 100_000:
                self._map.clear()
            self._map[path] = (time.monotonic() + self.ttl, attr)

    def drop(self, *paths: str) -> None:
        with self._lock:
            for p in paths:
                self._map.pop(p, None)

    def clear(self) -> None:
        with self._lock:
            self._map.clear()
