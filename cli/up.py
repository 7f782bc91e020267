"""``emberfs up``: a whole local cluster in the foreground.

Starts the metaserver (with its admin API) and the storage servers as child
processes on 127.0.0.1, prints where they listen and how to use them, restarts
a child that dies, and stops everything on Ctrl-C or SIGTERM. Started again on
the same data directory it comes back with all its data.

``--kv etcd`` keeps the metadata in a local etcd (``DATA_DIR/etcd``, the
``etcd`` server binary must be installed) and runs two metaservers on it
(``--metaservers``): kill one and the other takes over. The metaservers listen
on ``--meta-port`` and ``--admin-port`` and those + 10 i; clients and storage
servers are given all of them.

Authentication is on: the cluster's key file (``DATA_DIR/cluster.key``) and
the admin token (``DATA_DIR/admin.token``, or ``EMBERFS_ADMIN_TOKEN``) are
made on the first start, and a client config file with the metaserver, the
admin API and the admin token is written (``--client-config``; default
:func:`emberfs.client.config.config_path`), so this user's ``emberfs``
commands and ``fsspec.filesystem("emberfs")`` work as the administrator
without setting anything. ``--insecure`` runs the cluster without
authentication.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from emberfs.cli.localcluster import LocalCluster
from emberfs.cli.localetcd import etcd_binary
from emberfs.client import config
from emberfs.common.signals import StopSignals


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
    p.add_argument(
        "--trash-days",
        type=float,
        default=1.0,
        help="days removed entries stay in the trash (default: 1; 0: no trash)",
    )
    p.add_argument(
        "--kv",
        default="rocksdb",
        help="the metadata store: rocksdb (default), etcd (a local etcd in DATA_DIR/etcd, "
        "started with the cluster) or the etcd:// URL of a running etcd cluster",
    )
    p.add_argument(
        "--metaservers",
        type=int,
        help="metaservers on the store (default: 1 on RocksDB, 2 on etcd)",
    )
    p.add_argument(
        "--etcd-port",
        type=int,
        default=9450,
        help="client port of the local etcd with --kv etcd (its peers use the next) "
        "(default: 9450)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="run without authentication: anyone who reaches a port may do anything",
    )
    p.add_argument(
        "--client-config",
        help=f"where to write the client config file (default: {config.config_path()}; "
        "'none': do not write one)",
    )
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
    if args.kv not in ("rocksdb", "etcd") and not args.kv.startswith("etcd://"):
        print("emberfs up: --kv must be rocksdb, etcd or an etcd:// URL", file=sys.stderr)
        return 2
    metaservers = args.metaservers or (1 if args.kv == "rocksdb" else 2)
    if metaservers < 1 or (metaservers > 1 and args.kv == "rocksdb"):
        print("emberfs up: several metaservers need --kv etcd", file=sys.stderr)
        return 2
    if args.kv == "etcd":
        try:
            etcd_binary()
        except RuntimeError as exc:
            print(f"emberfs up: {exc}", file=sys.stderr)
            return 2
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
        trash_days=args.trash_days,
        insecure=args.insecure,
        kv=args.kv,
        metaservers=metaservers,
        etcd_port=args.etcd_port,
    )
    stop = threading.Event()
    StopSignals(stop.set)

    print(f"Starting EmberFS in {data_dir} ...", flush=True)
    try:
        cluster.start(timeout=120)
    except (RuntimeError, TimeoutError) as exc:
        print(f"emberfs up: the cluster did not start: {exc}", file=sys.stderr)
        return 1
    written = None
    if args.client_config != "none" and cluster.admin_token:
        written = config.write(
            args.client_config or config.config_path(),
            meta=cluster.meta_addresses,
            token=cluster.admin_token,
            admin=cluster.admin_url,
            admin_token=cluster.admin_token,
        )
    print_endpoints(cluster, written)
    try:
        supervise(cluster, stop)
    finally:
        print("\nStopping EmberFS ...", flush=True)
        cluster.stop()
        print("Stopped.", flush=True)
    return 0


def print_endpoints(cluster: LocalCluster, client_config: Path | None) -> None:
    lines = ["", "EmberFS is up."]
    if len(cluster.metas) == 1:
        lines += [
            f"  metaserver   {cluster.meta_address}  (gRPC; set EMBERFS_META to this)",
            f"  admin API    {cluster.admin_url}  (dashboard /, API docs /docs, metrics /metrics)",
        ]
    else:
        lines.append(
            f"  metaservers  {cluster.meta_addresses}  (gRPC; set EMBERFS_META to this list)"
        )
        for i, service in enumerate(cluster.metas):
            lines.append(
                f"  {service.name:<12} {cluster.host}:{cluster.meta_ports[i]}  admin API "
                f"{cluster.admin_url_of(i)}  (pid {service.proc.pid})"
            )
    if cluster.etcd is not None:
        lines.append(
            f"  etcd         {','.join(cluster.etcd.endpoints)}  (the metadata store, data in "
            f"{cluster.etcd.data_dir})"
        )
    elif cluster.kv.startswith("etcd://"):
        lines.append(f"  etcd         {cluster.kv}  (the metadata store)")
    for i, s in enumerate(cluster.storage):
        lines.append(
            f"  storage-{i}    data {cluster.storage_address(i)}  gRPC {cluster.storage_grpc_address(i)}"
            f"  metrics {cluster.storage_metrics_url(i)}"
            f"  (pid {s.proc.pid})"
        )
    if cluster.admin_token:
        lines += [
            f"  admin token  {cluster.admin_token}  (acts as root; kept in "
            f"{cluster.data_dir / 'admin.token'} unless EMBERFS_ADMIN_TOKEN is set)",
            f"  cluster key  {cluster.secret_file}  (every server of the cluster needs it)",
        ]
        if client_config is not None:
            lines.append(
                f"  client       {client_config}  (metaserver and admin token: commands and "
                "fsspec use it)"
            )
        else:
            lines.append("  client       export EMBERFS_TOKEN=<a token> for commands and fsspec")
    else:
        lines.append("  security     NONE (--insecure): anyone who reaches a port may do anything")
    lines += [
        f"  data         {cluster.data_dir}  (logs in {cluster.data_dir / 'logs'})",
        "",
        "Try:",
        "  emberfs put ./some-file /datasets/some-file && emberfs ls /datasets",
        "  python -c \"import fsspec; print(fsspec.filesystem('emberfs').ls('/'))\"",
        "  emberfs admin token create --uid 1000 --gid 1000 --name alice   # a user's token",
        "",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def supervise(cluster: LocalCluster, stop: threading.Event) -> None:
    """Restart any child that exits until ``stop`` is set."""
    etcd = cluster.etcd.services if cluster.etcd is not None else []
    while not stop.wait(1.0):
        for service in [*etcd, *cluster.metas, *cluster.storage]:
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
