"""The KV cache metrics of the metaserver's admin API, scraped after puts and gets."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from emberfs.kvcache import PutStatus

KiB = 1024


def kvcache_samples(cluster) -> dict[str, dict[str, float]]:
    """``{cache path: {sample name: value}}`` of every ``emberfs_kvcache_*`` sample."""
    text = httpx.get(f"{cluster.admin_url}/metrics", timeout=30).text
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("emberfs_kvcache_"):
                out.setdefault(sample.labels["cache"], {})[sample.name] = sample.value
    return out


def test_kvcache_metrics_follow_puts_gets_and_evictions(cluster, make_cache):
    cache = make_cache(block_size=64 * KiB, blocks=4)
    idle = make_cache(block_size=16 * KiB, blocks=8)
    length = 50_000  # shorter than a block: bytes are counted as stored, not as slots
    blocks = {f"k{i}": bytes([i]) * length for i in range(6)}
    first = ["k0", "k1", "k2", "k3"]
    assert cache.batch_put(first, [blocks[k] for k in first]) == [PutStatus.STORED] * 4
    assert cache.batch_get(["k0", "absent", "k1"]) == [blocks["k0"], None, blocks["k1"]]
    # the cache is full: two more blocks evict two
    assert cache.batch_put(["k4", "k5"], [blocks["k4"], blocks["k5"]]) == [PutStatus.STORED] * 2

    samples = kvcache_samples(cluster)
    assert samples[cache.path] == {
        "emberfs_kvcache_hits_total": 2.0,
        "emberfs_kvcache_misses_total": 1.0,
        "emberfs_kvcache_hit_bytes_total": 2.0 * length,
        "emberfs_kvcache_puts_total": 6.0,
        "emberfs_kvcache_put_bytes_total": 6.0 * length,
        "emberfs_kvcache_evictions_total": 2.0,
        "emberfs_kvcache_used_blocks": 4.0,
        "emberfs_kvcache_used_bytes": 4.0 * length,
        "emberfs_kvcache_capacity_blocks": 4.0,
        "emberfs_kvcache_hit_ratio": 2 / 3,
    }
    # each cache has its own label
    assert samples[idle.path]["emberfs_kvcache_capacity_blocks"] == 8.0
    assert samples[idle.path]["emberfs_kvcache_puts_total"] == 0.0
    assert samples[idle.path]["emberfs_kvcache_hit_ratio"] == 0.0
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.used_blocks) == (2, 1, 2, 4)

    cache.clear()
    after = kvcache_samples(cluster)[cache.path]
    assert after["emberfs_kvcache_used_blocks"] == 0.0
    assert after["emberfs_kvcache_used_bytes"] == 0.0
    assert after["emberfs_kvcache_puts_total"] == 6.0  # counters keep counting from creation

    idle.destroy()
    assert idle.path not in kvcache_samples(cluster)  # a removed cache leaves the metrics
