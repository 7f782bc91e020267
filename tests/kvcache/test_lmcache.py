"""The LMCache backend of the KV cache (EmberConnector) against LMCache's own classes.

Every LMCache object here is LMCache's: its engine config and metadata, its
CacheEngineKey, memory objects from its LocalCPUBackend, its connector
factory (CreateConnector with the remote storage plugin launcher) and its
RemoteBackend; the chunks go to a cache on the shared cluster.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmcache.v1.storage_backend.connector")

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.gpu_connector.utils import (  # noqa: E402
    EngineType,
    normalize_and_discover_per_layer_formats,
)
from lmcache.v1.kv_layer_groups import KVLayerGroupsManager  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.connector import (  # noqa: E402
    ConnectorAdapter,
    ConnectorContext,
    CreateConnector,
)
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402

from emberfs.kvcache import lmcache as lmc  # noqa: E402
from emberfs.kvcache.lmcache import EmberConnector, EmberConnectorAdapter  # noqa: E402
from emberfs.kvcache.lmchunk import ChunkHeader, byte_view  # noqa: E402

CAPACITY = 1 << 20
CHUNK = 16  # tokens of a chunk
SHAPE = (2, 2, CHUNK, 64)  # LMCache's KV_2LTD chunk: K/V, 2 layers, tokens, 4 heads x 16
FULL_CHUNK = 2 * 2 * CHUNK * 64 * 2  # float16


def metadata(**kwargs) -> LMCacheMetadata:
    """A 2-layer model with 4 KV heads of 16 in float16, chunks of CHUNK tokens."""
    args = dict(
        model_name="org/model-7b",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.float16,
        kv_shape=(2, 2, CHUNK, 4, 16),
        chunk_size=CHUNK,
    )
    args.update(kwargs)
    return LMCacheMetadata(**args)


def engine_config(extra: dict | None = None, plugins=None, **kwargs) -> LMCacheEngineConfig:
    args = dict(chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.01, remote_serde="naive")
    args.update(kwargs)
    return LMCacheEngineConfig.from_defaults(
        remote_storage_plugins=plugins, extra_config=extra, **args
    )


def cpu_backend(meta=None, size_gb: float = 0.01) -> LocalCPUBackend:
    return LocalCPUBackend(engine_config(max_local_cpu_size=size_gb), meta or metadata())


def key(chunk_hash: int, worker_id: int = 0) -> CacheEngineKey:
    return CacheEngineKey("org/model-7b", 1, worker_id, chunk_hash, torch.float16)


def chunk(backend: LocalCPUBackend, seed: int, tokens: int = CHUNK):
    """A memory object of ``backend`` holding random float16 KV of ``tokens`` tokens."""
    shape = torch.Size([2, 2, tokens, 64])
    obj = backend.allocate(shape, torch.float16, MemoryFormat.KV_2LTD)
    assert obj is not None
    gen = torch.Generator().manual_seed(seed)
    obj.tensor.copy_(torch.randn(shape, generator=gen, dtype=torch.float32).half())
    return obj


def data(obj) -> bytes:
    return bytes(obj.byte_array)


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
        backend = backend if backend is not None else cpu_backend()
        conn = EmberConnector(
            loop=None,
            local_cpu_backend=backend,
            config=engine_config(extra),
            url=f"emberfs://{cluster.meta_address}{kv_path}",
        )
        made.append(conn)
        return conn

    yield make
    for conn in made:
        asyncio.run(conn.close())


def test_lmcache_classes_are_lmcaches():
    assert issubclass(EmberConnector, RemoteConnector)
    assert issubclass(EmberConnectorAdapter, ConnectorAdapter)
    assert not EmberConnector.__abstractmethods__
    assert lmc.lmcache_version() >= lmc.MIN_LMCACHE


def test_lmcache_put_get_round_trip(connector):
    backend = cpu_backend()
    conn = connector(backend)
    full, partial = chunk(backend, 1), chunk(backend, 2, tokens=5)

    async def main():
        await conn.put(key(1), full)
        await conn.put(key(2), partial)
        return await conn.get(key(1)), await conn.get(key(2)), await conn.get(key(3))

    got, got_partial, missing = asyncio.run(main())
    assert full.get_ref_count() == 1 and partial.get_ref_count() == 1  # LMCache releases them
    assert missing is None
    assert got is not full and data(got) == data(full)
    assert torch.equal(got.tensor, full.tensor)
    assert got.get_shapes() == [torch.Size(SHAPE)] and got.get_dtypes() == [torch.float16]
    assert got.get_memory_format() == MemoryFormat.KV_2LTD
    # a partial chunk comes back with its own shape
    assert got_partial.get_shapes() == [torch.Size([2, 2, 5, 64])]
    assert torch.equal(got_partial.tensor, partial.tensor)
    # the block holds the header and the chunk's bytes
    block = conn.cache.get(key(1).to_string())
    header, start = ChunkHeader.decode(block)
    assert header.length == FULL_CHUNK and len(block) == start + FULL_CHUNK
    assert bytes(block[start:]) == data(full)
    assert conn.cache.block_size == FULL_CHUNK + lmc.HEADER_ROOM


def test_lmcache_without_chunk_meta_reads_into_allocated_chunks(connector):
    backend = cpu_backend()
    raw = connector(backend, save_chunk_meta=False)
    assert not raw.save_chunk_meta
    obj, partial = chunk(backend, 3), chunk(backend, 4, tokens=5)

    async def main():
        await raw.put(key(1), obj)
        await raw.put(key(2), partial)
        return await raw.get(key(1)), await raw.get(key(2)), await raw.get(key(3))

    got, got_partial, missing = asyncio.run(main())
    assert missing is None
    assert torch.equal(got.tensor, obj.tensor) and got.get_shapes() == [torch.Size(SHAPE)]
    # trimmed by LMCache's reshape_partial_chunk to the tokens stored
    assert got_partial.get_shape() == torch.Size([2, 2, 5, 64])
    assert torch.equal(got_partial.tensor, partial.tensor)
    assert bytes(raw.cache.get(key(1).to_string() + "#raw")) == data(obj)  # no header
    assert raw.cache.block_size == FULL_CHUNK
    # chunks with and without a header never mix
    headed = connector()
    assert not headed.exists_sync(key(1))
    assert asyncio.run(headed.list()) == []
    assert sorted(asyncio.run(raw.list())) == sorted([key(1).to_string(), key(2).to_string()])


def test_lmcache_exists_and_remove(connector):
    backend = cpu_backend()
    conn = connector(backend)

    async def exists():
        return await conn.exists(key(7))

    # before any put there is no cache: a miss, and nothing made
    assert not asyncio.run(exists()) and not conn.exists_sync(key(7))
    assert not conn.remove_sync(key(7)) and conn.batched_contains([key(7)]) == 0
    asyncio.run(conn.put(key(7), chunk(backend, 7)))
    assert asyncio.run(exists()) and conn.exists_sync(key(7))
    assert not conn.exists_sync(key(7, worker_id=1))  # another rank's chunk
    assert conn.remove_sync(key(7))
    assert not conn.exists_sync(key(7))
    assert not conn.remove_sync(key(7))


def test_lmcache_batched_calls(connector):
    backend = cpu_backend()
    conn = connector(backend)
    assert conn.support_batched_get() and conn.support_batched_put()
    assert conn.support_batched_contains() and conn.support_batched_async_contains()
    assert conn.support_batched_get_non_blocking()
    objs = {0: chunk(backend, 10), 1: chunk(backend, 11), 3: chunk(backend, 13)}
    keys = [key(n) for n in range(4)]

    async def main():
        await conn.batched_put([keys[n] for n in objs], list(objs.values()))
        got = await conn.batched_get(keys)
        count = await conn.batched_async_contains("lookup-1", keys, pin=True)
        leading = await conn.batched_get_non_blocking("lookup-2", keys)
        return got, count, leading, await conn.list()

    got, count, leading, listed = asyncio.run(main())
    assert got[2] is None
    assert [data(got[n]) for n in objs] == [data(o) for o in objs.values()]
    assert count == 2 and isinstance(count, int)
    assert conn.batched_contains(keys) == 2
    assert conn.batched_contains(keys[2:]) == 0
    assert [data(o) for o in leading] == [data(objs[0]), data(objs[1])]
    assert all(o.get_ref_count() == 1 for o in leading)
    assert sorted(listed) == sorted(keys[n].to_string() for n in objs)
    with pytest.raises(ValueError, match="one memory object per key"):
        asyncio.run(conn.batched_put(keys, [objs[0]]))
    assert asyncio.run(conn.batched_get([])) == []


class GatedBackend(LocalCPUBackend):
    """LMCache's backend whose allocation waits until two are waiting: only concurrent gets pass."""

    def __init__(self) -> None:
        super().__init__(engine_config(), metadata())
        self.gate = threading.Barrier(2, timeout=30)
        self.threads: set[int] = set()
        self.gated = False

    def allocate(self, *args, **kwargs):
        if self.gated:
            self.threads.add(threading.get_ident())
            self.gate.wait()
        return super().allocate(*args, **kwargs)


