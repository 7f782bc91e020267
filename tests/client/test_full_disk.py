"""A storage target whose disk fills up, in a real cluster of real processes.

Storage server 0 keeps its data on a small tmpfs: writes end with ENOSPC naming the file (not
with EIO after the write timeout), what was written reads back, the admin API and the metrics
show the target full, and once files are removed and collected, writes succeed again.
"""

from __future__ import annotations

import errno
import os
import time

import httpx
import pytest

from emberfs.cli.localcluster import LocalCluster
from emberfs.client.fs import EmberFileSystem

MiB = 1024 * 1024


def api(c: LocalCluster, path: str):
    return httpx.get(c.admin_url + path, timeout=10).json()


def metrics(c: LocalCluster) -> str:
    return httpx.get(c.admin_url + "/metrics", timeout=10).text


def wait_targets(c: LocalCluster, predicate, what: str) -> list[dict]:
    deadline = time.monotonic() + 60
    targets = api(c, "/api/v1/targets")
    while not predicate(targets):
        assert time.monotonic() < deadline, f"{what}: {targets}"
        time.sleep(0.1)
        targets = api(c, "/api/v1/targets")
    return targets


def assert_enospc(exc: pytest.ExceptionInfo, path: str) -> None:
    assert exc.value.errno == errno.ENOSPC, exc.value
    assert exc.value.filename == path and path in str(exc.value)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_full_disk_ends_writes_with_enospc_until_files_are_removed(
    tmp_path_factory, tmpfs, tmp_path
):
    data_dir = tmp_path_factory.mktemp("full-disk")
    tmpfs(data_dir / "storage-0", 24 * MiB)
    c = LocalCluster(
        data_dir,
        storage_servers=3,
        replicas=3,
        targets_per_server=1,
        heartbeat_timeout=2.0,
        extra_meta_args=["--chunk-size", str(MiB)],
        extra_storage_args=["--reserve-bytes", "2MiB"],
    )
    c.start(timeout=90)
    # a write that kept retrying would end with EIO after 2 s: the error must be ENOSPC
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True, write_timeout=2.0)
    try:
        fs.makedirs("/d")
        written: dict[str, bytes] = {}
        for i in range(40):
            path = f"/d/f{i}"
            data = os.urandom(3 * MiB + 1000)  # four chunks
            try:
                fs.pipe_file(path, data)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC and exc.filename == path, exc
                break
            written[path] = data
        else:
            raise AssertionError("the small disk never filled up")
        assert len(written) >= 2

        # every way a write reaches the user names the file
        with pytest.raises(OSError) as err:
            with fs.open("/d/stream", "wb") as f:
                f.write(os.urandom(2 * MiB))
        assert_enospc(err, "/d/stream")
        batch = {"/d/batch-1": os.urandom(MiB + 5), "/d/batch-2": os.urandom(10)}
        with pytest.raises(OSError) as err:
            fs.pipe(batch)
        assert_enospc(err, "/d/batch-1")
        # nothing half made: a file the batch created without its data is gone again
        assert not fs.exists("/d/batch-1")
        assert not fs.exists("/d/batch-2") or fs.cat_file("/d/batch-2") == batch["/d/batch-2"]
        local = tmp_path / "local"
        local.write_bytes(os.urandom(MiB + 7))
        with pytest.raises(OSError) as err:
            fs.put(str(local), "/d/put")
        assert_enospc(err, "/d/put")

        for path, data in written.items():
            assert fs.cat_file(path) == data

        targets = wait_targets(c, lambda ts: any(t["full"] for t in ts), "a target full")
        full = [t for t in targets if t["full"]]
        assert [t["address"] for t in full] == [c.storage_address(0)]
        assert all(t["state"] == "serving" for t in targets)
        assert api(c, "/api/v1/cluster")["targets"]["full"] == 1
        assert "emberfs_targets_full 1.0" in metrics(c)

        # removed files are collected; their space comes back and the target takes writes
        for path in list(written)[:2]:
            fs.rm(path)
            del written[path]
        wait_targets(c, lambda ts: not any(t["full"] for t in ts), "no target full")
        assert "emberfs_targets_full 0.0" in metrics(c)
        data = os.urandom(MiB + 3)
        fs.pipe_file("/d/again", data)
        written["/d/again"] = data
        for path, data in written.items():
            assert fs.cat_file(path) == data
    finally:
        fs.close()
        c.stop()
