"""The KV cache block store against real clusters: blocks, prefixes, eviction, several processes, faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from emberfs.client.chunkio import ChunkIO
from emberfs.client.fs import EmberFileSystem
from emberfs.common import kvgeometry
from emberfs.kvcache import KVCache, PutStatus
from emberfs.proto import kvcache_pb2
from tests.kvcache.worker import block_of, key_of

KiB = 1024
WORKER = Path(__file__).with_name("worker.py")


def test_blocks_go_straight_into_the_callers_buffers(make_cache):
    cache = make_cache(block_size=64 * KiB, blocks=64)
    keys = [key_of(i) for i in range(20)]
    blocks = [block_of(i, cache.block_size) for i in range(20)]
    assert cache.batch_put(keys, blocks) == [PutStatus.STORED] * 20
    # pinned host memory stands in as one numpy array, a block per row
    host = np.zeros((21, cache.block_size), dtype=np.uint8)
    got = cache.batch_get([*keys, b"missing"], into=list(host))
    assert got == [len(b) for b in blocks] + [None]
    for row, b in zip(host, blocks, strict=False):
        assert row[: len(b)].tobytes() == b
    assert not host[20].any()  # a miss leaves its buffer alone
    assert cache.batch_get(keys[:2]) == blocks[:2]  # without buffers: bytes
    assert cache.get(b"missing") is None and cache.exists(keys[0])
    assert cache.contains([b"missing", keys[3]]) == [False, True]


class CountingCalls(grpc.UnaryUnaryClientInterceptor):
    """Records the MetaService methods a client calls (not the routing it fetches)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def intercept_unary_unary(self, continuation, details, request):
        service, _, method = details.method.strip("/").partition("/")
        if service == "emberfs.MetaService":
            self.calls.append(method)
        return continuation(details, request)


def test_a_batch_costs_one_metaserver_call_to_get_and_two_to_put(cluster, make_cache):
    cache = make_cache(block_size=64 * KiB, blocks=256)
    keys = [key_of(i) for i in range(64)]
    blocks = [block_of(i, cache.block_size) for i in range(64)]
    counter = CountingCalls()
    counted = EmberFileSystem(
        cluster.meta_address, interceptors=(counter,), skip_instance_cache=True
    )
    try:
        cache = KVCache(cache.path, fs=counted)
        calls = counter.calls
        calls.clear()
        cache.batch_put(keys, blocks)
        assert calls == ["KvReserve", "KvCommit"]
        calls.clear()
        assert cache.batch_get(keys) == blocks
        assert calls == ["KvLookup"]  # the hits' read capabilities came with it
        calls.clear()
        assert cache.batch_exists(keys) == 64 and calls == ["KvLookup"]
    finally:
        counted.close()


def test_small_blocks_of_one_chunk_move_together(fs, make_cache):
    # 64 KiB blocks, 16 to a 1 MiB chunk: a batch of consecutive slots is one chunk write
    # and one chunk read per chunk, not one per block; short blocks keep their own length
    cache = make_cache(block_size=64 * KiB, blocks=64)
    keys = [key_of(i) for i in range(32)]
    blocks = [block_of(i, cache.block_size) for i in range(32)]  # some 1000 or 2000 shorter
    rt = fs.client.runtime()
    calls = {"write": 0, "read": 0}
    real_write, real_read = rt.data.write, rt.data.read

    def write(*args):
        calls["write"] += 1
        return real_write(*args)

    def read(*args):
        calls["read"] += 1
        if calls["read"] == 1 and fail_first_read:
            raise OSError(5, "storage went away")
        return real_read(*args)

    rt.data.write, rt.data.read = write, read
    try:
        fail_first_read = False
        assert cache.batch_put(keys, blocks) == [PutStatus.STORED] * 32
        assert calls["write"] == 2
        assert cache.batch_get(keys) == blocks
        assert calls["read"] == 2
        # a chunk read that fails makes misses of its blocks, and only of them
        calls["read"] = 0
        fail_first_read = True
        got = cache.batch_get(keys)
        assert got.count(None) == 16
        assert all(g is None or g == b for g, b in zip(got, blocks, strict=True))
    finally:
        rt.data.write, rt.data.read = real_write, real_read


def test_first_writer_wins_and_puts_are_idempotent(make_cache):
    cache = make_cache()
    key = key_of(1)
    assert cache.put(key, b"first" * 100) == PutStatus.STORED
    assert cache.put(key, b"second" * 100) == PutStatus.EXISTS
    assert cache.get(key) == b"first" * 100
    assert cache.batch_put([key_of(2), key_of(2)], [b"a", b"b"]) == [
        PutStatus.STORED,
        PutStatus.BUSY,
    ]
    assert cache.stats().puts == 2


