"""The DataLoader pattern: one filesystem shared by threads and by forked workers."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

MiB = 1024 * 1024
SHARDS = 8

# set in the parent before forking; the workers inherit it (as DataLoader workers
# inherit the dataset object that holds the filesystem)
_SHARED: dict = {}


def _read_shard(path: str) -> tuple[str, str, str, int]:
    fs = _SHARED["fs"]
    with fs.open(path, "rb") as f:
        whole = f.read()
    by_lines = b"".join(fs.open(path, "rb"))
    ranged = fs.cat_file(path, start=MiB // 2, end=MiB // 2 + 4096)
    digest = hashlib.sha256(whole).hexdigest()
    assert by_lines == whole
    return path, digest, hashlib.sha256(ranged).hexdigest(), os.getpid()


@pytest.fixture
def shards(fs, base):
    expected = {}
    for i in range(SHARDS):
        data = os.urandom(2 * MiB + i * 4099)
        path = f"{base}/shard-{i:03d}.tar"
        fs.pipe_file(path, data)
        expected[path] = (
            hashlib.sha256(data).hexdigest(),
            hashlib.sha256(data[MiB // 2 : MiB // 2 + 4096]).hexdigest(),
        )
    return expected


def test_threads_read_disjoint_shards(fs, shards):
    _SHARED["fs"] = fs
    with ThreadPoolExecutor(SHARDS) as pool:
        results = list(pool.map(_read_shard, sorted(shards)))
    for path, whole, ranged, _ in results:
        assert (whole, ranged) == shards[path]


def test_forked_workers_read_disjoint_shards(fs, shards):
    # the parent uses the instance first: channel, sockets and threads exist before fork
    first = sorted(shards)[0]
    assert hashlib.sha256(fs.cat_file(first)).hexdigest() == shards[first][0]
    _SHARED["fs"] = fs
    ctx = multiprocessing.get_context("fork")
    pool = ctx.Pool(4)
    try:
        results = pool.map_async(_read_shard, sorted(shards), chunksize=1).get(timeout=120)
    finally:
        pool.terminate()
        pool.join()
    pids = set()
    for path, whole, ranged, pid in results:
        assert (whole, ranged) == shards[path]
        pids.add(pid)
    assert os.getpid() not in pids
    # the parent keeps working with its own connections
    for path in sorted(shards):
        assert hashlib.sha256(fs.cat_file(path)).hexdigest() == shards[path][0]


def _write_in_child(args) -> int:
    path, n = args
    fs = _SHARED["fs"]
    fs.pipe_file(path, bytes([n]) * (MiB + n))
    return fs.info(path)["size"]


def test_forked_workers_write_with_fresh_request_ids(fs, base):
    # children must not reuse the parent's client id: the metaserver would take
    # their requests for retries of the parent's
    fs.pipe_file(f"{base}/parent", b"p")
    _SHARED["fs"] = fs
    ctx = multiprocessing.get_context("fork")
    pool = ctx.Pool(3)
    try:
        jobs = [(f"{base}/child-{n}", n) for n in range(6)]
        sizes = pool.map_async(_write_in_child, jobs, chunksize=1).get(timeout=120)
    finally:
        pool.terminate()
        pool.join()
    assert sizes == [MiB + n for n in range(6)]
    for n in range(6):
        assert fs.cat_file(f"{base}/child-{n}") == bytes([n]) * (MiB + n)
