"""The check file and KV block written before the run, and whether they survived it."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import grpc

from emberfs.cli.localcluster import LocalCluster
from emberfs.common import grpcauth
from emberfs.proto import storage_pb2, storage_pb2_grpc

from . import timeouts
from .scratch import CHECK_CACHE, CHECK_DIR, CHECK_KEY, CHECK_PATH, KV_BLOCK

if TYPE_CHECKING:
    from .cluster import Env


def write_check_file(cluster: LocalCluster, token: str, data: bytes) -> None:
    """Write :data:`CHECK_PATH` with ``data`` through the client."""
    from emberfs.client.fs import EmberFileSystem

    fs = EmberFileSystem(cluster.meta_address, token=token, skip_instance_cache=True)
    try:
        fs.mkdir(CHECK_DIR)
        with fs.open(CHECK_PATH, "wb") as f:
            f.write(data)
    finally:
        fs.close()


def read_check_file(cluster: LocalCluster, token: str) -> bytes:
    """Read :data:`CHECK_PATH` back through a fresh client."""
    from emberfs.client.fs import EmberFileSystem

    fs = EmberFileSystem(cluster.meta_address, token=token, skip_instance_cache=True)
    try:
        return fs.cat_file(CHECK_PATH)
    finally:
        fs.close()


def replica_snapshot(env: Env) -> list[tuple]:
    """Every replica of the check file's chunks: (target, index, version, length, checksum, ...)."""
    rows = []
    for i in range(env.storage_count):
        channel = grpcauth.channel(env.cluster.storage_grpc_address(i), keys=env.keys)
        with channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            for target in env.targets_of(i):
                req = storage_pb2.ListChunksRequest(target_id=target, inode=env.check_inode)
                for c in stub.ListChunks(req, timeout=timeouts.CALL_TIMEOUT).chunks:
                    rows.append(
                        (
                            target,
                            c.index,
                            c.version,
                            c.pending_version,
                            c.length,
                            c.checksum,
                            c.damaged,
                        )
                    )
    return sorted(rows)


def chunk_counts(env: Env) -> dict[str, int]:
    """Chunks (committed or pending) on each storage server, from TargetStats."""
    out = {}
    for i in range(env.storage_count):
        channel = grpcauth.channel(env.cluster.storage_grpc_address(i), keys=env.keys)
        with channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            stats = stub.TargetStats(
                storage_pb2.TargetStatsRequest(), timeout=timeouts.CALL_TIMEOUT
            )
        out[f"storage-{i}"] = sum(t.chunks for t in stats.targets)
    return out


def read_check_block(cluster: LocalCluster, token: str) -> bytes | None:
    """The block of :data:`CHECK_KEY` in :data:`CHECK_CACHE`, through a fresh client."""
    from emberfs.client.fs import EmberFileSystem
    from emberfs.kvcache import KVCache

    fs = EmberFileSystem(cluster.meta_address, token=token, skip_instance_cache=True)
    try:
        got = KVCache(CHECK_CACHE, fs=fs).get(CHECK_KEY)
        return None if got is None else bytes(got)
    finally:
        fs.close()


def check_state(env: Env, content: bytes, replicas: list[tuple]) -> dict:
    """Whether the check file reads back identical, its replicas unchanged, every target serving."""
    out: dict[str, Any] = {"path": CHECK_PATH, "size": len(content), "inode": env.check_inode}
    try:
        routing = env.cluster.wait_serving(timeout=60)
        out["targets_serving"] = True
        out["routing_version"] = [env.routing.version, routing.version]
    except TimeoutError as exc:
        out["targets_serving"] = False
        out["routing_error"] = str(exc)[:2000]
    try:
        got = read_check_file(env.cluster, env.token)
        out["intact"] = got == content
        if not out["intact"]:
            out["read_sha256"] = hashlib.sha256(got).hexdigest()
            out["read_size"] = len(got)
    except Exception as exc:  # noqa: BLE001 - an unreadable file is damage
        out["intact"] = False
        out["read_error"] = f"{type(exc).__name__}: {exc}"
    try:
        block = read_check_block(env.cluster, env.token)
        out["kv_intact"] = block == content[:KV_BLOCK]
    except Exception as exc:  # noqa: BLE001 - an unreadable block is damage
        out["kv_intact"] = False
        out["kv_error"] = f"{type(exc).__name__}: {exc}"
    try:
        now = replica_snapshot(env)
        out["replicas_unchanged"] = now == replicas
        if now != replicas:
            out["replicas_before"] = replicas
            out["replicas_after"] = now
    except grpc.RpcError as exc:
        out["replicas_unchanged"] = False
        out["replicas_error"] = str(exc)[:2000]
    out["sha256"] = hashlib.sha256(content).hexdigest()
    return out
