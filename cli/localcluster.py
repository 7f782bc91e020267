"""A whole EmberFS cluster as local child processes.

:class:`LocalCluster` starts one ``emberfs metaserver`` and N ``emberfs
storageserver`` processes on 127.0.0.1, each as its own command so ``ps``
shows every role, waits until every target serves, and can stop, kill
(SIGKILL) and restart any of them. With ``kv="etcd"`` it also starts an etcd
cluster (:class:`~emberfs.cli.localetcd.LocalEtcd`) and runs ``metaservers`` metaservers on it.
``emberfs up`` and the test suite's cluster fixtures both use it.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from emberfs.cli.localetcd import LocalEtcd
from emberfs.cli.ports import free_port
from emberfs.cli.processes import Service, emberfs_command
from emberfs.common import grpcauth
from emberfs.common.auth import ClusterKeys, write_secret_file
from emberfs.proto import cluster_pb2, cluster_pb2_grpc, common_pb2


@dataclass
class LocalCluster:
    """A metaserver and ``storage_servers`` storage servers under ``data_dir``.

    Parameters
    ----------
    data_dir : Path
        Root of all state: ``meta/`` and ``storage-<i>/``; logs under ``logs/``.
    storage_servers : int, default 3
    replicas : int, default 3
        Replication factor (chain length).
    targets_per_server : int, default 2
    meta_port, admin_port : int, default 0
        0 picks free ports.
    storage_ports : list[int] | None
        Data ports of the storage servers; each also uses the next port (gRPC)
        and the one after (Prometheus metrics). None picks free ports.
    heartbeat_timeout : float, default 5.0
    trash_days : float, default 0.0
        The metaservers' ``--trash-days``: a cluster made here keeps no trash
        unless asked (``emberfs up`` asks for its own default of 1 day).
    extra_meta_args, extra_storage_args : list[str]
        Passed through to the commands.
    kv : str, default "rocksdb"
        The metadata store: ``rocksdb`` (in ``data_dir/meta``), ``etcd`` (a
        local etcd of ``etcd_members`` members under ``data_dir/etcd``, started
        and stopped with the cluster), or an ``etcd://`` URL of a running one.
    metaservers : int, default 1
        Metaservers on the store (more than one needs etcd). The first listens
        on ``meta_port`` and ``admin_port``, metaserver i on those ports + 10 i
        when they were given (else on free ports); clients and storage servers
        are given all of them.
    etcd_members, etcd_port : int, default 1, 0
        With ``kv="etcd"``: the local etcd's members, and the client port of
        the first (member i uses ``etcd_port`` + 2 i, and the port after it for
        its peers; 0 picks free ports).
    insecure : bool, default False
        Run without authentication. Otherwise every server gets the key file
        ``data_dir/cluster.key`` (made on first start) and the metaserver
        the admin token (:attr:`admin_token`).
    admin_token : str or None
        The admin token (root); None takes ``EMBERFS_ADMIN_TOKEN``, else the
        one kept in ``data_dir/admin.token`` (made on first start).
    tls : TLSFiles or None
        Certificate, key and CA that every server serves gRPC and the admin
        API with, and checks the others against.

    Attributes
    ----------
    keys : ClusterKeys or None
        The cluster's keys (for calls and frames that act as a server).
    """

    data_dir: Path
    storage_servers: int = 3
    replicas: int = 3
    targets_per_server: int = 2
    meta_port: int = 0
    admin_port: int = 0
    storage_ports: list[int] | None = None
    heartbeat_timeout: float = 5.0
    trash_days: float = 0.0
    host: str = "127.0.0.1"
    extra_meta_args: list[str] = field(default_factory=list)
    extra_storage_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    insecure: bool = False
    admin_token: str | None = None
    tls: grpcauth.TLSFiles | None = None
    kv: str = "rocksdb"
    metaservers: int = 1
    etcd_members: int = 1
    etcd_port: int = 0

    def __post_init__(self) -> None:
        if self.metaservers < 1:
            raise ValueError("a cluster needs a metaserver")
        if self.metaservers > 1 and self.kv == "rocksdb":
            raise ValueError("several metaservers need a shared store (kv='etcd')")
        self.data_dir = Path(self.data_dir)
        self.keys: ClusterKeys | None = None
        security: list[str] = ["--insecure"]
        if not self.insecure:
            self.keys = ClusterKeys.from_file(self._secret_file())
            security = ["--secret-file", str(self.secret_file)]
            self.admin_token = self.admin_token or self._admin_token()
        if self.tls is not None:
            security += ["--tls-cert", self.tls.cert, "--tls-key", self.tls.key]
            security += ["--tls-ca", self.tls.ca]
        # Nothing binds the ports until start(), so each pick avoids the ones before it.
        taken: set[int] = set()
        fixed = bool(self.meta_port and self.admin_port)
        self.meta_port = self.meta_port or free_port(self.host, avoid=taken)
        taken.add(self.meta_port)
        self.admin_port = self.admin_port or free_port(self.host, avoid=taken)
        taken.add(self.admin_port)
        self.meta_ports = [self.meta_port]
        self.admin_ports = [self.admin_port]
        for i in range(1, self.metaservers):
            for ports, first in (
                (self.meta_ports, self.meta_port),
                (self.admin_ports, self.admin_port),
            ):
                ports.append(first + 10 * i if fixed else free_port(self.host, avoid=taken))
                taken.add(ports[-1])
        self.etcd: LocalEtcd | None = None
        if self.kv == "etcd":
            self.etcd = LocalEtcd(
                self.data_dir / "etcd",
                members=self.etcd_members,
                host=self.host,
                client_ports=(
                    [self.etcd_port + 2 * i for i in range(self.etcd_members)]
                    if self.etcd_port
                    else None
                ),
            )
            store = ["--kv", self.etcd.url("emberfs")]
        elif self.kv.startswith("etcd://"):
            store = ["--kv", self.kv]
        elif self.kv == "rocksdb":
            store = ["--data-dir", str(self.data_dir / "meta")]
        else:
            raise ValueError(f"unknown metadata store {self.kv!r}")
        if self.storage_ports is None:
            self.storage_ports = []
            for _ in range(self.storage_servers):
                port = free_port(self.host, count=3, avoid=taken)
                taken.update(range(port, port + 3))
                self.storage_ports.append(port)
        cmd = emberfs_command()
        logs = self.data_dir / "logs"
        self.metas = [
            Service(
                "metaserver" if i == 0 else f"metaserver-{i}",
                cmd
                + ["metaserver"]
                + store
                + [
                    "--listen",
                    f"{self.host}:{meta_port}",
                    "--admin-listen",
                    f"{self.host}:{admin_port}",
                    "--replicas",
                    str(self.replicas),
                    "--heartbeat-timeout",
                    str(self.heartbeat_timeout),
                    "--trash-days",
                    str(self.trash_days),
                ]
                + security
                + self.extra_meta_args,
                logs / ("metaserver.log" if i == 0 else f"metaserver-{i}.log"),
                "READY metaserver",
            )
            for i, (meta_port, admin_port) in enumerate(
                zip(self.meta_ports, self.admin_ports, strict=True)
            )
        ]
        self.meta = self.metas[0]
        self.storage = [
            Service(
                f"storage-{i}",
                cmd
                + [
                    "storageserver",
                    "--data-dir",
                    str(self.data_dir / f"storage-{i}"),
                    "--meta",
                    self.meta_addresses,
                    "--listen",
                    f"{self.host}:{port}",
                    "--grpc-listen",
                    f"{self.host}:{port + 1}",
                    "--metrics-listen",
                    f"{self.host}:{port + 2}",
                    "--targets",
                    str(self.targets_per_server),
                ]
                + security
                + self.extra_storage_args,
                logs / f"storage-{i}.log",
                "READY storageserver",
            )
            for i, port in enumerate(self.storage_ports)
        ]

    # security ----------------------------------------------------------------
    @property
    def secret_file(self) -> Path:
        return self.data_dir / "cluster.key"

    def _secret_file(self) -> Path:
        if not self.secret_file.exists():
            write_secret_file(self.secret_file)
        return self.secret_file

    def _admin_token(self) -> str:
        given = self.env.get("EMBERFS_ADMIN_TOKEN") or os.environ.get("EMBERFS_ADMIN_TOKEN")
        if given:
            return given
        path = self.data_dir / "admin.token"
        if not path.exists():
            write_secret_file(path, secrets.token_urlsafe(32))
        return path.read_text().strip()

    def channel(self, address: str | None = None) -> grpc.Channel:
        """A gRPC channel to the metaserver (or ``address``) whose calls act as a server."""
        return grpcauth.channel(address or self.meta_address, keys=self.keys, tls=self.tls)

    # addresses -------------------------------------------------------------
    @property
    def meta_address(self) -> str:
        return f"{self.host}:{self.meta_port}"

    @property
    def meta_addresses(self) -> str:
        """Every metaserver's address, comma-separated (what clients and storage servers get)."""
        return ",".join(f"{self.host}:{port}" for port in self.meta_ports)

    @property
    def admin_address(self) -> str:
        return f"{self.host}:{self.admin_port}"

    def admin_url_of(self, i: int) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.admin_ports[i]}"

    def leader(self, timeout: float = 30.0) -> int:
        """The index of the metaserver that leads (asked of each one's admin API)."""
        import json
        import urllib.request

        deadline = time.monotonic() + timeout
        while True:
            for i, service in enumerate(self.metas):
                if not service.running:
                    continue
                try:
                    with urllib.request.urlopen(
                        self.admin_url_of(i) + "/api/v1/leader", timeout=2
                    ) as answer:
                        if json.load(answer)["leading"]:
                            return i
                except OSError:
                    continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"no metaserver leads after {timeout:.0f} s")
            time.sleep(0.1)

    @property
    def admin_url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.admin_address}"

    def storage_address(self, i: int) -> str:
        return f"{self.host}:{self.storage_ports[i]}"

    def storage_grpc_address(self, i: int) -> str:
        return f"{self.host}:{self.storage_ports[i] + 1}"

    def storage_metrics_url(self, i: int) -> str:
        return f"http://{self.host}:{self.storage_ports[i] + 2}/metrics"

    # lifecycle ---------------------------------------------------------------
    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.admin_token:
            env["EMBERFS_ADMIN_TOKEN"] = self.admin_token
        env.update(self.env)
        return env

    def start(self, timeout: float = 60.0, wait_serving: bool = True) -> LocalCluster:
        """Start every process and wait until they are ready (and every target serves)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.start_meta(timeout)
            for i in range(len(self.storage)):
                self.storage[i].start(self.child_env())
            for s in self.storage:
                s.wait_ready(timeout)
            if wait_serving:
                self.wait_serving(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def start_meta(self, timeout: float = 60.0, i: int | None = None) -> None:
        """Start the metaservers (or metaserver ``i`` alone), and etcd first if it is ours."""
        if self.etcd is not None and i is None and not any(s.running for s in self.etcd.services):
            self.etcd.start(timeout)
        for service in self.metas if i is None else [self.metas[i]]:
            service.start(self.child_env())
        for service in self.metas if i is None else [self.metas[i]]:
            service.wait_ready(timeout)

    def start_storage(self, i: int, timeout: float = 60.0) -> None:
        self.storage[i].start(self.child_env())
        self.storage[i].wait_ready(timeout)

    def stop(self) -> None:
        """Stop storage servers first, then the metaservers and etcd (SIGTERM, then SIGKILL)."""
        for s in self.storage:
            s.stop()
        for s in self.metas:
            s.stop()
        if self.etcd is not None:
            self.etcd.stop()

    def kill_storage(self, i: int) -> None:
        self.storage[i].kill()

    def kill_meta(self, i: int = 0) -> None:
        self.metas[i].kill()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # cluster state -------------------------------------------------------------
    def routing(self, timeout: float = 5.0) -> common_pb2.RoutingInfo:
        """The routing info, from the first metaserver that runs and answers."""
        running = [i for i, s in enumerate(self.metas) if s.running] or [0]
        for n, i in enumerate(running):
            with self.channel(f"{self.host}:{self.meta_ports[i]}") as channel:
                stub = cluster_pb2_grpc.ClusterServiceStub(channel)
                try:
                    return stub.GetRouting(cluster_pb2.GetRoutingRequest(), timeout=timeout).routing
                except grpc.RpcError:
                    if n == len(running) - 1:
                        raise
        raise AssertionError("unreachable")

    def expected_chains(self) -> int:
        return (len(self.storage) * self.targets_per_server) // self.replicas

    def wait_serving(self, timeout: float = 60.0) -> common_pb2.RoutingInfo:
        """Wait until the expected chains exist and every target is SERVING."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.routing()
            except grpc.RpcError:
                time.sleep(0.2)
                continue
            states = [t.state for t in last.targets]
            if (
                len(last.chains) >= self.expected_chains()
                and len(states) == len(self.storage) * self.targets_per_server
                and all(s == common_pb2.SERVING for s in states)
            ):
                return last
            time.sleep(0.1)
        raise TimeoutError(f"targets not all serving after {timeout:.0f} s: {last}")

    def wait_for(self, predicate, timeout: float = 30.0, what: str = "condition"):
        """Poll routing until ``predicate(routing)`` is true; returns that routing."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.routing()
                if predicate(last):
                    return last
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{what} not reached after {timeout:.0f} s: {last}")