def test_lmcache_calls_do_not_block_the_event_loop(connector):
    backend = GatedBackend()
    conn = connector(backend)

    async def main():
        await conn.batched_put([key(1), key(2)], [chunk(backend, 1), chunk(backend, 2)])
        backend.gated = True
        loop_thread = threading.get_ident()
        # a get that blocked the loop would wait at the gate for the other one forever
        got = await asyncio.gather(conn.get(key(1)), conn.get(key(2)))
        return loop_thread, got

    loop_thread, got = asyncio.run(main())
    assert all(g is not None for g in got)
    assert len(backend.threads) == 2 and loop_thread not in backend.threads


def fill(backend: LocalCPUBackend) -> list:
    """Allocate every chunk ``backend`` has room for (nothing is evictable)."""
    held = []
    meta = backend.metadata
    while len(held) < 10_000:
        obj = backend.allocate(
            meta.get_shapes(), meta.get_dtypes(), MemoryFormat.KV_2LTD, busy_loop=False
        )
        if obj is None:
            return held
        held.append(obj)
    raise AssertionError("the local CPU backend never filled")


def test_lmcache_a_chunk_without_room_or_header_is_a_miss(connector):
    backend = cpu_backend(size_gb=0.0001)
    full = connector(backend)
    raw = connector(backend, save_chunk_meta=False)
    obj = chunk(backend, 1)
    asyncio.run(full.put(key(1), obj))
    asyncio.run(raw.put(key(1), obj))
    obj.ref_count_down()
    held = fill(backend)
    assert held  # the backend had room, and has none now
    assert asyncio.run(full.get(key(1))) is None
    assert asyncio.run(raw.get(key(1))) is None
    assert asyncio.run(raw.batched_get_non_blocking("lookup", [key(1)])) == []
    for o in held:
        o.ref_count_down()
    # blocks that are no chunk
    full.cache.put(key(2).to_string(), b"not a chunk")
    bad_dtype = ChunkHeader(length=4, shapes=[[2]], dtypes=["no_such_dtype"], fmt="KV_2LTD")
    full.cache.put(key(3).to_string(), bad_dtype.encode() + b"\0" * 4)
    assert asyncio.run(full.batched_get([key(2), key(3)])) == [None, None]
    # and a chunk back in room is a hit again
    assert torch.equal(asyncio.run(full.get(key(1))).tensor, chunk(backend, 1).tensor)


