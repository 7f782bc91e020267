"""The chaos checker on the docker compose cluster of ``deploy/``.

:class:`ComposeDriver` brings a cluster up with ``deploy/cluster.sh up`` under a
project name, host ports and image tag of its own (or attaches to a running
project), and breaks it the way containers break:

- ``storage_kill`` / ``meta_kill``: ``docker kill`` (SIGKILL) and ``docker start``;
- ``storage_pause_*``: ``docker pause`` / ``docker unpause`` (the cgroup freezer:
  every process of the container stops, its sockets stay open);
- ``partition_all``: ``docker network disconnect`` of a storage container from
  the cluster network (from everything: metaserver, chain peers and the clients
  on this host), then ``docker network connect`` with its address again;
- ``partition_meta`` and ``partition_peers``: the host's ``iptables`` run in the
  container's network namespace (``nsenter -n``) drops what the container sends
  to and receives from the metaserver's address, or its peers' addresses. The
  clients on this host still reach it. The image needs nothing for this; the host
  needs ``nsenter`` and ``iptables`` and root.

The compose file puts every container on one bridge network and each storage
server advertises one address (used by clients, peers and the metaserver alike),
so separate networks cannot cut the metaserver off alone; the packet filter in
the container's namespace can.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import grpc

from emberfs.common import grpcauth
from emberfs.common.auth import ClusterKeys
from emberfs.proto import cluster_pb2, cluster_pb2_grpc, common_pb2

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SH = ROOT / "deploy" / "cluster.sh"
STORAGE_SERVICES = ("storage1", "storage2", "storage3")
TARGETS_PER_NODE = 2
HEARTBEAT_TIMEOUT = 3.0  # deploy/docker-compose.yml
IMAGE = "emberfs:chaos"  # a tag of its own, so other clusters' images stay as they are


def _run(argv: list[str], timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {r.stderr.strip()[-2000:]}")
    return r


class ComposeDriver:
    """The compose cluster, started (or attached to) and broken through docker.

    Parameters
    ----------
    data_dir : Path
        Where the checker keeps its files (the cluster keeps its data in volumes).
    token : str
        The admin token the cluster is started with (an attached cluster's own
        is read from ``cluster.sh env``); the workload's clients present it.
    project : str or None
        Attach to this running compose project instead of starting one.
    """

    mode = "compose"
    monitor_interval = 2.0  # seconds between looks for processes that died
    servers = len(STORAGE_SERVICES)
    heartbeat_timeout = HEARTBEAT_TIMEOUT

    def __init__(self, data_dir: Path, token: str, project: str | None = None) -> None:
        from emberfs.cli.ports import free_port

        self.data_dir = Path(data_dir)
        self.token: str | None = token
        self.attached = project is not None
        self.project = project or f"emberfschaos{uuid.uuid4().hex[:8]}"
        # the checker's cluster leaves this user's client config alone
        self.env = dict(
            os.environ, EMBERFS_COMPOSE_PROJECT=self.project, EMBERFS_CLIENT_CONFIG="none"
        )
        self.env.pop("EMBERFS_INSECURE", None)
        if not self.attached:
            self.env["EMBERFS_ADMIN_TOKEN"] = token
        if not self.attached:
            meta_port = free_port()
            self.env.update(
                EMBERFS_META_PORT=str(meta_port),
                EMBERFS_ADMIN_PORT=str(free_port(avoid={meta_port})),
                EMBERFS_IMAGE=os.environ.get("EMBERFS_IMAGE", IMAGE),
                EMBERFS_UP_TIMEOUT="300",
                EMBERFS_LOG_LEVEL=os.environ.get("EMBERFS_LOG_LEVEL", "INFO"),
            )
            self.env.pop("EMBERFS_NET_PREFIX", None)
        self.settings: dict[str, str] = {}
        self.containers: dict[str, str] = {}
        self._down: set[str] = set()
        self._cut: dict[int, list[list[str]]] = {}  # server -> iptables rules to delete
        self._lock = threading.Lock()
        self.deaths: list[dict] = []

    # lifecycle -------------------------------------------------------------------------------
    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return _run([str(CLUSTER_SH), *args], timeout=timeout, env=self.env)

    def start(self) -> None:
        for tool in ("docker",):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not installed")
        if not self.attached:
            self.script("up", timeout=1500)
        self.settings = dict(
            line.split("=", 1) for line in self.script("env").stdout.splitlines() if "=" in line
        )
        self.token = self.settings.get("EMBERFS_ADMIN_TOKEN") or self.token
        for svc in ("metaserver", *STORAGE_SERVICES):
            cid = self.script("compose", "ps", "-q", svc, timeout=60).stdout.strip()
            if not cid:
                raise RuntimeError(f"no container for {svc}")
            self.containers[svc] = cid
        if not self.wait_serving(180):
            raise RuntimeError("the compose cluster's targets are not all serving")

    def stop(self) -> None:
        for svc in STORAGE_SERVICES:  # a frozen container does not stop
            subprocess.run(
                ["docker", "unpause", self.containers.get(svc, svc)],
                capture_output=True,
                timeout=60,
            )
        for i in list(self._cut):
            try:
                self.heal_partition(i)
            except Exception:
                pass
        self.save_logs()
        if not self.attached:
            try:
                self.script("down", timeout=300)
            except Exception as exc:
                print(f"cluster.sh down failed: {exc}")

    def save_logs(self) -> None:
        """Keep every container's log in ``data_dir/logs`` (the containers go with the project)."""
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for svc, cid in self.containers.items():
            with open(logs / f"{svc}.log", "w") as out:
                subprocess.run(
                    ["docker", "logs", cid], stdout=out, stderr=subprocess.STDOUT, timeout=120
                )

    # addresses ---------------------------------------------------------------------------------
    @property
    def meta_address(self) -> str:
        return self.settings["EMBERFS_META"]

    @property
    def admin_url(self) -> str:
        return self.settings["EMBERFS_ADMIN_URL"]

    @property
    def net_prefix(self) -> str:
        return self.settings["EMBERFS_NET_PREFIX"]

    @property
    def network(self) -> str:
        return f"{self.project}_emberfs"

    def ip_of(self, svc: str) -> str:
        last = 10 if svc == "metaserver" else 10 + int(svc.removeprefix("storage"))
        return f"{self.net_prefix}.{last}"

    def describe(self) -> dict:
        return {
            "mode": self.mode,
            "project": self.project,
            "meta": self.settings.get("EMBERFS_META"),
            "storage_servers": self.servers,
            "targets_per_server": TARGETS_PER_NODE,
            "replicas": 3,
            "heartbeat_timeout": self.heartbeat_timeout,
        }

    def server_name(self, data_address: str) -> str:
        host = data_address.rsplit(":", 1)[0]
        for svc in STORAGE_SERVICES:
            if self.ip_of(svc) == host:
                return svc
        return data_address

    # faults ------------------------------------------------------------------------------------
    def docker(self, *args: str, timeout: float = 120) -> str:
        return _run(["docker", *args], timeout=timeout).stdout

    def _kill(self, svc: str) -> None:
        with self._lock:
            self._down.add(svc)
        self.docker("kill", self.containers[svc])

    def _start(self, svc: str) -> None:
        self.docker("start", self.containers[svc])
        with self._lock:
            self._down.discard(svc)

    def kill_storage(self, i: int) -> None:
        self._kill(STORAGE_SERVICES[i])

    def start_storage(self, i: int) -> None:
        self._start(STORAGE_SERVICES[i])

    def pause_storage(self, i: int) -> None:
        self.docker("pause", self.containers[STORAGE_SERVICES[i]])

    def resume_storage(self, i: int) -> None:
        self.docker("unpause", self.containers[STORAGE_SERVICES[i]])

    def kill_meta(self) -> None:
        self._kill("metaserver")

    def start_meta(self) -> None:
        self._start("metaserver")

    def _pid(self, svc: str) -> str:
        return self.docker("inspect", "-f", "{{.State.Pid}}", self.containers[svc]).strip()

    def _iptables(self, svc: str, *rule: str) -> None:
        _run(["nsenter", "-t", self._pid(svc), "-n", "iptables", "-w", "5", *rule], timeout=30)

    def partition(self, i: int, how: str) -> None:
        """Cut storage server ``i`` off: from ``all``, from the ``meta``server, or its ``peers``."""
        svc = STORAGE_SERVICES[i]
        if how == "all":
            self.docker("network", "disconnect", self.network, self.containers[svc])
            self._cut[i] = []
            return
        others = ["metaserver"] if how == "meta" else [s for s in STORAGE_SERVICES if s != svc]
        rules = []
        for other in others:
            ip = self.ip_of(other)
            rules += [["INPUT", "-s", ip, "-j", "DROP"], ["OUTPUT", "-d", ip, "-j", "DROP"]]
        if shutil.which("nsenter") is None or shutil.which("iptables") is None:
            raise RuntimeError("partition_meta and partition_peers need nsenter and iptables")
        self._cut[i] = rules
        for rule in rules:
            self._iptables(svc, "-I", *rule)

    def heal_partition(self, i: int) -> None:
        svc = STORAGE_SERVICES[i]
        rules = self._cut.pop(i, None)
        if rules is None:
            return
        if not rules:
            self.docker(
                "network",
                "connect",
                "--ip",
                self.ip_of(svc),
                "--alias",
                svc,
                self.network,
                self.containers[svc],
            )
            return
        for rule in rules:
            self._iptables(svc, "-D", *rule)

    # security -------------------------------------------------------------------------------
    @property
    def secret_file(self) -> str | None:
        if self.settings.get("EMBERFS_INSECURE") == "1":
            return None
        return self.settings.get("EMBERFS_CLUSTER_KEY")

    @property
    def keys(self) -> ClusterKeys | None:
        """The cluster's keys (the checker lists chunks as a server would)."""
        path = self.secret_file
        return ClusterKeys.from_file(path) if path else None

    @property
    def client_token(self) -> str | None:
        return self.token

    # state ------------------------------------------------------------------------------------
    def routing(self) -> common_pb2.RoutingInfo:
        with grpcauth.channel(self.meta_address, keys=self.keys) as channel:
            stub = cluster_pb2_grpc.ClusterServiceStub(channel)
            return stub.GetRouting(cluster_pb2.GetRoutingRequest(), timeout=5).routing

    def wait_serving(self, timeout: float) -> bool:
        want = self.servers * TARGETS_PER_NODE
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                states = [t.state for t in self.routing().targets]
                if len(states) == want and all(s == common_pb2.SERVING for s in states):
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        return False

    def unexpected_deaths(self) -> list[dict]:
        """Containers that stopped without the checker stopping them (each reported once)."""
        found = []
        for svc, cid in self.containers.items():
            with self._lock:
                if svc in self._down:
                    continue
            try:
                state = json.loads(self.docker("inspect", "-f", "{{json .State}}", cid, timeout=30))
            except Exception:
                continue
            if state.get("Running"):
                continue
            with self._lock:
                if svc in self._down:
                    continue
                self._down.add(svc)
            logs = subprocess.run(
                ["docker", "logs", "--tail", "30", cid], capture_output=True, text=True, timeout=30
            )
            found.append(
                {
                    "process": svc,
                    "returncode": state.get("ExitCode"),
                    "oom_killed": state.get("OOMKilled"),
                    "t": time.monotonic(),
                    "log_tail": (logs.stdout + logs.stderr)[-3000:],
                }
            )
        self.deaths += found
        return found

    def revive(self, name: str) -> None:
        self._start(name)
