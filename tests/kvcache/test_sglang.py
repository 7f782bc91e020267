"""The SGLang backend of the KV cache (EmberHiCacheStorage) on the shared cluster."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np
import pytest

from emberfs.kvcache import sglang as sgl
from emberfs.kvcache.sglang import EmberHiCacheStorage

CAPACITY = 1 << 20


PAGE_SIZE = 4  # tokens of a page
TOKEN_ELEMS = 256  # float16 values of one token
PAGE_BYTES = PAGE_SIZE * TOKEN_ELEMS * 2


@dataclass
class StorageConfig:
    """A stand-in of SGLang's HiCacheStorageConfig."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    is_mla_model: bool = False
    enable_storage_metrics: bool = False
    is_page_first_layout: bool = True
    model_name: str | None = "org/model-7b"
    extra_config: dict | None = None


class HostPool:
    """A stand-in of SGLang's host KV pool: pages of PAGE_SIZE tokens in one float16 array."""

    def __init__(self, tokens: int = 64) -> None:
        self.page_size = PAGE_SIZE
        self.kv = np.zeros((tokens, TOKEN_ELEMS), np.float16)

    def get_dummy_flat_data_page(self) -> np.ndarray:
        return np.zeros(PAGE_SIZE * TOKEN_ELEMS, np.float16)

    def get_data_page(self, index, flat: bool = True) -> np.ndarray:
        return self.kv[index : index + PAGE_SIZE].reshape(-1)

    def set_from_flat_data_page(self, index, data) -> None:
        self.kv[index : index + PAGE_SIZE] = np.asarray(data).reshape(PAGE_SIZE, TOKEN_ELEMS)


