"""The mount's unlink, rmdir and rename-over go to the trash of a metaserver that keeps one."""

from __future__ import annotations

import os
import shutil

import pytest

from emberfs.client.fs import EmberFileSystem

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trash_cluster(tmp_path_factory):
    from tests.conftest import make_cluster

    c = make_cluster(tmp_path_factory, "mount-trash", trash_days=1)
    c.start(timeout=90)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def efs(trash_cluster):
    fs = EmberFileSystem(trash_cluster.meta_address, skip_instance_cache=True)
    yield fs
    fs.close()


def paths_in_trash(efs) -> set[str]:
    return {e["path"] for e in efs.trash_list()}


def test_unlink_rmdir_and_rename_over_keep_what_they_remove(trash_cluster, mounter, efs):
    mp = mounter(trash_cluster.meta_address)
    local = os.path.join(mp, "work")
    os.mkdir(local)
    with open(os.path.join(local, "a.txt"), "wb") as f:
        f.write(b"unlinked")
    os.unlink(os.path.join(local, "a.txt"))
    os.mkdir(os.path.join(local, "empty"))
    os.rmdir(os.path.join(local, "empty"))
    for name, data in (("old", b"replaced"), ("new", b"winner")):
        with open(os.path.join(local, name), "wb") as f:
            f.write(data)
    os.rename(os.path.join(local, "new"), os.path.join(local, "old"))
    os.makedirs(os.path.join(local, "tree", "sub"))
    with open(os.path.join(local, "tree", "sub", "leaf"), "wb") as f:
        f.write(b"leaf")
    shutil.rmtree(os.path.join(local, "tree"))  # unlinks and rmdirs, one entry each
    kept = paths_in_trash(efs)
    assert {"/work/a.txt", "/work/empty", "/work/old", "/work/tree"} <= kept
    assert sorted(os.listdir(local)) == ["old"]
    entries = {e["path"]: e["entry"] for e in efs.trash_list()}
    efs.trash_restore([entries["/work/a.txt"]])
    efs.trash_restore([entries["/work/old"]], to="/work/old.before")
    with open(os.path.join(local, "a.txt"), "rb") as f:
        assert f.read() == b"unlinked"
    with open(os.path.join(local, "old.before"), "rb") as f:
        assert f.read() == b"replaced"
    with open(os.path.join(local, "old"), "rb") as f:
        assert f.read() == b"winner"