def test_bad_calls_are_refused_and_store_nothing(make_cache):
    cache = make_cache(block_size=4 * KiB, blocks=16)
    with pytest.raises(ValueError):
        cache.put(b"big", bytes(4 * KiB + 1))
    with pytest.raises(ValueError):
        cache.put(b"empty", b"")
    with pytest.raises(ValueError):
        cache.batch_put([b"a", b"b"], [b"x"])
    with pytest.raises(TypeError):
        cache.put(123, b"x")
    with pytest.raises(OSError):  # the index refuses an empty key, and a key too long
        cache.put(b"", b"x")
    with pytest.raises(OSError):
        cache.put(b"k" * 600, b"x")
    cache.put(b"a", bytes(4 * KiB))
    small = bytearray(100)
    assert cache.get(b"a", into=small) is None  # a block longer than its buffer is not read
    assert small == bytearray(100)
    with pytest.raises(ValueError):
        cache.get(b"a", into=b"read-only" * 1000)
    assert list(cache.keys()) == [b"a"]


def test_prefix_existence(make_cache):
    cache = make_cache(block_size=4 * KiB, blocks=64)
    keys = [key_of(i) for i in range(10)]
    cache.batch_put(keys[:6], [b"x"] * 6)
    cache.put(keys[8], b"x")
    assert cache.batch_exists(keys) == 6
    assert cache.batch_exists(keys[:6]) == 6
    assert cache.batch_exists(keys[6:]) == 0
    assert cache.batch_exists([]) == 0
    assert cache.batch_exists(["text keys work too"]) == 0
    cache.delete([keys[2]])
    assert cache.batch_exists(keys) == 2


def test_create_open_and_errors(fs, make_cache):
    cache = make_cache(block_size=8 * KiB, blocks=32)
    again = KVCache(cache.path, fs=fs)  # another handle (another process would do the same)
    assert (again.cache_id, again.block_size, again.capacity) == (cache.cache_id, 8 * KiB, 32)
    same = KVCache.create(cache.path, block_size=8 * KiB, capacity=1, fs=fs, exist_ok=True)
    assert same.cache_id == cache.cache_id
    with pytest.raises(FileExistsError):
        KVCache.create(cache.path, block_size=8 * KiB, capacity=32 * 8 * KiB, fs=fs)
    with pytest.raises(FileExistsError):
        KVCache.create(cache.path, block_size=4 * KiB, capacity=1 << 20, fs=fs, exist_ok=True)
    with pytest.raises(FileNotFoundError):
        KVCache("/no/such/cache", fs=fs)
    plain = "/not-a-cache-" + os.urandom(4).hex()
    fs.pipe(f"{plain}/data", b"keep me")
    with pytest.raises(FileExistsError):  # a directory with other entries is not taken over
        KVCache.create(plain, block_size=8 * KiB, capacity=1 << 20, fs=fs)
    assert fs.ls(plain, detail=False) == [f"{plain}/data"]
    assert fs.cat(f"{plain}/data") == b"keep me"
    fs.rm(plain, recursive=True)
    with pytest.raises(ValueError):
        KVCache.create("/tiny", block_size=8 * KiB, capacity=100, fs=fs)
    assert not fs.exists("/tiny")


def test_full_cache_evicts_and_never_grows(fs, make_cache):
    cache = make_cache(block_size=16 * KiB, blocks=32, slab_blocks=16)
    before = {p["name"]: p["size"] for p in fs.ls(cache.path)}
    assert len(before) == kvgeometry.slab_count(cache.geometry)
    stored = []
    for r in range(6):  # 6 x 16 blocks into room for 32
        keys = [key_of(1000 * r + i) for i in range(16)]
        got = cache.batch_put(keys, [block_of(1000 * r + i, cache.block_size) for i in range(16)])
        assert got == [PutStatus.STORED] * 16
        stored.append(keys)
        # the cache's own blocks, just read, are the most recent: kept
        cache.batch_get(stored[0])
        time.sleep(1.1)  # reads refresh recency at most once a second per key
    s = cache.stats()
    assert s.used_blocks == 32 and s.evictions == 6 * 16 - 32
    assert cache.batch_exists(stored[0]) == 16  # read after every round: never evicted
    assert cache.batch_exists(stored[-1]) == 16  # the newest
    assert sum(cache.contains(k).count(True) for k in stored[1:-1]) == 0
    # the namespace holds what it held: the same slab files of the same sizes
    assert {p["name"]: p["size"] for p in fs.ls(cache.path)} == before
    for i, n in enumerate(cache.batch_get(stored[-1])):
        assert n == block_of(5000 + i, cache.block_size)


