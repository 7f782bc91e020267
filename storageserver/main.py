"""The ``emberfs storageserver`` process.

Opens ``--targets`` targets under ``--data-dir``, serves the framed data
protocol on ``--listen`` and ``StorageService`` on ``--grpc-listen`` (default:
the data port + 1), registers with the metaserver at ``--meta`` and prints
``READY storageserver <data address> grpc <grpc address>`` on stdout once it is
registered and serving. SIGTERM or SIGINT stops it cleanly.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from emberfs.common.addresses import split_address, split_addresses
from emberfs.common.auth import add_secret_arguments, keys_from_args, tls_from_args
from emberfs.common.signals import StopSignals
from emberfs.common.units import parse_size
from emberfs.storageserver.chunkstore import DEFAULT_SPARE_BYTES
from emberfs.storageserver.metrics import start_metrics_server
from emberfs.storageserver.node import MAX_TARGETS, Node
from emberfs.storageserver.space import DEFAULT_RESERVE_BYTES


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="emberfs storageserver",
        description="Run one storage server: chunk targets, CRAQ replication, data protocol.",
    )
    p.add_argument("--data-dir", required=True, help="directory of the node's targets")
    p.add_argument(
        "--meta",
        required=True,
        help="metaserver HOST:PORT, or several comma-separated (metaservers of one etcd store)",
    )
    p.add_argument("--listen", required=True, help="data protocol HOST:PORT (port 0: any)")
    p.add_argument(
        "--grpc-listen", help="StorageService HOST:PORT (default: listen host, data port + 1)"
    )
    p.add_argument(
        "--metrics-listen",
        help="Prometheus /metrics HOST:PORT (default: listen host, data port + 2; 'off' disables)",
    )
    p.add_argument("--advertise", help="data HOST:PORT that others use (default: --listen)")
    p.add_argument("--targets", type=int, default=1, help="number of targets (default 1)")
    p.add_argument("--node-id", help="node id (default: kept in DATA_DIR/node_id)")
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=0.5,
        help="seconds between heartbeats (default 0.5)",
    )
    p.add_argument(
        "--forward-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for a chain successor's answer (default 30); one the "
        "cluster declares offline is left at once",
    )
    p.add_argument(
        "--fsync", action="store_true", help="fsync every chunk change (power-loss durability)"
    )
    p.add_argument(
        "--buffered-io",
        action="store_true",
        help="write chunk files through the page cache instead of with O_DIRECT",
    )
    p.add_argument(
        "--spare-bytes",
        type=parse_size,
        default=DEFAULT_SPARE_BYTES,
        help="replaced chunk files kept per target to be written over by new chunks "
        "(default 1GiB; 0: unlink them)",
    )
    p.add_argument(
        "--reserve-bytes",
        type=parse_size,
        default=DEFAULT_RESERVE_BYTES,
        help="bytes of each target's file system that chunk writes leave free; a write "
        "that would leave less is refused with NO_SPACE (default 64MiB)",
    )
    p.add_argument(
        "--scrub-rate",
        type=float,
        default=32.0,
        help="MB a second the scrubber reads to check committed chunks against their block "
        "CRC32Cs (default 32; 0: no scrubber)",
    )
    p.add_argument(
        "--scrub-interval",
        type=float,
        default=86400.0,
        help="seconds from the start of one scrub pass to the next (default 86400)",
    )
    p.add_argument(
        "--scrub-delay",
        type=float,
        default=60.0,
        help="seconds from the start to the first scrub pass (default 60)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="data connections at most; more are refused BUSY (default 256)",
    )
    p.add_argument(
        "--forward-reserve",
        type=int,
        default=32,
        help="of --max-connections, how many only servers (chain forwards, resync) may use "
        "(default 32)",
    )
    p.add_argument(
        "--frame-timeout",
        type=float,
        default=10.0,
        help="seconds a request frame may take to arrive, plus its data at 1 MiB/s; a slower "
        "peer is dropped (default 10)",
    )
    add_secret_arguments(p)
    p.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    args = p.parse_args(argv)
    args.keys = keys_from_args(p, args)
    args.tls = tls_from_args(p, args)
    if not args.frame_timeout > 0:
        p.error("--frame-timeout must be positive")
    if args.max_connections < 2 or not 0 <= args.forward_reserve < args.max_connections:
        p.error("--max-connections must be at least 2 and above --forward-reserve (>= 0)")
    try:
        split_addresses(args.meta)
    except ValueError as exc:
        p.error(f"--meta: {exc}")
    for opt in ("listen", "grpc_listen", "advertise", "metrics_listen"):
        value = getattr(args, opt)
        if value is None or (opt == "metrics_listen" and value == "off"):
            continue
        try:
            split_address(value)
        except ValueError as exc:
            p.error(f"--{opt.replace('_', '-')}: {exc}")
    if not 1 <= args.targets <= MAX_TARGETS:
        p.error(f"--targets must be between 1 and {MAX_TARGETS}")
    if not args.heartbeat_interval > 0:
        p.error("--heartbeat-interval must be positive")
    if not args.forward_timeout > 0:
        p.error("--forward-timeout must be positive")
    if not args.scrub_rate >= 0:
        p.error("--scrub-rate must not be negative")
    if not args.scrub_interval > 0:
        p.error("--scrub-interval must be positive")
    if not args.scrub_delay >= 0:
        p.error("--scrub-delay must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run a storage server until SIGTERM or SIGINT; the exit code."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    node = Node(
        Path(args.data_dir),
        args.meta,
        listen=args.listen,
        grpc_listen=args.grpc_listen,
        advertise=args.advertise,
        targets=args.targets,
        node_id=args.node_id,
        heartbeat_interval=args.heartbeat_interval,
        forward_timeout=args.forward_timeout,
        fsync=args.fsync,
        direct_io=not args.buffered_io,
        spare_bytes=args.spare_bytes,
        reserve_bytes=args.reserve_bytes,
        scrub_rate=args.scrub_rate * 1e6,
        scrub_interval=args.scrub_interval,
        scrub_delay=args.scrub_delay,
        keys=args.keys,
        max_connections=args.max_connections,
        forward_reserve=args.forward_reserve,
        frame_timeout=args.frame_timeout,
        tls=args.tls,
    )
    StopSignals(node.request_stop)
    try:
        try:
            registered = node.start()
        except (OSError, ValueError) as exc:
            print(f"emberfs storageserver: {exc}", file=sys.stderr)
            return 1
        if registered:
            metrics_server = _start_metrics(args, node)
            print(
                f"READY storageserver {node.listen_address} grpc {node.grpc_listen_address}",
                flush=True,
            )
            while not node.wait(1.0):
                pass
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
        return 0
    finally:
        node.stop()


def _start_metrics(args: argparse.Namespace, node: Node):
    """Serve /metrics; a port that cannot be bound only costs the metrics (a warning)."""
    if args.metrics_listen == "off":
        return None
    if args.metrics_listen:
        host, port = split_address(args.metrics_listen)
    else:
        host, data_port = split_address(node.listen_address)
        port = data_port + 2 if split_address(args.listen)[1] else 0
    try:
        server, _ = start_metrics_server(host, port)
    except OSError as exc:
        print(
            f"emberfs storageserver: metrics off, cannot listen on {host}:{port}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        return None
    return server


if __name__ == "__main__":
    sys.exit(main())
