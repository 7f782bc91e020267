"""A local etcd cluster as child processes, for ``emberfs up --kv etcd`` and tests."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from emberfs.cli.ports import free_port
from emberfs.cli.processes import Service


def etcd_binary() -> str:
    """The ``etcd`` server binary; RuntimeError naming the package when it is not installed."""
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError(
            "the etcd server is not installed (Debian: apt-get install etcd-server); "
            "it is needed for --kv etcd"
        )
    return found


@dataclass
class LocalEtcd:
    """An etcd cluster of ``members`` local processes, for ``emberfs up --kv etcd`` and tests.

    Member i keeps its data in ``data_dir/etcd-<i>`` and listens for clients on
    ``client_ports[i]`` and for its peers on the port after it. The members run
    with etcd's default limits (128 operations and 1.5 MiB a transaction), so
    what works here works on a stock etcd.
    """

    data_dir: Path
    members: int = 1
    host: str = "127.0.0.1"
    client_ports: list[int] | None = None
    extra_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.client_ports is None:
            taken: set[int] = set()
            self.client_ports = []
            for _ in range(self.members):
                port = free_port(self.host, count=2, avoid=taken)
                taken.update((port, port + 1))
                self.client_ports.append(port)
        names = [f"etcd-{i}" for i in range(self.members)]
        cluster = ",".join(
            f"{name}=http://{self.host}:{port + 1}"
            for name, port in zip(names, self.client_ports, strict=True)
        )
        logs = self.data_dir / "logs"
        self.services = [
            Service(
                name,
                [
                    etcd_binary(),
                    "--name",
                    name,
                    "--data-dir",
                    str(self.data_dir / name),
                    "--listen-client-urls",
                    f"http://{self.host}:{port}",
                    "--advertise-client-urls",
                    f"http://{self.host}:{port}",
                    "--listen-peer-urls",
                    f"http://{self.host}:{port + 1}",
                    "--initial-advertise-peer-urls",
                    f"http://{self.host}:{port + 1}",
                    "--initial-cluster",
                    cluster,
                    "--initial-cluster-token",
                    "emberfs-local",
                    "--initial-cluster-state",
                    "new",
                ]
                + self.extra_args,
                logs / f"{name}.log",
                "",
            )
            for name, port in zip(names, self.client_ports, strict=True)
        ]

    @property
    def endpoints(self) -> list[str]:
        return [f"{self.host}:{port}" for port in self.client_ports]

    def url(self, prefix: str = "emberfs") -> str:
        """The ``etcd://`` URL of this cluster with key prefix ``prefix``."""
        return f"etcd://{','.join(self.endpoints)}/{prefix}"

    def start(self, timeout: float = 60.0) -> LocalEtcd:
        env = dict(os.environ)
        for service in self.services:
            service.start(env)
        self.wait_ready(timeout)
        return self

    def start_member(self, i: int) -> None:
        """Start member ``i`` again (after :meth:`kill`); it rejoins with its data."""
        self.services[i].start(dict(os.environ))

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until a write through the cluster succeeds."""
        from emberfs.metaserver.store.etcd import EtcdEngine

        engine = EtcdEngine(f"etcd://{','.join(self.endpoints)}/emberfs-ready?timeout=2")
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    engine.write({b"ready": b"1"})
                    return
                except Exception as exc:
                    for service in self.services:
                        if service.proc is not None and service.proc.poll() is not None:
                            raise RuntimeError(
                                f"{service.name} exited with {service.proc.returncode}:\n"
                                f"{service.tail()}"
                            ) from None
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"etcd not ready after {timeout:.0f} s: {exc}") from exc
                    time.sleep(0.1)
        finally:
            engine.close()

    def kill(self, i: int) -> None:
        """SIGKILL member ``i``."""
        self.services[i].kill()

    def stop(self) -> None:
        for service in self.services:
            service.stop()