def test_blocks_written_by_one_process_are_read_by_another(cluster, make_cache):
    cache = make_cache(block_size=16 * KiB, blocks=64)
    keys = [key_of(i) for i in range(8)]
    cache.batch_put(keys, [block_of(i, cache.block_size) for i in range(8)])
    code = (
        "import sys; from emberfs.kvcache import KVCache; "
        "from tests.kvcache.worker import key_of, block_of; "
        f"c = KVCache({cache.path!r}); "
        "got = c.batch_get([key_of(i) for i in range(10)]); "
        "sys.exit(0 if got == [block_of(i, c.block_size) for i in range(8)] + [None, None] else 1)"
    )
    env = {**os.environ, "EMBERFS_META": cluster.meta_address}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=Path(__file__).parents[2], timeout=120
    )
    assert done.returncode == 0
    assert cache.stats().hits == 8


def _run_workers(cluster, path: str, n: int, keys: int, rounds: int, batch: int) -> list[dict]:
    env = {**os.environ, "EMBERFS_META": cluster.meta_address}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), path, str(keys), str(rounds), str(batch), str(seed)],
            env=env,
            cwd=Path(__file__).parents[2],
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(n)
    ]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=240)
        out.append((p.returncode, json.loads(stdout.strip().splitlines()[-1])))
    for code, counts in out:
        assert counts["wrong"] == 0, out
        assert code == 0, out
    return [c for _, c in out]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_concurrent_writers_and_readers_under_eviction(cluster, make_cache):
    # room for a quarter of the keys: slots are evicted and written again while
    # other processes read them; small blocks share chunks, so writers of
    # different keys write the same chunks
    cache = make_cache(block_size=16 * KiB, blocks=48, slab_blocks=16)
    counts = _run_workers(cluster, cache.path, n=4, keys=192, rounds=40, batch=16)
    total = {k: sum(c.get(k, 0) for c in counts) for k in counts[0]}
    assert total["stored"] > 0 and total["hits"] > 0 and total["misses"] > 0
    s = cache.stats()
    assert s.used_blocks <= cache.capacity and s.evictions > 0
    # every block still indexed reads back as its key's own
    keys = [key_of(i) for i in range(192)]
    got = cache.batch_get(keys)
    assert any(g is not None for g in got)
    for i, g in enumerate(got):
        assert g is None or g == block_of(i, cache.block_size)


def test_a_slot_reused_while_it_is_read_is_a_miss(cluster, fs, make_cache):
    # A reader finds key A in slot S; before it reads S, another client deletes
    # A and stores B, which takes S. The reader then reads B's bytes from S:
    # it must answer a miss for A, never B's block.
    cache = make_cache(block_size=16 * KiB, blocks=16)
    a, b = key_of(1), key_of(2)
    assert cache.put(a, block_of(1, cache.block_size)) == PutStatus.STORED
    other_fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        other = KVCache(cache.path, fs=other_fs)
        rt = fs.client.runtime()
        real_read = rt.data.read
        looked_up, reused = threading.Event(), threading.Event()

        def read_after_reuse(*args):
            looked_up.set()
            assert reused.wait(30)
            return real_read(*args)

        rt.data.read = read_after_reuse
        result = {}
        reader = threading.Thread(target=lambda: result.update(got=cache.get(a)))
        reader.start()
        assert looked_up.wait(30)
        assert other.delete([a]) == 1
        assert other.put(b, block_of(2, cache.block_size)) == PutStatus.STORED
        reused.set()
        reader.join(30)
        rt.data.read = real_read
        assert result["got"] is None
        assert cache.get(b) == block_of(2, cache.block_size)  # B's block itself is fine
    finally:
        other_fs.close()


