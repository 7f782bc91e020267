"""The LMCache backend of the KV cache (EmberConnector) on the shared cluster."""

from __future__ import annotations

import asyncio
import importlib
import math
import threading
from dataclasses import dataclass, field

import numpy as np
import pytest

from emberfs.kvcache import lmcache as lmc
from emberfs.kvcache.lmcache import ChunkHeader, EmberConnector, EmberConnectorAdapter

CAPACITY = 1 << 20


@dataclass
class ChunkMetadata:
    """A stand-in of LMCache's LMCacheMetadata: chunks of 2 x 2 layers x tokens x 64 float16."""

    chunk_size: int = 16
    use_mla: bool = False

    def get_shapes(self) -> list:
        return [(2, 2, self.chunk_size, 64)]

    def get_dtypes(self) -> list:
        return [np.dtype("float16")]


FULL_CHUNK = 2 * 2 * 16 * 64 * 2


def _np_dtype(dtype) -> np.dtype:
    return np.dtype(str(dtype).removeprefix("torch."))


class MemoryObj:
    """A stand-in of LMCache's MemoryObj; its byte_array is larger than its data, as aligned."""

    def __init__(self, shapes, dtypes, fmt) -> None:
        self.shapes = [tuple(int(n) for n in s) for s in shapes]
        self.dtypes = [_np_dtype(d) for d in dtypes]
        self.fmt = fmt
        self.size = sum(
            math.prod(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes, strict=True)
        )
        self.byte_array = bytearray(self.size + 64)
        self.refs = 1

    def get_size(self) -> int:
        return self.size

    def get_shapes(self) -> list:
        return self.shapes

    def get_dtypes(self) -> list:
        return self.dtypes

    def get_memory_format(self):
        return self.fmt

    def ref_count_down(self) -> None:
        self.refs -= 1

    def data(self) -> bytes:
        return bytes(self.byte_array[: self.size])


def chunk(seed: int, tokens: int = 16) -> MemoryObj:
    obj = MemoryObj([(2, 2, tokens, 64)], ["float16"], "KV_2LTD")
    obj.byte_array[: obj.size] = np.random.default_rng(seed).bytes(obj.size)
    return obj


class LocalCPUBackend:
    """A stand-in of LMCache's local CPU backend: allocates memory objects, ``room`` at most."""

    def __init__(self, metadata=None, room: int | None = None) -> None:
        self.metadata = metadata if metadata is not None else ChunkMetadata()
        self.room = room
        self.allocated: list[MemoryObj] = []

    def allocate(self, shapes, dtypes, fmt="KV_2LTD", eviction=True, busy_loop=True):
        if self.room is not None and len(self.allocated) >= self.room:
            return None
        obj = MemoryObj(shapes, dtypes, fmt)
        self.allocated.append(obj)
        return obj


@dataclass
class EngineConfig:
    """A stand-in of LMCache's LMCacheEngineConfig."""

    extra_config: dict = field(default_factory=dict)
    remote_storage_plugins: list = field(default_factory=list)


@dataclass(frozen=True)
class Key:
    """A stand-in of LMCache's CacheEngineKey."""

    chunk_hash: int
    model_name: str = "org/model-7b"
    world_size: int = 1
    worker_id: int = 0
    dtype: str = "half"

    def to_string(self) -> str:
        return (
            f"{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash:x}@{self.dtype}"
        )


@pytest.fixture
def connector(cluster, kv_path):
    """``connector(backend=None, save_chunk_meta=True, **settings)``: closed after the test."""
    made: list[EmberConnector] = []

    def make(backend=None, save_chunk_meta: bool = True, **settings) -> EmberConnector:
        extra = {
            "save_chunk_meta": save_chunk_meta,
            "remote_storage_plugin.emberfs.capacity": CAPACITY,
        }
        extra.update({f"remote_storage_plugin.emberfs.{k}": v for k, v in settings.items()})
        conn = EmberConnector(
            loop=None,
            local_cpu_backend=backend if backend is not None else LocalCPUBackend(),
            config=EngineConfig(extra),
            url=f"emberfs://{cluster.meta_address}{kv_path}",
        )
        made.append(conn)
        return conn

    yield make
    for conn in made:
        asyncio.run(conn.close())


def test_lmcache_put_get_round_trip(connector):
    backend = LocalCPUBackend()
    conn = connector(backend)
    full, partial = chunk(1), chunk(2, tokens=5)

    async def main():
        await conn.put(Key(1), full)
        await conn.put(Key(2), partial)
        return await conn.get(Key(1)), await conn.get(Key(2)), await conn.get(Key(3))

    got, got_partial, missing = asyncio.run(main())
    assert full.refs == 1 and partial.refs == 1  # LMCache releases them, not the connector
    assert missing is None
    assert got in backend.allocated and got_partial in backend.allocated
    assert got.data() == full.data()
    assert got.shapes == [(2, 2, 16, 64)] and got.dtypes == [np.dtype("float16")]
    assert got.fmt == "KV_2LTD"
    # a partial chunk comes back with its own shape
    assert got_partial.shapes == [(2, 2, 5, 64)] and got_partial.data() == partial.data()
    # the block holds the header and the chunk's data, not the slack of its byte_array
    block = conn.cache.get(Key(1).to_string())
    header, start = ChunkHeader.decode(block)
    assert header.length == full.size and len(block) == start + full.size
    assert conn.cache.block_size == FULL_CHUNK + lmc.HEADER_ROOM


