"""``emberfs up``: a whole local cluster in the foreground.

Starts the metaserver (with its admin API) and the storage servers as child
processes on 127.0.0.1, prints where they listen and how to use them, restarts
a child that dies, and stops everything on Ctrl-C or SIGTERM. Started again on
the same data directory it comes back with all its data.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import threading
from pathlib import Path

from emberfs.cli.localcluster import LocalCluster


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="emberfs up", description="Start a whole local EmberFS cluster in the foreground."
    )
    p.add_argument(
        "--data-dir", default="./emberfs-data", help="state of every process (default: %(default)s)"
    )
    p.add_argument(
        "--storage-servers", type=int, default=3, help="number of storage servers (default: 3)"
    )
    p.add_argument("--replicas", type=int, default=3, help="replicas of every chunk (default: 3)")
    p.add_argument("--targets", type=int, default=2, help="storage targets per server (default: 2)")
    p.add_argument(
        "--meta-port", type=int, default=9400, help="metaserver gRPC port (default: 9400)"
    )
    p.add_argument(
        "--admin-port", type=int, default=9401, help="admin REST API port (default: 9401)"
    )
    p.add_argument(
        "--storage-port",
        type=int,
        default=9500,
        help="first storage port; server i uses PORT+3i (data), +1 (gRPC) and +2 (metrics) (default: 9500)",
    )
    p.add_argument("--heartbeat-timeout", type=float, default=5.0, help="seconds (default: 5)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.storage_servers < 1:
        print("emberfs up: --storage-servers must be at least 1", file=sys.stderr)
        return 2
    if not 1 <= args.replicas <= args.storage_servers:
        print(
            f"emberfs up: --replicas must be between 1 and --storage-servers ({args.storage_servers})",
            file=sys.stderr,
        )
        return 2
    token = os.environ.get("EMBERFS_ADMIN_TOKEN") or secrets.token_urlsafe(24)
    generated = "EMBERFS_ADMIN_TOKEN" not in os.environ
    data_dir = Path(args.data_dir).resolve()
    cluster = LocalCluster(
        data_dir,
        storage_servers=args.storage_servers,
        replicas=args.replicas,
        targets_per_server=args.targets,
        meta_port=args.meta_port,
        admin_port=args.admin_port,
        storage_ports=[args.storage_port + 3 * i for i in range(args.storage_servers)],
        heartbeat_timeout=args.heartbeat_timeout,
        env={"EMBERFS_ADMIN_TOKEN": token},
    )
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    print(f"Starting EmberFS in {data_dir} ...", flush=True)
    try:
        cluster.start(timeout=120)
    except (RuntimeError, TimeoutError) as exc:
        print(f"emberfs up: the cluster did not start: {exc}", file=sys.stderr)
        return 1
    print_endpoints(cluster, token, generated)
    try:
        supervise(cluster, stop)
    finally:
        print("\nStopping EmberFS ...", flush=True)
        cluster.stop()
        print("Stopped.", flush=True)
    return 0


def print_endpoints(cluster: LocalCluster, token: str, generated: bool) -> None:
    lines = [
        "",
        "EmberFS is up.",
        f"  metaserver   {cluster.meta_address}  (gRPC; set EMBERFS_META to this)",
        f"  admin API    {cluster.admin_url}  (dashboard /, API docs /docs, metrics /metrics)",
    ]
    for i, s in enumerate(cluster.storage):
        lines.append(
            f"  storage-{i}    data {cluster.storage_address(i)}  gRPC {cluster.storage_grpc_address(i)}"
            f"  metrics {cluster.storage_metrics_url(i)}"
            f"  (pid {s.proc.pid})"
        )
    lines += [
        f"  admin token  {token}"
        + ("  (generated; set EMBERFS_ADMIN_TOKEN to choose one)" if generated else ""),
        f"  data         {cluster.data_dir}  (logs in {cluster.data_dir / 'logs'})",
        "",
        "Try:",
        f"  export EMBERFS_META={cluster.meta_address}",
        "  emberfs put ./some-file /datasets/some-file && emberfs ls /datasets",
        "  python -c \"import fsspec; print(fsspec.filesystem('emberfs').ls('/'))\"",
        "",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def supervise(cluster: LocalCluster, stop: threading.Event) -> None:
    """Restart any child that exits until ``stop`` is set."""
    while not stop.wait(1.0):
        for service in [cluster.meta, *cluster.storage]:
            if not service.running and not stop.is_set():
                code = service.proc.returncode if service.proc else None
                print(
                    f"{service.name} exited ({code}); restarting it. Log tail:\n{service.tail(10)}",
                    flush=True,
                )
                try:
                    service.start(cluster.child_env())
                    service.wait_ready(60)
                except (RuntimeError, TimeoutError) as exc:
                    print(f"{service.name} did not restart: {exc}", file=sys.stderr, flush=True)
