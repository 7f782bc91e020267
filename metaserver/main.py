"""The ``emberfs metaserver`` process.

One RocksDB under ``DATA_DIR/meta`` holds the namespace and the cluster
state, or, with ``--kv etcd://...``, an etcd cluster that any number of
metaservers share (:mod:`emberfs.metaserver.store.etcd`). Every metaserver serves
the namespace; the cluster manager's work runs on the one that leads
(:mod:`emberfs.metaserver.clustermgr.leadership`), and the others answer storage nodes'
cluster calls with :class:`~emberfs.common.errors.NotLeader` naming it,
forward readers' lost-chunk reports to it, and pass admin API calls on to its
admin API. One gRPC server on ``--listen`` serves ``MetaService`` and
``ClusterService``; a second one on ``--cluster-listen`` serves
``ClusterService`` alone, on worker threads of its own, so that storage
nodes' heartbeats never wait behind metadata calls (nodes register on
``--listen`` and learn that address from the answer). The admin REST API
runs on ``--admin-listen`` (uvicorn in a thread). One background thread
applies heartbeat timeouts; another runs the sweeps: garbage collection,
write sessions whose lease ran out (``--session-timeout``), lock leases
that ran out (``--lock-lease-timeout``), old retry records. Both judge by a :class:`~emberfs.metaserver.clustermgr.grace.Grace` that
notices the process's own stalls. Once the servers listen, the process
prints ``READY metaserver <grpc address> admin <http address> cluster <grpc
address>`` on stdout; SIGTERM or SIGINT stops it cleanly.

With the cluster's key file (``--secret-file``) both gRPC servers check every
call's credentials (:class:`~emberfs.common.grpcauth.AuthInterceptor`: a
client's token, resolved by the :class:`~emberfs.metaserver.tokens.TokenStore`,
or a server's credential), opens hand out signed chunk capabilities, and the
metaserver's own calls to storage servers carry the server credential;
``--insecure`` turns all of that off. ``--max-pending-calls`` bounds the calls
admitted at once (more get ``RESOURCE_EXHAUSTED``).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from functools import partial
from pathlib import Path

import grpc

from emberfs.common import errors, grpcauth, wire
from emberfs.common import layout as layout_rules
from emberfs.common.addresses import join_address, split_address
from emberfs.common.auth import add_secret_arguments, keys_from_args, tls_from_args
from emberfs.common.grpcauth import AuthInterceptor
from emberfs.common.signals import StopSignals
from emberfs.metaserver import service as meta_service
from emberfs.metaserver.clustermgr import service as cluster_service
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.clustermgr.leadership import (
    DEFAULT_OUTAGE_GRACE,
    DEFAULT_TTL,
    EtcdLeadership,
    LeaderInfo,
    Leadership,
    new_id,
)
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.clustermgr.repair import ReadRepair, stat_inode_of
from emberfs.metaserver.fs import cuts as cuts_module
from emberfs.metaserver.fs.chunk_truncation import truncate_chunks
from emberfs.metaserver.fs.locking import DEFAULT_LEASE_TIMEOUT as DEFAULT_LOCK_LEASE_TIMEOUT
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.metrics import MetricsInterceptor
from emberfs.metaserver.store.etcd import COMPACT_INTERVAL, Compactor
from emberfs.metaserver.store.etcdclient import EtcdSettings, is_etcd_url
from emberfs.metaserver.store.kv import KVEngine, RocksEngine
from emberfs.metaserver.tokens import TokenStore
from emberfs.proto import common_pb2

log = logging.getLogger("emberfs.metaserver")

GRPC_WORKERS = 32
CLUSTER_WORKERS = 16  # the cluster address's own: a node has a few calls in flight at most
GC_SWEEP_INTERVAL = 10.0
SESSION_SWEEP_INTERVAL = 5.0  # at most; shorter for short session timeouts
RETRY_SWEEP_INTERVAL = 60.0
TRASH_SWEEP_INTERVAL = 10.0
TRASH_EXPIRY_INTERVAL = 60.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="emberfs metaserver",
        description="Run the metaserver: namespace, cluster manager and admin API.",
    )
    p.add_argument("--data-dir", help="directory of the metadata store (RocksDB, the default)")
    p.add_argument(
        "--kv",
        default="rocksdb",
        help="the metadata store: 'rocksdb' (in --data-dir, the default) or "
        "etcd://HOST:PORT[,HOST:PORT...][/PREFIX], shared by every metaserver given the same URL",
    )
    p.add_argument("--listen", default="127.0.0.1:9400", help="gRPC HOST:PORT (port 0: any)")
    p.add_argument(
        "--advertise",
        help="the address storage servers reach this metaserver's --listen by, as other "
        "metaservers tell them (default: the bound one; a wildcard host: this host's name)",
    )
    p.add_argument(
        "--leader-ttl",
        type=float,
        default=DEFAULT_TTL,
        help="etcd: seconds of the lease that holds the cluster manager's lead; a dead leader "
        f"is replaced after about this long (default {DEFAULT_TTL:g})",
    )
    p.add_argument(
        "--store-outage-grace",
        type=float,
        default=DEFAULT_OUTAGE_GRACE,
        help="etcd: seconds a leader cut off from etcd keeps storage nodes serving, and a new "
        f"leader waits before it declares a node offline (default {DEFAULT_OUTAGE_GRACE:g})",
    )
    p.add_argument(
        "--admin-listen", default="127.0.0.1:9401", help="admin HTTP HOST:PORT (port 0: any)"
    )
    p.add_argument(
        "--cluster-listen",
        help="gRPC HOST:PORT of ClusterService for storage nodes, on worker threads of its "
        "own (default: the --listen host, any free port; nodes learn it when they register)",
    )
    p.add_argument(
        "--cluster-advertise",
        help="the cluster address nodes are told (default: the bound one); a wildcard host, as "
        "in 0.0.0.0:9402, means the host each node reached the metaserver by (nothing binds it)",
    )
    p.add_argument("--replicas", type=int, default=3, help="targets per chain (default 3)")
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=5.0,
        help="seconds without heartbeats before a node's targets go offline (default 5)",
    )
    p.add_argument(
        "--chunk-size",
        type=int,
        default=layout_rules.DEFAULT_CHUNK_SIZE,
        help="default chunk size in bytes, a power of two (default 4 MiB)",
    )
    p.add_argument(
        "--stripe",
        type=int,
        default=layout_rules.DEFAULT_STRIPE,
        help="default number of chains per file (default 4)",
    )
    p.add_argument(
        "--admin-token",
        default=os.environ.get("EMBERFS_ADMIN_TOKEN"),
        help="bearer token of the admin API's steering routes (default: $EMBERFS_ADMIN_TOKEN; "
        "with neither, steering is refused)",
    )
    p.add_argument(
        "--session-timeout",
        type=float,
        default=300.0,
        help="seconds a write session lives without a lease renewal (default 300)",
    )
    p.add_argument(
        "--lock-lease-timeout",
        type=float,
        default=DEFAULT_LOCK_LEASE_TIMEOUT,
        help="seconds a client's lock lease lives without a renewal; a client that stops "
        "renewing (its mount died) loses its fcntl and flock locks then "
        f"(default {DEFAULT_LOCK_LEASE_TIMEOUT:g})",
    )
    p.add_argument(
        "--capability-ttl",
        type=float,
        default=300.0,
        help="seconds a chunk capability handed out with an open is valid (default 300); "
        "a revoked token's capabilities stop working within it",
    )
    p.add_argument(
        "--max-pending-calls",
        type=int,
        default=1024,
        help="gRPC calls admitted at once (running or waiting for a worker); more are "
        "answered RESOURCE_EXHAUSTED (default 1024)",
    )
    p.add_argument(
        "--trash-days",
        type=float,
        default=1.0,
        help="days a removed file or tree stays in its remover's trash, restorable, before it "
        "is purged (default 1; 0: no trash, removal deletes at once)",
    )
    p.add_argument(  # how often the trash is swept (tests shorten it)
        "--trash-sweep-interval", type=float, default=TRASH_EXPIRY_INTERVAL, help=argparse.SUPPRESS
    )
    add_secret_arguments(p)
    p.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    args = p.parse_args(argv)
    args.keys = keys_from_args(p, args)
    args.tls = tls_from_args(p, args)
    if not args.capability_ttl > 0:
        p.error("--capability-ttl must be positive")
    if args.max_pending_calls < 1:
        p.error("--max-pending-calls must be at least 1")
    if is_etcd_url(args.kv):
        try:
            args.etcd = EtcdSettings.parse(args.kv)
        except ValueError as exc:
            p.error(f"--kv: {exc}")
    elif args.kv == "rocksdb":
        args.etcd = None
        if not args.data_dir:
            p.error("--data-dir is needed for the RocksDB store (or give --kv etcd://...)")
    else:
        p.error(f"--kv: {args.kv!r} is neither 'rocksdb' nor an etcd:// URL")
    if args.leader_ttl < 2:
        p.error("--leader-ttl must be at least 2 seconds (etcd's shortest lease)")
    if args.store_outage_grace < 0:
        p.error("--store-outage-grace must not be negative")
    if args.replicas < 1:
        p.error("--replicas must be at least 1")
    if not args.heartbeat_timeout > 0:
        p.error("--heartbeat-timeout must be positive")
    if not args.session_timeout > 0:
        p.error("--session-timeout must be positive")
    if not args.lock_lease_timeout >= 1:
        p.error("--lock-lease-timeout must be at least 1 second")
    if not args.trash_days >= 0:
        p.error("--trash-days must not be negative")
    if not args.trash_sweep_interval > 0:
        p.error("--trash-sweep-interval must be positive")
    try:
        layout_rules.validate_chunk_size(args.chunk_size)
    except ValueError as exc:
        p.error(f"--chunk-size: {exc}")
    if not 1 <= args.stripe <= layout_rules.MAX_STRIPE:
        p.error(f"--stripe must be between 1 and {layout_rules.MAX_STRIPE}")
    for opt in ("listen", "admin_listen", "cluster_listen", "cluster_advertise", "advertise"):
        if getattr(args, opt) is None:
            continue
        try:
            split_address(getattr(args, opt))
        except ValueError as exc:
            p.error(f"--{opt.replace('_', '-')}: {exc}")
    return args


def build_namespace(
    engine: KVEngine, cluster: ClusterManager, gc: GCQueue, args: argparse.Namespace
) -> Namespace:
    """The namespace over ``engine``, fed chains and usage by the cluster manager.

    The GC items it queues are reported to ``gc``; its write sessions are
    judged by the cluster manager's grace.
    """
    return Namespace(
        engine,
        chain_table=cluster.chain_table,
        truncate_chunks=partial(
            truncate_chunks,
            cluster,
            pool=wire.ConnectionPool(
                max_per_address=None,
                credential=cluster.keys.server_credential() if cluster.keys else None,
            ),
        ),
        usage=cluster.usage,
        default_layout=common_pb2.Layout(chunk_size=args.chunk_size, stripe=args.stripe),
        session_timeout=args.session_timeout,
        gc_queued=gc.queued,
        grace=cluster.grace,
        trash_days=args.trash_days,
        lock_lease_timeout=args.lock_lease_timeout,
    )


def intervals(heartbeat_timeout: float, session_timeout: float) -> tuple[float, float, float]:
    """``(max_gap, check interval, session sweep interval)`` for these timeouts, in seconds.

    A gap of ``max_gap`` (half the shorter timeout) between two judging
    rounds is a stall of the metaserver itself (see :mod:`emberfs.metaserver.clustermgr.grace`);
    the heartbeat timeouts are checked at least twice as often, and sessions
    every quarter session timeout (at most every ``SESSION_SWEEP_INTERVAL``).
    """
    max_gap = min(heartbeat_timeout, session_timeout) / 2
    return (
        max_gap,
        min(0.5, max_gap / 2),
        min(SESSION_SWEEP_INTERVAL, session_timeout / 4),
    )


def sweep_loop(
    gc: GCQueue,
    namespace: Namespace,
    stop: threading.Event,
    interval: float,
    session_interval: float,
    leading: Callable[[], bool] = lambda: True,
    extra: Sequence[tuple[float, Callable[[], object], str]] = (),
) -> None:
    """The sweeps: GC, write sessions, retry records, detached trees, the index of removed KV
    caches (and ``extra`` jobs),
    each at its own interval, on the metaserver that leads.

    ``interval`` is the loop's step. A job that fails is logged and runs again
    at its next turn. (The heartbeat timeouts run in :func:`_check_loop`, so
    that a long sweep never delays them, nor looks like a stall.)
    """
    jobs = [
        (GC_SWEEP_INTERVAL, gc.collect, "garbage collection sweep"),
        (session_interval, namespace.expire_sessions, "write session expiry"),
        (RETRY_SWEEP_INTERVAL, namespace.prune_retry_records, "retry record sweep"),
        (TRASH_SWEEP_INTERVAL, namespace.purge_detached, "detached tree sweep"),
        (TRASH_SWEEP_INTERVAL, namespace.kvcaches.sweep_removed, "removed KV cache sweep"),
        *extra,
    ]
    waited = [0.0] * len(jobs)
    while not stop.wait(interval):
        if not leading():
            continue
        for i, (every, job, name) in enumerate(jobs):
            waited[i] += interval
            if waited[i] < every:
                continue
            waited[i] = 0.0
            try:
                job()
            except errors.Unavailable as exc:  # the store is away: the next turn tries again
                log.warning("%s failed: %s", name, exc)
            except Exception:
                log.exception("%s failed", name)


def _check_loop(cluster: ClusterManager, stop: threading.Event, interval: float) -> None:
    """Every ``interval``, the heartbeat timeouts on the leader, and a follower's copy of
    the cluster state (a failure is logged; the next round runs)."""
    while not stop.wait(interval):
        try:
            if cluster.leadership.leading():
                cluster.check_timeouts()
            else:
                cluster.follow()
        except errors.Unavailable as exc:
            log.info("cluster state: %s", exc)
        except Exception:
            log.exception("cluster timeout check failed")


def open_engine(args: argparse.Namespace) -> KVEngine:
    """The metadata store the arguments name."""
    if args.etcd is not None:
        from emberfs.metaserver.store.etcd import EtcdEngine

        return EtcdEngine(args.etcd)
    return RocksEngine(Path(args.data_dir) / "meta")


def _advertised(address: str, bound_port: int) -> str:
    """``address`` with the port bound, a wildcard host replaced by this host's name."""
    host, _ = split_address(address)
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return join_address(host, bound_port)