def test_lmcache_ping(connector, cluster):
    conn = connector()
    assert conn.support_ping()
    assert asyncio.run(conn.ping()) == 0  # no cache yet: the metaserver answers
    assert conn.cache is not None
    assert asyncio.run(conn.ping()) == 0


def test_lmcache_chunk_header_round_trip():
    backend = cpu_backend()
    obj = chunk(backend, 5, tokens=3)
    header = ChunkHeader.of(obj, obj.get_size())
    block = header.encode() + data(obj)
    decoded, start = ChunkHeader.decode(block)
    assert decoded == header and block[start:] == data(obj)
    assert decoded.allocation() == (
        [torch.Size([2, 2, 3, 64])],
        [torch.float16],
        MemoryFormat.KV_2LTD,
    )
    for bad in (b"", b"EKV1", b"XXXX" + block[4:], block[: start + 10]):
        with pytest.raises(ValueError):
            ChunkHeader.decode(bad)
    with pytest.raises(ValueError, match="memory format"):
        ChunkHeader(4, [[2]], ["float16"], "NO_FORMAT").allocation()


def two_group_manager() -> KVLayerGroupsManager:
    """LMCache's layer groups of a model of two kinds of layers: 2 of float16, 3 of bfloat16."""
    kv = [torch.zeros(2, 8, 16, 4, 16, dtype=torch.float16) for _ in range(2)]
    kv += [torch.zeros(2, 8, 16, 2, 32, dtype=torch.bfloat16) for _ in range(3)]
    caches, formats = normalize_and_discover_per_layer_formats(kv, [], EngineType.VLLM)
    return KVLayerGroupsManager(caches, formats, lmcache_tokens_per_chunk=CHUNK)


