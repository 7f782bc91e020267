"""The clusters the chaos checker runs against, and what it asks of them.

A driver starts (or attaches to) a cluster, breaks and heals its processes or
its network as :mod:`benchmarks.chaos_faults` asks, and answers what the checks
need: the routing (target states, chains), the chunks of every target
(``StorageService.ListChunks``) and the server processes that died without
being killed by the checker.

:class:`LocalDriver` runs a :class:`~emberfs.cli.localcluster.LocalCluster`
(real ``emberfs metaserver`` / ``emberfs storageserver`` processes on this
machine). The compose driver lives in :mod:`benchmarks.chaos_compose`.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from pathlib import Path

from emberfs.common import grpcauth
from emberfs.common.auth import ClusterKeys
from emberfs.proto import common_pb2, storage_pb2, storage_pb2_grpc

ChunkKey = tuple[int, int]  # (inode, index)
ChunkState = tuple[int, int, int, int]  # (version, pending version, length, checksum)


def list_chunks(
    grpc_address: str,
    target_id: int,
    timeout: float = 10.0,
    inode: int = 0,
    keys: ClusterKeys | None = None,
) -> dict:
    """Every chunk of one target (of one inode if given): ``(inode, index) -> (version,
    pending, length, checksum)``. ``keys``: the cluster's, to call as a server."""
    out: dict[ChunkKey, ChunkState] = {}
    with grpcauth.channel(grpc_address, keys=keys) as channel:
        stub = storage_pb2_grpc.StorageServiceStub(channel)
        req = storage_pb2.ListChunksRequest(target_id=target_id, limit=1000, inode=inode)
        while True:
            resp = stub.ListChunks(req, timeout=timeout)
            for c in resp.chunks:
                out[(c.inode, c.index)] = (c.version, c.pending_version, c.length, c.checksum)
            if not resp.more or not resp.chunks:
                return out
            last = resp.chunks[-1]
            req = storage_pb2.ListChunksRequest(
                target_id=target_id,
                limit=1000,
                inode=inode,
                has_after=True,
                after_inode=last.inode,
                after_index=last.index,
            )


def replica_differences(
    routing: common_pb2.RoutingInfo, lister=list_chunks, name_of=lambda address: address
) -> list[dict]:
    """The chunks whose replicas disagree (version, length, checksum) or hold a pending version.

    Every target of every chain is listed; a chunk missing on some replicas is
    a difference too. Each item names the chain (its targets head first, with
    the server each is on, ``name_of(data address)``), the chunk and each
    target's state of it.
    """
    targets = {t.target_id: t for t in routing.targets}
    out = []
    for chain in routing.chains:
        members = [
            {"target": tid, "server": name_of(targets[tid].data_address)} for tid in chain.targets
        ]
        listings = {tid: lister(targets[tid].grpc_address, tid) for tid in chain.targets}
        keys = set().union(*(set(v) for v in listings.values())) if listings else set()
        for key in sorted(keys):
            states = {tid: listing.get(key) for tid, listing in listings.items()}
            values = set(states.values())
            pending = any(s is not None and s[1] for s in values)
            if len(values) > 1 or pending:
                out.append(
                    {
                        "chain": chain.chain_id,
                        "chain_targets": members,
                        "inode": key[0],
                        "index": key[1],
                        "replicas": {
                            str(tid): (
                                None
                                if s is None
                                else {
                                    "version": s[0],
                                    "pending": s[1],
                                    "length": s[2],
                                    "checksum": s[3],
                                }
                            )
                            for tid, s in states.items()
                        },
                    }
                )
    return out


