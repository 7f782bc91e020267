"""The files open in a FUSE mount: one :class:`OpenNode` per inode, one :class:`Descriptor` per open.

Every descriptor of a file open in the mount shares its inode's node: the
write session and the :class:`~emberfs.client.writer.FileWriter` (buffered
writes, chunk writes in flight, the file's length as this mount's writes made
it), and the readahead of each descriptor, which forgets its blocks whenever
the file changes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from emberfs.client.handles import OpenHandle
from emberfs.client.readahead import SharedReadahead
from emberfs.proto import common_pb2

if TYPE_CHECKING:
    from emberfs.client.core import Client


class OpenNode:
    """An inode open in this mount: shared by all its descriptors.

    ``handle`` is the open file as the metaserver described it, its
    ``attr.size`` kept at the length this mount's writes made (:attr:`size`).
    Callers hold :attr:`lock` around every call.
    """

    def __init__(self, client: Client, handle: OpenHandle) -> None:
        self.client = client
        self.handle = handle
        self.inode = handle.inode
        self.lock = threading.RLock()
        self.opens = 0
        self.writers = 0
        self.readers: set[SharedReadahead] = set()
        self.writer = client.writer(handle, on_change=self._changed)
        self.gone = False  # its last descriptor closed: no longer in the mount's table

    @property
    def size(self) -> int:
        return self.handle.attr.size

    def _changed(self, size: int) -> None:
        for r in self.readers:
            r.resize(size)  # readers forget blocks a change may have touched

    def adopt(self, session_id: int) -> None:
        """Take ``session_id`` (of a new write open) as the node's write session."""
        self.handle.session_id = session_id
        self.handle.expired = False
        self.client.sessions.register(self.handle)

    def write(self, path: str | None, offset: int, data: memoryview) -> int:
        with self.lock:
            return self.writer.write(offset, data, path)

    def flush_writes(self) -> None:
        """Send the buffered writes and wait until the chains hold all of them."""
        with self.lock:
            self.writer.flush()

    def sync(self) -> None:
        """Make every write durable and the length exact on the metaserver (fsync, close(2))."""
        with self.lock:
            self.writer.sync()

    def learn(self, attr: common_pb2.InodeAttr) -> None:
        """New attributes from the metaserver (the local length still counts)."""
        with self.lock:
            self.writer.learn(attr)

    def truncate(self, path: str | None, length: int) -> common_pb2.InodeAttr:
        with self.lock:
            return self.writer.truncate(length, path)

    def set_times(self, path: str, mtime_ns: int) -> common_pb2.InodeAttr:
        """Set the mtime after the writes before it, so a later Close keeps it."""
        with self.lock:
            self.writer.sync()
            attr = self.client.meta.setattr(path, mtime_ns=mtime_ns, no_follow=True)
            self.writer.learn(attr)
            return attr

    def close_session(self) -> common_pb2.InodeAttr | None:
        """End the write session (the last writer's release)."""
        with self.lock:
            return self.writer.close()


class Descriptor:
    """One open descriptor: its node, how it was opened, and its readahead."""

    __slots__ = ("node", "write", "readahead")

    def __init__(self, node: OpenNode, write: bool, readahead: SharedReadahead) -> None:
        self.node = node
        self.write = write
        self.readahead = readahead