def _bind(server: grpc.Server, address: str, tls=None) -> int:
    """Bind ``server`` to ``address`` (with TLS when ``tls`` has a certificate); the port (0: it could not)."""
    try:
        return grpcauth.add_port(server, address, tls)
    except RuntimeError as exc:
        log.error("cannot listen on %s: %s", address, exc)
        return 0


def start_admin(app, address: str, tls=None):
    import uvicorn

    host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off only on connections of a socket whose
    # protocol says TCP, and with it on every answer waited for the client's delayed ACK (~40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    https = {}
    if tls is not None and tls.cert:
        https = {"ssl_certfile": tls.cert, "ssl_keyfile": tls.key}
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", **https)
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="admin-http", daemon=True
    )
    thread.start()
    return server, thread, sock


def main(argv: list[str] | None = None) -> int:
    """Run the metaserver until SIGTERM or SIGINT; the exit code."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    StopSignals(stop.set)

    try:
        engine = open_engine(args)
    except Exception as exc:
        print(f"emberfs metaserver: cannot open the metadata store: {exc}", file=sys.stderr)
        return 1
    grpc_server = None
    leadership: Leadership | None = None
    cluster_server = None
    admin = None
    loops: list[threading.Thread] = []
    try:
        max_gap, interval, session_interval = intervals(
            args.heartbeat_timeout, args.session_timeout
        )
        if engine.shared:
            leadership = EtcdLeadership(
                engine,
                LeaderInfo(new_id(), ""),
                ttl=args.leader_ttl,
                outage_grace=args.store_outage_grace,
            )
        else:
            leadership = Leadership()
        cluster = ClusterManager(
            engine,
            replicas=args.replicas,
            heartbeat_timeout=args.heartbeat_timeout,
            grace=Grace(max_gap=max_gap),
            leadership=leadership,
        )
        cluster.keys = args.keys
        cluster.tls = args.tls
        tokens = TokenStore(engine, admin_token=args.admin_token)
        interceptors = [MetricsInterceptor()]
        if args.keys is not None:
            interceptors.append(AuthInterceptor(args.keys, tokens.resolve))
        grpc_server, cluster_server = (
            grpc.server(
                futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name),
                options=[("grpc.so_reuseport", 0)],
                interceptors=grpcauth.server_interceptors(*interceptors),
                maximum_concurrent_rpcs=args.max_pending_calls,
            )
            for workers, name in ((GRPC_WORKERS, "grpc"), (CLUSTER_WORKERS, "cluster-grpc"))
        )
        gc = GCQueue(cluster)
        namespace = build_namespace(engine, cluster, gc, args)
        meta_service.add_to_server(
            meta_service.MetaServicer(namespace, args.keys, args.capability_ttl), grpc_server
        )
        repair = ReadRepair(cluster, stat_inode_of(namespace))
        servicer = cluster_service.ClusterServicer(
            cluster, gc, repair, forward=cluster_service.LeaderForwarder(cluster)
        )
        cluster_service.add_to_server(servicer, grpc_server)
        cluster_service.add_to_server(servicer, cluster_server)
        host, _ = split_address(args.listen)
        cluster_listen = args.cluster_listen or join_address(host, 0)
        cluster_host, _ = split_address(cluster_listen)
        port = _bind(grpc_server, args.listen, args.tls)
        cluster_port = port and _bind(cluster_server, cluster_listen, args.tls)
        if not cluster_port:
            where = cluster_listen if port else args.listen
            print(f"emberfs metaserver: cannot listen on {where}", file=sys.stderr)
            return 1
        cluster.cluster_address = args.cluster_advertise or join_address(cluster_host, cluster_port)
        cluster_server.start()
        grpc_server.start()

        from emberfs.metaserver.api import create_app

        try:
            app = create_app(
                cluster,
                gc,
                namespace,
                admin_token=args.admin_token,
                tokens=tokens,
                tls=args.tls,
            )
            admin = start_admin(app, args.admin_listen, args.tls)
        except OSError as exc:
            print(
                f"emberfs metaserver: cannot listen on {args.admin_listen}: {exc}", file=sys.stderr
            )
            return 1
        server, thread, sock = admin
        while not server.started and thread.is_alive() and not stop.wait(0.01):
            pass
        if not server.started:
            if not stop.is_set():
                print("emberfs metaserver: the admin API did not start", file=sys.stderr)
                return 1
            return 0

        admin_host, admin_port = sock.getsockname()[:2]
        advertised = _advertised(args.advertise or args.listen, port)
        scheme = "https" if args.tls is not None and args.tls.cert else "http"
        admin_advertised = _advertised(join_address(admin_host, admin_port), admin_port)
        if args.advertise:
            admin_advertised = join_address(split_address(advertised)[0], admin_port)
        leadership.me = LeaderInfo(
            leadership.me.id,
            advertised,
            _advertised(cluster.cluster_address, split_address(cluster.cluster_address)[1]),
            f"{scheme}://{admin_advertised}",
        )
        # Everything listens: the lead is taken (at once on a store of its own), and from
        # then nodes and writers are judged, a full timeout each at least.
        leadership.start(on_elected=cluster.take_over)
        if not leadership.wait_known(2 * args.leader_ttl + 1):
            log.warning("no leader known yet (is etcd reachable?); serving all the same")
        extra = [
            (args.trash_sweep_interval, namespace.expire_trash, "trash expiry"),
            (
                min(SESSION_SWEEP_INTERVAL, args.lock_lease_timeout / 4),
                namespace.locks.expire_leases,
                "lock lease expiry",
            ),
        ]
        if engine.shared:
            extra.append((COMPACT_INTERVAL, Compactor(engine), "etcd compaction"))
        for target, loop_args, name in (
            (_check_loop, (cluster, stop, interval), "timeouts"),
            (
                sweep_loop,
                (gc, namespace, stop, interval, session_interval, leadership.leading, extra),
                "sweeps",
            ),
            (repair.run, (stop,), "read-repair"),
            *([(cluster.run_usage_writer, (stop,), "usage-writer")] if engine.shared else []),
            *(
                [
                    (
                        namespace.cuts.run,
                        (stop, cuts_module.SWEEP_INTERVAL, leadership.leading),
                        "chunk-cuts",
                    )
                ]
                if namespace.cuts
                else []
            ),
        ):
            loop = threading.Thread(target=target, args=loop_args, name=name, daemon=True)
            loop.start()
            loops.append(loop)
        print(
            f"READY metaserver {join_address(host, port)} "
            f"admin {join_address(admin_host, admin_port)} cluster {cluster.cluster_address}",
            flush=True,
        )
        while not stop.wait(0.5):
            pass
        return 0
    finally:
        stop.set()
        stopped = [s.stop(grace=2) for s in (grpc_server, cluster_server) if s is not None]
        for event in stopped:
            event.wait()
        if admin is not None:
            server, thread, _ = admin
            server.should_exit = True
            thread.join(timeout=5)
        for loop in loops:
            loop.join(timeout=5)
        if leadership is not None:
            leadership.stop()
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
