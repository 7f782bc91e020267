"""The SGLang backend of the KV cache (EmberHiCacheStorage) against SGLang's own classes.

SGLang is installed (tests/engines.txt): the backend subclasses its real
``HiCacheStorage``, is built by its real storage backend factory from a real
``HiCacheStorageConfig``, and moves pages of real host memory pools (MHA in
every layout, MLA, Mamba states; built on the CPU by ``sglpools``). Every
call goes to the real cluster.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sglang.srt.mem_cache.hicache_storage", reason="SGLang (tests/engines.txt)")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (  # noqa: E402
    HybridCacheController,
)
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.observability.metrics_collector import (  # noqa: E402
    StorageMetrics,
    StorageMetricsCollector,
)
from sglang.srt.server_args import ServerArgs  # noqa: E402

from benchmarks.sglpools import fill, mamba_pool, mha_pool, mla_pool, page_bytes, slots  # noqa: E402
from emberfs.kvcache.sglang import EmberHiCacheStorage  # noqa: E402

CAPACITY = 4 << 20
PAGE_BYTES = 4096
SPLIT_LAYOUTS = ["page_first", "page_first_direct", "page_head"]


def storage_config(extra: dict, **fields) -> HiCacheStorageConfig:
    values = dict(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="org/model-7b",
    )
    values.update(fields)
    return HiCacheStorageConfig(extra_config=extra, **values)


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
        backend = EmberHiCacheStorage(storage_config(settings, **config), {})
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def page(seed: int, nbytes: int = PAGE_BYTES) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, nbytes, np.uint8))


class Counted:
    """Counts the calls of a host pool's flat-page copy methods (the path that copies)."""

    def __init__(self, pool) -> None:
        self.calls = 0
        for name in ("get_dummy_flat_data_page", "set_from_flat_data_page"):
            setattr(pool, name, self.wrap(getattr(pool, name)))

    def wrap(self, method):
        def counted(*args, **kwargs):
            self.calls += 1
            return method(*args, **kwargs)

        return counted


