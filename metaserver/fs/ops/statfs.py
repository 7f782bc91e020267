"""StatFs: capacity and usage from storage, inode counts from the namespace."""

from __future__ import annotations

from emberfs.proto import meta_pb2


def statfs(usage: tuple[int, int], counts: dict[str, int]) -> meta_pb2.StatFsResponse:
    """The StatFs answer from ``(capacity, used)`` bytes and the namespace's counts."""
    capacity, used = usage
    return meta_pb2.StatFsResponse(
        capacity=capacity,
        used=used,
        free=max(capacity - used, 0),
        inodes=counts["inodes"],
        files=counts["files"],
        directories=counts["directories"],
    )
