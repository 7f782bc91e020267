"""Removals that skip the trash, through real processes on a cluster that keeps one.

The client's own removals (a checkpoint a newer one replaced, a staging
leftover, the sources of a glob move) never land in the trash; ``rm`` and
``emberfs rm`` do so when asked (``skip_trash``); a plain removal still keeps
what it takes.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from emberfs.client.fs import EmberFileSystem
from emberfs.proto import meta_pb2
from tests.metaserver.test_trash_cluster import cli, entry_of, new_token

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def trash_cluster(tmp_path_factory):
    """A cluster whose metaserver keeps a trash of one day."""
    from tests.conftest import make_cluster

    c = make_cluster(tmp_path_factory, "skiptrash", trash_days=1)
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
    path = f"/s-{uuid.uuid4().hex[:10]}"
    tfs.mkdir(path)
    tfs.client.meta.setattr(path, mode=0o777)
    return path


def trashed_under(fs, base: str) -> list[str]:
    return [e["path"] for e in fs.trash_list() if e["path"].startswith(f"{base}/")]


def chunks_of(cluster, inodes) -> int:
    """Chunk files of ``inodes`` on every storage target."""
    return sum(
        1
        for inode in inodes
        for _ in cluster.data_dir.glob(f"storage-*/target-*/chunks/{inode:016x}/*")
    )


def inodes_under(fs, path: str) -> list[int]:
    return [fs.info(p)["ino"] for p in fs.find(path)]


def wait_collected(cluster, inodes) -> None:
    deadline = time.monotonic() + 60
    while chunks_of(cluster, inodes):
        assert time.monotonic() < deadline, f"{chunks_of(cluster, inodes)} chunk files left"
        time.sleep(0.3)


def test_checkpoint_saves_leave_nothing_in_the_trash(trash_cluster, tfs, base):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    from emberfs.client.checkpoint import CheckpointReader, CheckpointWriter, staging_path
    from tests.client.torchjob import state

    path = f"{base}/ckpt"
    where = f"emberfs://{trash_cluster.meta_address}{path}"
    dcp.save(state(1, 8), storage_writer=CheckpointWriter(where))
    # a killed save's leftover in the staging directory, cleared by the next save
    tfs.pipe_file(f"{staging_path(path)}/__0_0.distcp", os.urandom(MiB))
    old = inodes_under(tfs, path) + inodes_under(tfs, staging_path(path))
    assert chunks_of(trash_cluster, old) > 0
    dcp.save(state(2, 8), storage_writer=CheckpointWriter(where))
    target = {k: torch.zeros_like(v) for k, v in state(0, 8).items()}
    dcp.load(target, storage_reader=CheckpointReader(where))
    assert all(torch.equal(target[k], v) for k, v in state(2, 8).items())
    assert trashed_under(tfs, base) == []
    assert tfs.ls(base, detail=False) == [path]
    # the previous checkpoint's and the leftover's chunks are collected
    wait_collected(trash_cluster, old)


def test_put_and_glob_move_over_existing_files_leave_no_trash_entry(tfs, base, tmp_path):
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(b"new small")
    big.write_bytes(os.urandom(tfs.default_block_size + MiB))  # streamed, not grouped
    tfs.pipe({f"{base}/small": b"old small", f"{base}/big": b"old big"})
    tfs.put([str(small), str(big)], [f"{base}/small", f"{base}/big"])
    tfs.put_file(str(small), f"{base}/big")
    assert tfs.cat_file(f"{base}/big") == b"new small"
    tfs.pipe({f"{base}/m1.txt": b"1", f"{base}/m2.txt": b"2"})
    tfs.mkdir(f"{base}/moved")
    tfs.mv(f"{base}/m*.txt", f"{base}/moved/")
    assert sorted(tfs.ls(f"{base}/moved", detail=False)) == [
        f"{base}/moved/m1.txt",
        f"{base}/moved/m2.txt",
    ]
    assert trashed_under(tfs, base) == []


def test_rm_skip_trash_deletes_and_frees_the_chunks(trash_cluster, tfs, base):
    tfs.pipe_file(f"{base}/big", os.urandom(2 * 4 * MiB))  # 2 chunks x 3 replicas
    inode = tfs.client.meta.stat(f"{base}/big").inode
    assert chunks_of(trash_cluster, [inode]) == 6
    tfs.rm(f"{base}/big", skip_trash=True)
    assert not tfs.exists(f"{base}/big")
    with pytest.raises(FileNotFoundError):
        tfs.client.meta.stat_inode(inode)
    wait_collected(trash_cluster, [inode])
    # trees and many paths at once (one BatchRemove), and a single file by rm_file
    tfs.pipe({f"{base}/d/{i}": b"x" for i in range(3)})
    tfs.pipe({f"{base}/a": b"a", f"{base}/b": b"b", f"{base}/c": b"c"})
    tfs.rm(f"{base}/d", recursive=True, skip_trash=True)
    tfs.rm([f"{base}/a", f"{base}/b"], skip_trash=True)
    tfs.rm_file(f"{base}/c", skip_trash=True)
    assert tfs.ls(base, detail=False) == []
    assert trashed_under(tfs, base) == []
    # a plain rm still keeps what it takes
    tfs.pipe_file(f"{base}/kept", b"kept")
    tfs.rm(f"{base}/kept")
    assert trashed_under(tfs, base) == [f"{base}/kept"]


def test_rename_over_a_file_skip_trash(tfs, base):
    tfs.pipe({f"{base}/src": b"new", f"{base}/dst": b"old", f"{base}/src2": b"newer"})
    tfs.mv(f"{base}/src", f"{base}/dst", skip_trash=True)
    assert tfs.cat_file(f"{base}/dst") == b"new"
    assert trashed_under(tfs, base) == []
    tfs.mv(f"{base}/src2", f"{base}/dst")  # a user's rename keeps the replaced file
    assert tfs.cat_file(f"{base}/dst") == b"newer"
    assert entry_of(tfs, f"{base}/dst")["type"] == "file"


def test_cli_rm_skip_trash(trash_cluster, tfs, base):
    tfs.pipe_file(f"{base}/f", os.urandom(4 * MiB))
    tfs.pipe({f"{base}/tree/{i}": os.urandom(1000) for i in range(3)})
    inodes = inodes_under(tfs, base)
    assert chunks_of(trash_cluster, inodes) == 4 * 3
    done = cli(trash_cluster, "rm", "--skip-trash", f"{base}/f")
    assert done.returncode == 0, done.stderr
    done = cli(trash_cluster, "rm", "-r", "--skip-trash", f"{base}/tree")
    assert done.returncode == 0, done.stderr
    assert tfs.ls(base, detail=False) == []
    assert trashed_under(tfs, base) == []
    wait_collected(trash_cluster, inodes)
    tfs.pipe_file(f"{base}/g", b"g")
    assert cli(trash_cluster, "rm", f"{base}/g").returncode == 0
    assert trashed_under(tfs, base) == [f"{base}/g"]


def test_skip_trash_keeps_permission_checks_and_retries_are_deduplicated(trash_cluster, tfs, base):
    tfs.mkdir(f"{base}/root-only")
    tfs.client.meta.setattr(f"{base}/root-only", mode=0o755)
    tfs.pipe_file(f"{base}/root-only/f", b"root's")
    alice = EmberFileSystem(
        trash_cluster.meta_address, token=new_token(trash_cluster, 1000), skip_instance_cache=True
    )
    try:
        with pytest.raises(PermissionError):
            alice.rm(f"{base}/root-only/f", skip_trash=True)
        assert tfs.cat_file(f"{base}/root-only/f") == b"root's"
        alice.pipe_file(f"{base}/alice", b"mine")
        alice.rm(f"{base}/alice", skip_trash=True)  # anyone may, for their own removals
        assert alice.trash_list() == []
    finally:
        alice.close()
    # the same request sent twice (a retry) is applied once and answered alike
    tfs.pipe_file(f"{base}/r", b"r")
    meta = tfs.client.meta
    req = meta_pb2.RemoveRequest(ctx=meta.context(), path=f"{base}/r", skip_trash=True)
    assert meta.meta("Remove", req).removed == 1
    assert meta.meta("Remove", req).removed == 1
    assert not tfs.exists(f"{base}/r") and trashed_under(tfs, base) == []
