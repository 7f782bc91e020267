"""``emberfs warmup`` and ``emberfs cache stats|clear``, run as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from benchmarks.epochs import server_read_bytes
from emberfs.cli.processes import emberfs_command
from emberfs.client.fs import EmberFileSystem

MiB = 1024 * 1024

pytestmark = pytest.mark.slow


@pytest.fixture
def run(cluster, tmp_path):
    def run(*args, env=None, timeout=120):
        full = dict(os.environ)
        for name in ("EMBERFS_CACHE_DIR", "EMBERFS_CACHE_SIZE"):
            full.pop(name, None)
        full["EMBERFS_META"] = cluster.meta_address
        full.update(env or {})
        return subprocess.run(
            emberfs_command() + list(args),
            capture_output=True,
            text=True,
            env=full,
            timeout=timeout,
        )

    return run


@pytest.fixture
def tree(cluster):
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    base = f"/warm-{uuid.uuid4().hex[:10]}"
    files = {
        f"{base}/a.bin": os.urandom(5 * MiB),
        f"{base}/sub/b.bin": os.urandom(MiB + 17),
        f"{base}/sub/deeper/c.bin": os.urandom(100),
        f"{base}/sub/empty": b"",
    }
    for p, data in files.items():
        fs.pipe_file(p, data)
    try:
        yield fs, base, files
    finally:
        fs.rm(base, recursive=True)
        fs.close()


def test_warmup_fills_the_cache_so_a_job_reads_nothing_from_the_servers(
    run, tree, cluster, tmp_path
):
    fs, base, files = tree
    cache_dir = str(tmp_path / "cache")
    r = run("warmup", base, "--cache-dir", cache_dir, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    total = sum(map(len, files.values()))
    assert report["files"] == 4 and report["files_read"] == 3 and report["files_cached"] == 1
    assert report["bytes_read"] == total and report["bytes_cached"] == 0
    assert report["files_skipped"] == [] and report["failed"] == 0
    # a job's reads come from the cache
    job = EmberFileSystem(cluster.meta_address, skip_instance_cache=True, cache_dir=cache_dir)
    try:
        before = server_read_bytes(cluster)
        assert job.cat(sorted(files)) == files
        for p, data in files.items():
            assert job.cat_file(p) == data
        assert server_read_bytes(cluster) == before
        assert job.metrics()["disk_cache"]["misses"] == 0
    finally:
        job.close()
    # a second warmup finds everything cached and reads nothing
    r = run("warmup", f"{base}/a.bin", f"{base}/sub", "--cache-dir", cache_dir)
    assert r.returncode == 0, r.stderr
    assert "4 files: 0 read into the cache (0 B), 4 cached already (6 MiB)" in r.stdout
    # stats, through the environment's cache directory
    r = run("cache", "stats", "--json", env={"EMBERFS_CACHE_DIR": cache_dir})
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["entries"] == 4 and stats["fills"] == 4 and stats["fill_bytes"] == total
    assert stats["hits"] == 8 and stats["hit_bytes"] == 2 * total and stats["misses"] == 0
    assert stats["limit"] == 10 * 1024**3
    r = run("cache", "stats", "--cache-dir", cache_dir)
    assert r.returncode == 0 and "in 4 chunks (limit 10 GiB)" in r.stdout
    assert "hits         8 (100.0 % of reads)" in r.stdout
    # and clear, through the client config file
    config = tmp_path / "client.toml"
    config.write_text(f'cache_dir = "{cache_dir}"\n')
    r = run("cache", "clear", env={"EMBERFS_CONFIG": str(config)})
    assert r.returncode == 0 and "removed 4 chunks" in r.stdout
    r = run("cache", "stats", "--json", "--cache-dir", cache_dir)
    assert json.loads(r.stdout)["entries"] == json.loads(r.stdout)["hits"] == 0


def test_warmup_reports_files_it_cannot_cache_and_paths_that_are_missing(run, tree, tmp_path):
    fs, base, files = tree
    cache_dir = str(tmp_path / "cache")
    with fs.open(f"{base}/a.bin", "ab") as f:  # a writer has it open while the warmup runs
        f.write(b"x")
        f.flush(force=True)
        r = run("warmup", base, "--cache-dir", cache_dir, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["files_skipped"] == [f"{base}/a.bin"] and report["files_read"] == 2
    r = run("warmup", f"{base}/missing", "--cache-dir", cache_dir)
    assert r.returncode == 1 and "No such file or directory" in r.stderr
    assert f"{base}/missing" in r.stderr


def test_cache_commands_need_a_cache(run, tmp_path):
    r = run("cache", "stats", env={"EMBERFS_CONFIG": str(tmp_path / "none.toml")})
    assert r.returncode == 2 and "no disk cache named" in r.stderr
    r = run("cache", "clear", "--cache-dir", str(tmp_path / "nothing"))
    assert r.returncode == 1 and "holds no disk cache" in r.stderr
    assert not (tmp_path / "nothing").exists()
    r = run("warmup", "/", "--cache-dir", str(tmp_path / "c"), "--cache-size", "lots")
    assert r.returncode == 2 and "not a size" in r.stderr
