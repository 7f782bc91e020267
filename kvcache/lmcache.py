"""LMCache's remote storage on EmberFS: :class:`EmberConnector` and :class:`EmberConnectorAdapter`.

LMCache keeps KV chunks (``chunk_size`` tokens of every layer) in local CPU
memory and, behind it, in remote storage reached through a
``RemoteConnector``. :class:`EmberConnector` is such a connector over a
:class:`~emberfs.kvcache.store.KVCache`: each chunk is one block, stored under
``CacheEngineKey.to_string()`` (which names the model, world size, worker,
chunk hash and dtype), so every LMCache instance that opens the same cache
directory shares the chunks the others stored.

Needs LMCache 0.3.15 or later (tested with 0.5.6): the first release whose
``RemoteConnector`` takes ``(config, metadata)`` and keeps
``full_chunk_size_bytes``, whose ``batched_contains`` returns a count, and
that loads adapters named by ``remote_storage_plugins``. Importing this module
without it raises ImportError; the rest of EmberFS does not need LMCache.

LMCache loads it as a remote storage plugin, whose name is ``emberfs`` or
``emberfs.<instance>`` (LMCache 0.4.4 and later)::

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 5
    remote_serde: naive
    remote_storage_plugins: ["emberfs"]
    extra_config:
      remote_storage_plugin.emberfs.module_path: emberfs.kvcache.lmcache
      remote_storage_plugin.emberfs.class_name: EmberConnectorAdapter
      remote_storage_plugin.emberfs.url: "emberfs://10.0.0.1:9400/kvcache/llama-70b"
      remote_storage_plugin.emberfs.capacity: 1099511627776

or, on any supported version, with ``remote_url:
"emberfs://10.0.0.1:9400/kvcache/llama-70b"`` and the same plugin entries.
``class_name: EmberConnector`` works too (0.4.4 and later): LMCache then
builds the connector itself, with the metadata of its local CPU backend.

Settings are ``remote_storage_plugin.<name>.<key>`` entries of
``extra_config``:

``url``
    ``emberfs://HOST:PORT[,HOST:PORT...]/path``: the metaserver and the
    cache directory (a connector URL of that form overrides it).
``meta``, ``path``
    The same, apart. Defaults: ``EMBERFS_META`` or the client config, and
    ``/kvcache/lmcache``.
``token``
    The client token. Default: ``EMBERFS_TOKEN`` or the client config.
``capacity``
    Bytes the cache holds when the connector makes it. Default 64 GiB.
``block_size``
    Bytes of a block when the connector makes the cache. Default: a full
    chunk of the model, plus room for the chunk header.
``create``
    Make the cache when it is missing (default true).
``workers``
    Threads that run the cache's blocking calls (default 8).

The cache is opened when first used and made, when missing, by the first
put (or by :meth:`EmberConnector.post_init`), not when the connector is
built: LMCache may build it before the model's KV layer groups are known,
and a full chunk's size is final only then. Until then its chunk shapes are
taken again from the metadata each time the cache is looked for.

A chunk is stored as LMCache's ``save_chunk_meta`` (default true) says:

* with it, a block is a small header (the chunk's length, shapes, dtypes
  and memory format) and the chunk's bytes, so chunks of any shape come back
  as they went (a serde may change them); a get allocates from the header
  and copies the bytes in, a put copies them behind the header;
* without it, a block is the chunk's bytes alone, under the key with
  ``#raw`` appended (so the two kinds never mix); a get allocates a full
  chunk from the connector's metadata and reads straight into it, then
  trims a partial chunk with ``reshape_partial_chunk``.

The bytes of a chunk are its ``get_size()`` bytes of ``byte_array``.

Every coroutine runs the cache's blocking calls on the connector's threads,
so the event loop never waits on the cluster. Errors of the cluster
propagate to LMCache; a chunk that cannot be read or allocated (local memory
full, after what can be evicted is) is a miss.
A put does not release the memory object: LMCache's connector wrapper does.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata as dist_metadata
from urllib.parse import urlsplit

MIN_LMCACHE = (0, 3, 15)
_NEEDS = "emberfs.kvcache.lmcache needs LMCache 0.3.15 or later (pip install 'lmcache>=0.3.15')"


def lmcache_version() -> tuple[int, ...] | None:
    """The installed LMCache's release as numbers (None when its version is not known)."""
    try:
        text = dist_metadata.version("lmcache")
    except dist_metadata.PackageNotFoundError:
        return None
    found = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(n) for n in found.group().split(".")) if found else None