def set_layout(admin_url: str, token: str, path: str, chunk_size: int, stripe: int) -> dict:
    """Set the layout of directory ``path`` through the admin API."""
    req = urllib.request.Request(
        f"{admin_url}/api/v1/layouts?path={path}",
        data=json.dumps({"chunk_size": chunk_size, "stripe": stripe}).encode(),
        method="PUT",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


class LocalDriver:
    """A local cluster of real processes that the checker starts and breaks.

    Parameters
    ----------
    data_dir : Path
        Where the cluster keeps its state and logs.
    servers, targets_per_server, replicas : int
    heartbeat_timeout : float
    token : str
        The admin token (to set the chaos directory's layout).
    """

    mode = "local"
    monitor_interval = 0.5  # seconds between looks for processes that died

    def __init__(
        self,
        data_dir: Path,
        servers: int,
        targets_per_server: int,
        replicas: int,
        heartbeat_timeout: float,
        token: str,
    ) -> None:
        from emberfs.cli.localcluster import LocalCluster

        self.servers = servers
        self.token = token
        self.cluster = LocalCluster(
            Path(data_dir),
            storage_servers=servers,
            targets_per_server=targets_per_server,
            replicas=replicas,
            heartbeat_timeout=heartbeat_timeout,
            admin_token=token,
        )
        self._down: set[str] = set()  # services the checker killed and has not restarted
        self._lock = threading.Lock()
        self.deaths: list[dict] = []

    # addresses -------------------------------------------------------------------------------
    @property
    def meta_address(self) -> str:
        return self.cluster.meta_address

    @property
    def admin_url(self) -> str:
        return self.cluster.admin_url

    @property
    def heartbeat_timeout(self) -> float:
        return self.cluster.heartbeat_timeout

    @property
    def keys(self) -> ClusterKeys | None:
        """The cluster's keys (the checker lists chunks as a server would)."""
        return self.cluster.keys

    @property
    def secret_file(self) -> str | None:
        return None if self.cluster.insecure else str(self.cluster.secret_file)

    @property
    def client_token(self) -> str | None:
        """The token the workload's clients present."""
        return self.cluster.admin_token

    def describe(self) -> dict:
        c = self.cluster
        return {
            "mode": self.mode,
            "data_dir": str(c.data_dir),
            "meta": c.meta_address,
            "storage_servers": len(c.storage),
            "targets_per_server": c.targets_per_server,
            "replicas": c.replicas,
            "heartbeat_timeout": c.heartbeat_timeout,
        }

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self.cluster.start(timeout=120)

    def stop(self) -> None:
        for s in self.cluster.storage:
            s.signal(signal.SIGCONT)
        self.cluster.stop()

    # faults ------------------------------------------------------------------------------------
    def _service(self, name: str):
        c = self.cluster
        return c.meta if name == "metaserver" else c.storage[int(name.split("-")[1])]

    def kill_storage(self, i: int) -> None:
        with self._lock:
            self._down.add(f"storage-{i}")
        self.cluster.kill_storage(i)

    def start_storage(self, i: int) -> None:
        self.cluster.start_storage(i, timeout=90)
        with self._lock:
            self._down.discard(f"storage-{i}")

    def pause_storage(self, i: int) -> None:
        self.cluster.storage[i].signal(signal.SIGSTOP)

    def resume_storage(self, i: int) -> None:
        self.cluster.storage[i].signal(signal.SIGCONT)

    def kill_meta(self) -> None:
        with self._lock:
            self._down.add("metaserver")
        self.cluster.kill_meta()

    def start_meta(self) -> None:
        self.cluster.start_meta(timeout=90)
        with self._lock:
            self._down.discard("metaserver")

    def partition(self, i: int, how: str) -> None:
        raise NotImplementedError("a local cluster has no network to partition")

    def heal_partition(self, i: int) -> None:
        raise NotImplementedError("a local cluster has no network to partition")

    # state ------------------------------------------------------------------------------------
    def routing(self) -> common_pb2.RoutingInfo:
        return self.cluster.routing()

    def server_name(self, data_address: str) -> str:
        """The name of the storage server that serves ``data_address``."""
        for i in range(self.servers):
            if self.cluster.storage_address(i) == data_address:
                return f"storage-{i}"
        return data_address

    def wait_serving(self, timeout: float) -> bool:
        try:
            self.cluster.wait_serving(timeout)
            return True
        except TimeoutError:
            return False

    def unexpected_deaths(self) -> list[dict]:
        """Server processes that exited without the checker killing them (each reported once)."""
        found = []
        names = ["metaserver"] + [f"storage-{i}" for i in range(self.servers)]
        for name in names:
            with self._lock:
                if name in self._down:
                    continue
                svc = self._service(name)
                if svc.proc is None or svc.proc.poll() is None:
                    continue
                self._down.add(name)
            found.append(
                {
                    "process": name,
                    "returncode": svc.proc.returncode,
                    "t": time.monotonic(),
                    "log_tail": svc.tail(30),
                }
            )
        self.deaths += found
        return found

    def revive(self, name: str) -> None:
        """Start again a process that died on its own (so the run can go on)."""
        if name == "metaserver":
            self.start_meta()
        else:
            self.start_storage(int(name.split("-")[1]))
