"""SGLang's HiCache storage on EmberFS: :class:`EmberHiCacheStorage`.

SGLang's hierarchical cache keeps KV pages in GPU memory, then in a host
memory pool, then in a storage backend (its "L3"). This module is such a
backend over a :class:`~emberfs.kvcache.store.KVCache`: each page is one
block of the cache (two, keys and values, where the host layout keeps them
apart), so every inference server that opens the same cache directory
shares the pages the others wrote. It needs SGLang 0.5.10 or later (the
pool-transfer calls of hybrid models); it is tested with 0.5.23.

SGLang loads it as a dynamic backend::

    python -m sglang.launch_server --model-path <model> --page-size 64 \\
      --enable-hierarchical-cache --hicache-mem-layout page_first \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "emberfs",
        "module_path": "emberfs.kvcache.sglang", "class_name": "EmberHiCacheStorage",
        "emberfs_meta": "10.0.0.1:9400", "emberfs_path": "/kvcache/llama-70b",
        "emberfs_capacity": 1099511627776, "interface_v1": 1}'

The settings are keys of ``storage_config.extra_config`` (the keyword
arguments of the factory, when it passes some, override them):

``emberfs_meta``
    The metaserver address (``HOST:PORT``, or several joined by commas).
    Default: the authority of an ``emberfs://`` URL in ``emberfs_path``,
    else ``EMBERFS_META`` or the client config, as for every EmberFS client.
``emberfs_token``
    The client token. Default: ``EMBERFS_TOKEN`` or the client config.
``emberfs_path``
    The cache directory (or an ``emberfs://HOST:PORT/path`` URL). Default
    ``/kvcache/sglang``. Each further pool of a hybrid model (Mamba states,
    sliding-window KV, indexer) has a cache of its own, ``PATH.POOL``.
``emberfs_capacity``
    Bytes each cache holds when this backend makes it. Default 64 GiB.
``emberfs_block_size``
    Bytes of a block when this backend makes the KV cache. Default: a
    block of the host pool's pages (:mod:`emberfs.kvcache.hostpages`),
    known once SGLang registers it, else the largest page of the first write.
    The caches of further pools have blocks of their pools' pages.
``emberfs_create``
    Make the caches when missing (default true). With false, a missing
    cache is a cache that misses every page and stores none.

Keys are SGLang's page hashes with a suffix naming the model, the part of
it the rank holds, the host layout and the KV dtype
(:func:`~emberfs.kvcache.hostpages.key_suffix`,
:func:`~emberfs.kvcache.hostpages.pool_suffix`), so ranks, and servers whose
pools differ, never read each other's pages.

Storage errors (an unreachable metaserver, lost chunks) are logged and count
as misses and failed writes, as the reference backend's do; a page larger
than the cache's blocks raises ValueError.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence

import torch

from emberfs.client.fs import EmberFileSystem
from emberfs.client.paths import meta_of_url, strip_protocol
from emberfs.kvcache.hostpages import (
    PageStore,
    key_suffix,
    page_plan,
    page_regions,
    page_slots,
    page_source,
    page_target,
    restorable_pages,
    sized,
)
from emberfs.kvcache.store import KVCache, PutStatus

try:
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorage,
        PoolName,
        PoolTransferResult,
    )
except ImportError as exc:  # pragma: no cover - the module is SGLang's plug-in
    raise ImportError(
        "emberfs.kvcache.sglang is a storage backend of SGLang (0.5.10 or later): "
        f"install SGLang to use it ({exc})"
    ) from exc

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics
except ImportError:  # SGLang before 0.5.10 kept it there
    from sglang.srt.metrics.collector import StorageMetrics

log = logging.getLogger(__name__)

DEFAULT_PATH = "/kvcache/sglang"
DEFAULT_CAPACITY = 64 << 30
_RESTORABLE = "restorable_prefix_pages" in {f.name for f in dataclasses.fields(PoolTransferResult)}


def _flag(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)


class EmberHiCacheStorage(HiCacheStorage):
    """SGLang's HiCache storage backend over an EmberFS KV cache.

    Parameters
    ----------
    storage_config : HiCacheStorageConfig, optional
        SGLang's storage config: the rank coordinates, the model name,
        ``enable_storage_metrics``, and the settings in ``extra_config``
        (see the module docstring).
    kwargs : dict, optional
        The factory's keyword arguments; ``emberfs_*`` keys override
        ``extra_config``.

    Attributes
    ----------
    cache : KVCache or None
        The KV cache, None while it is missing (and not yet made).
    stores : dict of str to PageStore
        The further pools of a hybrid model, by SGLang's pool name.
    fs : EmberFileSystem
        The filesystem instance of this backend (closed by :meth:`close`).

    Notes
    -----
    ``batch_get_v1`` / ``batch_set_v1`` (SGLang uses them with
    ``"interface_v1": 1``) and the ``*_v2`` calls of hybrid models read
    straight into the host pool's pages and write straight from them where
    the layout keeps a page in one or two regions; other layouts go through
    the pool's flat page, one host copy per page read, as SGLang's
    reference backends do. ``get`` and ``batch_get`` read straight into
    their targets; ``set`` and ``batch_set`` write from a byte view of the
    page. A flat page of a split layout is stored as its two blocks, so the
    calls share pages whichever SGLang uses.
    """

    def __init__(self, storage_config=None, kwargs: dict | None = None) -> None:
        settings = dict(getattr(storage_config, "extra_config", None) or {})
        settings.update({k: v for k, v in (kwargs or {}).items() if k.startswith("emberfs_")})
        self.storage_config = storage_config
        self.mem_pool_host = None
        path = str(settings.get("emberfs_path") or DEFAULT_PATH)
        meta = settings.get("emberfs_meta") or meta_of_url(path)
        self.fs = EmberFileSystem(meta, settings.get("emberfs_token"), skip_instance_cache=True)
        self.path = strip_protocol(path)
        self.capacity = int(settings.get("emberfs_capacity", DEFAULT_CAPACITY))
        block_size = settings.get("emberfs_block_size")
        self.block_size = int(block_size) if block_size else None
        self.create_missing = _flag(settings.get("emberfs_create", True))
        self.metrics_enabled = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._lock = threading.Lock()
        self._metrics = StorageMetrics()
        self.kv = PageStore(str(PoolName.KV), None, key_suffix(storage_config))
        self.stores: dict[str, PageStore] = {}
        self._open(self.block_size)

    # the caches -----------------------------------------------------------------------------
    @property
    def cache(self) -> KVCache | None:
        return self.kv.cache

    @property
    def suffix(self) -> str:
        """What every page hash gets appended in the KV cache."""
        return self.kv.suffix

    def _open(self, block_size: int | None) -> KVCache | None:
        """The KV cache, opened on first need (made with ``block_size`` when missing)."""
        cache = self.kv.cache
        if cache is not None:
            return cache
        with self._lock:
            if self.kv.cache is None:
                size = (self.block_size or block_size) if self.create_missing else None
                self.kv.cache = KVCache.open_or_create(
                    self.path, block_size=size, capacity=self.capacity, fs=self.fs
                )
            return self.kv.cache

    def _check(self, store: PageStore, path: str) -> None:
        """Refuse a pool whose blocks do not fit the blocks of its cache."""
        cache, plan = store.cache, store.plan
        if cache is not None and plan.block_bytes > cache.block_size:
            raise ValueError(
                f"a page of the host pool {store.name!r} takes {plan.block_bytes} bytes per "
                f"block, a block of the KV cache at {path} {cache.block_size}"
            )

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Take SGLang's KV host pool; make the cache with blocks of its pages if missing.

        Raises ValueError when a block of a page is larger than the blocks of the cache.
        """
        super().register_mem_pool_host(mem_pool_host)
        plan = page_plan(mem_pool_host)
        self.kv.pool, self.kv.plan = mem_pool_host, plan
        self.kv.suffix = key_suffix(self.storage_config) + plan.suffix
        self._open(plan.block_bytes)
        self._check(self.kv, self.path)
        log.info(
            "EmberFS HiCache storage at %s: pages of %d bytes as %d block(s), %s",
            self.path,
            plan.page_bytes,
            len(plan.parts),
            "in place" if plan.direct else "through the flat page",
        )

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        """Take a further host pool of a hybrid model; make its cache, ``PATH.POOL``, if missing."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        if name == str(PoolName.KV):
            self.register_mem_pool_host(host_pool)
            return
        plan = page_plan(host_pool)
        path = f"{self.path}.{name}"
        size = plan.block_bytes if self.create_missing else None
        cache = KVCache.open_or_create(path, block_size=size, capacity=self.capacity, fs=self.fs)
        # Mamba states are split over the tensor-parallel ranks even of an MLA model
        sharded = name == str(PoolName.MAMBA)
        suffix = key_suffix(self.storage_config, sharded=sharded) + plan.suffix
        store = PageStore(name, cache, suffix, host_pool, plan)
        self._check(store, path)
        self.stores[name] = store

    def _cache_of(self, store: PageStore, block_size: int | None = None) -> KVCache | None:
        """The cache of ``store``; the KV cache is opened (or made with ``block_size``) on need."""
        return self._open(block_size) if store.name == self.kv.name else store.cache

    def _store(self, name) -> PageStore | None:
        name = str(name)
        return self.kv if name == str(PoolName.KV) else self.stores.get(name)

    # moving blocks ----------------------------------------------------------------------------
    def _read(self, store: PageStore, keys: Sequence[str], views: list[memoryview]) -> list[bool]:
        """Read the blocks of the pages of ``keys`` into ``views``; per page whether it is whole."""
        cache = self._cache_of(store)
        if cache is None or not keys:
            return [False] * len(keys)
        start = time.perf_counter()
        try:
            got = cache.batch_get(store.names(keys), into=views)
        except OSError as exc:
            log.warning(
                "reading %d pages from the KV cache %s failed: %s", len(keys), store.name, exc
            )
            return [False] * len(keys)
        # a block longer or shorter than its target is a page of another layout: a miss
        whole = [n is not None and n == len(v) for n, v in zip(got, views, strict=True)]
        n = len(store.parts)
        hits = [all(whole[i * n : (i + 1) * n]) for i in range(len(keys))]
        self._record(
            "prefetch",
            sum(hits),
            sum(len(v) for v, w in zip(views, whole, strict=True) if w),
            start,
        )
        return hits

    def _write(self, store: PageStore, keys: Sequence[str], views: list[memoryview]) -> list[bool]:
        """Store the blocks ``views`` of the pages of ``keys``; per page whether it is stored."""
        if not keys:
            return []
        cache = self._cache_of(store, max(len(v) for v in views))
        if cache is None:
            return [False] * len(keys)
        start = time.perf_counter()
        try:
            statuses = cache.batch_put(store.names(keys), views)
        except OSError as exc:
            log.warning(
                "writing %d pages to the KV cache %s failed: %s", len(keys), store.name, exc
            )
            return [False] * len(keys)
        n = len(store.parts)
        stored = sum(len(v) for v, s in zip(views, statuses, strict=True) if s == PutStatus.STORED)
        pages = [all(s.present for s in statuses[i * n : (i + 1) * n]) for i in range(len(keys))]
        self._record("backup", sum(pages), stored, start)
        return pages

    def _get_pages(self, store: PageStore, keys: list[str], slots: list[int]) -> list[bool]:
        """Read the pages of ``keys`` into the pool's pages at ``slots``."""
        pool, plan = store.pool, store.plan
        if plan.direct:
            views = [v for slot in slots for v in page_regions(pool, plan, slot)]
            return self._read(store, keys, views)
        pages = [pool.get_dummy_flat_data_page() for _ in keys]
        hits = self._read(store, keys, [page_target(p) for p in pages])
        for slot, page, hit in zip(slots, pages, hits, strict=True):
            if hit:
                pool.set_from_flat_data_page(slot, page)
        return hits

    def _set_pages(self, store: PageStore, keys: list[str], slots: list[int]) -> list[bool]:
        """Store the pool's pages at ``slots`` under ``keys``."""
        pool, plan = store.pool, store.plan
        if plan.direct:
            views = [v for slot in slots for v in page_regions(pool, plan, slot)]
        else:
            views = [page_source(pool.get_data_page(slot, flat=True)) for slot in slots]
        return self._write(store, keys, views)

    def _registered(self) -> PageStore:
        if self.kv.pool is None:
            raise RuntimeError("no host pool registered (register_mem_pool_host)")
        return self.kv

    # the v1 interface: pages of the KV host pool -----------------------------------------------
    def batch_get_v1(self, keys: Sequence[str], host_indices, extra_info=None) -> list[bool]:
        """Read the pages of ``keys`` into the KV host pool's slots ``host_indices``.

        ``host_indices`` holds ``page_size`` slots per key; page ``i`` goes to
        the page from ``host_indices[i * page_size]``. Returns per key whether
        it was read (``extra_info`` is not used).
        """
        store = self._registered()
        keys = list(keys)
        return self._get_pages(store, keys, page_slots(keys, host_indices, store.pool.page_size))

    def batch_set_v1(self, keys: Sequence[str], host_indices, extra_info=None) -> list[bool]:
        """Store the pages at the KV host pool's slots ``host_indices`` under ``keys``.

        Returns per key whether it is stored (``extra_info`` is not used).
        """
        store = self._registered()
        keys = list(keys)
        return self._set_pages(store, keys, page_slots(keys, host_indices, store.pool.page_size))

    # the v2 interface: the pools of hybrid models ------------------------------------------
    def _transfer(self, transfer, move) -> list[bool]:
        keys = list(transfer.keys or [])
        store = self._store(transfer.name)
        if store is None or store.pool is None:
            log.warning("no host pool %r registered: %d pages not moved", transfer.name, len(keys))
            return [False] * len(keys)
        page_size = getattr(store.pool, "page_size", 1) or 1
        try:
            slots = page_slots(keys, transfer.host_indices, page_size)
        except ValueError as exc:
            log.error("pool %s: %s", transfer.name, exc)
            return [False] * len(keys)
        return move(store, keys, slots)

    def batch_get_v2(self, transfers, extra_info=None) -> dict[str, list[bool]]:
        """Read each transfer's pages into its pool; per pool name, per key whether it was read."""
        return {t.name: self._transfer(t, self._get_pages) for t in transfers}

    def batch_set_v2(self, transfers, extra_info=None) -> dict[str, list[bool]]:
        """Store each transfer's pages of its pool; per pool name, per key whether it is stored."""
        return {t.name: self._transfer(t, self._set_pages) for t in transfers}

    def batch_exists_v2(self, keys: Sequence[str], pool_transfers=None, extra_info=None):
        """The longest prefix of ``keys`` whose pages every pool can restore.

        The KV pages' stored prefix, cut by each pool as its hit policy says:
        ``ALL_PAGES`` needs the pool's page of every page of the prefix,
        ``TRAILING_PAGES`` those of the prefix's last ``len(transfer.keys)``
        pages. A pool of another policy (block groups) gives no verdict and
        does not cut. A pool not registered cuts the prefix to nothing.
        """
        keys = list(keys)
        kv_pages = self.batch_exists(keys)
        hit_count: dict = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            if not restorable:
                break
            store = self._store(transfer.name)
            if store is None or store.cache is None:
                restorable = set()
                break
            present = self._contains(store, keys[:kv_pages])
            verdict = restorable_pages(present, transfer.hit_policy, len(transfer.keys or ()))
            if verdict is None:  # a policy that gives no verdict (block groups)
                continue
            boundary, mine = verdict
            if boundary:
                hit_count[transfer.name] = boundary
            restorable &= mine
        ordered = sorted(restorable)
        final = ordered[-1] if ordered else 0
        if _RESTORABLE:
            return PoolTransferResult(final, hit_count, ordered)
        return PoolTransferResult(final, hit_count)

    def _contains(self, store: PageStore, keys: list[str]) -> list[bool]:
        """Per page of ``keys`` whether each of its blocks is stored."""
        if not keys:
            return []
        try:
            found = store.cache.contains(store.names(keys))
        except OSError as exc:
            log.warning("looking up pages in the KV cache %s failed: %s", store.name, exc)
            return [False] * len(keys)
        n = len(store.parts)
        return [all(found[i * n : (i + 1) * n]) for i in range(len(keys))]

    # the generic interface: pages in caller buffers ----------------------------------------
    def get(self, key: str, target_location=None, target_sizes=None):
        """The page of ``key``, or None when it is not stored.

        Parameters
        ----------
        key : str
            The page hash.
        target_location : tensor or buffer, optional
            Host memory to read the page into; it is returned on a hit.
            Without it, a dummy page of the registered host pool is filled
            and returned; without a pool either, a new uint8 tensor.
        target_sizes : int, optional
            Bytes of the target to use (default: all of it).
        """
        targets = None if target_location is None else [target_location]
        sizes = None if target_sizes is None else [target_sizes]
        return self.batch_get([key], targets, sizes)[0]

    def batch_get(self, keys: Sequence[str], target_locations=None, target_sizes=None) -> list:
        """The pages of ``keys`` (None for each not stored), read in one batch.

        Parameters
        ----------
        keys : sequence of str
        target_locations : sequence of tensors or buffers, optional
            One per key (see :meth:`get`).
        target_sizes : sequence of int, optional
            One per key: bytes of its target to use.
        """
        keys = list(keys)
        targets = list(target_locations) if target_locations is not None else None
        if targets is None and self.kv.pool is not None:
            targets = [self.kv.pool.get_dummy_flat_data_page() for _ in keys]
        if targets is None:
            return self._get_new(keys)
        if len(targets) != len(keys):
            raise ValueError("batch_get needs one target per key")
        views = [sized(page_target(t), target_sizes, i) for i, t in enumerate(targets)]
        hits = self._pages(keys, views, self._read)
        return [t if hit else None for t, hit in zip(targets, hits, strict=True)]

    def _pages(self, keys: list[str], views: list[memoryview], move) -> list[bool]:
        """Move flat pages: whole pages of a split layout as their blocks, others as one block."""
        split = [len(self.kv.split(v)) > 1 for v in views]
        result = [False] * len(keys)
        whole = PageStore(self.kv.name, None, self.kv.suffix)
        for store, pick in ((self.kv, True), (whole, False)):
            chosen = [i for i, s in enumerate(split) if s == pick]
            if chosen:
                blocks = [b for i in chosen for b in store.split(views[i])]
                moved = move(store, [keys[i] for i in chosen], blocks)
                for i, ok in zip(chosen, moved, strict=True):
                    result[i] = ok
        return result

    def _get_new(self, keys: list[str]) -> list:
        """Pages as new uint8 tensors (no target, no host pool)."""
        cache = self._open(None)
        if cache is None or not keys:
            return [None] * len(keys)
        try:
            got = cache.batch_get([f"{k}{self.suffix}" for k in keys])
        except OSError as exc:
            log.warning(
                "reading %d pages from the KV cache %s failed: %s", len(keys), self.path, exc
            )
            return [None] * len(keys)
        return [None if b is None else torch.frombuffer(b, dtype=torch.uint8) for b in got]

    def set(self, key: str, value=None, target_location=None, target_sizes=None) -> bool:
        """Store one page; True when it is stored (a page stored already stays: the first wins).

        Parameters
        ----------
        key : str
        value : tensor or buffer, optional
            The page.
        target_location : tensor or buffer, optional
            The page, when ``value`` is not given.
        target_sizes : int, optional
            Bytes of the page to store (default: all of it).
        """
        values = None if value is None else [value]
        locations = None if target_location is None else [target_location]
        sizes = None if target_sizes is None else [target_sizes]
        return self.batch_set([key], values, locations, sizes)

    def batch_set(
        self, keys: Sequence[str], values=None, target_locations=None, target_sizes=None
    ) -> bool:
        """Store pages in one batch; True when every one is stored.

        Parameters
        ----------
        keys : sequence of str
        values : sequence of tensors or buffers, optional
            One page per key.
        target_locations : sequence of tensors or buffers, optional
            The pages, when ``values`` is not given.
        target_sizes : sequence of int, optional
            One per key: bytes of its page to store.
        """
        pages = values if values is not None else target_locations
        if pages is None:
            raise ValueError("batch_set needs the pages (values or target_locations)")
        keys = list(keys)
        pages = list(pages)
        if len(pages) != len(keys):
            raise ValueError("batch_set needs one page per key")
        if not keys:
            return True
        views = [sized(page_source(p), target_sizes, i) for i, p in enumerate(pages)]
        return all(self._pages(keys, views, self._write))

    # lookups and upkeep ---------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        """Whether the page of ``key`` is stored (each of its blocks)."""
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: Sequence[str], extra_info=None) -> int:
        """How many leading ``keys`` are stored, in one index call (``extra_info`` is not used)."""
        cache = self._open(None)
        if cache is None or not keys:
            return 0
        try:
            blocks = cache.batch_exists(self.kv.names(list(keys)))
        except OSError as exc:
            log.warning("looking up pages in the KV cache %s failed: %s", self.path, exc)
            return 0
        return blocks // len(self.kv.parts)

    def clear(self) -> None:
        """Remove every page of the caches, of every model and rank (as the file backend does)."""
        self._open(None)
        for store in [self.kv, *self.stores.values()]:
            if store.cache is not None:
                store.cache.clear()

    def _record(self, kind: str, count: int, nbytes: int, start: float) -> None:
        """Note a batch of ``count`` pages of ``kind`` (prefetch or backup) for :meth:`get_stats`."""
        if not self.metrics_enabled or not count:
            return
        elapsed = time.perf_counter() - start
        with self._lock:
            getattr(self._metrics, f"{kind}_pgs").append(count)
            if elapsed > 0:
                getattr(self._metrics, f"{kind}_bandwidth").append(nbytes / elapsed / 1e9)

    def get_stats(self) -> StorageMetrics:
        """Pages and GB/s of each batch read (prefetch) and stored (backup) since the last call.

        Recorded only with ``enable_storage_metrics`` in the storage config;
        the caches' own counters are ``self.cache.stats()``.
        """
        with self._lock:
            metrics, self._metrics = self._metrics, StorageMetrics()
        return metrics

    def close(self) -> None:
        """Release the filesystem's connections and threads (SGLang calls it when it detaches)."""
        self.fs.close()
