"""Reads and writes keep working while a storage server dies (kill -9)."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from emberfs.client.fs import EmberFileSystem

MiB = 1024 * 1024


def _pattern(size: int) -> bytes:
    """Incompressible, reproducible content (so a mismatch is visible by offset)."""
    block = os.urandom(MiB)
    return b"".join(
        hashlib.sha256(block + i.to_bytes(4, "little")).digest() * (MiB // 32)
        for i in range(size // MiB)
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("unit", [MiB, 4 * MiB], ids=["1MiB-reads", "chunk-reads"])
def test_read_survives_kill_9_of_a_storage_server(private_cluster, unit):
    # 1 MiB reads take pieces of pooled readahead blocks; chunk-sized reads
    # receive reads sent ahead straight into the buffer (both must fail over)
    cluster = private_cluster()
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        data = _pattern(256 * MiB)
        fs.pipe_file("/big.bin", data)
        killed = threading.Event()
        progress = {"read": 0}

        def killer():
            while progress["read"] < 32 * MiB:
                time.sleep(0.001)
            cluster.kill_storage(1)
            killed.set()

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        got = bytearray()
        with fs.open("/big.bin", "rb") as f:
            buf = bytearray(unit)
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                got += buf[:n]
                progress["read"] += n
                if progress["read"] > 32 * MiB and not killed.is_set():
                    killed.wait(30)  # make sure the kill lands mid-read
        thread.join(30)
        assert killed.is_set()
        assert len(got) == len(data)
        assert got == data
        # a fresh whole-file read after the failover, and a new write
        assert fs.cat_file("/big.bin") == data
        fs.pipe_file("/after.bin", data[: 16 * MiB])
        assert fs.cat_file("/after.bin") == data[: 16 * MiB]
    finally:
        fs.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_write_survives_kill_9_of_a_storage_server(private_cluster):
    cluster = private_cluster()
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        data = _pattern(96 * MiB)
        with fs.open("/w.bin", "wb") as f:
            for i in range(0, len(data), 4 * MiB):
                f.write(data[i : i + 4 * MiB])
                if i == 24 * MiB:
                    cluster.kill_storage(0)
        assert fs.info("/w.bin")["size"] == len(data)
        assert fs.cat_file("/w.bin") == data
    finally:
        fs.close()
