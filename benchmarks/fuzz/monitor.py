"""Watching the servers while a surface runs: probes that must answer, processes that must live."""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time
from collections.abc import Callable

from emberfs.common import framing, grpcauth
from emberfs.common.framing import Op, Status
from emberfs.proto import (
    cluster_pb2,
    cluster_pb2_grpc,
    meta_pb2,
    meta_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)

from . import timeouts
from .cluster import Env
from .frames import FrameParts
from .tally import Tally


class Prober:
    """Asks every server a question it must answer within :data:`timeouts.PROBE_TIMEOUT` seconds."""

    def __init__(self, env: Env) -> None:
        self.env = env
        cluster = env.cluster
        self._meta = grpcauth.channel(cluster.meta_address, token=env.token)
        self._storage = [
            grpcauth.channel(cluster.storage_grpc_address(i), keys=env.keys)
            for i in range(env.storage_count)
        ]

    def close(self) -> None:
        self._meta.close()
        for channel in self._storage:
            channel.close()

    def probes(self) -> list[tuple[str, str, Callable[[], None]]]:
        """(probe, process it asks, the question) for every server."""
        out: list[tuple[str, str, Callable[[], None]]] = []
        for i in range(self.env.storage_count):
            out.append((f"data PING storage-{i}", f"storage-{i}", lambda i=i: self._ping(i)))
            out.append(
                (f"TargetStats storage-{i}", f"storage-{i}", lambda i=i: self._target_stats(i))
            )
        out.append(("gRPC Ping", "metaserver", self._meta_ping))
        out.append(("GetRouting", "metaserver", self._routing))
        out.append(("GET /healthz", "metaserver", self._healthz))
        return out

    def _ping(self, i: int) -> None:
        frame = FrameParts(Op.PING, cred=self.env.keys.server_credential()).encode()
        deadline = time.monotonic() + timeouts.PROBE_TIMEOUT
        with socket.create_connection(
            self.env.data_address(i), timeout=timeouts.PROBE_TIMEOUT
        ) as sock:
            sock.sendall(frame)
            header, _, _ = framing.recv_head(sock, deadline)
        if header.status != Status.OK:
            raise RuntimeError(f"PING answered {framing.status_name(header.status)}")

    def _target_stats(self, i: int) -> None:
        stub = storage_pb2_grpc.StorageServiceStub(self._storage[i])
        stub.TargetStats(storage_pb2.TargetStatsRequest(), timeout=timeouts.PROBE_TIMEOUT)

    def _meta_ping(self) -> None:
        meta_pb2_grpc.MetaServiceStub(self._meta).Ping(
            meta_pb2.PingRequest(), timeout=timeouts.PROBE_TIMEOUT
        )

    def _routing(self) -> None:
        cluster_pb2_grpc.ClusterServiceStub(self._meta).GetRouting(
            cluster_pb2.GetRoutingRequest(), timeout=timeouts.PROBE_TIMEOUT
        )

    def _healthz(self) -> None:
        host, port = self.env.cluster.admin_address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=timeouts.PROBE_TIMEOUT)
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"/healthz answered {resp.status}")
        finally:
            conn.close()


class Monitor:
    """While a surface runs: a crash (a server process exited) and a probe not answered in time.

    A crash stops the surface (``stop`` is set); a hang is counted and the run goes on.
    """

    def __init__(
        self,
        env: Env,
        prober: Prober,
        tally: Tally,
        stop: threading.Event,
        progress: float | None = None,
    ) -> None:
        self.env = env
        self.prober = prober
        self.tally = tally
        self.stop = stop
        self.progress = progress  # seconds between progress lines on stderr (None: none)
        self._started = time.monotonic()
        self._shown = self._started
        self._done = threading.Event()
        self._dead: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="fuzz-monitor", daemon=True)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def finish(self) -> None:
        """Stop watching, after one last round of every probe."""
        self._done.set()
        self._thread.join()
        self.check()

    def _loop(self) -> None:
        while not self._done.wait(timeouts.PROBE_INTERVAL):
            self.check()
            now = time.monotonic()
            if self.progress is not None and now - self._shown >= self.progress:
                self._shown = now
                t = self.tally
                rate = t.inputs / (now - self._started)
                print(
                    f"fuzz: {t.surface}: {t.inputs} inputs ({rate:.0f}/s), {len(t.crashes)} "
                    f"crashes, {t.hangs} hangs, {t.errors} server errors",
                    file=sys.stderr,
                    flush=True,
                )

    def check(self) -> None:
        """One round: has a process exited, does every live server answer its probes in time."""
        for proc in self.env.procs:
            code = proc.exit_code()
            if code is not None and proc.name not in self._dead:
                self._dead.add(proc.name)
                self.tally.crash(proc.name, code, proc.service.tail(60))
                self.stop.set()
        for name, owner, probe in self.prober.probes():
            if owner in self._dead:
                continue
            started = time.monotonic()
            try:
                probe()
            except Exception as exc:  # noqa: BLE001 - any failure of a probe is reported
                took = time.monotonic() - started
                self.tally.probe_hang(name, f"{type(exc).__name__}: {exc} after {took:.1f} s")
