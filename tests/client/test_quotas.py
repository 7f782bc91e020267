"""Directory quotas through fsspec against real processes: EDQUOT, usage, statfs, moves."""

from __future__ import annotations

import errno
import os
import uuid

import pytest

MiB = 1 << 20
CHUNK = 4 * MiB


@pytest.fixture
def qdir(fs):
    path = f"/quota-{uuid.uuid4().hex[:10]}"
    fs.mkdir(path)
    return path


def used(fs, path):
    q = fs.quota_get(path)
    return q["used_bytes"], q["used_inodes"]


def test_writes_stop_at_the_quota_with_edquot_and_usage_is_exact(fs, qdir):
    quota, over = fs.quota_set(qdir, max_bytes=10 * MiB, max_inodes=100)
    assert not over and quota["max_bytes"] == 10 * MiB and quota["used_inodes"] == 0
    block = os.urandom(MiB)
    with fs.open(f"{qdir}/a", "wb") as f:
        for _ in range(6):
            f.write(block)
    assert used(fs, qdir) == (6 * MiB, 1)
    written = 0
    with pytest.raises(OSError) as exc:
        with fs.open(f"{qdir}/b", "wb") as f:
            for _ in range(8):
                f.write(block)
                written += MiB
    assert exc.value.errno == errno.EDQUOT
    # nothing past the quota was kept: the file holds what was written before the refusal
    size_b = fs.info(f"{qdir}/b")["size"]
    assert size_b <= written and 6 * MiB + size_b <= 10 * MiB
    assert used(fs, qdir) == (6 * MiB + size_b, 2)
    assert fs.cat(f"{qdir}/b") == (block * 8)[:size_b]
    fs.rm(f"{qdir}/a")
    assert used(fs, qdir) == (size_b, 1)
    fs.pipe(f"{qdir}/c", block * 6)
    assert used(fs, qdir) == (size_b + 6 * MiB, 2)


def test_many_small_files_in_one_batch_fail_alone_and_leave_nothing_half_made(fs, qdir):
    fs.quota_set(qdir, max_bytes=3 * MiB)
    data = {f"{qdir}/s{i}": os.urandom(MiB) for i in range(5)}
    with pytest.raises(OSError) as exc:
        fs.pipe(data)
    assert exc.value.errno == errno.EDQUOT
    kept = sorted(fs.ls(qdir, detail=False))
    assert len(kept) == 3  # the files that fit, whole; the others were not made
    for p in kept:
        assert fs.cat(p) == data["/" + p.lstrip("/")]
    assert used(fs, qdir) == (3 * MiB, 3)


def test_inode_limit_refuses_creates(fs, qdir):
    fs.quota_set(qdir, max_inodes=2)
    fs.touch(f"{qdir}/a")
    fs.mkdir(f"{qdir}/d")
    with pytest.raises(OSError) as exc:
        fs.touch(f"{qdir}/b")
    assert exc.value.errno == errno.EDQUOT
    assert not fs.exists(f"{qdir}/b")


def test_statfs_of_a_quota_directory_shows_the_quota(fs, qdir):
    fs.quota_set(qdir, max_bytes=64 * MiB, max_inodes=1000)
    fs.mkdir(f"{qdir}/sub")
    fs.pipe(f"{qdir}/sub/f", b"x" * MiB)
    st = fs.statfs(f"{qdir}/sub")
    assert (st["capacity"], st["used"], st["free"]) == (64 * MiB, MiB, 63 * MiB)
    assert (st["inode_limit"], st["inodes"], st["quota_path"]) == (1000, 2, qdir)
    assert fs.statfs()["quota_path"] == ""


def test_moves_between_quotas(fs, qdir):
    a, b = f"{qdir}/a", f"{qdir}/b"
    fs.mkdir(a)
    fs.mkdir(b)
    fs.quota_set(a)
    fs.quota_set(b, max_bytes=2 * MiB)
    fs.pipe(f"{a}/f", b"y" * MiB)
    fs.mv(f"{a}/f", f"{b}/f")  # a file: a rename, its usage moves
    assert used(fs, a) == (0, 0) and used(fs, b) == (MiB, 1)
    fs.mkdir(f"{a}/dir")
    fs.pipe(f"{a}/dir/g", b"z" * 100)
    fs.mv(f"{a}/dir", f"{b}/dir")  # a directory: EXDEV for the rename, copied then removed
    assert fs.cat(f"{b}/dir/g") == b"z" * 100 and not fs.exists(f"{a}/dir")
    assert used(fs, a) == (0, 0) and used(fs, b) == (MiB + 100, 3)
    fs.pipe(f"{a}/big", b"w" * (2 * MiB))
    with pytest.raises(OSError) as exc:
        fs.mv(f"{a}/big", f"{b}/big")
    assert exc.value.errno == errno.EDQUOT and fs.exists(f"{a}/big")


def test_quota_calls_and_their_errors(fs, qdir):
    with pytest.raises(FileNotFoundError):
        fs.quota_get(qdir)
    fs.quota_set(qdir, max_bytes=MiB)
    assert [q["path"] for q in fs.quota_list() if q["path"] == qdir] == [qdir]
    fs.pipe(f"{qdir}/f", b"1" * 1000)
    _, over = fs.quota_set(qdir, max_bytes=10)  # below what is used: applied, and said
    assert over
    with pytest.raises(OSError) as exc:
        fs.pipe(f"{qdir}/g", b"1")
    assert exc.value.errno == errno.EDQUOT
    assert fs.quota_remove(qdir)["used_bytes"] == 1000
    fs.pipe(f"{qdir}/g", b"1")
    with pytest.raises(ValueError):
        fs.quota_set(qdir, max_bytes=-1)
    with pytest.raises(NotADirectoryError):
        fs.quota_set(f"{qdir}/g", max_bytes=1)