try:
    from lmcache.v1.storage_backend.connector import ConnectorAdapter
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
except ImportError as exc:
    raise ImportError(f"{_NEEDS}: {exc}") from exc
if (lmcache_version() or MIN_LMCACHE) < MIN_LMCACHE:
    raise ImportError(f"{_NEEDS}; {dist_metadata.version('lmcache')} is installed")

from emberfs.client.fs import EmberFileSystem  # noqa: E402 (after LMCache's check)
from emberfs.client.paths import strip_protocol  # noqa: E402
from emberfs.kvcache.lmchunk import (  # noqa: E402
    HEADER_ROOM,
    ChunkHeader,
    byte_view,
    chunk_bytes,
)
from emberfs.kvcache.lmchunk import payload as chunk_payload  # noqa: E402
from emberfs.kvcache.store import KVCache  # noqa: E402

log = logging.getLogger(__name__)

PLUGIN_TYPE = "emberfs"
URL_SCHEMES = ("emberfs://", "ember://")
DEFAULT_PATH = "/kvcache/lmcache"
DEFAULT_CAPACITY = 64 << 30
RAW_SUFFIX = "#raw"  # keys of chunks stored without a header


def plugin_type(url: str) -> str | None:
    """The plugin type of a ``plugin://<type>[.<instance>]`` URL (None for other URLs)."""
    if not url.startswith("plugin://"):
        return None
    return url.removeprefix("plugin://").split(".", 1)[0]


def plugin_settings(config, plugin_name: str, url: str | None = None) -> dict:
    """The ``remote_storage_plugin.<plugin_name>.*`` settings, with an ``emberfs://`` URL applied.

    The URL is ``url`` when it is an ``emberfs://`` URL, else the ``url``
    setting; its authority and path override the ``meta`` and ``path``
    settings. Raises ValueError for a ``url`` setting of another scheme.
    """
    extra = getattr(config, "extra_config", None) or {}
    prefix = f"remote_storage_plugin.{plugin_name}."
    settings = {k.removeprefix(prefix): v for k, v in extra.items() if k.startswith(prefix)}
    given = settings.get("url")
    if given is not None and not str(given).startswith(URL_SCHEMES):
        raise ValueError(f"{prefix}url must be an emberfs://HOST:PORT/path URL, not {given!r}")
    for candidate in (url, given):
        if candidate and str(candidate).startswith(URL_SCHEMES):
            parts = urlsplit(str(candidate))
            if parts.netloc:
                settings["meta"] = parts.netloc
            if parts.path not in ("", "/"):
                settings["path"] = parts.path
            break
    return settings


def count_setting(settings: dict, key: str, default: int, plugin_name: str) -> int:
    """A positive whole number setting (``default`` when absent); ValueError otherwise."""
    value = settings.get(key, default)
    try:
        number = int(value)
        whole = not isinstance(value, bool) and float(value) == number
    except (TypeError, ValueError):
        whole = False
    if not whole or number <= 0:
        raise ValueError(
            f"remote_storage_plugin.{plugin_name}.{key} must be a positive whole number, "
            f"not {value!r}"
        )
    return number


def flag_setting(settings: dict, key: str, default: bool, plugin_name: str) -> bool:
    """A true/false setting (YAML booleans, or the words true/false/1/0/yes/no)."""
    value = settings.get(key, default)
    if isinstance(value, bool):
        return value
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if str(value).strip().lower() not in words:
        raise ValueError(f"remote_storage_plugin.{plugin_name}.{key} must be true or false")
    return words[str(value).strip().lower()]


def _plugin_name(config, class_name: str) -> str:
    """The name of the plugin whose class is ``class_name`` (``emberfs`` when none is)."""
    extra = getattr(config, "extra_config", None) or {}
    for name in getattr(config, "remote_storage_plugins", None) or []:
        if extra.get(f"remote_storage_plugin.{name}.class_name") == class_name:
            return name
    return PLUGIN_TYPE