# the generic interface: pages in caller buffers ---------------------------------------------
def test_hicache_set_get_exists(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES})
    assert isinstance(backend, HiCacheStorage)
    a = page(1)
    assert backend.set("h1", a)
    assert backend.exists("h1")
    assert not backend.exists("h2")
    target = torch.zeros_like(a)
    assert backend.get("h1", target) is target
    assert torch.equal(target, a)
    assert backend.get("h2", torch.zeros_like(a)) is None
    # no target and no host pool: the page's bytes
    assert torch.equal(backend.get("h1"), a)
    assert backend.get("h2") is None
    # the page's first bytes only
    half = torch.zeros_like(a)
    assert backend.set("h3", a, target_sizes=PAGE_BYTES // 2)
    assert backend.get("h3", half, target_sizes=PAGE_BYTES // 2) is half
    assert torch.equal(half[: PAGE_BYTES // 2], a[: PAGE_BYTES // 2])
    assert not half[PAGE_BYTES // 2 :].any()
    # bad input: a target that is not host memory in one piece, a size beyond the buffer
    with pytest.raises(ValueError, match="contiguous"):
        backend.get("h1", torch.zeros(64, 128, dtype=torch.uint8).t())
    with pytest.raises(ValueError, match="size"):
        backend.set("h4", a, target_sizes=PAGE_BYTES + 1)
    with pytest.raises(ValueError, match="one page per key"):
        backend.batch_set(["a", "b"], [a])


def test_hicache_a_page_of_another_size_is_a_miss(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES})
    a = page(3)
    assert backend.set("whole", a)
    assert backend.set("half", a[: PAGE_BYTES // 2])
    small, large = torch.zeros(PAGE_BYTES // 2, dtype=torch.uint8), torch.zeros_like(a)
    got = backend.batch_get(["whole", "half", "whole"], [small, large, torch.zeros_like(a)])
    assert got[0] is None and got[1] is None and torch.equal(got[2], a)
    with pytest.raises(ValueError, match="the cache takes"):
        backend.set("big", page(4, PAGE_BYTES + 1))


def test_hicache_batch_exists_get_and_first_writer_wins(hicache):
    backend = hicache({"emberfs_block_size": PAGE_BYTES})
    pages = [page(10), page(11), page(12)]
    assert backend.batch_set(["k0", "k1", "k3"], pages)
    assert backend.batch_exists(["k0", "k1", "k2", "k3"]) == 2
    assert backend.batch_exists(["k2", "k0"]) == 0
    assert backend.batch_exists([]) == 0
    targets = [torch.zeros(PAGE_BYTES, dtype=torch.uint8) for _ in range(4)]
    got = backend.batch_get(["k0", "k1", "absent", "k3"], targets)
    assert [g is t for g, t in zip(got, targets, strict=True)] == [True, True, False, True]
    assert not targets[2].any()
    assert all(
        torch.equal(t, p) for t, p in zip([targets[0], targets[1], targets[3]], pages, strict=True)
    )
    with pytest.raises(ValueError, match="one target per key"):
        backend.batch_get(["k0", "k1"], targets[:1])
    assert backend.set("k0", page(13))  # stored already: a success that keeps the first page
    assert torch.equal(backend.get("k0", torch.zeros(PAGE_BYTES, dtype=torch.uint8)), pages[0])


# the host pool's pages: v1 ---------------------------------------------------------------------
@pytest.mark.parametrize("layout", SPLIT_LAYOUTS)
def test_hicache_v1_moves_mha_pages_in_place_as_keys_and_values(hicache, layout):
    backend = hicache()
    pool = mha_pool(layout)
    backend.register_mem_pool_host(pool)
    size = pool.get_dummy_flat_data_page().numel() * 2
    assert backend.cache.block_size == size // 2  # made with blocks of half a page
    fill(pool, 40)
    saved = [page_bytes(pool, p) for p in range(3)]
    copies = Counted(pool)
    assert backend.batch_set_v1(["a", "b", "c"], slots(pool, 0, 3)) == [True, True, True]
    suffix = f"_org-model-7b_0_1_{layout}_bfloat16"
    assert sorted(list(backend.cache.keys())) == sorted(
        f"{k}-{part}{suffix}".encode() for k in "abc" for part in "kv"
    )
    assert copies.calls == 0  # written from the pool's pages: no flat page
    fill(pool, None)
    copies.calls = 0
    got = backend.batch_get_v1(["a", "b", "absent", "c"], slots(pool, 5, 4))
    assert got == [True, True, False, True]
    assert torch.equal(page_bytes(pool, 5), saved[0]) and torch.equal(page_bytes(pool, 6), saved[1])
    assert not page_bytes(pool, 7).any()
    assert torch.equal(page_bytes(pool, 8), saved[2])
    assert copies.calls == 0  # read into the pool's pages: no flat page
    # a flat page of the pool is the same two blocks: the generic calls share the pages
    assert torch.equal(backend.get("b").view(torch.uint8), saved[1])
    assert backend.set("d", saved[0])
    assert backend.batch_get_v1(["d"], slots(pool, 9, 1)) == [True]
    assert torch.equal(page_bytes(pool, 9), saved[0])
    # bad input
    with pytest.raises(ValueError, match="host slots"):
        backend.batch_get_v1(["a", "b"], slots(pool, 0, 1))
    assert backend.batch_get_v1([], slots(pool, 0, 0)) == []


@pytest.mark.parametrize("make_pool", [mha_pool, mla_pool], ids=["mha", "mla"])
def test_hicache_v1_layer_first_goes_through_the_page_bytes(hicache, make_pool):
    backend = hicache()
    pool = make_pool("layer_first")
    backend.register_mem_pool_host(pool)
    fill(pool, 41)
    saved = [page_bytes(pool, p) for p in range(2)]
    assert backend.batch_set_v1(["a", "b"], slots(pool, 0, 2)) == [True, True]
    assert len(list(backend.cache.keys())) == 2  # one block per page
    fill(pool, None)
    assert backend.batch_get_v1(["b", "a"], slots(pool, 3, 2)) == [True, True]
    assert torch.equal(page_bytes(pool, 3), saved[1]) and torch.equal(page_bytes(pool, 4), saved[0])


def test_hicache_v1_moves_mla_pages_in_place(hicache):
    backend = hicache(is_mla_model=True, tp_rank=1, tp_size=2)
    pool = mla_pool("page_first")
    backend.register_mem_pool_host(pool)
    fill(pool, 42)
    saved = page_bytes(pool, 1)
    copies = Counted(pool)
    assert backend.batch_set_v1(["m"], slots(pool, 1, 1)) == [True]
    assert list(backend.cache.keys()) == [b"m_org-model-7b_page_first_bfloat16"]  # no rank: shared
    assert copies.calls == 0
    fill(pool, None)
    copies.calls = 0
    assert backend.batch_get_v1(["m"], slots(pool, 2, 1)) == [True]
    assert torch.equal(page_bytes(pool, 2), saved)
    assert copies.calls == 0


def test_hicache_keys_name_the_rank_the_layout_and_the_dtype(hicache):
    writer = hicache(tp_rank=0, tp_size=2)
    pool = mha_pool("page_first")
    writer.register_mem_pool_host(pool)
    fill(pool, 43)
    assert writer.batch_set_v1(["h"], slots(pool, 0, 1)) == [True]

    def sees(pool, **config) -> bool:
        reader = hicache(**config)
        reader.register_mem_pool_host(pool)
        return reader.batch_exists(["h"]) == 1

    assert sees(mha_pool("page_first"), tp_rank=0, tp_size=2)
    assert not sees(mha_pool("page_first"), tp_rank=1, tp_size=2)
    assert not sees(mha_pool("page_first"), tp_rank=0, tp_size=2, model_name="org/other")
    assert not sees(mha_pool("page_first"), tp_rank=0, tp_size=2, pp_rank=0, pp_size=2)
    # same page size, other layout or dtype: never read as valid
    assert not sees(mha_pool("page_head"), tp_rank=0, tp_size=2)
    assert not sees(mha_pool("page_first", dtype=torch.float16), tp_rank=0, tp_size=2)


def test_hicache_makes_the_cache_with_the_pools_blocks(hicache):
    backend = hicache()
    assert backend.cache is None  # missing, and no block size yet to make it with
    assert not backend.exists("h") and backend.batch_exists(["h"]) == 0
    assert backend.get("h", torch.zeros(PAGE_BYTES, dtype=torch.uint8)) is None
    with pytest.raises(RuntimeError, match="no host pool"):
        backend.batch_set_v1(["h"], torch.arange(16))
    pool = mla_pool("page_first")
    backend.register_mem_pool_host(pool)
    assert backend.cache.block_size == pool.get_dummy_flat_data_page().numel() * 2
    assert backend.batch_set_v1(["h"], slots(pool, 0, 1)) == [True]
    other = hicache()  # another server opens the cache this one made
    other.register_mem_pool_host(mla_pool("page_first"))
    assert other.exists("h")


def test_hicache_does_not_make_a_cache_when_told_not_to(hicache):
    backend = hicache({"emberfs_create": False})
    backend.register_mem_pool_host(mha_pool())
    assert backend.cache is None
    assert backend.batch_set_v1(["h"], torch.arange(16)) == [False]
    assert not backend.set("h", page(51))
    assert not backend.exists("h")


def test_hicache_refuses_a_pool_of_larger_blocks(hicache):
    backend = hicache({"emberfs_block_size": 1024})
    with pytest.raises(ValueError, match="host pool 'kv'"):
        backend.register_mem_pool_host(mha_pool())


# metrics ---------------------------------------------------------------------------------------
def test_hicache_metrics_are_sglangs_own(hicache):
    backend = hicache(enable_storage_metrics=True)
    pool = mha_pool()
    backend.register_mem_pool_host(pool)
    assert backend.batch_set_v1(["s0", "s1", "s2"], slots(pool, 0, 3)) == [True] * 3
    assert backend.batch_get_v1(["s0", "s1", "s2"], slots(pool, 3, 3)) == [True] * 3
    metrics = backend.get_stats()
    assert type(metrics) is StorageMetrics
    assert metrics.backup_pgs == [3] and metrics.prefetch_pgs == [3]
    assert len(metrics.backup_bandwidth) == 1 and len(metrics.prefetch_bandwidth) == 1
    # SGLang's collector asserts the type, and takes it
    collector = StorageMetricsCollector(labels={"model_name": "org/model-7b", "storage": "t"})
    collector.log_storage_metrics(metrics)
    assert backend.get_stats() == StorageMetrics()  # drained
    stats = backend.cache.stats()
    assert stats.used_blocks == 6 and stats.hits >= 6
    backend.clear()
    assert backend.batch_exists(["s0", "s1", "s2"]) == 0
    quiet = hicache()  # without enable_storage_metrics nothing is recorded
    quiet.register_mem_pool_host(pool)
    assert quiet.batch_set_v1(["q"], slots(pool, 0, 1)) == [True]
    assert quiet.get_stats() == StorageMetrics()


# SGLang's factory -------------------------------------------------------------------------------
def test_hicache_loads_through_sglangs_dynamic_factory(cluster, kv_path):
    extra = {
        "backend_name": "emberfs",
        "module_path": "emberfs.kvcache.sglang",
        "class_name": "EmberHiCacheStorage",
        "interface_v1": 1,
        # the metaserver in the URL of the path
        "emberfs_path": f"emberfs://{cluster.meta_address}{kv_path}",
        "emberfs_capacity": CAPACITY,
    }
    pool = mha_pool()
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra), pool)
    try:
        assert isinstance(backend, EmberHiCacheStorage)
        assert backend.path == kv_path
        backend.register_mem_pool_host(pool)  # as SGLang's cache controller does next
        fill(pool, 44)
        saved = page_bytes(pool, 0)
        assert backend.batch_set_v1(["d0"], slots(pool, 0, 1)) == [True]
        assert backend.batch_get_v1(["d0"], slots(pool, 4, 1)) == [True]
        assert torch.equal(page_bytes(pool, 4), saved)
    finally:
        backend.close()


# the pools of hybrid models: v2 -----------------------------------------------------------------
def transfer(name, keys, pool, first_page, policy=PoolHitPolicy.ALL_PAGES) -> PoolTransfer:
    return PoolTransfer(
        name=name, keys=keys, host_indices=slots(pool, first_page, len(keys)), hit_policy=policy
    )


def test_hicache_v2_moves_a_hybrid_models_pools(hicache, kv_path):
    backend = hicache()
    kv, mamba, indexer = mha_pool(), mamba_pool(), mla_pool("layer_first")
    backend.register_mem_pool_host(kv)
    backend.register_mem_host_pool_v2(kv, PoolName.KV)  # the anchor again: nothing new
    backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    backend.register_mem_host_pool_v2(indexer, PoolName.INDEXER)
    backend.on_host_pools_registered()
    assert set(backend.stores) == {"mamba", "indexer"}
    assert backend.fs.exists(f"{kv_path}.mamba") and backend.fs.exists(f"{kv_path}.indexer")
    for seed, pool in enumerate((kv, mamba, indexer)):
        fill(pool, 50 + seed)
    keys = ["p0", "p1", "p2", "p3"]
    saved_kv = [page_bytes(kv, p) for p in range(4)]
    saved_mamba = {p: page_bytes(mamba, p) for p in (1, 3)}
    saved_indexer = [page_bytes(indexer, p) for p in range(4)]
    assert backend.batch_set_v1(keys, slots(kv, 0, 4)) == [True] * 4
    # Mamba keeps the state at the end of pages 2 and 4 of the prefix; the indexer every page
    written = backend.batch_set_v2(
        [
            transfer(PoolName.MAMBA, ["p1"], mamba, 1, PoolHitPolicy.TRAILING_PAGES),
            transfer(PoolName.INDEXER, keys, indexer, 0),
        ]
    )
    assert written == {PoolName.MAMBA: [True], PoolName.INDEXER: [True] * 4}
    assert backend.batch_set_v2(
        [transfer(PoolName.MAMBA, ["p3"], mamba, 3, PoolHitPolicy.TRAILING_PAGES)]
    ) == {PoolName.MAMBA: [True]}

    def exists(keys, *pools):
        result = backend.batch_exists_v2(keys, list(pools))
        return result.kv_hit_pages, result.extra_pool_hit_pages, result.restorable_prefix_pages

    trailing = transfer(PoolName.MAMBA, ["x"], mamba, 0, PoolHitPolicy.TRAILING_PAGES)
    everything = transfer(PoolName.INDEXER, keys, indexer, 0)
    assert exists(keys, trailing, everything) == (
        4,
        {PoolName.KV: 4, PoolName.MAMBA: 4, PoolName.INDEXER: 4},
        [2, 4],
    )
    assert exists(keys[:3], trailing)[0] == 2  # no state at the end of page 3
    assert exists(keys + ["p4"], trailing)[0] == 4  # the KV prefix ends at 4
    assert exists(["zz"] + keys, trailing, everything)[0] == 0
    # a pool of another policy gives no verdict; a pool not registered cuts everything
    groups = transfer(PoolName.INDEXER, keys, indexer, 0, PoolHitPolicy.BLOCK_GROUPS)
    assert exists(keys, groups)[:2] == (4, {PoolName.KV: 4})
    assert exists(keys, transfer(PoolName.SWA, keys, indexer, 0))[0] == 0

    for pool in (kv, mamba, indexer):
        fill(pool, None)
    assert backend.batch_get_v1(keys, slots(kv, 4, 4)) == [True] * 4
    got = backend.batch_get_v2(
        [
            transfer(PoolName.MAMBA, ["p3", "p2"], mamba, 5, PoolHitPolicy.TRAILING_PAGES),
            transfer(PoolName.INDEXER, keys, indexer, 4),
            transfer(PoolName.SWA, ["p0"], indexer, 0),
        ]
    )
    assert got == {
        PoolName.MAMBA: [True, False],
        PoolName.INDEXER: [True] * 4,
        PoolName.SWA: [False],  # not registered
    }
    assert all(torch.equal(page_bytes(kv, 4 + p), saved_kv[p]) for p in range(4))
    assert torch.equal(page_bytes(mamba, 5), saved_mamba[3])
    assert not page_bytes(mamba, 6).any()
    assert all(torch.equal(page_bytes(indexer, 4 + p), saved_indexer[p]) for p in range(4))
    # host slots that do not match the keys move nothing
    bad = PoolTransfer(name=PoolName.INDEXER, keys=keys, host_indices=slots(indexer, 0, 2))
    assert backend.batch_get_v2([bad]) == {PoolName.INDEXER: [False] * 4}
    assert backend.batch_set_v2([bad]) == {PoolName.INDEXER: [False] * 4}
    # clear empties every pool's cache
    backend.clear()
    assert exists(keys, trailing) == (0, {}, [])
    assert backend.stores["mamba"].cache.stats().used_blocks == 0


def launch_command() -> list[str]:
    """The arguments of the ``sglang.launch_server`` command in docs/kvcache.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "kvcache.md").read_text()
    block = text.split("python -m sglang.launch_server", 1)[1].split("```", 1)[0]
    return shlex.split(block.replace("\\\n", " "))


def test_hicache_the_documented_launch_command_works(cluster, kv_path):
    """SGLang's own argument parser and extra-config parser take the docs' command as written."""
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(launch_command())
    assert args.enable_hierarchical_cache and args.hicache_storage_backend == "dynamic"
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(
        args.hicache_storage_backend_extra_config
    )
    assert extra["interface_v1"] == 1  # what makes SGLang call batch_get_v1 / batch_set_v1
    extra.update(emberfs_meta=cluster.meta_address, emberfs_path=kv_path, emberfs_capacity=CAPACITY)
    pool = mha_pool(args.hicache_mem_layout, page_size=args.page_size, tokens=4 * args.page_size)
    backend = StorageBackendFactory.create_backend(
        args.hicache_storage_backend, storage_config(extra), pool
    )
    try:
        backend.register_mem_pool_host(pool)
        assert backend.kv.plan.direct  # the documented layout reads in place
        fill(pool, 45)
        saved = page_bytes(pool, 0)
        assert backend.batch_set_v1(["l0"], slots(pool, 0, 1)) == [True]
        assert backend.batch_get_v1(["l0"], slots(pool, 2, 1)) == [True]
        assert torch.equal(page_bytes(pool, 2), saved)
    finally:
        backend.close()
