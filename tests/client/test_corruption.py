"""A byte flipped in a chunk file on disk is caught on read; the data comes from a good replica."""

from __future__ import annotations

import os

import pytest

MiB = 1024 * 1024


def _chunk_files(cluster, inode: int, index: int) -> list:
    """Every replica's file of one chunk (committed versions only), across all storage servers."""
    found = []
    for i in range(len(cluster.storage)):
        root = cluster.data_dir / f"storage-{i}"
        for d in root.glob(f"target-*/chunks/{inode:016x}"):
            found += sorted(d.glob(f"{index:08x}.*"))
    return found


@pytest.mark.slow
def test_flipped_byte_is_detected_and_another_replica_serves(fs, base, cluster):
    data = os.urandom(9 * MiB + 12345)
    path = f"{base}/victim.bin"
    fs.pipe_file(path, data)
    inode = fs.info(path)["ino"]
    chunk_size = fs.info(path)["chunk_size"] if "chunk_size" in fs.info(path) else 4 * MiB
    files = _chunk_files(cluster, inode, 1)
    assert len(files) == cluster.replicas, files
    # Corrupt two of the three replicas of chunk 1 (one bit each, at different blocks):
    # whichever replica a read picks first, the result must be the good data.
    for n, f in enumerate(files[:2]):
        with open(f, "r+b") as fh:
            fh.seek(100_000 + n * 200_000)
            b = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([b[0] ^ 0x20]))
    for _ in range(6):
        fresh = type(fs)(cluster.meta_address, skip_instance_cache=True)
        try:
            assert fresh.cat_file(path) == data
            with fresh.open(path, "rb") as f:
                f.seek(chunk_size + 99_000)
                assert f.read(300_000) == data[chunk_size + 99_000 : chunk_size + 399_000]
        finally:
            fresh.close()
