"""The trash through real processes: fsspec, the CLI, purge and expiry by the metaserver."""

from __future__ import annotations

import errno
import os
import subprocess
import time
import uuid

import pytest

from emberfs.cli.admin import AdminClient
from emberfs.cli.processes import emberfs_command
from emberfs.client.fs import EmberFileSystem
from emberfs.proto import meta_pb2

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def trash_cluster(tmp_path_factory):
    """A cluster whose metaserver keeps a trash of one day, swept twice a second."""
    from tests.conftest import make_cluster

    c = make_cluster(
        tmp_path_factory,
        "trash",
        trash_days=1,
        extra_meta_args=["--trash-sweep-interval", "0.5"],
    )
    c.start(timeout=90)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def tfs(trash_cluster):
    fs = EmberFileSystem(trash_cluster.meta_address, skip_instance_cache=True)
    try:
        yield fs
    finally:
        fs.close()


@pytest.fixture
def base(tfs):
    path = f"/t-{uuid.uuid4().hex[:10]}"
    tfs.mkdir(path)
    tfs.client.meta.setattr(path, mode=0o777)
    return path


def new_token(cluster, uid: int) -> str:
    made = AdminClient(cluster.admin_url, cluster.admin_token).post(
        "/api/v1/tokens", {"uid": uid, "gid": uid, "groups": [], "name": f"u{uid}-{uuid.uuid4()}"}
    )
    return made["token"]


def cli(cluster, *args, token=None):
    env = dict(os.environ, EMBERFS_META=cluster.meta_address)
    if token:
        env["EMBERFS_TOKEN"] = token
    return subprocess.run(
        emberfs_command() + list(args), capture_output=True, text=True, env=env, timeout=60
    )


def entry_of(fs, path):
    found = [e for e in fs.trash_list() if e["path"] == path]
    assert len(found) == 1, fs.trash_list()
    return found[0]


def chunk_files(cluster) -> int:
    return sum(1 for _ in cluster.data_dir.glob("storage-*/target-*/chunks/*/*"))


def test_file_remove_list_restore(tfs, base):
    tfs.pipe_file(f"{base}/a.bin", b"precious" * 1000)
    tfs.rm(f"{base}/a.bin")
    assert not tfs.exists(f"{base}/a.bin")
    assert tfs.ls("/", detail=False) == sorted(tfs.ls("/", detail=False))  # no trash in /
    assert not any(".trash" in p for p in tfs.ls("/", detail=False))
    entry = entry_of(tfs, f"{base}/a.bin")
    assert entry["type"] == "file" and entry["entries"] == 1 and entry["uid"] == 0
    [back] = tfs.trash_restore([entry["entry"]])
    assert back["path"] == f"{base}/a.bin"
    assert tfs.cat_file(f"{base}/a.bin") == b"precious" * 1000


def test_recursive_rm_of_ten_thousand_files_is_one_entry_restored_whole(tfs, base):
    tree = f"{base}/tree"
    tfs.mkdir(tree)
    names = [f"f{i:05d}" for i in range(10000)]
    meta = tfs.client.meta
    for start in range(0, len(names), 5000):
        part = names[start : start + 5000]
        req = meta_pb2.BatchCreateRequest(
            ctx=meta.context(len(part)),
            items=[meta_pb2.CreateRequest(path=f"{tree}/{n}", mode=0o644) for n in part],
        )
        resp = meta.meta("BatchCreate", req)
        assert all(r.errno == 0 for r in resp.results)
    tfs.rm(tree, recursive=True)
    assert not tfs.exists(tree)
    entry = entry_of(tfs, tree)
    assert entry["type"] == "directory" and entry["entries"] == 10001
    tfs.trash_restore([entry["entry"]])
    assert sorted(p.rsplit("/", 1)[1] for p in tfs.ls(tree, detail=False)) == names
    assert all(e["path"] != tree for e in tfs.trash_list())


def test_restore_over_an_existing_name_is_refused_and_loses_nothing(trash_cluster, tfs, base):
    tfs.pipe_file(f"{base}/x", b"old")
    tfs.rm(f"{base}/x")
    tfs.pipe_file(f"{base}/x", b"new")
    entry = entry_of(tfs, f"{base}/x")
    with pytest.raises(FileExistsError):
        tfs.trash_restore([entry["entry"]])
    assert tfs.cat_file(f"{base}/x") == b"new"
    assert entry_of(tfs, f"{base}/x")["entry"] == entry["entry"]
    done = cli(trash_cluster, "trash", "restore", str(entry["entry"]))
    assert done.returncode == 1 and "exists" in done.stderr
    done = cli(trash_cluster, "trash", "restore", str(entry["entry"]), "--to", f"{base}/x.old")
    assert done.returncode == 0, done.stderr
    assert tfs.cat_file(f"{base}/x.old") == b"old" and tfs.cat_file(f"{base}/x") == b"new"


def test_cli_ls_restore_and_purge(trash_cluster, tfs, base):
    tfs.pipe_file(f"{base}/c", b"c")
    assert cli(trash_cluster, "rm", f"{base}/c").returncode == 0
    done = cli(trash_cluster, "trash", "ls", "--json")
    assert done.returncode == 0, done.stderr
    assert f"{base}/c" in done.stdout
    entry = entry_of(tfs, f"{base}/c")
    done = cli(trash_cluster, "trash", "ls")
    assert str(entry["entry"]) in done.stdout and f"{base}/c" in done.stdout
    done = cli(trash_cluster, "trash", "purge", str(entry["entry"]))
    assert done.returncode == 0 and "purged 1 entry" in done.stdout, done.stderr
    assert all(e["path"] != f"{base}/c" for e in tfs.trash_list())
    assert cli(trash_cluster, "trash", "purge").returncode == 2
    assert cli(trash_cluster, "trash", "purge", "--all", "--older-than", "7d").returncode == 0
    assert cli(trash_cluster, "trash", "purge", "--all", "--older-than", "x").returncode == 2


