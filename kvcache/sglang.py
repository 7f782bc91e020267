"""SGLang's HiCache storage on EmberFS: :class:`EmberHiCacheStorage`.

SGLang's hierarchical cache keeps KV pages in GPU memory, then in a host
memory pool, then in a storage backend (its "L3"). This module is such a
backend over a :class:`~emberfs.kvcache.store.KVCache`: each page is one
block of the cache, so every inference server that opens the same cache
directory shares the pages the others wrote.

SGLang loads it as a dynamic backend::

    python -m sglang.launch_server --model-path <model> --page-size 64 \\
      --enable-hierarchical-cache --hicache-storage-backend dynamic \\
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
    ``/kvcache/sglang``.
``emberfs_capacity``
    Bytes the cache holds when this backend makes it. Default 64 GiB.
``emberfs_block_size``
    Bytes of a block when this backend makes the cache. Default: one page
    of the host pool (known once SGLang registers it), else the largest
    page of the first write.
``emberfs_create``
    Make the cache when it is missing (default true). With false, a
    missing cache is a cache that misses every page and stores none.

Keys are SGLang's page hashes with a suffix naming the model and the part of
it the rank holds, as SGLang's own file backend names its files: the model
name, the tensor-parallel rank and size (not for MLA models, whose ranks hold
the same KV), the pipeline stage when there are several, the context-parallel
rank when there are several. The host layout is named too, since a flat page
keeps its bytes in the order of the host layout. So ranks never read each
other's pages.

Storage errors (an unreachable metaserver, lost chunks) are logged and count
as misses and failed writes, as the reference backend's do; a page larger
than the cache's blocks raises ValueError.

When SGLang is installed, :class:`EmberHiCacheStorage` subclasses its
``HiCacheStorage`` (the dynamic factory checks ``issubclass``) and
:meth:`~EmberHiCacheStorage.get_stats` returns its ``StorageMetrics``. When it
is not (nor torch), the class subclasses a stand-in defined here with the same
method names, and pages may be any buffer (numpy arrays, bytearrays).
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from emberfs.client.fs import EmberFileSystem
from emberfs.client.paths import meta_of_url, strip_protocol
from emberfs.kvcache.store import KVCache, PutStatus

try:
    import torch
except ImportError:  # pages are then numpy arrays or other buffers
    torch = None

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
except ImportError:

    class HiCacheStorage(abc.ABC):
        """A stand-in of SGLang's ``HiCacheStorage``, used when SGLang is not installed.

        The same methods and defaults: the zero-copy and pool-transfer calls
        raise NotImplementedError, :meth:`batch_exists` asks :meth:`exists`
        key by key.
        """

        def register_mem_pool_host(self, mem_pool_host) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
            raise NotImplementedError

        def batch_get_v2(self, transfers, extra_info=None):
            raise NotImplementedError

        def batch_set_v2(self, transfers, extra_info=None):
            raise NotImplementedError

        def batch_get_v1(self, keys, host_indices, extra_info=None) -> list[bool]:
            raise NotImplementedError

        def batch_set_v1(self, keys, host_indices, extra_info=None) -> list[bool]:
            raise NotImplementedError

        @abc.abstractmethod
        def get(self, key, target_location=None, target_sizes=None): ...

        @abc.abstractmethod
        def batch_get(self, keys, target_locations=None, target_sizes=None): ...

        @abc.abstractmethod
        def set(self, key, value=None, target_location=None, target_sizes=None) -> bool: ...

        @abc.abstractmethod
        def batch_set(
            self, keys, values=None, target_locations=None, target_sizes=None
        ) -> bool: ...

        @abc.abstractmethod
        def exists(self, key) -> bool: ...

        def batch_exists(self, keys, extra_info=None) -> int:
            for i, key in enumerate(keys):
                if not self.exists(key):
                    return i
            return len(keys)

        def clear(self) -> None:  # noqa: B027 (a no-op by default, as in SGLang)
            pass

        def get_stats(self):
            return None


try:
    from sglang.srt.metrics.collector import StorageMetrics
except ImportError:

    @dataclass
    class StorageMetrics:
        """A stand-in of SGLang's ``StorageMetrics``: per batch since the last report."""

        prefetch_pgs: list[int] = field(default_factory=list)
        backup_pgs: list[int] = field(default_factory=list)
        prefetch_bandwidth: list[float] = field(default_factory=list)  # GB/s
        backup_bandwidth: list[float] = field(default_factory=list)  # GB/s


