"""The cluster under test: started, prepared with scratch and check data, described."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from emberfs.cli.localcluster import LocalCluster
from emberfs.cli.processes import Service
from emberfs.common import grpcauth
from emberfs.common.auth import ClusterKeys
from emberfs.proto import common_pb2, meta_pb2, meta_pb2_grpc

from . import timeouts
from .check import write_check_file
from .scratch import (
    CHECK_CACHE,
    CHECK_DIR,
    CHECK_KEY,
    CHECK_PATH,
    CHECK_SIZE,
    KV_BLOCK,
    SCRATCH_CACHE,
    SCRATCH_DIR,
)
from .values import MiB

PAGE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class CouldNotRun(Exception):
    """The run could not be made (exit code 2)."""


@dataclass
class Proc:
    """One server process of the cluster under test."""

    name: str
    service: Service

    @property
    def pid(self) -> int:
        return self.service.proc.pid if self.service.proc is not None else 0

    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.service.proc.poll() if self.service.proc is not None else -1

    def cpu(self) -> float:
        """CPU seconds (user and system) so far, from ``/proc/PID/stat`` (0 when it is gone)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        except (OSError, ValueError, IndexError):
            return 0.0

    def rss(self) -> int:
        """Resident bytes, from ``/proc/PID/statm`` (0 when it is gone)."""
        try:
            return int(Path(f"/proc/{self.pid}/statm").read_text().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            return 0


@dataclass
class Env:
    """The cluster under test and what the fuzzers need to know of it."""

    cluster: LocalCluster
    keys: ClusterKeys
    token: str
    procs: list[Proc]
    routing: common_pb2.RoutingInfo
    check_inode: int
    check_chunks: int
    protected: frozenset[int]
    scratch_inodes: list[int] = field(default_factory=list)
    check_cache: int = 0  # the cache id (directory inode) of :data:`CHECK_CACHE`
    scratch_cache: int = 0

    @property
    def storage_count(self) -> int:
        return len(self.cluster.storage)

    def data_address(self, i: int) -> tuple[str, int]:
        host, port = self.cluster.storage_address(i).rsplit(":", 1)
        return host, int(port)

    def server_of_target(self, target_id: int) -> int | None:
        """The index of the storage server that holds ``target_id``."""
        for t in self.routing.targets:
            if t.target_id == target_id:
                for i in range(self.storage_count):
                    if t.data_address == self.cluster.storage_address(i):
                        return i
        return None

    def targets_of(self, i: int) -> list[int]:
        address = self.cluster.storage_address(i)
        return [t.target_id for t in self.routing.targets if t.data_address == address]

    def rss(self) -> dict[str, int]:
        return {p.name: p.rss() for p in self.procs}

    def cpu(self) -> dict[str, float]:
        """CPU seconds of every server process, and of this one (``fuzzer``)."""
        times = os.times()
        return {"fuzzer": times.user + times.system} | {p.name: p.cpu() for p in self.procs}


def meta_stub(cluster: LocalCluster, token: str) -> tuple[grpc.Channel, Any]:
    """A channel to the metaserver whose calls carry ``token``, and its MetaService stub."""
    channel = grpcauth.channel(cluster.meta_address, token=token)
    return channel, meta_pb2_grpc.MetaServiceStub(channel)


def make_scratch(stub: Any) -> list[int]:
    """``/fuzz-scratch`` with a few files, directories and a symlink; their inodes."""
    inodes = [
        stub.Mkdir(meta_pb2.MkdirRequest(path=SCRATCH_DIR, mode=0o777), timeout=30).attr.inode
    ]
    for name in ("a", "b", "c"):
        req = meta_pb2.CreateRequest(path=f"{SCRATCH_DIR}/{name}", mode=0o644)
        inodes.append(stub.Create(req, timeout=30).attr.inode)
    for name in ("d", "d/e"):
        req = meta_pb2.MkdirRequest(path=f"{SCRATCH_DIR}/{name}", mode=0o755)
        inodes.append(stub.Mkdir(req, timeout=30).attr.inode)
    req = meta_pb2.SymlinkRequest(path=f"{SCRATCH_DIR}/s", target="d")
    inodes.append(stub.Symlink(req, timeout=30).attr.inode)
    return inodes


def make_caches(cluster: LocalCluster, token: str, block: bytes) -> tuple[Any, Any]:
    """:data:`CHECK_CACHE` holding ``block`` under :data:`CHECK_KEY`, and :data:`SCRATCH_CACHE`."""
    from emberfs.client.fs import EmberFileSystem
    from emberfs.kvcache import KVCache

    fs = EmberFileSystem(cluster.meta_address, token=token, skip_instance_cache=True)
    try:
        made = []
        for path in (CHECK_CACHE, SCRATCH_CACHE):
            made.append(
                KVCache.create(path, block_size=KV_BLOCK, capacity=64 * KV_BLOCK, mode=0o777, fs=fs)
            )
        made[0].put(CHECK_KEY, block)
        made[1].batch_put([b"a", b"b", b"c"], [block[:100], block[:1], block])
        return made[0].info, made[1].info
    finally:
        fs.close()


def prepare(cluster: LocalCluster, seed: int) -> tuple[Env, bytes]:
    """The :class:`Env` of a started cluster, with the check file written; and its content."""
    token = cluster.admin_token or ""
    content = random.Random(seed).randbytes(CHECK_SIZE)
    write_check_file(cluster, token, content)
    channel, stub = meta_stub(cluster, token)
    with channel:
        root = stub.Stat(meta_pb2.StatRequest(path="/"), timeout=30).attr.inode
        folder = stub.Stat(meta_pb2.StatRequest(path=CHECK_DIR), timeout=30).attr.inode
        attr = stub.Stat(meta_pb2.StatRequest(path=CHECK_PATH), timeout=30).attr
        scratch = make_scratch(stub)
    check_cache, scratch_cache = make_caches(cluster, token, content[:KV_BLOCK])
    chunk = attr.layout.chunk_size or 4 * MiB
    procs = [Proc("metaserver", cluster.meta)]
    procs += [Proc(f"storage-{i}", s) for i, s in enumerate(cluster.storage)]
    env = Env(
        cluster=cluster,
        keys=cluster.keys,
        token=token,
        procs=procs,
        routing=cluster.routing(),
        check_inode=attr.inode,
        check_chunks=-(-attr.size // chunk),
        # the check cache's directory (its cache id) and slab files are left alone too
        protected=frozenset(
            {root, folder, attr.inode, check_cache.cache_id, *(s.inode for s in check_cache.slabs)}
        ),
        scratch_inodes=scratch + [scratch_cache.cache_id, *(s.inode for s in scratch_cache.slabs)],
        check_cache=check_cache.cache_id,
        scratch_cache=scratch_cache.cache_id,
    )
    return env, content


def start_cluster(data_dir: Path) -> LocalCluster:
    """A started LocalCluster of 3 storage servers (``--frame-timeout`` :data:`timeouts.FRAME_TIMEOUT`)."""
    cluster = LocalCluster(
        data_dir,
        storage_servers=3,
        heartbeat_timeout=10.0,
        extra_storage_args=["--frame-timeout", str(timeouts.FRAME_TIMEOUT)],
    )
    try:
        cluster.start(timeout=120)
    except (RuntimeError, TimeoutError) as exc:
        raise CouldNotRun(f"the cluster did not start: {exc}") from exc
    return cluster
