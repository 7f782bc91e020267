"""The scrubber finds chunk files that rotted on disk and has their replica resynced.

Real processes for the repair (a local cluster whose storage servers scrub
every second); a chunk store in the test process for what one pass marks.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request

import pytest

from emberfs.client.fs import EmberFileSystem
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.scrub import Scrubber, check_chunk
from tests.client.test_lost_data import chunk_metas

MiB = 1024 * 1024
pytestmark = pytest.mark.timeout(180)


def chunk_file(root, inode: int, index: int):
    """The committed file of a chunk under a storage server's (or store's) directory."""
    found = [
        p
        for p in root.rglob(f"{inode:016x}/{index:08x}.*")
        if "spare" not in p.parts and p.is_file()
    ]
    assert len(found) == 1, found
    return found[0]


def flip(path, offsets) -> None:
    with open(path, "r+b") as f:
        for off in offsets:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))


def test_one_pass_marks_a_rotten_chunk_damaged_and_reports_it(tmp_path):
    store = ChunkStore(tmp_path / "t", direct_io=False)
    try:
        good, bad = os.urandom(300_000), os.urandom(200_000)
        store.install(7, 0, 3, good)
        store.install(7, 1, 4, bad)
        flip(chunk_file(tmp_path / "t", 7, 1), [5, 150_000])
        reported = []
        scrubber = Scrubber(
            lambda: {1: store},
            1e9,
            lambda t, m: reported.append((t, m.inode, m.index)),
            threading.Event(),
        )
        stats = scrubber.scrub_pass()
        assert (stats.chunks, stats.damaged, stats.bytes) == (2, 1, 500_000)
        assert reported == [(1, 7, 1)]
        assert store.meta(7, 1).damaged and not store.meta(7, 0).damaged
        assert scrubber.scrub_pass().chunks == 1  # a damaged chunk waits for its resync
        assert store.install(7, 1, 4, bad)  # the resync's whole copy makes it whole again
        assert not store.meta(7, 1).damaged
        report = scrubber.report(1, store.repaired)
        assert (report.passes, report.errors, report.repairs) == (2, 1, 1)
        assert (report.chunks_verified, report.bytes_verified) == (1, 300_000)  # the last pass
        assert not report.running and report.last_pass_ended_ns >= report.pass_started_ns > 0
    finally:
        store.close()


def test_a_chunk_whose_file_is_gone_is_marked_damaged_and_the_pass_goes_on(tmp_path):
    store = ChunkStore(tmp_path / "t", direct_io=False)
    try:
        store.install(3, 0, 2, os.urandom(50_000))
        store.install(3, 1, 2, os.urandom(50_000))
        chunk_file(tmp_path / "t", 3, 0).unlink()
        committed, _, problem = check_chunk(store, 3, 0, blocks=False)
        assert committed.version == 2 and "cannot be opened" in problem
        assert check_chunk(store, 3, 1, blocks=False)[2] == ""
        reported = []
        scrubber = Scrubber(
            lambda: {1: store}, 1e9, lambda t, m: reported.append(m.index), threading.Event()
        )
        stats = scrubber.scrub_pass()
        assert (stats.chunks, stats.damaged, reported) == (2, 1, [0])
        assert store.meta(3, 0).damaged and not store.meta(3, 1).damaged
    finally:
        store.close()


def test_pause_holds_a_pass_between_chunks_and_start_begins_one_at_once(tmp_path):
    store = ChunkStore(tmp_path / "t", direct_io=False)
    stop = threading.Event()
    try:
        for i in range(4):
            store.install(9, i, 1, os.urandom(10_000))
        scrubber = Scrubber(lambda: {1: store}, 1e9, lambda t, m: None, stop)
        scrubber.control(paused=False, start=5)  # the first start seen is history
        runner = threading.Thread(target=scrubber.run, args=(3600.0, 3600.0), daemon=True)
        runner.start()
        time.sleep(0.5)
        assert scrubber.report(1, 0).passes == 0  # nothing due for an hour
        scrubber.control(paused=True, start=6)  # started, but paused
        time.sleep(0.5)
        assert scrubber.report(1, 0).passes == 0 and scrubber.report(1, 0).paused
        scrubber.control(paused=False, start=6)
        deadline = time.monotonic() + 10
        while scrubber.report(1, 0).passes < 1:
            assert time.monotonic() < deadline, "the started pass did not run"
            time.sleep(0.05)
        assert scrubber.report(1, 0).chunks_verified == 4
    finally:
        stop.set()
        store.close()


def test_a_pass_gives_way_to_busy_clients_but_still_ends(tmp_path, monkeypatch):
    from emberfs.storageserver import scrub

    monkeypatch.setattr(scrub, "YIELD_MAX", 0.05)
    store = ChunkStore(tmp_path / "t", direct_io=False)
    asked = []
    try:
        for i in range(3):
            store.install(4, i, 1, os.urandom(5_000))
        scrubber = Scrubber(
            lambda: {1: store},
            1e9,
            lambda t, m: None,
            threading.Event(),
            busy=lambda: asked.append(time.monotonic()) or True,  # clients never stop
        )
        assert scrubber.scrub_pass().chunks == 3
        assert len(asked) >= 3  # it waited before every chunk
    finally:
        store.close()


def test_rotten_replicas_are_found_and_resynced_while_reads_stay_exact(private_cluster):
    cluster = private_cluster(
        extra_storage_args=["--scrub-rate", "200", "--scrub-interval", "1", "--scrub-delay", "0"]
    )
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        data = os.urandom(3 * MiB)
        fs.pipe_file("/rot.bin", data)
        inode = fs.info("/rot.bin")["ino"]
        before = chunk_metas(cluster, inode, 0)
        assert len(before) == 3
        rotten = []
        for i in range(2):  # two of the three replicas
            path = chunk_file(cluster.data_dir / f"storage-{i}", inode, 0)
            size = path.stat().st_size
            flip(path, [17, size // 2, size - 1])
            rotten.append(i)
        assert fs.cat_file("/rot.bin") == data  # the healthy replica serves

        def whole(i: int) -> bool:
            try:
                got = chunk_file(cluster.data_dir / f"storage-{i}", inode, 0).read_bytes()
            except (AssertionError, FileNotFoundError):  # between the resync's two files
                return False
            return got == data[: len(got)]

        deadline = time.monotonic() + 120
        while True:
            after = chunk_metas(cluster, inode, 0)
            states = {t.target_id: t.state for t in cluster.routing().targets}
            if all(whole(i) for i in rotten) and after == before and set(states.values()) == {1}:
                break  # rewritten by a resync from the healthy replica, every target serving
            assert time.monotonic() < deadline, f"not repaired: {after} vs {before}, {states}"
            assert fs.cat_file("/rot.bin") == data
            time.sleep(0.3)
        assert fs.cat_file("/rot.bin") == data
        for i in rotten:  # the scrubber of each rotten replica counted it
            port = cluster.storage_ports[i] + 2
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            damaged = [
                line
                for line in text.splitlines()
                if line.startswith("emberfs_storage_scrub_damaged_total")
            ]
            assert damaged and sum(float(line.split()[-1]) for line in damaged) >= 1
            for name in (
                "emberfs_storage_scrub_pass_start_seconds",
                "emberfs_storage_scrub_last_full_pass_seconds",
                "emberfs_storage_scrub_repaired",
            ):
                assert any(line.startswith(name + "{") for line in text.splitlines()), name
        # the admin API shows each rotten target's errors and repairs
        rotten_targets = {
            t.target_id
            for t in cluster.routing().targets
            if t.data_address in {cluster.storage_address(i) for i in rotten}
        } & set(before)
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(cluster.admin_url + "/api/v1/scrub", timeout=5) as r:
                shown = {t["id"]: t for t in json.load(r)["targets"]}
            if all(
                shown.get(t, {}).get("errors", 0) >= 1 and shown[t]["repairs"] >= 1
                for t in rotten_targets
            ):
                break
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)
        assert all(t["last_full_pass"] > 0 for t in shown.values())
        # (that module uses this one's helpers)
        from tests.metaserver.consistency.test_fsck import fsck

        rc, report = fsck(cluster, "--deep")
        assert rc == 0 and report["summary"]["clean"], report
    finally:
        fs.close()
