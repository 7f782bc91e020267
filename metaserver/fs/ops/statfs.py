"""StatFs: capacity and usage from storage, inode counts from the namespace; under a quota,
the quota's limits and usage."""

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


def limited(out: meta_pb2.StatFsResponse, q, used_bytes: int, used_inodes: int) -> None:
    """Turn ``out`` into the figures of quota ``q`` (a :class:`~emberfs.metaserver.fs.quota.Quota`)
    with its usage: a byte limit is the capacity (free no more than the cluster has), an inode
    limit the inode count's bound."""
    out.quota_path = q.path
    if q.max_bytes:
        out.free = min(max(q.max_bytes - used_bytes, 0), out.free)
        out.capacity = q.max_bytes
        out.used = used_bytes
    if q.max_inodes:
        out.inode_limit = q.max_inodes
        out.inodes = used_inodes