def test_lmcache_block_size_is_the_final_chunk_size(cluster, kv_path):
    """LMCache builds the connector before a multi-group model registers its layer groups."""
    meta = metadata()
    backend = cpu_backend(meta, size_gb=0.02)
    config = engine_config({"remote_storage_plugin.emberfs.capacity": 8 << 20})
    url = f"emberfs://{cluster.meta_address}{kv_path}"
    conn = EmberConnector(local_cpu_backend=backend, config=config, url=url + "/one")
    try:
        assert conn.full_chunk_size_bytes == FULL_CHUNK
        meta.kv_layer_groups_manager = two_group_manager()  # as the serving engine does later
        final = 2 * 2 * CHUNK * 256 * 2 + 2 * 3 * CHUNK * 512 * 2
        assert len(meta.get_shapes()) == 2
        conn.post_init()  # LMCache's hook after the connector is built
        assert conn.full_chunk_size_bytes == final
        assert conn.single_token_size == final // CHUNK
        assert conn.cache.block_size == final + lmc.HEADER_ROOM
        # a chunk of both groups goes and comes back whole
        obj = backend.allocate(meta.get_shapes(), meta.get_dtypes(), MemoryFormat.KV_2LTD)
        view = byte_view(obj)
        view[:] = os.urandom(len(view))
        asyncio.run(conn.put(key(1), obj))
        got = asyncio.run(conn.get(key(1)))
        assert got.get_shapes() == meta.get_shapes() and data(got) == data(obj)
    finally:
        asyncio.run(conn.close())
    # without post_init: the first put makes the cache with the size then
    meta2 = metadata()
    conn2 = EmberConnector(
        local_cpu_backend=cpu_backend(meta2), config=config, url=url + "/two", metadata=meta2
    )
    try:
        meta2.kv_layer_groups_manager = two_group_manager()
        assert not conn2.exists_sync(key(1))  # a read makes no cache
        meta2.kv_layer_groups_manager = None
        meta2.kv_shape = (4, 2, CHUNK, 4, 16)  # or a changed model: 4 layers
        backend2 = conn2.local_cpu_backend
        obj = backend2.allocate(meta2.get_shapes(), meta2.get_dtypes(), MemoryFormat.KV_2LTD)
        asyncio.run(conn2.put(key(1), obj))
        assert conn2.cache.block_size == 2 * FULL_CHUNK + lmc.HEADER_ROOM
        # a chunk bigger than the blocks is refused with the reason
        meta2.kv_shape = (8, 2, CHUNK, 4, 16)
        big = backend2.allocate(meta2.get_shapes(), meta2.get_dtypes(), MemoryFormat.KV_2LTD)
        with pytest.raises(ValueError, match="does not fit the blocks"):
            asyncio.run(conn2.put(key(2), big))
    finally:
        asyncio.run(conn2.close())


def test_lmcache_adapter_parses_its_urls():
    adapter = EmberConnectorAdapter()
    for url in (
        "emberfs://127.0.0.1:9400/kvcache",
        "ember://10.0.0.1:9400,10.0.0.2:9400/kv",
        "plugin://emberfs",
        "plugin://emberfs.primary",
    ):
        assert adapter.can_parse(url), url
    for url in ("plugin://fs", "plugin://emberfsx", "redis://127.0.0.1:6379", "fs:///tmp/kv", ""):
        assert not adapter.can_parse(url), url
    context = ConnectorContext("redis://127.0.0.1:6379", None, cpu_backend(), engine_config(), None)
    with pytest.raises(ValueError, match="not an EmberFS URL"):
        adapter.create_connector(context)