def page(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(PAGE_SIZE * TOKEN_ELEMS).astype(np.float16)


@pytest.fixture
def hicache(cluster, kv_path):
    """``hicache(extra=None, **config)``: a backend on the test's cache directory, closed after."""
    made: list[EmberHiCacheStorage] = []

    def make(extra: dict | None = None, **config) -> EmberHiCacheStorage:
        settings = {
            "emberfs_meta": cluster.meta_address,
            "emberfs_path": kv_path,
            "emberfs_capacity": CAPACITY,
            **(extra or {}),
        }
        backend = EmberHiCacheStorage(StorageConfig(extra_config=settings, **config), {})
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def test_hicache_set_get_exists(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES})
    a = page(1)
    assert backend.set("h1", a)
    assert backend.exists("h1")
    assert not backend.exists("h2")
    target = np.zeros_like(a)
    assert backend.get("h1", target) is target
    np.testing.assert_array_equal(target, a)
    assert backend.get("h2", np.zeros_like(a)) is None
    # no target and no host pool: the page's bytes
    assert bytes(backend.get("h1")) == a.tobytes()
    assert backend.get("h2") is None
    # the page's first bytes only
    half = np.zeros_like(a)
    assert backend.set("h3", a, target_sizes=PAGE_BYTES // 2)
    assert backend.get("h3", half, target_sizes=PAGE_BYTES // 2) is half
    np.testing.assert_array_equal(half[: a.size // 2], a[: a.size // 2])
    assert not half[a.size // 2 :].any()


def test_hicache_a_page_of_another_size_is_a_miss(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES})
    a = page(3)
    assert backend.set("whole", a)
    assert backend.set("half", a[: a.size // 2])
    small = np.zeros(a.size // 2, np.float16)
    large = np.zeros_like(a)
    # larger than its target, shorter than its target: misses; the others in the batch hit
    got = backend.batch_get(["whole", "half", "whole"], [small, large, np.zeros_like(a)])
    assert got[0] is None and got[1] is None and got[2] is not None
    np.testing.assert_array_equal(got[2], a)
    assert backend.get("half", small) is small
    np.testing.assert_array_equal(small, a[: a.size // 2])


def test_hicache_get_without_target_fills_a_page_of_the_pool(hicache):
    backend = hicache()
    backend.register_mem_pool_host(HostPool())
    a = page(2)
    assert backend.set("h", a)
    got = backend.get("h")
    assert isinstance(got, np.ndarray) and got.dtype == np.float16
    np.testing.assert_array_equal(got, a)


def test_hicache_batch_exists_counts_the_stored_prefix(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES})
    assert backend.batch_set(["p0", "p1", "p3"], [page(0), page(1), page(3)])
    assert backend.batch_exists(["p0", "p1", "p2", "p3"]) == 2
    assert backend.batch_exists(["p0", "p1"]) == 2
    assert backend.batch_exists(["p2", "p0"]) == 0
    assert backend.batch_exists([]) == 0
    assert backend.batch_exists(["p3"], extra_info=None) == 1


def test_hicache_batch_get_reads_into_the_targets(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES})
    pages = [page(10), page(11), page(12)]
    assert backend.batch_set(["k0", "k1", "k2"], pages)
    targets = [np.zeros(PAGE_SIZE * TOKEN_ELEMS, np.float16) for _ in range(4)]
    got = backend.batch_get(["k0", "k1", "absent", "k2"], targets)
    assert got[0] is targets[0] and got[1] is targets[1] and got[3] is targets[3]
    assert got[2] is None
    assert not targets[2].any()
    for t, p in zip([targets[0], targets[1], targets[3]], pages, strict=True):
        np.testing.assert_array_equal(t, p)
    with pytest.raises(ValueError):
        backend.batch_get(["k0", "k1"], targets[:1])


def test_hicache_first_writer_wins(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES})
    a, b = page(20), page(21)
    assert backend.set("h", a)
    assert backend.set("h", b)  # stored already: a success that keeps the first page
    target = np.zeros_like(a)
    backend.get("h", target)
    np.testing.assert_array_equal(target, a)


def test_hicache_ranks_do_not_read_each_others_pages(hicache):
    sized = {"emberfs_block_size": PAGE_BYTES}
    rank0 = hicache(sized, tp_rank=0, tp_size=2)
    rank1 = hicache(sized, tp_rank=1, tp_size=2)
    a, b = page(30), page(31)
    assert rank0.set("h", a)
    assert not rank1.exists("h")
    assert rank1.batch_exists(["h"]) == 0
    assert rank1.set("h", b)
    target = np.zeros_like(a)
    rank0.get("h", target)
    np.testing.assert_array_equal(target, a)
    rank1.get("h", target)
    np.testing.assert_array_equal(target, b)
    assert sorted(rank0.cache.keys()) == [
        b"h_org-model-7b_0_2_pagefirst",
        b"h_org-model-7b_1_2_pagefirst",
    ]
    # another model, another pipeline stage, another layout: other pages
    assert not hicache(sized, model_name="org/other", tp_rank=0, tp_size=2).exists("h")
    assert not hicache(sized, tp_rank=0, tp_size=2, pp_rank=0, pp_size=2).exists("h")
    assert not hicache(sized, tp_rank=0, tp_size=2, is_page_first_layout=False).exists("h")
    # the ranks of an MLA model hold the same KV: they share pages
    mla0 = hicache(sized, is_mla_model=True, tp_rank=0, tp_size=2)
    mla1 = hicache(sized, is_mla_model=True, tp_rank=1, tp_size=2)
    assert mla0.set("m", a)
    assert mla1.get("m", target) is target
    np.testing.assert_array_equal(target, a)


def test_hicache_v1_moves_pages_through_the_host_pool(hicache):
    backend = hicache()
    with pytest.raises(RuntimeError):
        backend.batch_set_v1(["v0"], np.arange(PAGE_SIZE))
    pool = HostPool()
    backend.register_mem_pool_host(pool)
    pool.kv[:8] = np.random.default_rng(40).standard_normal((8, TOKEN_ELEMS))
    saved = pool.kv[:8].copy()
    assert backend.batch_set_v1(["v0", "v1"], np.arange(0, 8)) == [True, True]
    assert backend.batch_exists(["v0", "v1"]) == 2
    pool.kv[:] = 0
    got = backend.batch_get_v1(["v0", "v1", "absent"], np.arange(16, 28), extra_info=None)
    assert got == [True, True, False]
    np.testing.assert_array_equal(pool.kv[16:24], saved)
    assert not pool.kv[24:28].any()
    assert not pool.kv[:16].any()
    with pytest.raises(ValueError):
        backend.batch_get_v1(["v0", "v1"], np.arange(7))
    assert backend.batch_get_v1([], np.arange(0)) == []


def test_hicache_makes_the_cache_with_pages_of_the_host_pool(hicache):
    backend = hicache()
    assert backend.cache is None  # missing, and no page size yet to make it with
    assert not backend.exists("h")
    assert backend.batch_exists(["h"]) == 0
    assert backend.get("h", np.zeros(PAGE_SIZE * TOKEN_ELEMS, np.float16)) is None
    backend.register_mem_pool_host(HostPool())
    assert backend.cache.block_size == PAGE_BYTES
    assert backend.set("h", page(50))
    # another server opens the cache this one made
    assert hicache().exists("h")


def test_hicache_does_not_make_a_cache_when_told_not_to(hicache):
    backend = hicache({"emberfs_create": False})
    assert not backend.set("h", page(51))
    assert backend.cache is None
    assert not backend.exists("h")


def test_hicache_refuses_a_pool_of_larger_pages(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES // 2})
    with pytest.raises(ValueError, match="host pool"):
        backend.register_mem_pool_host(HostPool())


def test_hicache_clear_and_stats(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES}, enable_storage_metrics=True)
    keys = ["s0", "s1", "s2"]
    assert backend.batch_set(keys, [page(60), page(61), page(62)])
    targets = [np.zeros(PAGE_SIZE * TOKEN_ELEMS, np.float16) for _ in keys]
    assert all(t is not None for t in backend.batch_get(keys, targets))
    metrics = backend.get_stats()
    assert isinstance(metrics, sgl.StorageMetrics)
    assert metrics.backup_pgs == [3]
    assert metrics.prefetch_pgs == [3]
    assert len(metrics.backup_bandwidth) == 1 and len(metrics.prefetch_bandwidth) == 1
    assert backend.get_stats() == sgl.StorageMetrics()  # drained
    stats = backend.cache.stats()
    assert stats.used_blocks == 3 and stats.used_bytes == 3 * PAGE_BYTES
    assert stats.hits >= 3
    backend.clear()
    assert backend.batch_exists(keys) == 0
    assert backend.cache.stats().used_blocks == 0
    # without enable_storage_metrics nothing is recorded
    quiet = hicache({"emberfs_block_size": PAGE_BYTES})
    assert quiet.set("q", page(63))
    assert quiet.get_stats() == sgl.StorageMetrics()


def test_hicache_loads_the_way_sglangs_dynamic_factory_does(cluster, kv_path):
    extra = {
        "backend_name": "emberfs",
        "module_path": "emberfs.kvcache.sglang",
        "class_name": "EmberHiCacheStorage",
        "interface_v1": 1,
        # the metaserver in the URL of the path
        "emberfs_path": f"emberfs://{cluster.meta_address}{kv_path}",
        "emberfs_capacity": CAPACITY,
    }
    config = StorageConfig(extra_config=extra)
    module = importlib.import_module(extra["module_path"])
    cls = getattr(module, extra["class_name"])
    assert issubclass(cls, module.HiCacheStorage)
    backend = cls(config, {})
    try:
        assert backend.path == kv_path
        pool = HostPool()
        backend.register_mem_pool_host(pool)
        pool.kv[:4] = 1.5
        assert all(backend.batch_set_v1(["d0"], np.arange(4)))
        pool.kv[:] = 0
        assert backend.batch_get_v1(["d0"], np.arange(8, 12)) == [True]
        assert (pool.kv[8:12] == 1.5).all()
    finally:
        backend.close()