def test_lmcache_without_chunk_meta_reads_into_allocated_chunks(connector):
    backend = LocalCPUBackend()
    raw = connector(backend, save_chunk_meta=False)
    obj = chunk(3)

    async def main():
        await raw.put(Key(1), obj)
        return await raw.get(Key(1)), await raw.get(Key(2))

    got, missing = asyncio.run(main())
    assert missing is None
    assert got.data() == obj.data() and got.shapes == [(2, 2, 16, 64)]
    assert bytes(raw.cache.get(Key(1).to_string() + "#raw")) == obj.data()  # no header
    # the object allocated for the miss went back
    assert [o.refs for o in backend.allocated] == [1, 0]
    # chunks with and without a header never mix
    headed = connector(LocalCPUBackend())
    assert not headed.exists_sync(Key(1))
    assert asyncio.run(headed.list()) == []
    assert asyncio.run(raw.list()) == [Key(1).to_string()]


def test_lmcache_exists_and_remove(connector):
    conn = connector()

    async def exists():
        return await conn.exists(Key(7))

    assert not asyncio.run(exists()) and not conn.exists_sync(Key(7))
    asyncio.run(conn.put(Key(7), chunk(7)))
    assert asyncio.run(exists()) and conn.exists_sync(Key(7))
    assert conn.remove_sync(Key(7))
    assert not conn.exists_sync(Key(7))
    assert not conn.remove_sync(Key(7))


def test_lmcache_batched_calls(connector):
    backend = LocalCPUBackend()
    conn = connector(backend)
    assert conn.support_batched_get() and conn.support_batched_put()
    assert conn.support_batched_contains() and conn.support_batched_async_contains()
    objs = {0: chunk(10), 1: chunk(11), 3: chunk(13)}
    keys = [Key(n) for n in range(4)]

    async def main():
        await conn.batched_put([keys[n] for n in objs], list(objs.values()))
        got = await conn.batched_get(keys)
        count = await conn.batched_async_contains("lookup-1", keys, pin=True)
        leading = await conn.batched_get_non_blocking("lookup-2", keys)
        return got, count, leading, await conn.list()

    got, count, leading, listed = asyncio.run(main())
    assert got[2] is None
    assert [got[n].data() for n in objs] == [o.data() for o in objs.values()]
    assert count == 2
    assert conn.batched_contains(keys) == 2
    assert conn.batched_contains(keys[2:]) == 0
    assert [o.data() for o in leading] == [objs[0].data(), objs[1].data()]
    # the hit after the miss was read and given back
    released = [o for o in backend.allocated if o.refs == 0]
    assert len(released) == 1 and released[0].data() == objs[3].data()
    assert sorted(listed) == sorted(keys[n].to_string() for n in objs)