def test_lmcache_adapter_creates_connectors(cluster, kv_path):
    backend = cpu_backend()
    url = f"emberfs://{cluster.meta_address}{kv_path}"
    capacity = {"remote_storage_plugin.emberfs.capacity": CAPACITY}
    adapter = EmberConnectorAdapter()
    # LMCache's context; without metadata the backend's is taken
    conn = adapter.create_connector(
        ConnectorContext(url, None, backend, engine_config(capacity), None)
    )
    plugin = adapter.create_connector(
        ConnectorContext(
            "plugin://emberfs.primary",
            None,
            backend,
            engine_config({"remote_storage_plugin.emberfs.primary.url": url}),
            backend.metadata,
            plugin_name="emberfs.primary",
        )
    )
    try:
        assert conn.metadata is backend.metadata
        assert conn.path == kv_path and plugin.path == kv_path
        assert plugin.plugin_name == "emberfs.primary"
        obj = chunk(backend, 1)
        asyncio.run(conn.put(key(1), obj))
        assert plugin.exists_sync(key(1))
        assert data(asyncio.run(plugin.get(key(1)))) == data(obj)
    finally:
        asyncio.run(conn.close())
        asyncio.run(plugin.close())


def plugin_config(cluster, kv_path, **kwargs) -> LMCacheEngineConfig:
    extra = {
        # an adapter class: instantiated without arguments, asked to parse plugin://<name>
        "remote_storage_plugin.emberfs.module_path": "emberfs.kvcache.lmcache",
        "remote_storage_plugin.emberfs.class_name": "EmberConnectorAdapter",
        "remote_storage_plugin.emberfs.meta": cluster.meta_address,
        "remote_storage_plugin.emberfs.path": kv_path,
        "remote_storage_plugin.emberfs.capacity": CAPACITY,
        # a connector class: LMCache builds it with the loop, the backend and the config
        # (and no plugin name: its settings are those of the plugin naming EmberConnector)
        "remote_storage_plugin.kv.module_path": "emberfs.kvcache.lmcache",
        "remote_storage_plugin.kv.class_name": "EmberConnector",
        "remote_storage_plugin.kv.url": f"emberfs://{cluster.meta_address}{kv_path}",
    }
    return engine_config(extra, plugins=["emberfs", "kv"], **kwargs)


def test_lmcache_loads_through_lmcaches_plugin_launcher(cluster, kv_path):
    config = plugin_config(cluster, kv_path)
    backend = cpu_backend()
    meta = backend.metadata
    made = []
    try:
        for name in ("emberfs", "kv"):
            made.append(CreateConnector(f"plugin://{name}", None, backend, config, meta, name))
        # and the legacy remote_url, parsed by the adapter the plugins loaded
        made.append(
            CreateConnector(
                f"emberfs://{cluster.meta_address}{kv_path}", None, backend, config, meta
            )
        )
        assert [repr(c) for c in made] == [
            f"InstrumentedRemoteConnector(<EmberConnector emberfs {kv_path}>)",
            f"InstrumentedRemoteConnector(<EmberConnector kv {kv_path}>)",
            f"InstrumentedRemoteConnector(<EmberConnector emberfs {kv_path}>)",
        ]
        by_adapter, by_class, by_url = made
        obj = chunk(backend, 9)
        obj.ref_count_up()  # LMCache's wrapper releases a reference after the put
        asyncio.run(by_adapter.put(key(9), obj))
        assert obj.get_ref_count() == 1
        got = asyncio.run(by_class.get(key(9)))
        assert got is not None and data(got) == data(obj)
        assert by_url.batched_contains([key(9), key(10)]) == 1
    finally:
        for conn in made:
            asyncio.run(conn.close())


