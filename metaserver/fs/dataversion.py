"""A file's data version and its count of writers: what lets a client cache its bytes exactly.

The metaserver sees every moment a file's bytes may change: a write session
opens (from then on its writer sends chunks straight to storage), a Sync, a
session's end (Close, or a lease that lapsed), a truncation. At each it moves
the inode's ``data_version`` (:func:`changed`) and keeps ``writers``, the
count of open write sessions, so a client that opens the file knows both
which bytes it sees and whether anyone may be changing them. A client's disk
cache (:mod:`emberfs.client.diskcache`) keys what it keeps on inode and data
version and keeps nothing of a file while ``writers`` is not 0.

A version never repeats for an inode: it is the metaserver's clock in
nanoseconds, or one more than the last version when the clock is behind it
(a clock stepped back, or a store copied from elsewhere), so even a metadata
store restored from an old copy gives new versions, not ones already used.
"""

from __future__ import annotations

from emberfs.proto import common_pb2


def changed(attr: common_pb2.InodeAttr, now_ns: int) -> None:
    """The file's bytes may change (or did): give it a new data version."""
    attr.data_version = max(now_ns, attr.data_version + 1)


def writer_opened(attr: common_pb2.InodeAttr, now_ns: int) -> None:
    """A write session opened on the file."""
    attr.writers += 1
    changed(attr, now_ns)


def writer_closed(attr: common_pb2.InodeAttr, now_ns: int) -> None:
    """A write session of the file ended (Close or a lapsed lease)."""
    attr.writers = max(0, attr.writers - 1)
    changed(attr, now_ns)


def mark_unversioned(attr: common_pb2.InodeAttr) -> bool:
    """The file is written without sessions from now on (a KV cache slab); True if that is news."""
    if attr.unversioned:
        return False
    attr.unversioned = True
    changed(attr, 0)
    return True
