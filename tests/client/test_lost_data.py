"""Reads never pass off missing data as zeros: holes read as zeros, lost or removed data is an error.

Real processes: the shared local cluster. A file's chunks are taken away on
every replica the ways they can go: the file removed while a reader has it
open (the chunks are garbage-collected), the file replaced by a rename while
open, and chunk records gone on every replica (as recovery after a power loss
drops a record whose file did not reach the disk). A chunk gone from one
replica only is read from another, and the replica is resynced (read repair).
"""

from __future__ import annotations

import errno
import os
import time

import pytest

from emberfs.client.fs import EmberFileSystem
from emberfs.proto import common_pb2, storage_pb2, storage_pb2_grpc

CHUNK = 1024 * 1024  # the cluster's default layout has larger chunks; the data spans several
pytestmark = pytest.mark.timeout(120)


def listed(cluster, inode: int) -> dict[int, list]:
    """target id -> the ``ChunkMeta`` of every chunk of ``inode`` it lists."""
    out = {}
    for t in cluster.routing().targets:
        with cluster.channel(t.grpc_address) as channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            resp = stub.ListChunks(
                storage_pb2.ListChunksRequest(target_id=t.target_id, inode=inode), timeout=5
            )
        out[t.target_id] = list(resp.chunks)
    return out


def replicas_of(cluster, inode: int) -> dict[int, list[int]]:
    """target id -> the chunk indexes of ``inode`` it holds."""
    return {tid: [c.index for c in chunks] for tid, chunks in listed(cluster, inode).items()}


def remove_everywhere(cluster, inode: int, index: int) -> None:
    """Chunk ``index`` of ``inode`` gone from every replica."""
    for t in cluster.routing().targets:
        remove_on(cluster, t, inode, index)


def remove_on(cluster, t, inode: int, index: int) -> None:
    """Chunk ``index`` of ``inode`` gone from target ``t`` (a ``TargetInfo``) alone."""
    with cluster.channel(t.grpc_address) as channel:
        storage_pb2_grpc.StorageServiceStub(channel).RemoveChunks(
            storage_pb2.RemoveChunksRequest(target_id=t.target_id, inode=inode, indices=[index]),
            timeout=5,
        )


def wait_collected(cluster, inode: int) -> None:
    deadline = time.monotonic() + 60
    while any(replicas_of(cluster, inode).values()):
        assert time.monotonic() < deadline, "the removed file's chunks were not collected"
        time.sleep(0.2)


def test_a_file_removed_while_open_is_stale_not_zeros(cluster, fs, base):
    data = os.urandom(3 * CHUNK)
    fs.pipe_file(f"{base}/gone.bin", data)
    inode = fs.info(f"{base}/gone.bin")["ino"]
    with fs.open(f"{base}/gone.bin", "rb", block_size=0) as f:  # every read goes to storage
        assert f.read(CHUNK) == data[:CHUNK]
        fs.rm(f"{base}/gone.bin")
        wait_collected(cluster, inode)
        with pytest.raises(OSError) as err:
            f.read()
        assert err.value.errno == errno.ESTALE


def test_a_file_replaced_by_a_rename_while_open_is_stale_not_zeros(cluster, fs, base):
    old, new = os.urandom(2 * CHUNK), os.urandom(2 * CHUNK)
    fs.pipe_file(f"{base}/a.bin", old)
    fs.pipe_file(f"{base}/b.bin", new)
    inode = fs.info(f"{base}/a.bin")["ino"]
    with fs.open(f"{base}/a.bin", "rb", block_size=0) as f:
        fs.mv(f"{base}/b.bin", f"{base}/a.bin")
        wait_collected(cluster, inode)
        with pytest.raises(OSError) as err:
            f.read()
        assert err.value.errno == errno.ESTALE
    assert fs.cat_file(f"{base}/a.bin") == new


def test_data_gone_from_every_replica_is_an_error_naming_the_file(cluster, fs, base):
    data = os.urandom(3 * CHUNK)
    path = f"{base}/lost.bin"
    fs.pipe_file(path, data)
    info = fs.info(path)
    lost_index = (2 * CHUNK) // info["chunk_size"]
    remove_everywhere(cluster, info["ino"], lost_index)
    fresh = type(fs)(fs.meta, skip_instance_cache=True)
    try:
        with pytest.raises(OSError) as err:
            fresh.cat_file(path)
        assert err.value.errno == errno.EIO
        assert path in str(err.value) and f"chunk {lost_index}" in str(err.value)
        with pytest.raises(OSError):
            with fresh.open(path, "rb") as f:
                f.read()
    finally:
        fresh.close()


def test_a_hole_made_by_growing_a_file_reads_as_zeros(fs, base):
    path = f"{base}/grown.bin"
    fs.pipe_file(path, b"x" * 1000)
    fs.truncate(path, 3 * CHUNK + 17)
    assert fs.cat_file(path) == b"x" * 1000 + bytes(3 * CHUNK + 17 - 1000)
    with fs.open(path, "ab") as f:  # data after the hole is data again
        f.write(b"y" * 100)
    got = fs.cat_file(path)
    assert got[:1000] == b"x" * 1000 and got[-100:] == b"y" * 100
    assert got[1000:-100] == bytes(len(got) - 1100)
    assert fs.info(path)["size"] == 3 * CHUNK + 117


def chunk_metas(cluster, inode: int, index: int) -> dict[int, tuple]:
    """target id -> (version, length, checksum, damaged) of the chunk, for targets holding it."""
    return {
        tid: (c.version, c.length, c.checksum, c.damaged)
        for tid, chunks in listed(cluster, inode).items()
        for c in chunks
        if c.index == index
    }


def test_a_chunk_gone_from_one_replica_is_read_from_another_and_repaired(private_cluster):
    cluster = private_cluster()  # a replica leaves service for a while
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        read_repair(cluster, fs)
    finally:
        fs.close()


def read_repair(cluster, fs) -> None:
    data = os.urandom(3 * CHUNK)
    path = "/one-lost.bin"
    fs.pipe_file(path, data)
    info = fs.info(path)
    inode, index = info["ino"], (2 * CHUNK) // info["chunk_size"]
    before = chunk_metas(cluster, inode, index)
    assert len(before) == 3 and len(set(before.values())) == 1
    lost_on = sorted(before)[-1]
    target = next(t for t in cluster.routing().targets if t.target_id == lost_on)
    remove_on(cluster, target, inode, index)
    assert lost_on not in chunk_metas(cluster, inode, index)

    deadline = time.monotonic() + 60
    while True:
        # reads spread over the serving replicas: every one returns the exact bytes
        with fs.open(path, "rb", block_size=0) as f:
            f.seek(2 * CHUNK)
            assert f.read() == data[2 * CHUNK :]
        after = chunk_metas(cluster, inode, index)
        states = {t.target_id: t.state for t in cluster.routing().targets}
        if after == before and states[lost_on] == common_pb2.SERVING:
            break  # resynced from its chain, and serving again
        assert time.monotonic() < deadline, f"not repaired: {after} vs {before}, {states}"
        time.sleep(0.2)
    assert fs.cat_file(path) == data
