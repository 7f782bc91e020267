"""Pass 1 of ``emberfs fsck``: the namespace checked against itself.

Every inode, then every directory entry: an entry that names no inode or names it with the wrong
type, a link count that is not the number of entries naming the file, a directory named by no
entry or by several, an inode that no entry names (an unlinked file still open is fine).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

from emberfs.metaserver.consistency.findings import Finding, Inodes, dentry_parent
from emberfs.metaserver.fs import records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine
from emberfs.proto import common_pb2


class NamespaceCheck:
    """The namespace pass over ``engine``; :attr:`links` keeps each wrong link count found
    (inode: (count read, entries naming it)) for its repair."""

    def __init__(self, engine: KVEngine) -> None:
        self.engine = engine
        self.links: dict[int, tuple[int, int]] = {}

    def load_inodes(self) -> Inodes:
        ids, nlinks, types = array("Q"), array("I"), array("B")
        for key, raw in self.engine.scan_prefix(keys.INODE):
            attr = records.decode_inode(raw)
            ids.append(int.from_bytes(key[len(keys.INODE) :], "little"))
            nlinks.append(min(attr.nlink, 0xFFFFFFFF))
            types.append(attr.type)
        order = sorted(range(len(ids)), key=ids.__getitem__)
        return Inodes(
            array("Q", (ids[i] for i in order)),
            array("I", (nlinks[i] for i in order)),
            array("B", (types[i] for i in order)),
        )

    def check(self, inodes: Inodes, dirs: dict[int, tuple[int, str]]) -> Iterator[Finding]:
        """The findings on the entries and link counts; ``dirs`` gets each directory's
        (parent, name)."""
        named = array("I", bytes(4 * len(inodes.ids)))
        guard_len = len(keys.DENTRY) + 8
        for key, raw in self.engine.scan_prefix(keys.DENTRY):
            if len(key) == guard_len:
                continue  # a directory's entry guard
            parent, name = dentry_parent(key), keys.dentry_name(key)
            entry = records.decode_dentry(raw)
            pos = inodes.find(entry.inode)
            if pos < 0:
                if self.engine.get(keys.inode_key(entry.inode)) is not None:
                    continue  # created after the inodes were read
                yield Finding(
                    "dangling_entry",
                    entry.inode,
                    detail=f"entry {name!r} of directory {parent}",
                    entry=(parent, name),
                )
                continue
            named[pos] += 1
            if inodes.types[pos] == common_pb2.DIRECTORY:
                dirs[entry.inode] = (parent, name)
            if entry.type != inodes.types[pos]:
                yield Finding(
                    "wrong_entry_type",
                    entry.inode,
                    detail=f"entry {name!r} of directory {parent} says type {entry.type}, "
                    f"the inode is {inodes.types[pos]}",
                    entry=(parent, name),
                )
        for pos, inode in enumerate(inodes.ids):
            n, nlink, kind = named[pos], inodes.nlinks[pos], inodes.types[pos]
            if n == 0 and self.engine.get(keys.recycled_key(inode)) is not None:
                n = 1  # kept in the trash: its entry is the trash record
            if kind == common_pb2.DIRECTORY:
                want = 0 if inode == records.ROOT_INODE else 1
                if n == want or not self._unchanged(inode, nlink):
                    continue  # fine, or removed while this ran
                if n == 0 and self.engine.get(keys.trash_key(inode)) is not None:
                    continue  # a removed tree whose entries are being deleted
                what = "unreachable_inode" if n == 0 else "wrong_link_count"
                yield Finding(what, inode, detail=f"a directory named by {n} entries")
            elif n != nlink and self._unchanged(inode, nlink):  # not linked or removed meanwhile
                if n == 0:
                    yield Finding("unreachable_inode", inode, detail=f"link count {nlink}")
                else:
                    self.links[inode] = (nlink, n)
                    yield Finding(
                        "wrong_link_count",
                        inode,
                        detail=f"link count {nlink}, named by {n} entries",
                    )

    def _unchanged(self, inode: int, nlink: int) -> bool:
        """The inode still exists with the link count read at the start."""
        raw = self.engine.get(keys.inode_key(inode))
        return raw is not None and records.decode_inode(raw).nlink == nlink
