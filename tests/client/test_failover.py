"""Reads and writes keep working while a storage server dies (kill -9) or hangs (SIGSTOP)."""

from __future__ import annotations

import hashlib
import os
import signal
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_reads_and_writes_go_on_while_a_storage_server_hangs(private_cluster):
    # SIGSTOP freezes the server with its connections open: requests are taken
    # in by its kernel and never answered, as when a host hangs or drops off
    # the network. Only the metaserver, whose heartbeats stop, can tell. The
    # client's socket timeout and the servers' forward timeout are set far
    # beyond the test's wait, so the reads and the write (whose chains forward
    # through the frozen server) can finish only by leaving it once the
    # cluster has declared it offline, while it is still frozen.
    cluster = private_cluster(extra_storage_args=["--forward-timeout", "900"])
    fs = EmberFileSystem(
        cluster.meta_address,
        skip_instance_cache=True,
        io_timeout=900.0,
        read_timeout=900.0,
        write_timeout=900.0,
    )
    frozen = cluster.storage[1]
    try:
        data = _pattern(64 * MiB)
        fs.pipe_file("/old.bin", data)
        new = data[::-1]
        results: dict[str, object] = {}

        def read_old():
            got = bytearray()
            with fs.open("/old.bin", "rb") as f:
                buf = bytearray(4 * MiB)
                while n := f.readinto(buf):
                    got += buf[:n]
            results["read"] = bytes(got)
            results["cat"] = fs.cat_file("/old.bin")

        def write_new():
            fs.pipe_file("/new.bin", new)
            results["written"] = True

        # the client's routing still names the frozen server as serving
        frozen.signal(signal.SIGSTOP)
        workers = [threading.Thread(target=t, daemon=True) for t in (read_old, write_new)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert not any(w.is_alive() for w in workers), "a read or write waits on the frozen server"
        assert results["read"] == data
        assert results["cat"] == data
        assert results["written"]
        assert fs.cat_file("/new.bin") == new
    finally:
        frozen.signal(signal.SIGCONT)
        fs.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_client_follows_the_routing_of_a_server_that_failed_it(private_cluster):
    # A killed server's connections close, but new ones to a vanished host wait
    # for the connect timeout. A client whose transfer to a server failed keeps
    # asking the metaserver about that server, without another error, so that
    # it stops choosing it once the cluster has declared it offline.
    from emberfs.common.stalls import LIVE_STATES

    cluster = private_cluster()
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        data = _pattern(32 * MiB)
        fs.pipe_file("/f.bin", data)
        dead = cluster.storage_address(1)
        cluster.kill_storage(1)
        assert fs.cat_file("/f.bin") == data  # some chunk reads fail on the dead server
        cluster.wait_for(
            lambda r: all(t.state not in LIVE_STATES for t in r.targets if t.data_address == dead),
            30,
            "the dead server's targets to go offline",
        )
        routing = fs.client.runtime().routing
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = {t.state for t in routing.get().targets.values() if t.data_address == dead}
            if states and not states & LIVE_STATES:
                break
            time.sleep(0.1)
        assert states and not states & LIVE_STATES, "the client still counts the dead server up"
    finally:
        fs.close()