class EmberConnector(RemoteConnector):
    """LMCache's remote connector over an EmberFS KV cache.

    Parameters
    ----------
    loop : asyncio.AbstractEventLoop, optional
        LMCache's event loop (the coroutines run on whichever loop awaits them).
    local_cpu_backend : LocalCPUBackend
        Allocates the memory objects a get returns.
    config : LMCacheEngineConfig
        Its ``extra_config`` holds the settings (see the module docstring).
    metadata : LMCacheMetadata, optional
        The model's chunk shapes and dtypes; default ``local_cpu_backend.metadata``.
    url : str, optional
        The connector URL: ``emberfs://HOST:PORT/path`` or ``plugin://<name>``.
    plugin_name : str, optional
        The plugin's name, whose settings are read; default the plugin whose
        ``class_name`` is this class, else ``emberfs``.

    Attributes
    ----------
    fs : EmberFileSystem
        The filesystem instance of this connector (closed by :meth:`close`).
    path : str
        The cache directory.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        local_cpu_backend=None,
        config=None,
        metadata=None,
        *,
        url: str | None = None,
        plugin_name: str | None = None,
    ) -> None:
        if metadata is None:
            metadata = getattr(local_cpu_backend, "metadata", None)
        if config is None or metadata is None:
            raise ValueError(
                "EmberConnector needs LMCache's engine config and the model's metadata "
                "(LMCacheMetadata), given or as local_cpu_backend.metadata"
            )
        super().__init__(config, metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.config = config
        self.metadata = metadata
        if plugin_name is None and url is not None and plugin_type(url) == PLUGIN_TYPE:
            plugin_name = url.removeprefix("plugin://")
        self.plugin_name = plugin_name or _plugin_name(config, type(self).__name__)
        name = self.plugin_name
        settings = plugin_settings(config, name, url)
        self.path = strip_protocol(str(settings.get("path") or DEFAULT_PATH))
        given = settings.get("block_size")
        self._block_size = None if given is None else count_setting(settings, "block_size", 0, name)
        self._capacity = count_setting(settings, "capacity", DEFAULT_CAPACITY, name)
        self._create = flag_setting(settings, "create", True, name)
        workers = count_setting(settings, "workers", 8, name)
        self._geometry = (list(self.meta_shapes), list(self.meta_dtypes))
        self._cache: KVCache | None = None
        self._lock = threading.Lock()
        self.fs = EmberFileSystem(
            settings.get("meta"), settings.get("token"), skip_instance_cache=True
        )
        if not self._create and self._find_cache(write=False) is None:
            self.fs.close()
            raise FileNotFoundError(errno.ENOENT, "no KV cache (and create is off)", self.path)
        self._executor = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="emberfs-lmcache"
        )

    # the cache, made when first needed ------------------------------------------------------
    def _refresh_geometry(self) -> None:
        """Take the chunk shapes from the metadata again when they changed since the last look.

        LMCache's base computes them once, when the connector is built; a model
        whose KV layer groups are registered later changes them afterwards.
        """
        shapes, dtypes = list(self.metadata.get_shapes()), list(self.metadata.get_dtypes())
        if (shapes, dtypes) == self._geometry:
            return
        self._geometry = (shapes, dtypes)
        self.meta_shapes, self.meta_dtypes = shapes, dtypes
        self.full_chunk_size_bytes = chunk_bytes(shapes, dtypes)
        self.single_token_size = self.full_chunk_size_bytes // self.metadata.chunk_size

    def block_size_wanted(self) -> int:
        """The block size the connector makes the cache with: a full chunk now, and its header."""
        if self._block_size is not None:
            return self._block_size
        self._refresh_geometry()
        full = self.full_chunk_size_bytes
        return full + HEADER_ROOM if self.save_chunk_meta else full

    def _find_cache(self, write: bool) -> KVCache | None:
        """The cache: opened when it exists, made for a write (None: missing, for a read).

        The chunk shapes are taken again from the metadata on every call.
        """
        with self._lock:
            self._refresh_geometry()
            if self._cache is None:
                size = self.block_size_wanted() if write and self._create else None
                self._cache = KVCache.open_or_create(
                    self.path, block_size=size, capacity=self._capacity, fs=self.fs
                )
                if self._cache is None and write:
                    raise FileNotFoundError(
                        errno.ENOENT, "no KV cache (and create is off)", self.path
                    )
            return self._cache

    @property
    def cache(self) -> KVCache:
        """The KV cache (opened, or made when missing, on first use)."""
        return self._find_cache(write=True)

    def post_init(self) -> None:
        """LMCache's hook after the connector is built: take the final chunk shapes, and open or make the cache."""
        self._find_cache(write=True)

    def _name(self, key) -> str:
        name = key.to_string()
        return name if self.save_chunk_meta else name + RAW_SUFFIX

    async def _run(self, fn, *args):
        """``fn(*args)`` on the connector's threads, awaited without blocking the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # reads ----------------------------------------------------------------------------------
    def _allocate(self, shapes, dtypes, fmt):
        """A memory object from the local CPU backend, evicting what it can; None when full.

        Never waits for other requests to free memory (``busy_loop`` off): a
        chunk without room is a miss, and the connector's thread is not held.
        """
        return self.local_cpu_backend.allocate(shapes, dtypes, fmt, eviction=True, busy_loop=False)

    def _get_blocking(self, keys) -> list:
        names = [self._name(k) for k in keys]
        cache = self._find_cache(write=False) if names else None
        if cache is None:
            return [None] * len(names)
        if self.save_chunk_meta:
            return [None if b is None else self._unpack(b) for b in cache.batch_get(names)]
        return self._get_raw(cache, names)

    def _unpack(self, block: bytearray):
        """The memory object of a block with a header, or None (no header, no memory)."""
        try:
            header, start = ChunkHeader.decode(block)
            allocation = header.allocation()
        except ValueError as exc:
            log.warning("a block of the KV cache %s is no chunk: %s", self.path, exc)
            return None
        obj = self._allocate(*allocation)
        if obj is None:
            return None  # local memory is full
        dest = byte_view(obj)
        if len(dest) < header.length:
            obj.ref_count_down()
            log.warning("a chunk of %d bytes does not fit its memory object", header.length)
            return None
        dest[: header.length] = memoryview(block)[start : start + header.length]
        return obj

    def _get_raw(self, cache: KVCache, names: list[str]) -> list:
        """Chunks stored without a header, read straight into full-chunk memory objects."""
        objs = [self._allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt) for _ in names]
        wanted = [i for i, obj in enumerate(objs) if obj is not None]
        try:
            got = cache.batch_get(
                [names[i] for i in wanted], into=[byte_view(objs[i]) for i in wanted]
            )
        except BaseException:
            for i in wanted:
                objs[i].ref_count_down()
            raise
        full = self.full_chunk_size_bytes
        out: list = [None] * len(names)
        for i, nread in zip(wanted, got, strict=True):
            obj = objs[i]
            if nread is None:
                obj.ref_count_down()
                continue
            if nread != full:
                try:
                    obj = self.reshape_partial_chunk(obj, nread)
                except ValueError:  # LMCache refuses a chunk that does not fit: a miss
                    log.warning("a partial chunk of %d bytes cannot be used", nread, exc_info=True)
                    objs[i].ref_count_down()
                    continue
            out[i] = obj
        return out

    async def get(self, key):
        """The memory object of ``key`` (allocated by the local CPU backend), or None."""
        return (await self._run(self._get_blocking, [key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys) -> list:
        """The memory objects of ``keys`` (None for a miss), read in one batch."""
        return await self._run(self._get_blocking, list(keys))

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys) -> list:
        """The memory objects of the leading ``keys`` that are stored; the others are released."""
        objs = await self.batched_get(keys)
        hits = next((i for i, obj in enumerate(objs) if obj is None), len(objs))
        for obj in objs[hits:]:
            if obj is not None:
                obj.ref_count_down()
        return objs[:hits]

    # writes ---------------------------------------------------------------------------------
    def _pack(self, obj):
        """The block of a memory object: its bytes, behind a header with ``save_chunk_meta``."""
        payload = chunk_payload(obj)
        if not self.save_chunk_meta:
            return payload
        header = ChunkHeader.of(obj, len(payload)).encode()
        block = bytearray(len(header) + len(payload))
        block[: len(header)] = header
        block[len(header) :] = payload
        return block

    def _put_blocking(self, keys, objs) -> None:
        names = [self._name(k) for k in keys]
        if len(objs) != len(names):
            raise ValueError("batched_put needs one memory object per key")
        if not names:
            return
        cache = self._find_cache(write=True)
        blocks = [self._pack(obj) for obj in objs]
        for block in blocks:
            if not 0 < len(block) <= cache.block_size:
                raise ValueError(
                    f"a chunk block of {len(block)} bytes does not fit the blocks of "
                    f"{cache.block_size} bytes of the KV cache {self.path} (its block_size "
                    "setting, or the model it was made for, is smaller)"
                )
        statuses = cache.batch_put(names, blocks)
        lost = [s.name for s in statuses if not s.present]
        if lost:
            log.warning(
                "%d of %d chunks not stored in the KV cache %s (%s)",
                len(lost),
                len(names),
                self.path,
                ", ".join(sorted(set(lost))),
            )

    async def put(self, key, memory_obj) -> None:
        """Store a chunk (a key stored already keeps its chunk; the reference is not released)."""
        await self._run(self._put_blocking, [key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys, memory_objs) -> None:
        """Store chunks in one batch (see :meth:`put`)."""
        await self._run(self._put_blocking, list(keys), list(memory_objs))

    # lookups and upkeep ---------------------------------------------------------------------
    def exists_sync(self, key) -> bool:
        """Whether ``key`` is stored (blocking)."""
        cache = self._find_cache(write=False)
        return cache is not None and cache.exists(self._name(key))

    async def exists(self, key) -> bool:
        """Whether ``key`` is stored."""
        return await self._run(self.exists_sync, key)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys) -> int:
        """How many leading ``keys`` are stored, in one index call (blocking)."""
        names = [self._name(k) for k in keys]
        cache = self._find_cache(write=False) if names else None
        return 0 if cache is None else cache.batch_exists(names)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys, pin: bool = False) -> int:
        """How many leading ``keys`` are stored (``pin`` has no effect: the cache evicts by LRU)."""
        return await self._run(self.batched_contains, list(keys))

    def remove_sync(self, key) -> bool:
        """Remove ``key``; whether it was stored."""
        cache = self._find_cache(write=False)
        return cache is not None and cache.delete([self._name(key)]) > 0

    def _list_blocking(self) -> list[str]:
        cache = self._find_cache(write=False)
        out = []
        for raw in cache.keys() if cache is not None else ():
            name = raw.decode("utf-8", "replace")
            if name.endswith(RAW_SUFFIX) != (not self.save_chunk_meta):
                continue  # a chunk of the other kind
            out.append(name.removesuffix(RAW_SUFFIX) if not self.save_chunk_meta else name)
        return out

    async def list(self) -> list[str]:
        """The key strings of every chunk stored (of this connector's kind)."""
        return await self._run(self._list_blocking)

    def support_ping(self) -> bool:
        return True

    def _ping_blocking(self) -> None:
        cache = self._find_cache(write=False)
        if cache is None:
            self.fs.info("/")  # no cache yet: the metaserver answers
        else:
            cache.stats()

    async def ping(self) -> int:
        """0 when the cache (or, before it is made, the metaserver) answers, else the errno."""
        try:
            await self._run(self._ping_blocking)
        except OSError as exc:
            return exc.errno or errno.EIO
        return 0

    def _close_blocking(self) -> None:
        self._executor.shutdown(wait=True)
        self.fs.close()

    async def close(self) -> None:
        """Wait for the calls in flight, then release the threads and connections."""
        await asyncio.to_thread(self._close_blocking)

    def __repr__(self) -> str:
        return f"<EmberConnector {self.plugin_name} {self.path}>"


class EmberConnectorAdapter(ConnectorAdapter):
    """Makes :class:`EmberConnector` for ``emberfs://`` URLs and ``plugin://emberfs[.name]``."""

    def __init__(self) -> None:
        super().__init__(URL_SCHEMES[0])

    def can_parse(self, url: str) -> bool:
        """Whether ``url`` is an EmberFS URL or the plugin URL of an ``emberfs`` plugin."""
        return url.startswith(URL_SCHEMES) or plugin_type(url) == PLUGIN_TYPE

    def create_connector(self, context) -> EmberConnector:
        """A connector for ``context`` (its URL, loop, local CPU backend, config, metadata)."""
        if not self.can_parse(context.url):
            raise ValueError(f"not an EmberFS URL: {context.url!r}")
        name = getattr(context, "plugin_name", None)  # LMCache 0.4.4 and later
        if name is None and plugin_type(context.url) == PLUGIN_TYPE:
            name = context.url.removeprefix("plugin://")
        return EmberConnector(
            loop=context.loop,
            local_cpu_backend=context.local_cpu_backend,
            config=context.config,
            metadata=context.metadata,
            url=context.url,
            plugin_name=name or _plugin_name(context.config, type(self).__name__),
        )