def test_lmcache_remote_backend_stores_and_retrieves(cluster, kv_path):
    """LMCache's RemoteBackend over the plugin, its event loop on a thread of its own."""
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend

    config = plugin_config(cluster, kv_path)
    backend = cpu_backend()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    remote = RemoteBackend(config, backend.metadata, loop, backend, "cpu", plugin_name="emberfs")
    try:
        assert remote.connection is not None
        keys = [key(n) for n in range(3)]
        objs = [chunk(backend, n) for n in range(2)]
        remote.batched_submit_put_task(keys[:2], objs)
        for _ in range(200):  # the puts run on LMCache's loop
            if remote.batched_contains(keys) == 2:
                break
            threading.Event().wait(0.05)
        assert remote.batched_contains(keys) == 2
        assert remote.contains(keys[0]) and not remote.contains(keys[2])
        got = remote.batched_get_blocking(keys)
        assert got[2] is None and [data(g) for g in got[:2]] == [data(o) for o in objs]
        assert remote.remove(keys[0]) and not remote.contains(keys[0])
    finally:
        remote.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_lmcache_connector_needs_metadata_and_good_settings(cluster, kv_path):
    url = f"emberfs://{cluster.meta_address}{kv_path}"
    with pytest.raises(ValueError, match="metadata"):
        EmberConnector(config=engine_config(), url=url)  # no backend, no metadata
    told_not_to = engine_config({"remote_storage_plugin.emberfs.create": False})
    with pytest.raises(FileNotFoundError):
        EmberConnector(local_cpu_backend=cpu_backend(), config=told_not_to, url=url)
    bad = {
        "block_size": "lots",
        "capacity": 0,
        "workers": -1,
        "create": "perhaps",
        "url": "redis://127.0.0.1:6379",
    }
    for name, value in bad.items():
        config = engine_config({f"remote_storage_plugin.emberfs.{name}": value})
        with pytest.raises(ValueError, match=f"remote_storage_plugin.emberfs.{name}"):
            EmberConnector(local_cpu_backend=cpu_backend(), config=config)


def test_lmcache_module_needs_lmcache():
    """Without LMCache the module says what it needs; the rest of EmberFS imports."""
    code = (
        "import sys; sys.modules['lmcache'] = None\n"
        "import emberfs.kvcache\n"
        "try:\n"
        "    import emberfs.kvcache.lmcache\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert "needs LMCache 0.3.15 or later" in out


def documented_yaml() -> str:
    """The YAML config of the LMCache section of docs/kvcache.md."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "kvcache.md").read_text()
    section = doc[doc.index("### LMCache") :]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_lmcache_documented_config_enables_the_backend(cluster, kv_path, tmp_path, monkeypatch):
    """The documented YAML, found through LMCACHE_CONFIG_FILE, read and used as LMCache does."""
    from lmcache.v1.storage_backend import CreateStorageBackends

    text = documented_yaml()
    text = text.replace(
        "emberfs://10.0.0.1:9400/kvcache/llama-70b", f"emberfs://{cluster.meta_address}{kv_path}"
    )
    text = text.replace("1099511627776", str(CAPACITY))
    path = tmp_path / "lmcache-emberfs.yaml"
    path.write_text(text)
    monkeypatch.setenv("LMCACHE_CONFIG_FILE", str(path))
    # small enough for a test machine: LMCache's own environment overrides
    monkeypatch.setenv("LMCACHE_CHUNK_SIZE", str(CHUNK))
    monkeypatch.setenv("LMCACHE_MAX_LOCAL_CPU_SIZE", "0.01")
    config = LMCacheEngineConfig.from_file(os.environ["LMCACHE_CONFIG_FILE"])
    config.update_config_from_env()  # as LMCache's vLLM integration loads it
    assert config.remote_storage_plugins == ["emberfs"] and config.chunk_size == CHUNK
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    backends = CreateStorageBackends(config, metadata(), loop, "cpu")
    try:
        remote = backends["RemoteBackend-emberfs"]
        assert repr(remote.connection) == (
            f"InstrumentedRemoteConnector(<EmberConnector emberfs {kv_path}>)"
        )
        obj = chunk(backends["LocalCPUBackend"], 4)
        remote.submit_put_task(key(4), obj).result(30)
        got = remote.get_blocking(key(4))
        assert got is not None and torch.equal(got.tensor, obj.tensor)
    finally:
        for backend in backends.values():
            backend.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
