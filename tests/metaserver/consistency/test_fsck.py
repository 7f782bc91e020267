"""``emberfs fsck`` as an operator runs it, against a real cluster damaged behind its back."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time

import pytest

from emberfs.cli.processes import emberfs_command
from emberfs.client.fs import EmberFileSystem
from emberfs.metaserver.fs import records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import RocksEngine
from tests.client.test_lost_data import chunk_metas
from tests.storageserver.test_scrub import chunk_file, flip

MiB = 1024 * 1024
TOKEN = os.environ["EMBERFS_ADMIN_TOKEN"]  # the suite's admin token (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def fsck(cluster, *args: str, token: str | None = None) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBERFS_ADMIN")}
    if token:
        env["EMBERFS_ADMIN_TOKEN"] = token
    done = subprocess.run(
        emberfs_command() + ["fsck", "--admin", cluster.admin_url, "--json", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    return done.returncode, json.loads(done.stdout)


def kinds(report: dict) -> list[tuple]:
    return sorted((f["kind"], f["path"], f.get("index")) for f in report["findings"])


def quiet_cluster(private_cluster):
    """A cluster whose scrubbers stay out of the way (fsck is what is tested)."""
    return private_cluster(
        env={"EMBERFS_ADMIN_TOKEN": TOKEN}, extra_storage_args=["--scrub-rate", "0"]
    )


def target_of(cluster, i: int, inode: int, index: int) -> int:
    """The target of storage server ``i`` that holds chunk ``index`` of ``inode``."""
    mine = {
        t.target_id
        for t in cluster.routing().targets
        if t.data_address == cluster.storage_address(i)
    }
    (target,) = mine & set(chunk_metas(cluster, inode, index))
    return target


def test_a_chunk_file_deleted_on_one_replica_is_found_and_restored(private_cluster):
    c = quiet_cluster(private_cluster)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        data, other = os.urandom(5 * MiB), os.urandom(100_000)
        fs.pipe_file("/data/a.bin", data)
        fs.pipe_file("/data/b.bin", other)
        rc, report = fsck(c)
        assert rc == 0 and report["summary"]["clean"], report
        assert report["summary"]["files"] == 2 and report["summary"]["chunks"] == 3

        inode = fs.info("/data/a.bin")["ino"]
        target = target_of(c, 0, inode, 1)
        chunk_file(c.data_dir / "storage-0", inode, 1).unlink()
        assert fs.cat_file("/data/a.bin") == data  # the other replicas serve
        rc, report = fsck(c)
        assert rc == 1 and kinds(report) == [("missing_replica", "/data/a.bin", 1)], report
        (finding,) = report["findings"]
        assert finding["targets"] == [target] and "cannot be opened" in finding["detail"]

        rc, report = fsck(c, "--repair")
        assert rc == 2 and "401" in report["error"]  # repairing needs the token
        rc, report = fsck(c, "--repair", token=TOKEN)
        assert rc == 0 and report["findings"][0]["repair"] == "done", report
        rc, report = fsck(c)
        assert rc == 0 and report["summary"]["clean"], report
        assert chunk_file(c.data_dir / "storage-0", inode, 1).read_bytes() == data[4 * MiB :]
        assert fs.cat_file("/data/a.bin") == data and fs.cat_file("/data/b.bin") == other
    finally:
        fs.close()


def test_a_chunk_rotten_on_every_replica_is_named_and_nothing_else(private_cluster):
    c = quiet_cluster(private_cluster)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True, read_timeout=20.0)
    try:
        lost, fine = os.urandom(2 * MiB), os.urandom(2 * MiB)
        fs.pipe_file("/lost.bin", lost)
        fs.pipe_file("/fine.bin", fine)
        inode = fs.info("/lost.bin")["ino"]
        for i in range(3):
            path = chunk_file(c.data_dir / f"storage-{i}", inode, 0)
            flip(path, [100, path.stat().st_size // 2])
        with pytest.raises(OSError) as caught:
            fs.cat_file("/lost.bin")
        assert caught.value.errno == errno.EIO
        rc, report = fsck(c, "--deep")
        assert rc == 1 and kinds(report) == [("lost_chunk", "/lost.bin", 0)], report
        assert len(report["findings"][0]["targets"]) == 3
        assert report["summary"]["bytes_verified"] >= 3 * len(fine)
        rc, report = fsck(c, "--deep", "--repair", token=TOKEN)
        assert rc == 1 and report["findings"][0]["repair"].startswith("not repaired")
        assert fs.cat_file("/fine.bin") == fine  # nothing else was touched
    finally:
        fs.close()


def test_namespace_damage_and_orphan_chunks_are_found_and_repaired(private_cluster):
    c = quiet_cluster(private_cluster)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        fs.pipe_file("/d/gone.bin", os.urandom(300_000))
        kept = os.urandom(300_000)
        fs.pipe_file("/kept.bin", kept)
        gone, kept_inode = fs.info("/d/gone.bin")["ino"], fs.info("/kept.bin")["ino"]
    finally:
        fs.close()

    c.meta.stop()  # damage the metadata store behind the metaserver's back
    engine = RocksEngine(c.data_dir / "meta" / "meta")
    try:
        attr = records.decode_inode(engine.get(keys.inode_key(kept_inode)))
        attr.nlink = 5
        engine.write(
            {keys.inode_key(kept_inode): records.encode_inode(attr)}, {keys.inode_key(gone)}
        )
    finally:
        engine.close()
    c.start_meta()
    c.wait_serving(60)

    rc, report = fsck(c)
    assert rc == 1, report
    assert kinds(report) == [
        ("dangling_entry", "/d/gone.bin", None),
        ("orphan_chunk", "/d/gone.bin", None),  # named by the entry left over
        ("wrong_link_count", "/kept.bin", None),
    ]
    rc, report = fsck(c, "--repair", token=TOKEN)
    assert rc == 0 and {f["repair"] for f in report["findings"]} == {"done"}, report
    deadline = time.monotonic() + 60
    while True:  # the orphans go with the GC queue
        rc, report = fsck(c)
        if rc == 0:
            break
        assert time.monotonic() < deadline, report
        time.sleep(1)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        assert fs.ls("/d") == [] and fs.cat_file("/kept.bin") == kept
        assert fs.info("/kept.bin")["nlink"] == 1
    finally:
        fs.close()


def test_a_busy_cluster_checks_clean(private_cluster):
    """Files written, cut and removed while fsck runs show no damage (no false positives)."""
    import random
    import threading

    c = quiet_cluster(private_cluster)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    fs.mkdir("/busy")
    fs.quota_set("/busy", max_bytes=1 << 40)  # usage that changes while fsck counts it
    stop = threading.Event()
    errors_seen: list[BaseException] = []

    def churn() -> None:
        rng = random.Random(5)
        n = 0
        try:
            while not stop.is_set():
                path = f"/busy/f{rng.randrange(40)}"
                what = rng.random()
                if what < 0.5:
                    fs.pipe_file(path, os.urandom(rng.randrange(1, 3 * MiB)))
                elif what < 0.7 and fs.exists(path):
                    fs.truncate(path, rng.randrange(0, 2 * MiB))
                elif fs.exists(path):
                    fs.rm(path)
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors_seen.append(exc)

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        for _ in range(4):
            rc, report = fsck(c)
            assert rc == 0, report
            time.sleep(0.5)
    finally:
        stop.set()
        writer.join(60)
        fs.close()
    assert not errors_seen, errors_seen
    rc, report = fsck(c, "--deep")
    assert rc == 0 and report["summary"]["files"] >= 1, report


def test_a_sparse_petabyte_file_is_checked_by_its_data_chunks(private_cluster):
    c = quiet_cluster(private_cluster)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        data = os.urandom(100_000)
        fs.pipe_file("/sparse.bin", data)
        fs.truncate("/sparse.bin", 1 << 50)  # one chunk of data, the rest a hole
        rc, report = fsck(c, "--repair", token=TOKEN)
        assert rc == 0 and report["summary"]["chunks"] == 1, report
        with fs.open("/sparse.bin", "rb") as f:
            assert f.read(len(data)) == data
    finally:
        fs.close()


def test_a_quota_usage_damaged_is_found_and_recounted(private_cluster):
    from emberfs.metaserver.fs import quota

    c = quiet_cluster(private_cluster)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        fs.mkdir("/q/n")
        fs.quota_set("/q", max_bytes=1 << 30)
        fs.quota_set("/q/n")
        fs.pipe_file("/q/n/a", os.urandom(300_000))
        fs.pipe_file("/q/b", os.urandom(1000))
        rc, report = fsck(c)
        assert rc == 0 and report["summary"]["clean"], report
        outer, inner = fs.quota_get("/q")["inode"], fs.quota_get("/q/n")["inode"]
    finally:
        fs.close()

    c.meta.stop()  # usage records made wrong behind the metaserver's back
    engine = RocksEngine(c.data_dir / "meta" / "meta")
    try:
        wrong = quota.USAGE_FORMAT.pack(5, 7)
        engine.write({keys.quota_usage_key(inner, 3): wrong})
        stale = [k for k, _ in engine.scan_prefix(keys.quota_usage_prefix(outer))]
        engine.write({}, set(stale))
    finally:
        engine.close()
    c.start_meta()
    c.wait_serving(60)

    rc, report = fsck(c)
    assert rc == 1 and kinds(report) == [("quota_usage", "/q", None), ("quota_usage", "/q/n", None)]
    rc, report = fsck(c, "--repair", token=TOKEN)
    assert rc == 0 and {f["repair"] for f in report["findings"]} == {"done"}, report
    rc, report = fsck(c)
    assert rc == 0, report
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        assert fs.quota_get("/q")["used_bytes"] == 301_000
        assert fs.quota_get("/q/n")["used_inodes"] == 1
    finally:
        fs.close()
