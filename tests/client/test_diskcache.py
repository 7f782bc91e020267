"""The client's local disk cache on a real cluster: hits never reach a storage server, a changed
file is never served stale, processes share it, it survives them, it keeps to its size."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.request

import pytest

from emberfs.client.cacheentry import entry_size
from emberfs.client.diskcache import DiskCache
from emberfs.client.fs import EmberFileSystem
from emberfs.proto import meta_pb2

pytestmark = pytest.mark.slow

MiB = 1024 * 1024


def server_reads(cluster) -> tuple[float, float]:
    """Chunk bytes the storage servers sent to readers, and their read operations, so far."""
    nbytes = ops = 0.0
    for i in range(cluster.storage_servers):
        with urllib.request.urlopen(cluster.storage_metrics_url(i), timeout=10) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith("emberfs_storage_read_bytes_total"):
                nbytes += float(line.split()[-1])
            elif line.startswith("emberfs_storage_chunk_ops_total") and 'op="read"' in line:
                ops += float(line.split()[-1])
    return nbytes, ops


def cached_fs(cluster, directory, **kw) -> EmberFileSystem:
    return EmberFileSystem(
        cluster.meta_address, skip_instance_cache=True, cache_dir=str(directory), **kw
    )


def read_all_ways(fs, path: str) -> list[bytes]:
    """The file read as an application may: read(), readinto, pieces, cat_file, cat of a list."""
    with fs.open(path, "rb") as f:
        whole = f.read()
    buf = bytearray(len(whole))
    with fs.open(path, "rb") as f:
        f.readinto(buf)
    with fs.open(path, "rb") as f:
        pieces = b"".join(iter(lambda: f.read(300_000), b""))
    return [whole, bytes(buf), pieces, fs.cat_file(path), fs.cat([path])[path]]


@pytest.fixture
def cfs(cluster, tmp_path):
    instance = cached_fs(cluster, tmp_path / "cache")
    try:
        yield instance
    finally:
        instance.close()


def test_a_second_read_comes_from_the_cache_and_never_reaches_a_storage_server(
    cluster, fs, cfs, base
):
    data = os.urandom(9 * MiB + 12345)  # three chunks, the last one short
    small = os.urandom(1000)
    fs.pipe_file(f"{base}/big", data)
    fs.pipe_file(f"{base}/small", small)
    first = read_all_ways(cfs, f"{base}/big") + read_all_ways(cfs, f"{base}/small")
    assert first == [data] * 5 + [small] * 5
    cache = cfs.client.cache
    assert cache.flush()
    assert cache.stats()["entries"] == 4
    before = server_reads(cluster)
    again = read_all_ways(cfs, f"{base}/big") + read_all_ways(cfs, f"{base}/small")
    assert again == first
    with cfs.open(f"{base}/big", "rb") as f:  # random reads within chunks
        f.seek(5 * MiB + 7)
        assert f.read(100_000) == data[5 * MiB + 7 : 5 * MiB + 100_007]
    assert server_reads(cluster) == before
    m = cfs.metrics()["disk_cache"]
    assert m["hits"] >= 5 * 4 and m["hit_bytes"] >= 5 * (len(data) + len(small))
    assert m["fills"] == 4 and m["fill_bytes"] == len(data) + len(small)
    assert m["fill_errors"] == m["corrupt"] == m["evictions"] == 0


def test_chunks_received_ahead_are_kept_with_the_checksums_they_came_with(cluster, fs, cfs, base):
    data = os.urandom(16 * MiB)  # a readinto stream of whole chunks: reads sent ahead
    fs.pipe_file(f"{base}/stream", data)

    def stream() -> bytes:
        out, buf = [], bytearray(4 * MiB)
        with cfs.open(f"{base}/stream", "rb") as f:
            while n := f.readinto(buf):
                out.append(bytes(buf[:n]))
        return b"".join(out)

    assert stream() == data
    cfs.client.cache.flush()
    before = server_reads(cluster)
    assert stream() == data
    assert server_reads(cluster) == before
    m = cfs.metrics()["disk_cache"]
    assert (m["fills"], m["hits"], m["corrupt"]) == (4, 4, 0)


def test_a_changed_file_is_never_served_from_the_cache(cluster, fs, cfs, base):
    path = f"{base}/f"
    cache = cfs.client.cache

    def check(expected: bytes) -> None:
        assert read_all_ways(cfs, path) == [expected] * 5
        cache.flush()
        assert read_all_ways(cfs, path) == [expected] * 5  # and from the cache now

    v1 = os.urandom(5 * MiB)
    fs.pipe_file(path, v1)
    check(v1)
    # rewritten in place with other bytes of the same length, through another client
    v2 = os.urandom(len(v1))
    fs.pipe_file(path, v2)
    check(v2)
    # truncated (shrunk, then grown over a hole that reads as zeros)
    fs.truncate(path, 3 * MiB)
    check(v2[: 3 * MiB])
    fs.truncate(path, 4 * MiB + 5)
    check(v2[: 3 * MiB] + bytes(MiB + 5))
    # appended to
    with fs.open(path, "ab") as f:
        f.write(b"tail")
    check(v2[: 3 * MiB] + bytes(MiB + 5) + b"tail")
    # written in place without a truncation or a length change: same size, same chunk
    with fs.open(path, "rb") as f:
        now = f.read()
    handle = fs.client.open(path, meta_pb2.OPEN_READ | meta_pb2.OPEN_WRITE)
    writer = fs.client.writer(handle)
    writer.write(10, b"X" * 10)
    writer.close()
    check(now[:10] + b"X" * 10 + now[20:])
    # replaced by another file renamed over it
    v3 = os.urandom(2 * MiB)
    fs.pipe_file(f"{base}/other", v3)
    fs.mv(f"{base}/other", path)
    check(v3)


def test_nothing_is_cached_while_a_writer_has_the_file_open(cluster, fs, cfs, base):
    path = f"{base}/open"
    fs.pipe_file(path, os.urandom(2 * MiB))
    f = fs.open(path, "ab")  # a write session stays open on the file
    try:
        f.write(b"more")
        f.flush(force=True)
        with cfs.open(path, "rb") as r:
            r.read()
        cfs.client.cache.flush()
        before = server_reads(cluster)
        with cfs.open(path, "rb") as r:
            assert len(r.read()) == 2 * MiB  # its length: the last Sync or Close
        assert server_reads(cluster)[0] > before[0]
        assert cfs.metrics()["disk_cache"]["fills"] == 0
    finally:
        f.close()
    with cfs.open(path, "rb") as r:
        assert len(r.read()) == 2 * MiB + 4


_SHARED: dict = {}


def _worker(paths: list[str], out) -> None:
    fs = _SHARED["fs"]
    n = sum(len(fs.cat_file(p)) for p in paths)
    out.put((os.getpid(), n, fs.metrics()["disk_cache"]))


def test_forked_workers_share_the_cache_one_fills_another_hits(cluster, fs, base, tmp_path):
    files = {f"{base}/shard-{i}": os.urandom(3 * MiB + i) for i in range(4)}
    for p, data in files.items():
        fs.pipe_file(p, data)
    shared = cached_fs(cluster, tmp_path / "cache")
    try:
        shared.info(base)  # the parent uses it first: connections exist before the fork
        _SHARED["fs"] = shared
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        results = []
        for _ in range(2):  # a DataLoader worker of one epoch, then of the next
            w = ctx.Process(target=_worker, args=(sorted(files), out))
            before = server_reads(cluster)
            w.start()
            results.append(out.get(timeout=120))
            w.join(60)
            assert w.exitcode == 0
            results[-1] += (server_reads(cluster)[0] - before[0],)
        (pid1, n1, m1, read1), (pid2, n2, m2, read2) = results
        total = sum(map(len, files.values()))
        assert pid1 != pid2 and n1 == n2 == total
        assert m1["misses"] == len(files) and m1["hits"] == 0 and read1 >= total
        # the second worker found what the first one kept (written as it ended)
        assert m2["hits"] == len(files) and m2["misses"] == 0 and read2 == 0
        stats = DiskCache(str(tmp_path / "cache"), None).stats()
        assert (stats["hits"], stats["misses"], stats["fills"]) == (4, 4, 4)
        assert stats["fill_bytes"] == stats["hit_bytes"] == total
    finally:
        shared.close()


_READER = textwrap.dedent(
    """
    import json, sys
    from emberfs.client.fs import EmberFileSystem
    meta, cache_dir, path = sys.argv[1:]
    fs = EmberFileSystem(meta, skip_instance_cache=True, cache_dir=cache_dir)
    data = fs.cat_file(path)
    print(json.dumps({"n": len(data), "cache": fs.metrics()["disk_cache"]}))
    """
)


def read_in_process(cluster, cache_dir, path: str, env=None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _READER, cluster.meta_address, str(cache_dir), path],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_cache_survives_the_processes_that_filled_it(cluster, fs, base, tmp_path):
    data = os.urandom(6 * MiB)
    fs.pipe_file(f"{base}/f", data)
    first = read_in_process(cluster, tmp_path / "cache", f"{base}/f")
    assert first["n"] == len(data) and first["cache"]["misses"] == 2
    before = server_reads(cluster)
    second = read_in_process(cluster, tmp_path / "cache", f"{base}/f")
    assert second["n"] == len(data)
    assert second["cache"]["hits"] == 2 and second["cache"]["misses"] == 0
    assert server_reads(cluster) == before


def test_the_least_recently_used_chunks_are_evicted_to_keep_the_size_limit(
    cluster, fs, base, tmp_path
):
    files = {name: os.urandom(MiB) for name in "abcd"}  # one chunk each
    for name, data in files.items():
        fs.pipe_file(f"{base}/{name}", data)
    entry = entry_size(MiB)  # the bytes, a CRC per 64 KiB, the footer, to a multiple of 4 KiB
    assert entry == MiB + 4096
    limit = int(3.5 * entry)
    cfs = cached_fs(cluster, tmp_path / "cache", cache_size=limit)
    cache = cfs.client.cache
    try:
        for name in "abc":
            assert cfs.cat_file(f"{base}/{name}") == files[name]
        cache.flush()
        assert cache.stats()["entries"] == 3
        for age, name in enumerate("bca"):  # read long ago, "b" first ...
            key = cache.key(cfs.client.meta.stat(f"{base}/{name}"), 0)
            os.utime(cache.path(key), ns=((age + 1) * 10**18,) * 2)
        assert cfs.cat_file(f"{base}/a") == files["a"]  # ... and "a" once more just now
        assert cfs.cat_file(f"{base}/d") == files["d"]  # a fill past the limit evicts
        cache.flush()
        stats = cache.stats()
        assert stats["used"] <= limit and stats["entries"] == 3
        assert stats["evictions"] == 1 and stats["evicted_bytes"] == entry
        before = server_reads(cluster)
        for name in "acd":
            assert cfs.cat_file(f"{base}/{name}") == files[name]
        assert server_reads(cluster) == before
        assert cfs.cat_file(f"{base}/b") == files["b"]  # evicted: from the cluster again
        assert server_reads(cluster)[0] >= before[0] + MiB
    finally:
        cfs.close()


def test_a_damaged_entry_is_dropped_and_the_chunk_read_from_the_cluster(cfs, fs, base):
    data = os.urandom(MiB)
    fs.pipe_file(f"{base}/f", data)
    cache = cfs.client.cache
    assert cfs.cat_file(f"{base}/f") == data
    cache.flush()
    ((_, _, path),) = cache.entries()
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(b"\xff" if data[1000] != 0xFF else b"\0")
    assert cfs.cat_file(f"{base}/f") == data
    assert cfs.metrics()["disk_cache"]["corrupt"] == 1
    cache.flush()
    assert cfs.cat_file(f"{base}/f") == data  # kept again, whole
    assert cfs.metrics()["disk_cache"]["hits"] == 1


def test_a_cache_directory_that_cannot_be_written_is_a_clear_error(cluster, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    script = textwrap.dedent(
        """
        import sys
        from emberfs.client.fs import EmberFileSystem
        try:
            EmberFileSystem(sys.argv[1], skip_instance_cache=True, cache_dir=sys.argv[2])
        except PermissionError as exc:
            print(exc.filename, "|", exc.strerror)
        """
    )
    # as root: without the capability that lets root write anywhere (a user lacks it anyway)
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    if os.geteuid() != 0:
        drop = []
    elif shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to run as root without CAP_DAC_OVERRIDE")
    done = subprocess.run(
        [*drop, sys.executable, "-c", script, cluster.meta_address, str(locked / "cache")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    filename, message = done.stdout.strip().split(" | ")
    assert filename == str(locked / "cache")
    assert message.startswith(f"the disk cache directory {locked / 'cache'} cannot be used")
    assert message.endswith("Permission denied")
    # a path that is a file is no directory either
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match="disk cache directory"):
        cached_fs(cluster, tmp_path / "file")


def test_a_full_cache_disk_drops_fills_and_reads_go_on_from_the_cluster(
    cluster, fs, base, tmp_path, tmpfs
):
    disk = tmpfs(tmp_path / "small", 2 * MiB)  # room for one chunk of 1.5 MiB, not two
    files = {f"{base}/{n}": os.urandom(MiB + MiB // 2) for n in "ab"}
    for p, data in files.items():
        fs.pipe_file(p, data)
    script = textwrap.dedent(
        """
        import json, sys
        from emberfs.client.fs import EmberFileSystem
        meta, cache_dir, *paths = sys.argv[1:]
        fs = EmberFileSystem(meta, skip_instance_cache=True, cache_dir=cache_dir)
        out = []
        for p in paths:
            out.append(len(fs.cat_file(p)))
            fs.client.cache.flush()
        out.append(sum(len(fs.cat_file(p)) for p in paths))
        print(json.dumps({"n": out, "cache": fs.metrics()["disk_cache"]}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, cluster.meta_address, str(disk / "c"), *sorted(files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["n"] == [MiB + MiB // 2] * 2 + [3 * MiB]
    m = got["cache"]
    assert m["fills"] == 1 and m["fill_errors"] == 1  # the second fill found no room
    assert m["hits"] == 1 and m["misses"] == 3  # "b" was read from the cluster both times
    assert "No space left on device" in done.stderr
    assert not os.listdir(disk / "c" / "tmp")  # the failed fill left nothing behind