class GatedBackend(LocalCPUBackend):
    """Allocation waits until two allocations are waiting: only concurrent gets get through."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Barrier(2, timeout=30)
        self.threads: set[int] = set()

    def allocate(self, *args, **kwargs):
        self.threads.add(threading.get_ident())
        self.gate.wait()
        return super().allocate(*args, **kwargs)


def test_lmcache_calls_do_not_block_the_event_loop(connector):
    backend = GatedBackend()
    conn = connector(backend)

    async def main():
        await conn.batched_put([Key(1), Key(2)], [chunk(1), chunk(2)])
        loop_thread = threading.get_ident()
        # a get that blocked the loop would wait at the gate for the other one forever
        got = await asyncio.gather(conn.get(Key(1)), conn.get(Key(2)))
        return loop_thread, got

    loop_thread, got = asyncio.run(main())
    assert all(g is not None for g in got)
    assert len(backend.threads) == 2 and loop_thread not in backend.threads


def test_lmcache_a_chunk_without_room_or_header_is_a_miss(connector):
    full = connector(LocalCPUBackend(room=0))
    raw = connector(LocalCPUBackend(room=0), save_chunk_meta=False)
    asyncio.run(full.put(Key(1), chunk(1)))
    asyncio.run(raw.put(Key(1), chunk(1)))
    assert asyncio.run(full.get(Key(1))) is None
    assert asyncio.run(raw.get(Key(1))) is None
    # a block that is no chunk
    full.cache.put(Key(2).to_string(), b"not a chunk")
    assert asyncio.run(connector().get(Key(2))) is None


def test_lmcache_ping(connector):
    conn = connector()
    assert conn.support_ping()
    assert asyncio.run(conn.ping()) == 0


def test_lmcache_chunk_header_round_trip():
    obj = chunk(5, tokens=3)
    header = ChunkHeader.of(obj, obj.size)
    block = header.encode() + obj.data()
    decoded, start = ChunkHeader.decode(block)
    assert decoded == header and block[start:] == obj.data()
    shapes, dtypes, fmt = decoded.allocation()
    assert [tuple(s) for s in shapes] == [(2, 2, 3, 64)] and fmt == "KV_2LTD"
    assert [_np_dtype(d) for d in dtypes] == [np.dtype("float16")]
    for bad in (b"", b"EKV1", b"XXXX" + block[4:], block[: start + 10]):
        with pytest.raises(ValueError):
            ChunkHeader.decode(bad)


def test_lmcache_adapter_parses_its_urls():
    adapter = EmberConnectorAdapter()
    for url in (
        "emberfs://127.0.0.1:9400/kvcache",
        "ember://10.0.0.1:9400,10.0.0.2:9400/kv",
        "plugin://emberfs",
        "plugin://emberfs.primary",
    ):
        assert adapter.can_parse(url), url
    for url in ("plugin://fs", "plugin://emberfsx", "redis://127.0.0.1:6379", "fs:///tmp/kv"):
        assert not adapter.can_parse(url), url


def test_lmcache_adapter_creates_connectors(cluster, kv_path):
    backend = LocalCPUBackend()
    url = f"emberfs://{cluster.meta_address}{kv_path}"
    capacity = {"remote_storage_plugin.emberfs.capacity": CAPACITY}
    context = lmc.ConnectorContext(
        url=url, loop=None, local_cpu_backend=backend, config=EngineConfig(capacity)
    )
    adapter = EmberConnectorAdapter()
    conn = adapter.create_connector(context)
    # a plugin URL: the settings of the named plugin
    plugin = adapter.create_connector(
        lmc.ConnectorContext(
            url="plugin://emberfs.primary",
            loop=None,
            local_cpu_backend=backend,
            config=EngineConfig({"remote_storage_plugin.emberfs.primary.url": url}),
            metadata=backend.metadata,
            plugin_name="emberfs.primary",
        )
    )
    try:
        assert conn.metadata is backend.metadata  # the backend's, as LMCache passes none
        assert conn.path == kv_path and plugin.path == kv_path
        assert plugin.plugin_name == "emberfs.primary"
        asyncio.run(conn.put(Key(1), chunk(1)))
        assert plugin.exists_sync(Key(1))
    finally:
        asyncio.run(conn.close())
        asyncio.run(plugin.close())


def test_lmcache_loads_the_way_lmcaches_plugin_launcher_does(cluster, kv_path):
    backend = LocalCPUBackend()
    extra = {
        # an adapter class: instantiated without arguments, asked to parse plugin://<name>
        "remote_storage_plugin.emberfs.module_path": "emberfs.kvcache.lmcache",
        "remote_storage_plugin.emberfs.class_name": "EmberConnectorAdapter",
        "remote_storage_plugin.emberfs.meta": cluster.meta_address,
        "remote_storage_plugin.emberfs.path": kv_path,
        "remote_storage_plugin.emberfs.capacity": CAPACITY,
        # a connector class: built with the loop, the local CPU backend and the config only
        "remote_storage_plugin.kv.module_path": "emberfs.kvcache.lmcache",
        "remote_storage_plugin.kv.class_name": "EmberConnector",
        "remote_storage_plugin.kv.url": f"emberfs://{cluster.meta_address}{kv_path}",
    }
    config = EngineConfig(extra, remote_storage_plugins=["emberfs", "kv"])
    made = []
    try:
        for name in config.remote_storage_plugins:
            module = importlib.import_module(extra[f"remote_storage_plugin.{name}.module_path"])
            cls = getattr(module, extra[f"remote_storage_plugin.{name}.class_name"])
            if issubclass(cls, module.ConnectorAdapter):
                adapter = cls()
                url = f"plugin://{name}"
                assert adapter.can_parse(url)
                context = module.ConnectorContext(
                    url=url,
                    loop=None,
                    local_cpu_backend=backend,
                    config=config,
                    metadata=backend.metadata,
                    plugin_name=name,
                )
                made.append(adapter.create_connector(context))
            else:
                assert issubclass(cls, module.RemoteConnector)
                made.append(cls(loop=None, local_cpu_backend=backend, config=config))
        by_adapter, by_class = made
        assert by_class.plugin_name == "kv"
        assert by_adapter.path == by_class.path == kv_path
        asyncio.run(by_adapter.put(Key(9), chunk(9)))
        got = asyncio.run(by_class.get(Key(9)))
        assert got is not None and got.data() == chunk(9).data()
    finally:
        for conn in made:
            asyncio.run(conn.close())


def test_lmcache_connector_needs_a_cache_or_a_block_size(cluster, kv_path):
    url = f"emberfs://{cluster.meta_address}{kv_path}"
    without_metadata = LocalCPUBackend()
    without_metadata.metadata = None
    with pytest.raises(ValueError, match="block size"):
        EmberConnector(local_cpu_backend=without_metadata, config=EngineConfig(), url=url)
    told_not_to = EngineConfig({"remote_storage_plugin.emberfs.create": False})
    with pytest.raises(FileNotFoundError):
        EmberConnector(local_cpu_backend=LocalCPUBackend(), config=told_not_to, url=url)
