"""LMCache's remote storage on EmberFS: :class:`EmberConnector` and :class:`EmberConnectorAdapter`.

LMCache keeps KV chunks (``chunk_size`` tokens of every layer) in local CPU
memory and, behind it, in remote storage reached through a
``RemoteConnector``. :class:`EmberConnector` is such a connector over a
:class:`~emberfs.kvcache.store.KVCache`: each chunk is one block, stored under
``CacheEngineKey.to_string()`` (which names the model, world size, worker,
chunk hash and dtype), so every LMCache instance that opens the same cache
directory shares the chunks the others stored.

LMCache loads it as a remote storage plugin, whose name is ``emberfs`` or
``emberfs.<instance>``::

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

or with ``remote_url: "emberfs://10.0.0.1:9400/kvcache/llama-70b"`` and the
same ``module_path`` / ``class_name``. ``class_name: EmberConnector`` works
too: LMCache then builds the connector itself with the settings below.

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
    chunk of the model (``metadata``), plus room for the chunk header.
``create``
    Make the cache when it is missing (default true).
``workers``
    Threads that run the cache's blocking calls (default 8).

A chunk is stored as LMCache's ``save_chunk_meta`` (default true) says:

* with it, a block is a small header (the chunk's length, shapes, dtypes
  and memory format) and the chunk's bytes, so chunks of any shape come back
  as they went (a serde may change them); a get allocates from the header
  and copies the bytes in, a put copies them behind the header;
* without it, a block is the chunk's bytes alone, under the key with
  ``#raw`` appended (so the two kinds never mix); a get allocates a full
  chunk from the connector's metadata and reads straight into it, then
  trims a partial chunk with ``reshape_partial_chunk``.

The bytes of a chunk are its ``get_size()`` bytes of ``byte_array`` (the
whole ``byte_array`` for an object without ``get_size``).

Every coroutine runs the cache's blocking calls on the connector's threads,
so the event loop never waits on the cluster. Errors of the cluster
propagate to LMCache; a chunk that cannot be read or allocated is a miss.

When LMCache is installed, the classes subclass its ``RemoteConnector`` and
``ConnectorAdapter`` (versions whose ``RemoteConnector`` takes ``(config,
metadata)``), and stored formats and dtypes come back as its ``MemoryFormat``
and torch dtypes. When it is not (nor torch), they subclass stand-ins defined
here with the same method names, and formats and dtypes come back as names.
"""

from __future__ import annotations

import abc
import asyncio
import errno
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from emberfs.client.fs import EmberFileSystem
from emberfs.client.paths import strip_protocol
from emberfs.kvcache.lmchunk import (
    HEADER_ROOM,
    ChunkHeader,
    byte_view,
    itemsize,
)
from emberfs.kvcache.lmchunk import (
    payload as chunk_payload,
)
from emberfs.kvcache.store import KVCache

try:
    import torch
except ImportError:  # dtypes are then kept as names
    torch = None

