"""Whole-cluster recovery: GC on every replica, truncation through chains, lastsrv."""

from __future__ import annotations

import os
import time

import grpc
import pytest

from emberfs.client.fs import EmberFileSystem
from emberfs.proto import common_pb2, storage_pb2, storage_pb2_grpc

MiB = 1024 * 1024
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def chunks_of(cluster, inode: int) -> dict[int, list[tuple[int, int, int, int]]]:
    """target id -> [(index, version, length, checksum)] of one inode, from every live server."""
    routing = cluster.routing()
    out: dict[int, list] = {}
    for t in routing.targets:
        with cluster.channel(t.grpc_address) as ch:
            stub = storage_pb2_grpc.StorageServiceStub(ch)
            try:
                r = stub.ListChunks(
                    storage_pb2.ListChunksRequest(target_id=t.target_id, inode=inode), timeout=5
                )
            except grpc.RpcError:
                continue  # that server is down
            out[t.target_id] = [(c.index, c.version, c.length, c.checksum) for c in r.chunks]
    return out


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def all_serving(routing) -> bool:
    return all(t.state == common_pb2.SERVING for t in routing.targets)


def test_removed_files_leave_every_replica_even_one_that_was_away(private_cluster):
    c = private_cluster(targets_per_server=1)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        fs.pipe_file("/keep.bin", os.urandom(5 * MiB))
        fs.pipe_file("/gone.bin", os.urandom(9 * MiB))
        gone = fs.info("/gone.bin")["ino"]
        keep = fs.info("/keep.bin")["ino"]
        assert all(len(v) == 3 for v in chunks_of(c, gone).values())

        c.kill_storage(2)  # away while the file is removed
        c.wait_for(lambda r: any(t.state == common_pb2.OFFLINE for t in r.targets), 30, "offline")
        fs.rm("/gone.bin")
        wait_until(
            lambda: all(v == [] for v in chunks_of(c, gone).values()), 30, "GC on live replicas"
        )
        c.start_storage(2)
        c.wait_for(all_serving, 60, "the returning server to serve")
        wait_until(
            lambda: (
                (got := chunks_of(c, gone)) and len(got) == 3 and all(v == [] for v in got.values())
            ),
            60,
            "the returning replica to drop the removed file's chunks",
        )
        kept = chunks_of(c, keep)
        assert len(kept) == 3 and len({tuple(v) for v in kept.values()}) == 1
        assert kept[next(iter(kept))], "the kept file lost its chunks"
        wait_until(lambda: _gc_empty(c), 30, "the GC queue to drain")
    finally:
        fs.close()


def _gc_empty(c) -> bool:
    import httpx

    return httpx.get(f"{c.admin_url}/api/v1/gc", timeout=5).json() == []


def test_truncate_cuts_chunks_on_every_replica(private_cluster):
    c = private_cluster(targets_per_server=1)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        data = os.urandom(10 * MiB + 777)
        fs.pipe_file("/t.bin", data)
        inode = fs.info("/t.bin")["ino"]
        new_len = 4 * MiB + 1000  # inside chunk 1
        fs.truncate("/t.bin", new_len)
        assert fs.info("/t.bin")["size"] == new_len
        assert fs.cat_file("/t.bin") == data[:new_len]
        per_target = chunks_of(c, inode)
        assert len(per_target) == 3
        assert len({tuple(v) for v in per_target.values()}) == 1, per_target
        indices = [(i, length) for i, _, length, _ in next(iter(per_target.values()))]
        # chunks past the end stay as empty chunks (their versions keep growing) until the
        # file is removed
        assert indices == [(0, 4 * MiB), (1, 1000), (2, 0)]
        # growing again reads zeros past the old cut, never the old bytes
        fs.truncate("/t.bin", 6 * MiB)
        assert fs.cat_file("/t.bin") == data[:new_len] + bytes(6 * MiB - new_len)
    finally:
        fs.close()


def test_chain_waits_for_its_last_serving_target(private_cluster):
    c = private_cluster(targets_per_server=1)
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True, read_timeout=4.0)
    try:
        v1 = os.urandom(3 * MiB)
        fs.pipe_file("/f.bin", v1)
        head, middle, tail = list(c.routing().chains[0].targets)
        server_of = {t.target_id: _server_index(c, t.data_address) for t in c.routing().targets}

        c.kill_storage(server_of[tail])
        c.wait_for(lambda r: _state(r, tail) == common_pb2.OFFLINE, 30, "tail offline")
        v2 = os.urandom(3 * MiB)
        fs.pipe_file("/f.bin", v2)
        c.kill_storage(server_of[middle])
        c.wait_for(lambda r: _state(r, middle) == common_pb2.OFFLINE, 30, "middle offline")
        v3 = os.urandom(3 * MiB)
        fs.pipe_file("/f.bin", v3)  # only the head holds v3 now
        c.kill_storage(server_of[head])
        routing = c.wait_for(lambda r: _state(r, head) == common_pb2.LASTSRV, 30, "head lastsrv")
        assert _state(routing, middle) == _state(routing, tail) == common_pb2.OFFLINE

        # the stale replicas come back first: they must wait, and nothing stale is served
        c.start_storage(server_of[tail])
        c.start_storage(server_of[middle])
        routing = c.wait_for(
            lambda r: _state(r, tail) == _state(r, middle) == common_pb2.WAITING, 30, "waiting"
        )
        assert _state(routing, head) == common_pb2.LASTSRV
        with pytest.raises(OSError):
            fs.cat_file("/f.bin")

        c.start_storage(server_of[head])
        c.wait_for(all_serving, 90, "every target serving again")
        assert fs.cat_file("/f.bin") == v3
        inode = fs.info("/f.bin")["ino"]
        per_target = chunks_of(c, inode)
        assert len(per_target) == 3 and len({tuple(v) for v in per_target.values()}) == 1
    finally:
        fs.close()


def _state(routing, target_id: int) -> int:
    return next(t.state for t in routing.targets if t.target_id == target_id)


def _server_index(c, data_address: str) -> int:
    return next(i for i in range(len(c.storage)) if c.storage_address(i) == data_address)