log = logging.getLogger(__name__)

DEFAULT_PATH = "/kvcache/sglang"
DEFAULT_CAPACITY = 64 << 30


def key_suffix(storage_config) -> str:
    """What :class:`EmberHiCacheStorage` appends to a page hash: the model and the rank's part.

    Parameters
    ----------
    storage_config : HiCacheStorageConfig or None
        SGLang's storage config (any object with its attributes); None adds nothing.
    """
    if storage_config is None:
        return ""
    parts = []
    model = getattr(storage_config, "model_name", None)
    if model:
        parts.append(str(model).replace("/", "-"))
    if not getattr(storage_config, "is_mla_model", False):
        parts.append(f"{storage_config.tp_rank}_{storage_config.tp_size}")
    pp_size = getattr(storage_config, "pp_size", 1) or 1
    if pp_size > 1:
        parts.append(f"{pp_size}_{storage_config.pp_rank}")
    cp_size = getattr(storage_config, "attn_cp_size", 1) or 1
    if cp_size > 1:
        parts.append(f"cp{storage_config.attn_cp_rank}_{cp_size}")
    if getattr(storage_config, "is_page_first_layout", False):
        parts.append("pagefirst")
    return "".join(f"_{p}" for p in parts)


def page_source(value) -> memoryview:
    """The bytes of a page to store, without a copy when it is contiguous host memory.

    A torch tensor is viewed as bytes through numpy (a tensor in device
    memory is copied to the host first, a non-contiguous one made
    contiguous); any other object must offer the buffer protocol.
    """
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        return memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
    view = memoryview(value)
    if not view.contiguous:
        view = memoryview(view.tobytes())
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def page_target(target) -> memoryview:
    """A writable byte view of a page buffer to read into (a contiguous host tensor or buffer)."""
    if torch is not None and isinstance(target, torch.Tensor):
        if target.device.type != "cpu" or not target.is_contiguous():
            raise ValueError("a page target must be a contiguous tensor in host memory")
        return memoryview(target.detach().reshape(-1).view(torch.uint8).numpy())
    view = memoryview(target)
    if view.readonly or not view.contiguous:
        raise ValueError("a page target must be a writable contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _sized(view: memoryview, sizes, i: int) -> memoryview:
    if sizes is None or sizes[i] is None:
        return view
    size = int(sizes[i])
    if size > len(view):
        raise ValueError(f"page {i}: a size of {size} bytes for a buffer of {len(view)}")
    return view[:size]


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
        The cache, None while it is missing (and not yet made).
    fs : EmberFileSystem
        The filesystem instance of this backend (closed by :meth:`close`).
    suffix : str
        What every page hash gets appended (:func:`key_suffix`).

    Notes
    -----
    ``get`` and ``batch_get`` read straight into their targets (SGLang's
    dummy pages, tensors in host memory); ``set`` and ``batch_set`` write
    from a byte view of the page, with no copy for a contiguous host tensor.

    ``batch_get_v1`` / ``batch_set_v1`` (SGLang uses them with
    ``"interface_v1": 1``) move pages through the host pool's
    ``get_data_page`` and ``set_from_flat_data_page``: a write stores the
    page the pool hands out, a read fills a dummy page that the pool then
    copies into its slots, which is one host copy per page read (the
    reference backend's generic path does the same). They cannot read into
    the pool's slots directly: a page of the usual page-first layout is two
    separate regions (keys, values) and a block is read into one buffer.
    The ``*_v2`` pool-transfer calls (hybrid models) are left to the base
    class, which raises NotImplementedError.
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
        self.suffix = key_suffix(storage_config)
        self.metrics_enabled = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._lock = threading.Lock()
        self._metrics = StorageMetrics()
        self.cache: KVCache | None = None
        self._open(self.block_size)

    # the cache ------------------------------------------------------------------------------
    def _open(self, block_size: int | None) -> KVCache | None:
        """The cache, opened on first need (made with ``block_size`` when missing)."""
        cache = self.cache
        if cache is not None:
            return cache
        with self._lock:
            if self.cache is None:
                size = (self.block_size or block_size) if self.create_missing else None
                self.cache = KVCache.open_or_create(
                    self.path, block_size=size, capacity=self.capacity, fs=self.fs
                )
            return self.cache

    def _key(self, key: str) -> str:
        return f"{key}{self.suffix}"

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Take SGLang's host pool; make the cache with blocks of one of its pages if missing.

        Raises ValueError when a page is larger than the blocks of the cache.
        """
        super().register_mem_pool_host(mem_pool_host)
        self.mem_pool_host = mem_pool_host
        page = len(page_source(mem_pool_host.get_dummy_flat_data_page()))
        cache = self._open(page)
        if cache is not None and page > cache.block_size:
            raise ValueError(
                f"a page of the host pool takes {page} bytes, a block of the KV cache at "
                f"{self.path} {cache.block_size}"
            )

    # reads ----------------------------------------------------------------------------------
    def _read(self, keys: Sequence[str], views: list[memoryview]) -> list[bool]:
        """Read the pages of ``keys`` into ``views``; per key whether it was read whole."""
        cache = self._open(None)
        if cache is None or not keys:
            return [False] * len(keys)
        names = [self._key(k) for k in keys]
        start = time.perf_counter()
        try:
            got = cache.batch_get(names, into=views)  # a block larger than its target misses
        except OSError as exc:
            log.warning(
                "reading %d pages from the KV cache %s failed: %s", len(keys), self.path, exc
            )
            return [False] * len(keys)
        # a block shorter than its target is a page of another layout: a miss
        hits = [n is not None and n == len(v) for n, v in zip(got, views, strict=True)]
        self._record(
            "prefetch",
            sum(hits),
            sum(len(v) for v, hit in zip(views, hits, strict=True) if hit),
            start,
        )
        return hits

    def _new_page(self):
        """A page to read into when the caller gives none: a dummy page of the host pool."""
        pool = self.mem_pool_host
        return None if pool is None else pool.get_dummy_flat_data_page()

    def get(self, key: str, target_location=None, target_sizes=None):
        """The page of ``key``, or None when it is not stored.

        Parameters
        ----------
        key : str
            The page hash.
        target_location : tensor or buffer, optional
            Host memory to read the page into; it is returned on a hit.
            Without it, a dummy page of the registered host pool is filled
            and returned; without a pool either, a uint8 tensor (a
            ``bytearray`` where torch is not installed).
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
        if targets is None and self.mem_pool_host is not None:
            targets = [self._new_page() for _ in keys]
        if targets is None:
            return self._get_new(keys)
        if len(targets) != len(keys):
            raise ValueError("batch_get needs one target per key")
        views = [_sized(page_target(t), target_sizes, i) for i, t in enumerate(targets)]
        hits = self._read(keys, views)
        return [t if hit else None for t, hit in zip(targets, hits, strict=True)]

    def _get_new(self, keys: list[str]) -> list:
        """Pages as new buffers (no target, no host pool)."""
        cache = self._open(None)
        if cache is None or not keys:
            return [None] * len(keys)
        try:
            got = cache.batch_get([self._key(k) for k in keys])
        except OSError as exc:
            log.warning(
                "reading %d pages from the KV cache %s failed: %s", len(keys), self.path, exc
            )
            return [None] * len(keys)
        if torch is None:
            return got
        return [None if b is None else torch.frombuffer(b, dtype=torch.uint8) for b in got]

    def batch_get_v1(self, keys: Sequence[str], host_indices, extra_info=None) -> list[bool]:
        """Read the pages of ``keys`` into the host pool's slots ``host_indices``.

        ``len(host_indices)`` is ``len(keys)`` times the page size; page
        ``i`` goes to the slots from ``host_indices[i * page_size]``. Returns
        per key whether it was read (``extra_info`` is not used).
        """
        pool, step = self._pool_pages(keys, host_indices)
        pages = [pool.get_dummy_flat_data_page() for _ in keys]
        hits = self._read(list(keys), [page_target(p) for p in pages])
        for i, hit in enumerate(hits):
            if hit:
                pool.set_from_flat_data_page(host_indices[i * step], pages[i])
        return hits

    # writes ---------------------------------------------------------------------------------
    def _write(self, keys: Sequence[str], views: list[memoryview]) -> list[bool]:
        """Store ``views`` under ``keys``; per key whether it is stored (by this or another writer)."""
        if not keys:
            return []
        cache = self._open(max(len(v) for v in views))
        if cache is None:
            return [False] * len(keys)
        start = time.perf_counter()
        try:
            statuses = cache.batch_put([self._key(k) for k in keys], views)
        except OSError as exc:
            log.warning("writing %d pages to the KV cache %s failed: %s", len(keys), self.path, exc)
            return [False] * len(keys)
        stored = [s == PutStatus.STORED for s in statuses]
        self._record(
            "backup",
            sum(stored),
            sum(len(v) for v, s in zip(views, stored, strict=True) if s),
            start,
        )
        return [s.present for s in statuses]

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
        views = [_sized(page_source(p), target_sizes, i) for i, p in enumerate(pages)]
        return all(self._write(keys, views))

    def batch_set_v1(self, keys: Sequence[str], host_indices, extra_info=None) -> list[bool]:
        """Store the pages in the host pool's slots ``host_indices`` under ``keys``.

        Page ``i`` is the flat data page from ``host_indices[i * page_size]``.
        Returns per key whether it is stored (``extra_info`` is not used).
        """
        pool, step = self._pool_pages(keys, host_indices)
        views = [
            page_source(pool.get_data_page(host_indices[i * step], flat=True))
            for i in range(len(keys))
        ]
        return self._write(list(keys), views)

    def _pool_pages(self, keys: Sequence[str], host_indices):
        """The host pool and the slots of a page, for a v1 call."""
        pool = self.mem_pool_host
        if pool is None:
            raise RuntimeError("no host pool registered (register_mem_pool_host)")
        if not keys:
            return pool, 0
        step, rest = divmod(len(host_indices), len(keys))
        if rest or not step:
            raise ValueError(f"{len(host_indices)} host slots for {len(keys)} pages")
        return pool, step

    # lookups and upkeep ---------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        """Whether the page of ``key`` is stored."""
        cache = self._open(None)
        if cache is None:
            return False
        try:
            return cache.exists(self._key(key))
        except OSError as exc:
            log.warning("looking up a page in the KV cache %s failed: %s", self.path, exc)
            return False

    def batch_exists(self, keys: Sequence[str], extra_info=None) -> int:
        """How many leading ``keys`` are stored, in one index call (``extra_info`` is not used)."""
        cache = self._open(None)
        if cache is None:
            return 0
        try:
            return cache.batch_exists([self._key(k) for k in keys])
        except OSError as exc:
            log.warning("looking up pages in the KV cache %s failed: %s", self.path, exc)
            return 0

    def clear(self) -> None:
        """Remove every page of the cache, of every model and rank (as the file backend does)."""
        cache = self._open(None)
        if cache is not None:
            cache.clear()

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
        the cache's own counters are ``self.cache.stats()``.
        """
        with self._lock:
            metrics, self._metrics = self._metrics, StorageMetrics()
        return metrics

    def close(self) -> None:
        """Release the filesystem's connections and threads (SGLang calls it when it detaches)."""
        self.fs.close()
