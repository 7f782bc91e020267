"""Directory quotas on the mount: write(2) and creat(2) get EDQUOT, df of a quota directory shows
the quota, mv across quota directories falls back to a copy."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time

import pytest

from emberfs.client.fs import EmberFileSystem

pytestmark = pytest.mark.slow
MiB = 1 << 20


@pytest.fixture
def efs(cluster):
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    yield fs
    fs.close()


def settled(efs, path, used_bytes):
    """The quota's usage once the writers' sessions ended (the kernel releases a file just
    after close(2) returns; until then a writer's reservation counts)."""
    deadline = time.monotonic() + 10
    while True:
        q = efs.quota_get(path)
        if q["used_bytes"] == used_bytes or time.monotonic() > deadline:
            return q["used_bytes"], q["used_inodes"]
        time.sleep(0.05)


def test_writes_past_the_quota_fail_with_edquot(mdir, efs):
    local, remote = mdir
    efs.quota_set(remote, max_bytes=8 * MiB, max_inodes=4)
    block = os.urandom(MiB)
    with open(os.path.join(local, "a"), "wb") as f:
        for _ in range(5):
            f.write(block)
    fd = os.open(os.path.join(local, "b"), os.O_WRONLY | os.O_CREAT, 0o644)
    written = 0
    try:
        with pytest.raises(OSError) as exc:
            for _ in range(8):
                written += os.write(fd, block)
        assert exc.value.errno == errno.EDQUOT
    finally:
        os.close(fd)
    assert 5 * MiB + os.path.getsize(os.path.join(local, "b")) <= 8 * MiB
    with open(os.path.join(local, "b"), "rb") as f:
        assert f.read() == (block * 8)[:written]
    assert settled(efs, remote, 5 * MiB + written) == (5 * MiB + written, 2)
    os.mkdir(os.path.join(local, "d"))
    open(os.path.join(local, "d", "c"), "wb").close()
    with pytest.raises(OSError) as exc:
        open(os.path.join(local, "d", "e"), "wb")
    assert exc.value.errno == errno.EDQUOT


def test_df_of_a_quota_directory_shows_its_quota(mdir, efs):
    local, remote = mdir
    efs.quota_set(remote, max_bytes=64 * MiB, max_inodes=1000)
    os.mkdir(os.path.join(local, "sub"))
    with open(os.path.join(local, "sub", "f"), "wb") as f:
        f.write(b"x" * (2 * MiB))
    # the kernel ends the write session (release) just after close(2) returns: until then the
    # writer's reservation counts
    deadline = time.monotonic() + 10
    while True:
        st = os.statvfs(os.path.join(local, "sub"))
        if st.f_bfree * st.f_frsize == 62 * MiB or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert st.f_blocks * st.f_frsize == 64 * MiB
    assert st.f_bfree * st.f_frsize == 62 * MiB
    assert (st.f_files, st.f_ffree) == (1000, 998)
    out = subprocess.run(
        ["df", "-B1", "--output=size,used", os.path.join(local, "sub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[-2:] == [str(64 * MiB), str(2 * MiB)]
    assert os.statvfs(local).f_files == 1000  # the quota directory itself
    whole = os.statvfs(os.path.dirname(local))  # the mount's root: the cluster's figures
    assert whole.f_files != 1000 and whole.f_blocks * whole.f_frsize != 64 * MiB


def test_mv_of_a_directory_across_quotas_copies(mdir, efs):
    local, remote = mdir
    for d in ("a", "b"):
        os.mkdir(os.path.join(local, d))
        efs.quota_set(f"{remote}/{d}", max_bytes=16 * MiB)
    os.makedirs(os.path.join(local, "a", "tree"))
    with open(os.path.join(local, "a", "tree", "f"), "wb") as f:
        f.write(b"t" * MiB)
    with pytest.raises(OSError) as exc:
        os.rename(os.path.join(local, "a", "tree"), os.path.join(local, "b", "tree"))
    assert exc.value.errno == errno.EXDEV
    subprocess.run(["mv", os.path.join(local, "a", "tree"), os.path.join(local, "b")], check=True)
    assert os.listdir(os.path.join(local, "b", "tree")) == ["f"]
    assert settled(efs, f"{remote}/a", 0)[0] == 0
    assert settled(efs, f"{remote}/b", MiB)[0] == MiB
    shutil.move(os.path.join(local, "b", "tree", "f"), os.path.join(local, "a", "f"))  # a rename
    assert efs.quota_get(f"{remote}/a")["used_bytes"] == MiB