try:
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
except ImportError:
    MemoryFormat = None

    @dataclass
    class ConnectorContext:
        """A stand-in of LMCache's ``ConnectorContext``, used when LMCache is not installed."""

        url: str
        loop: asyncio.AbstractEventLoop | None
        local_cpu_backend: Any
        config: Any = None
        metadata: Any = None
        plugin_name: str | None = None

    class ConnectorAdapter(abc.ABC):
        """A stand-in of LMCache's ``ConnectorAdapter``, used when LMCache is not installed."""

        def __init__(self, schema: str = "") -> None:
            self.schema = schema

        def can_parse(self, url: str) -> bool:
            return url.startswith(self.schema)

        @abc.abstractmethod
        def create_connector(self, context): ...

    class RemoteConnector(abc.ABC):
        """A stand-in of LMCache's ``RemoteConnector``, used when LMCache is not installed.

        The same attributes (``save_chunk_meta``, ``meta_fmt``, ``meta_shapes``,
        ``meta_dtypes``, ``full_chunk_size_bytes``, ``single_token_size``) and
        methods; the optional calls raise NotImplementedError, and so does
        trimming a partial chunk, which needs LMCache's memory objects.
        """

        def __init__(self, config, metadata) -> None:
            extra = getattr(config, "extra_config", None) or {}
            self.config = config
            self.metadata = metadata
            self.save_chunk_meta = bool(extra.get("save_chunk_meta", True))
            self.meta_fmt = "KV_MLA_FMT" if getattr(metadata, "use_mla", False) else "KV_2LTD"

        @property
        def meta_shapes(self) -> list:
            return self.metadata.get_shapes()

        @property
        def meta_dtypes(self) -> list:
            return self.metadata.get_dtypes()

        @property
        def full_chunk_size_bytes(self) -> int:
            return sum(
                math.prod(shape) * itemsize(dtype)
                for shape, dtype in zip(self.meta_shapes, self.meta_dtypes, strict=True)
            )

        @property
        def single_token_size(self) -> int:
            return self.full_chunk_size_bytes // self.metadata.chunk_size

        def reshape_partial_chunk(self, memory_obj, bytes_read: int):
            raise NotImplementedError("trimming a partial chunk needs LMCache's memory objects")

        def post_init(self) -> None:  # noqa: B027 (a hook, empty by default)
            pass

        @abc.abstractmethod
        async def exists(self, key) -> bool: ...

        @abc.abstractmethod
        def exists_sync(self, key) -> bool: ...

        @abc.abstractmethod
        async def get(self, key): ...

        @abc.abstractmethod
        async def put(self, key, memory_obj) -> None: ...

        @abc.abstractmethod
        async def list(self) -> list[str]: ...

        @abc.abstractmethod
        async def close(self) -> None: ...

        def support_ping(self) -> bool:
            return False

        async def ping(self) -> int:
            raise NotImplementedError

        def support_batched_get(self) -> bool:
            return False

        async def batched_get(self, keys) -> list:
            raise NotImplementedError

        def support_batched_put(self) -> bool:
            return False

        async def batched_put(self, keys, memory_objs) -> None:
            raise NotImplementedError

        def support_batched_async_contains(self) -> bool:
            return False

        async def batched_async_contains(self, lookup_id: str, keys, pin: bool = False) -> int:
            raise NotImplementedError

        def support_batched_get_non_blocking(self) -> bool:
            return False

        async def batched_get_non_blocking(self, lookup_id: str, keys) -> list:
            raise NotImplementedError

        def remove_sync(self, key) -> bool:
            raise NotImplementedError

        def support_batched_contains(self) -> bool:
            return False

        def batched_contains(self, keys) -> int:
            raise NotImplementedError


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
    settings.
    """
    extra = getattr(config, "extra_config", None) or {}
    prefix = f"remote_storage_plugin.{plugin_name}."
    settings = {k.removeprefix(prefix): v for k, v in extra.items() if k.startswith(prefix)}
    for candidate in (url, settings.get("url")):
        if candidate and str(candidate).startswith(URL_SCHEMES):
            parts = urlsplit(str(candidate))
            if parts.netloc:
                settings["meta"] = parts.netloc
            if parts.path not in ("", "/"):
                settings["path"] = parts.path
            break
    return settings


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
    config : LMCacheEngineConfig, optional
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
    cache : KVCache
    fs : EmberFileSystem
        The filesystem instance of this connector (closed by :meth:`close`).
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
        super().__init__(config, metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.config = config
        self.metadata = metadata
        if plugin_name is None and url is not None and plugin_type(url) == PLUGIN_TYPE:
            plugin_name = url.removeprefix("plugin://")
        self.plugin_name = plugin_name or _plugin_name(config, type(self).__name__)
        settings = plugin_settings(config, self.plugin_name, url)
        self.fs = EmberFileSystem(
            settings.get("meta"), settings.get("token"), skip_instance_cache=True
        )
        self.path = strip_protocol(str(settings.get("path") or DEFAULT_PATH))
        block_size = settings.get("block_size")
        block_size = int(block_size) if block_size else self._chunk_block_size()
        create = bool(settings.get("create", True))
        capacity = int(settings.get("capacity", DEFAULT_CAPACITY))
        cache = KVCache.open_or_create(
            self.path, block_size=block_size if create else None, capacity=capacity, fs=self.fs
        )
        if cache is None:
            self.fs.close()
            if create:
                raise ValueError(
                    f"no KV cache at {self.path}, and no block size to make one: give "
                    f"remote_storage_plugin.{self.plugin_name}.block_size or the model's metadata"
                )
            raise FileNotFoundError(errno.ENOENT, "no KV cache (and create is off)", self.path)
        self.cache = cache
        self._executor = ThreadPoolExecutor(
            max_workers=int(settings.get("workers", 8)), thread_name_prefix="emberfs-lmcache"
        )

    def _chunk_block_size(self) -> int | None:
        """A block for a full chunk of the model (and its header), None without metadata."""
        if self.metadata is None:
            return None
        size = self.full_chunk_size_bytes
        return size + HEADER_ROOM if self.save_chunk_meta else size

    def _name(self, key) -> str:
        name = key.to_string() if hasattr(key, "to_string") else str(key)
        return name if self.save_chunk_meta else name + RAW_SUFFIX

    async def _run(self, fn, *args):
        """``fn(*args)`` on the connector's threads, awaited without blocking the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # reads ----------------------------------------------------------------------------------
    def _get_blocking(self, keys) -> list:
        names = [self._name(k) for k in keys]
        if not names:
            return []
        if self.save_chunk_meta:
            return [None if b is None else self._unpack(b) for b in self.cache.batch_get(names)]
        return self._get_raw(names)

    def _unpack(self, block: bytearray):
        """The memory object of a block with a header, or None (no header, no memory)."""
        try:
            header, start = ChunkHeader.decode(block)
        except ValueError as exc:
            log.warning("a block of the KV cache %s is no chunk: %s", self.path, exc)
            return None
        obj = self.local_cpu_backend.allocate(*header.allocation())
        if obj is None:
            return None  # local memory is full
        dest = byte_view(obj)
        if len(dest) < header.length:
            obj.ref_count_down()
            log.warning("a chunk of %d bytes does not fit its memory object", header.length)
            return None
        dest[: header.length] = memoryview(block)[start : start + header.length]
        return obj

    def _get_raw(self, names: list[str]) -> list:
        """Chunks stored without a header, read straight into full-chunk memory objects."""
        objs = [
            self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
            for _ in names
        ]
        wanted = [i for i, obj in enumerate(objs) if obj is not None]
        try:
            got = self.cache.batch_get(
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
                except Exception:  # LMCache refuses a chunk that does not fit: a miss
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
        statuses = self.cache.batch_put(names, [self._pack(obj) for obj in objs])
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
        return self.cache.exists(self._name(key))

    async def exists(self, key) -> bool:
        """Whether ``key`` is stored."""
        return await self._run(self.exists_sync, key)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys) -> int:
        """How many leading ``keys`` are stored, in one index call (blocking)."""
        return self.cache.batch_exists([self._name(k) for k in keys])

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys, pin: bool = False) -> int:
        """How many leading ``keys`` are stored (``pin`` has no effect: the cache evicts by LRU)."""
        return await self._run(self.batched_contains, list(keys))

    def remove_sync(self, key) -> bool:
        """Remove ``key``; whether it was stored."""
        return self.cache.delete([self._name(key)]) > 0

    def _list_blocking(self) -> list[str]:
        out = []
        for raw in self.cache.keys():
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

    async def ping(self) -> int:
        """0 when the cache answers, else the error's errno."""
        try:
            await self._run(self.cache.stats)
        except OSError as exc:
            return exc.errno or errno.EIO
        return 0

    def _close_blocking(self) -> None:
        self._executor.shutdown(wait=True)
        self.fs.close()

    async def close(self) -> None:
        """Wait for the calls in flight, then release the threads and connections."""
        await asyncio.to_thread(self._close_blocking)


class EmberConnectorAdapter(ConnectorAdapter):
    """Makes :class:`EmberConnector` for ``emberfs://`` URLs and ``plugin://emberfs[.name]``."""

    def __init__(self) -> None:
        super().__init__(URL_SCHEMES[0])

    def can_parse(self, url: str) -> bool:
        """Whether ``url`` is an EmberFS URL or the plugin URL of an ``emberfs`` plugin."""
        return url.startswith(URL_SCHEMES) or plugin_type(url) == PLUGIN_TYPE

    def create_connector(self, context) -> EmberConnector:
        """A connector for ``context`` (its URL, loop, local CPU backend, config, metadata)."""
        name = getattr(context, "plugin_name", None)
        if name is None and plugin_type(context.url) == PLUGIN_TYPE:
            name = context.url.removeprefix("plugin://")
        return EmberConnector(
            loop=context.loop,
            local_cpu_backend=context.local_cpu_backend,
            config=context.config,
            metadata=context.metadata,
            url=context.url,
            plugin_name=name or PLUGIN_TYPE,
        )
