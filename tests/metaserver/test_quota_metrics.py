"""The directory quota gauges of the metaserver's ``/metrics``."""

from __future__ import annotations

import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from emberfs.metaserver.metrics import MAX_QUOTA_SERIES, quota_metrics
from emberfs.proto import meta_pb2

MiB = 1 << 20


def samples(families) -> dict[tuple[str, str], float]:
    """``{(sample name, path label): value}`` of the quota samples (path "" without one)."""
    return {
        (s.name, s.labels.get("path", "")): s.value
        for family in families
        for s in family.samples
        if s.name.startswith("emberfs_quota")
    }


def test_usage_and_limits_follow_the_quota(cluster, fs):
    base = f"/metricsquota-{uuid.uuid4().hex[:10]}"
    fs.mkdir(base)
    try:
        fs.quota_set(base, max_bytes=10 * MiB)
        fs.pipe_file(f"{base}/a", b"a" * (3 * MiB))
        fs.pipe_file(f"{base}/b", b"b")

        def scrape() -> dict[tuple[str, str], float]:
            text = httpx.get(f"{cluster.admin_url}/metrics", timeout=30).text
            return samples(text_string_to_metric_families(text))

        got = scrape()
        assert got[("emberfs_quota_used_bytes", base)] == 3 * MiB + 1
        assert got[("emberfs_quota_limit_bytes", base)] == 10 * MiB
        assert got[("emberfs_quota_used_inodes", base)] == 2
        assert ("emberfs_quota_limit_inodes", base) not in got  # no inode limit: no series
        assert got[("emberfs_quotas", "")] == len(fs.quota_list())

        fs.quota_set(base, max_inodes=5)
        fs.rm(f"{base}/a")
        got = scrape()
        assert got[("emberfs_quota_used_bytes", base)] == 1
        assert got[("emberfs_quota_limit_inodes", base)] == 5
        assert got[("emberfs_quota_used_inodes", base)] == 1

        fs.quota_remove(base)
        assert not [key for key in scrape() if key[1] == base]
    finally:
        fs.rm(base, recursive=True)


def test_at_most_the_fullest_quotas_are_exported():
    quotas = [
        meta_pb2.QuotaInfo(path=f"/q{i:04d}", max_bytes=1000, used_bytes=i)
        for i in range(MAX_QUOTA_SERIES + 100)
    ]
    quotas.append(meta_pb2.QuotaInfo(path="/inodes", max_inodes=10, used_inodes=11))
    quotas.append(meta_pb2.QuotaInfo(path="/unlimited", used_bytes=1 << 40))
    got = samples(quota_metrics(quotas))
    assert got[("emberfs_quotas", "")] == len(quotas)
    shown = {path for name, path in got if name == "emberfs_quota_used_bytes"}
    assert len(shown) == MAX_QUOTA_SERIES
    # the fullest first: over its inode limit, then the byte quotas by usage
    expected = {"/inodes"} | {f"/q{i:04d}" for i in range(len(quotas) - MAX_QUOTA_SERIES - 1, 356)}
    assert shown == expected
    assert got[("emberfs_quota_limit_inodes", "/inodes")] == 10
    assert ("emberfs_quota_limit_bytes", "/inodes") not in got
