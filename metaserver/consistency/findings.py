"""What ``emberfs fsck`` finds: the kinds of finding (:data:`KINDS`), a finding
(:class:`Finding`), the error that stops a check (:class:`FsckError`), and the compact table of
every inode the passes share (:class:`Inodes`).
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field

import grpc

from emberfs.common.routing import TargetView
from emberfs.metaserver.store import keys

KINDS = {
    "dangling_entry": "a directory entry names an inode that does not exist",
    "wrong_entry_type": "a directory entry gives its inode another type than the inode has",
    "wrong_link_count": "a file's link count is not the number of entries naming it",
    "unreachable_inode": "no directory entry names this inode",
    "lost_chunk": "no serving replica holds chunk data the file needs",
    "missing_replica": "a serving replica lacks chunk data that another holds",
    "replicas_disagree": "serving replicas hold one chunk at different versions, lengths or bytes",
    "chunk_past_end": "a replica holds bytes past the file's length",
    "orphan_chunk": "chunks of an inode no file owns and no GC item covers",
    "quota_usage": "a quota's recorded usage is not what the inodes below it hold",
}


class FsckError(Exception):
    """The check could not run to its end (a serving target did not answer)."""


def unanswered(target: TargetView, inode: int, exc: grpc.RpcError) -> FsckError:
    return FsckError(
        f"target {target.target_id} ({target.grpc_address}) did not list chunks of inode "
        f"{inode}: {exc.code().name}: {exc.details()}"
    )


@dataclass
class Finding:
    kind: str
    inode: int
    index: int | None = None
    targets: list[int] = field(default_factory=list)
    detail: str = ""
    path: str = ""
    repair: str = ""  # with repair: "done", or why not
    entry: tuple[int, str] | None = None  # (directory, name) of the entry it is about

    def public(self) -> dict:
        out = {"kind": self.kind, "inode": self.inode, "path": self.path, "detail": self.detail}
        if self.index is not None:
            out["index"] = self.index
        if self.targets:
            out["targets"] = self.targets
        if self.repair:
            out["repair"] = self.repair
        return out


@dataclass
class Inodes:
    """Every inode's id, link count and type, sorted by id (compact arrays)."""

    ids: array
    nlinks: array
    types: array

    def find(self, inode: int) -> int:
        """The position of ``inode``, or -1."""
        pos = bisect.bisect_left(self.ids, inode)
        return pos if pos < len(self.ids) and self.ids[pos] == inode else -1


def dentry_parent(key: bytes) -> int:
    return int.from_bytes(key[len(keys.DENTRY) : len(keys.DENTRY) + 8], "big")