def test_purge_frees_the_chunks(trash_cluster, tfs, base):
    before = chunk_files(trash_cluster)
    tfs.pipe_file(f"{base}/big", os.urandom(2 * 4 * MiB))  # 2 chunks x 3 replicas
    written = chunk_files(trash_cluster)
    assert written - before == 6
    tfs.rm(f"{base}/big")
    time.sleep(1.5)  # GC would have had its turns: a kept file keeps its chunks
    assert chunk_files(trash_cluster) == written
    tfs.trash_purge([entry_of(tfs, f"{base}/big")["entry"]])
    deadline = time.monotonic() + 60
    while chunk_files(trash_cluster) > before:
        assert time.monotonic() < deadline, "the purged file's chunks were not collected"
        time.sleep(0.3)


def test_another_user_cannot_see_restore_or_purge_my_entries(trash_cluster, tfs, base):
    alice = EmberFileSystem(
        trash_cluster.meta_address, token=new_token(trash_cluster, 1000), skip_instance_cache=True
    )
    bob_token = new_token(trash_cluster, 1001)
    bob = EmberFileSystem(trash_cluster.meta_address, token=bob_token, skip_instance_cache=True)
    try:
        alice.pipe_file(f"{base}/alice", b"a")
        alice.rm(f"{base}/alice")
        entry = entry_of(alice, f"{base}/alice")
        assert entry["uid"] == 1000
        assert bob.trash_list() == []
        with pytest.raises(PermissionError):
            bob.trash_list(user=1000)
        with pytest.raises(FileNotFoundError):
            bob.trash_restore([entry["entry"]])
        with pytest.raises(FileNotFoundError):
            bob.trash_purge([entry["entry"]])
        done = cli(trash_cluster, "trash", "restore", str(entry["entry"]), token=bob_token)
        assert done.returncode == 1
        assert any(e["entry"] == entry["entry"] for e in tfs.trash_list(user=1000))  # root
        alice.trash_restore([entry["entry"]])
        assert alice.cat_file(f"{base}/alice") == b"a"
    finally:
        alice.close()
        bob.close()


@pytest.mark.slow
def test_kill_9_after_a_removal_keeps_the_entry(trash_cluster, base):
    fs = EmberFileSystem(trash_cluster.meta_address, skip_instance_cache=True, retry_timeout=60)
    try:
        fs.pipe_file(f"{base}/k", b"kept")
        fs.rm(f"{base}/k")
        trash_cluster.kill_meta()
        trash_cluster.start_meta()
        entry = entry_of(fs, f"{base}/k")
        fs.trash_restore([entry["entry"]])
        assert fs.cat_file(f"{base}/k") == b"kept"
    finally:
        fs.close()


@pytest.mark.slow
def test_the_metaserver_purges_expired_entries(private_cluster):
    c = private_cluster(trash_days=2 / 86400, extra_meta_args=["--trash-sweep-interval", "0.5"])
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        before = chunk_files(c)
        fs.pipe_file("/soon", os.urandom(4 * MiB))
        fs.rm("/soon")
        assert [e["path"] for e in fs.trash_list()] == ["/soon"]
        deadline = time.monotonic() + 60
        while fs.trash_list() or chunk_files(c) > before:
            assert time.monotonic() < deadline, "the expired entry was not purged"
            time.sleep(0.3)
    finally:
        fs.close()


def test_without_a_trash_removal_deletes_as_before(cluster, fs):
    """The shared cluster runs with --trash-days 0: a removed file's inode goes at once."""
    path = f"/nt-{uuid.uuid4().hex[:10]}"
    fs.pipe_file(path, b"gone")
    inode = fs.client.meta.stat(path).inode
    fs.rm(path)
    assert fs.trash_list() == []
    with pytest.raises(FileNotFoundError):
        fs.client.meta.stat_inode(inode)


def test_with_a_trash_the_inode_stays_until_purged(tfs, base):
    tfs.pipe_file(f"{base}/s", b"stays")
    inode = tfs.client.meta.stat(f"{base}/s").inode
    tfs.rm(f"{base}/s")
    assert tfs.client.meta.stat_inode(inode).size == 5
    tfs.trash_purge([inode])
    with pytest.raises(FileNotFoundError):
        tfs.client.meta.stat_inode(inode)


def test_a_removed_file_counts_in_its_quota_until_purged(tfs, base):
    tfs.quota_set(base, max_bytes=3 * MiB)
    tfs.pipe(f"{base}/a", b"a" * (2 * MiB))
    tfs.rm(f"{base}/a")
    assert tfs.quota_get(base)["used_bytes"] == 2 * MiB  # the trash keeps it, and its space
    with pytest.raises(OSError) as exc:
        tfs.pipe(f"{base}/b", b"b" * (2 * MiB))
    assert exc.value.errno == errno.EDQUOT
    [entry] = [e for e in tfs.trash_list() if e["path"] == f"{base}/a"]
    tfs.trash_purge([entry["entry"]])
    q = tfs.quota_get(base)
    assert (q["used_bytes"], q["used_inodes"]) == (0, 1)  # b, made empty by the refused write
    assert tfs.info(f"{base}/b")["size"] == 0
    tfs.pipe(f"{base}/b", b"b" * (2 * MiB))
    assert tfs.quota_get(base)["used_bytes"] == 2 * MiB