def test_a_damaged_block_is_a_miss_and_leaves_the_index(fs, make_cache):
    cache = make_cache(block_size=16 * KiB, blocks=16)
    key = key_of(7)
    assert cache.put(key, block_of(7, cache.block_size)) == PutStatus.STORED
    req = kvcache_pb2.KvLookupRequest(
        ctx=fs.client.meta.context(), cache_id=cache.cache_id, keys=[key]
    )
    loc = fs.client.meta.meta("KvLookup", req).locations[0]
    # overwrite a few of the slot's bytes behind the index's back, through the data path
    # (the put left this client the slab's write capability)
    slab, offset = kvgeometry.locate(cache.geometry, loc.slot)
    inode, chains = cache.slabs[slab]
    cs = cache.geometry.chunk_size
    index, inner = divmod(offset, cs)
    rt = fs.client.runtime()
    chain = chains[index % len(chains)]
    rt.data.write(ChunkIO.over(chain, inode, index, inner + 100, b"garbage!", chunk_size=cs))
    assert cache.get(key) is None
    assert not cache.exists(key)  # the reader dropped it: the next put stores it again
    assert cache.put(key, block_of(7, cache.block_size)) == PutStatus.STORED
    assert cache.get(key) == block_of(7, cache.block_size)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_storage_server_restart_mid_batch(private_cluster):
    cluster = private_cluster()
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        cache = KVCache.create("/kv", block_size=256 * KiB, capacity=512 * 256 * KiB, fs=fs)
        bs = cache.block_size
        keys = [key_of(i) for i in range(256)]
        assert (
            cache.batch_put(keys[:128], [block_of(i, bs) for i in range(128)])
            == [PutStatus.STORED] * 128
        )
        results: dict[str, list] = {"gets": [], "puts": []}
        stop = threading.Event()

        def load():
            i = 128
            while not stop.is_set():
                results["gets"].append(cache.batch_get(keys[:128]))
                if i < 256:
                    got = cache.batch_put(
                        keys[i : i + 16], [block_of(j, bs) for j in range(i, i + 16)]
                    )
                    results["puts"].append((i, got))
                    i += 16

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        time.sleep(1.0)
        cluster.kill_storage(1)  # kill -9 while batches are in flight
        time.sleep(2.0)
        cluster.start_storage(1)
        cluster.wait_serving(timeout=120)
        time.sleep(1.0)
        stop.set()
        thread.join(240)
        assert not thread.is_alive()
        assert len(results["gets"]) > 2
        for got in results["gets"]:  # hits or clean misses, never wrong bytes
            for i, g in enumerate(got):
                assert g is None or g == block_of(i, bs)
        for first, statuses in results["puts"]:
            for j, s in enumerate(statuses):
                if s == PutStatus.STORED:  # acknowledged: readable now
                    assert cache.get(keys[first + j]) == block_of(first + j, bs)
        assert cache.batch_get(keys[:128]) == [block_of(i, bs) for i in range(128)]
    finally:
        fs.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_metaservers_on_etcd_share_one_cache(private_cluster):
    # writers of the same keys through two metaservers at once (batches larger than one etcd
    # transaction takes): each key holds one writer's block, whole; then the leader is killed
    cluster = private_cluster(kv="etcd", metaservers=2)
    addresses = cluster.meta_addresses.split(",")
    fs_a = EmberFileSystem(",".join(addresses), skip_instance_cache=True, retry_timeout=60)
    fs_b = EmberFileSystem(",".join(addresses[::-1]), skip_instance_cache=True, retry_timeout=60)
    try:
        bs = 64 * KiB
        caches = [
            KVCache.open_or_create("/kv", block_size=bs, capacity=512 * bs, fs=f)
            for f in (fs_a, fs_b)
        ]
        assert caches[0].cache_id == caches[1].cache_id
        keys = [key_of(i) for i in range(96)]

        def blocks(tag: bytes) -> list[bytes]:
            return [tag + block_of(i, bs)[1:] for i in range(96)]

        got: dict[bytes, list[PutStatus]] = {}
        threads = [
            threading.Thread(target=lambda c=c, t=t: got.update({t: c.batch_put(keys, blocks(t))}))
            for c, t in zip(caches, (b"A", b"B"), strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for sa, sb in zip(got[b"A"], got[b"B"], strict=True):
            # one writer stored it; the other found it stored, or being stored
            assert {sa, sb} in (
                {PutStatus.STORED, PutStatus.EXISTS},
                {PutStatus.STORED, PutStatus.BUSY},
            )
        for cache in caches:
            read = cache.batch_get(keys)
            for i, data in enumerate(read):
                winner = b"A" if got[b"A"][i] == PutStatus.STORED else b"B"
                assert data == winner + block_of(i, bs)[1:]
        cluster.kill_meta(cluster.leader())  # kill -9: acknowledged blocks stay, calls go on
        more = [key_of(i) for i in range(96, 128)]
        assert (
            caches[0].batch_put(more, [block_of(i, bs) for i in range(96, 128)])
            == [PutStatus.STORED] * 32
        )
        assert caches[1].batch_exists(keys + more) == 128
        assert caches[1].batch_get(more) == [block_of(i, bs) for i in range(96, 128)]
    finally:
        fs_a.close()
        fs_b.close()


def test_a_cache_opened_before_fork_works_in_the_child(make_cache):
    # inference servers and dataloaders fork with the client in hand
    cache = make_cache(block_size=16 * KiB, blocks=32)
    cache.batch_put(
        [key_of(i) for i in range(4)], [block_of(i, cache.block_size) for i in range(4)]
    )
    pid = os.fork()
    if pid == 0:  # the child: its own connections, the same cache
        ok = False
        try:
            got = cache.batch_get([key_of(i) for i in range(5)])
            ok = got == [block_of(i, cache.block_size) for i in range(4)] + [None]
            ok = ok and cache.put(key_of(9), b"from the child") == PutStatus.STORED
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cache.get(key_of(9)) == b"from the child"
