"""A mount reads through the client's disk cache (``emberfs mount --cache-dir``)."""

from __future__ import annotations

import hashlib
import os
import time
import uuid

import pytest

from emberfs.client.diskcache import DiskCache
from emberfs.client.fs import EmberFileSystem
from tests.client.test_diskcache import server_reads
from tests.mount.conftest import unmount

pytestmark = pytest.mark.slow

MiB = 1024 * 1024


def read_through(mountpoint: str, path: str) -> bytes:
    with open(os.path.join(mountpoint, path.lstrip("/")), "rb") as f:
        return f.read()


def wait_entries(cache_dir: str, n: int, timeout: float = 60.0) -> dict:
    """The cache's stats once it holds ``n`` entries (the daemon fills in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = DiskCache(cache_dir, None).stats()
        if stats["entries"] >= n or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


@pytest.fixture
def files(cluster):
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    base = f"/mc-{uuid.uuid4().hex[:10]}"
    data = {f"{base}/big.bin": os.urandom(13 * MiB + 5), f"{base}/small.txt": b"hello\n" * 100}
    for p, d in data.items():
        fs.pipe_file(p, d)
    try:
        yield fs, base, data
    finally:
        fs.rm(base, recursive=True)
        fs.close()


def test_a_mount_reads_through_the_disk_cache_and_a_new_mount_finds_it(
    cluster, mounter, files, tmp_path
):
    fs, base, data = files
    cache_dir = str(tmp_path / "cache")
    mp = mounter(cluster.meta_address, "--cache-dir", cache_dir, "--cache-size", "1G")
    for p, d in data.items():
        assert read_through(mp, p) == d
    stats = wait_entries(cache_dir, 5)  # four chunks of big.bin, one of small.txt
    assert stats["entries"] == 5 and stats["limit"] == 1024**3
    unmount(mp)
    # another mount (another process, an empty page cache) reads from the disk cache alone
    mp = mounter(cluster.meta_address, "--cache-dir", cache_dir)
    before = server_reads(cluster)
    for p, d in data.items():
        assert hashlib.sha256(read_through(mp, p)).digest() == hashlib.sha256(d).digest()
    assert server_reads(cluster) == before
    # a file changed by another client is read anew
    new = os.urandom(len(data[f"{base}/big.bin"]))
    fs.pipe_file(f"{base}/big.bin", new)
    assert read_through(mp, f"{base}/big.bin") == new
    assert server_reads(cluster)[0] >= before[0] + len(new)
    unmount(mp)
    stats = DiskCache(cache_dir, None).stats()
    assert stats["hits"] >= 5 and stats["fill_errors"] == stats["corrupt"] == 0


def test_a_mount_refuses_a_cache_directory_it_cannot_use(cluster, mounter, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"x")
    done = mounter.command(
        mounter.mountpoint(), cluster.meta_address, "--cache-dir", str(not_a_dir), check=False
    )
    assert done.returncode == 1
    assert f"the disk cache directory {not_a_dir} cannot be used: Not a directory" in done.stderr
