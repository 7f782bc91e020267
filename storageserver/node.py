"""A storage node: its targets, its servers and its conversation with the metaserver.

A node owns ``--targets`` targets, ``DATA_DIR/target-<k>`` for k = 1..N, each a
:class:`~emberfs.storageserver.chunkstore.ChunkStore`. It

- serves the framed data protocol (:class:`~emberfs.storageserver.dataserver.DataServer`)
  and the ``StorageService`` gRPC control plane;
- registers with the metaserver's ``ClusterService`` (retrying until it
  answers), keeping the target ids it is given in ``target-<k>/target_id`` and
  its node id in ``DATA_DIR/node_id``;
- sends a heartbeat with its targets' usage (and whether each is full) every
  ``heartbeat_interval`` seconds and keeps the newest routing information it
  hears of; each answered heartbeat extends the lease it serves under (see
  :meth:`Node.fenced`). Which metaserver node calls go to, and through which
  address, is :class:`~emberfs.storageserver.membership.MetaserverLink`'s
  to say;
- runs a background loop that drains the garbage-collection queue and, for
  each local SERVING target whose successor is SYNCING, copies the chunks the
  successor lacks (one resync per chain at a time) and reports ``SyncDone``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from emberfs.common import grpcauth
from emberfs.common.addresses import join_address, split_address
from emberfs.common.auth import ClusterKeys
from emberfs.common.grpcauth import AuthInterceptor
from emberfs.common.routing import SERVING, RoutingView
from emberfs.proto import cluster_pb2
from emberfs.storageserver import metrics
from emberfs.storageserver import replication as rp
from emberfs.storageserver.chunkstore import DEFAULT_SPARE_BYTES, ChunkStore
from emberfs.storageserver.dataserver import DataServer
from emberfs.storageserver.gc import run_gc_once
from emberfs.storageserver.membership import RPC_TIMEOUT, Lease, MetaserverLink
from emberfs.storageserver.resync import sync_successor
from emberfs.storageserver.scrub import Scrubber
from emberfs.storageserver.service import StorageServicer, add_to_server
from emberfs.storageserver.space import DEFAULT_RESERVE_BYTES
from emberfs.storageserver.targets import load_node_id, read_target_id, target_reports, write_atomic

log = logging.getLogger(__name__)

GRPC_WORKERS = 16
MAX_TARGETS = 64


class Node:
    """One storage server process's worth of state and threads.

    Parameters
    ----------
    data_dir : Path
        Root of the node's state (created if missing).
    meta_address : str
        ``HOST:PORT`` of the metaserver's ``ClusterService``, or several,
        comma-separated (the metaservers of one shared store).
    listen : str
        ``HOST:PORT`` of the data protocol (port 0: any free port).
    grpc_listen : str, optional
        ``HOST:PORT`` of ``StorageService``; default the listen host and the
        data port + 1 (or any free port when the data port is 0).
    advertise : str, optional
        The data address other nodes and clients use; default the listen
        address. The gRPC address is advertised on the same host.
    targets : int, default 1
        Number of targets (``target-1`` .. ``target-N``).
    node_id : str, optional
        Fixed node id; default the one stored in ``DATA_DIR/node_id`` (made
        and stored at first start).
    heartbeat_interval : float, default 0.5
        Seconds between heartbeats.
    forward_timeout : float, default 30.0
        Seconds a write or truncation waits for the chain successor's answer
        (a successor the cluster declares offline is left at once).
    fsync : bool, default False
        Chunk stores fsync every change (power-loss durability).
    direct_io : bool, default True
        Chunk stores write chunk files with ``O_DIRECT`` where the file
        system allows it.
    spare_bytes : int, default chunkstore.DEFAULT_SPARE_BYTES
        Bytes of replaced chunk files each target keeps to write new chunks over.
    reserve_bytes : int, default space.DEFAULT_RESERVE_BYTES
        Bytes of each target's file system that chunk writes leave free.
    background_interval : float, default 1.0
        Seconds between garbage-collection / resync rounds.
    scrub_rate : float, default 0.0
        Bytes a second the scrubber reads to check committed chunks against
        their block CRC32Cs (:mod:`emberfs.storageserver.scrub`); 0: no scrubber.
    scrub_interval : float, default 86400.0
        Seconds from the start of one scrub pass to the start of the next.
    scrub_delay : float, default 60.0
        Seconds from the node's start to its first scrub pass.
    """

    def __init__(
        self,
        data_dir: Path,
        meta_address: str,
        *,
        listen: str,
        grpc_listen: str | None = None,
        advertise: str | None = None,
        targets: int = 1,
        node_id: str | None = None,
        heartbeat_interval: float = 0.5,
        forward_timeout: float = 30.0,
        fsync: bool = False,
        direct_io: bool = True,
        spare_bytes: int = DEFAULT_SPARE_BYTES,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
        background_interval: float = 1.0,
        scrub_rate: float = 0.0,
        scrub_interval: float = 86400.0,
        scrub_delay: float = 60.0,
        keys: ClusterKeys | None = None,
        max_connections: int = 256,
        forward_reserve: int = 32,
        frame_timeout: float = 10.0,
        tls: grpcauth.TLSFiles | None = None,
    ):
        if not 1 <= targets <= MAX_TARGETS:
            raise ValueError(f"targets must be between 1 and {MAX_TARGETS}")
        self.data_dir = Path(data_dir)
        self.metaserver = MetaserverLink(meta_address, keys, tls)
        self.listen = split_address(listen)
        self.grpc_listen = split_address(grpc_listen) if grpc_listen else None
        self.advertise = split_address(advertise) if advertise else None
        self.n_targets = targets
        self._node_id_arg = node_id
        self.heartbeat_interval = heartbeat_interval
        self.forward_timeout = forward_timeout
        self.fsync = fsync
        self.direct_io = direct_io
        self.spare_bytes = spare_bytes
        self.reserve_bytes = reserve_bytes
        self.background_interval = background_interval
        self.keys = keys
        self.max_connections = max_connections
        self.forward_reserve = forward_reserve
        self.frame_timeout = frame_timeout
        self.tls = tls

        self.node_id = ""
        self.data_address = ""  # advertised
        self.grpc_address = ""
        self.listen_address = ""  # bound
        self.grpc_listen_address = ""
        self._stores: dict[int, ChunkStore] = {}
        self._local: list[ChunkStore] = []
        self._view = RoutingView()
        self._view_lock = threading.Lock()
        self._have_routing = False
        self._lease = Lease()
        self._target_ids: list[int] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self.scrubber = (
            Scrubber(
                lambda: dict(self._stores),
                scrub_rate,
                self._report_damaged,
                self._stop,
                busy=lambda: self._data is not None and self._data.busy(),
            )
            if scrub_rate > 0
            else None
        )
        self._scrub_timing = (scrub_interval, scrub_delay)
        self._syncs: dict[int, threading.Thread] = {}
        self._sync_retry_at: dict[int, float] = {}
        self._data: DataServer | None = None
        self._grpc: grpc.Server | None = None

    # ------------------------------------------------------------------ state

    @property
    def stores(self) -> dict[int, ChunkStore]:
        """``{target id: ChunkStore}`` of the registered local targets."""
        return self._stores

    @property
    def routing(self) -> RoutingView:
        """The newest routing view the node knows."""
        return self._view

    def set_routing(self, routing) -> bool:
        """Adopt ``routing`` (a ``RoutingInfo``) if it is newer than the current one."""
        with self._view_lock:
            if self._have_routing and routing.version <= self._view.version:
                return False
            self._view = RoutingView.from_proto(routing)
            self._have_routing = True
            return True

    def fenced(self) -> bool:
        """Whether the node must not serve: the metaserver has not answered for too long.

        Each answered heartbeat (or registration) lets the node serve for the
        lease the metaserver grants, counted from when the request was sent.
        A node cut off from the metaserver, or paused, stops serving before
        the metaserver declares its targets offline, so a client with old
        routing never reads from it what the chain has since overwritten.
        """
        return self._lease.expired()

    @property
    def meta_address(self) -> str:
        """The metaserver node calls go to now."""
        return self.metaserver.meta_address

    @property
    def meta_addresses(self) -> list[str]:
        """The metaservers the node knows of."""
        return self.metaserver.meta_addresses

    def chain_of(self, target_id: int) -> int:
        return self._view.chain_of(target_id)

    def state_of(self, target_id: int) -> int:
        return self._view.state(target_id)

    def reports(self) -> list[cluster_pb2.TargetReport]:
        """The usage report of each local target, as heartbeats carry them."""
        io_counters = self._data.io_counters if self._data is not None else None
        return target_reports(self._local, self._target_ids, io_counters, self.scrubber)

    # ------------------------------------------------------------------ lifecycle

    def _load_node_id(self) -> str:
        return self._node_id_arg or load_node_id(self.data_dir)

    def start(self) -> bool:
        """Open the targets, start both servers, register (retrying) and start the loops.

        Returns False when :meth:`stop` was called before registration succeeded.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.node_id = self._load_node_id()
        for k in range(1, self.n_targets + 1):
            store = ChunkStore(
                self.data_dir / f"target-{k}",
                fsync=self.fsync,
                direct_io=self.direct_io,
                spare_bytes=self.spare_bytes,
                reserve_bytes=self.reserve_bytes,
            )
            self._local.append(store)
            self._target_ids.append(read_target_id(store.root / "target_id"))

        host, port = self.listen
        self._data = DataServer(
            host,
            port,
            stores=lambda: self._stores,
            routing=lambda: self._view,
            keys=self.keys,
            max_connections=self.max_connections,
            forward_reserve=self.forward_reserve,
            frame_timeout=self.frame_timeout,
            forward_timeout=self.forward_timeout,
            on_stale=self._wake.set,
            fenced=self.fenced,
        ).start()
        data_port = self._data.address[1]
        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="storage-grpc"),
            options=[("grpc.so_reuseport", 0)],
            interceptors=grpcauth.server_interceptors(
                *([AuthInterceptor(self.keys)] if self.keys is not None else [])
            ),
        )
        add_to_server(
            StorageServicer(
                self.node_id, lambda: self._stores, self.chain_of, state_of=self.state_of
            ),
            self._grpc,
        )
        ghost, gport = self.grpc_listen or (host, data_port + 1 if port else 0)
        try:
            bound = grpcauth.add_port(self._grpc, join_address(ghost, gport), self.tls)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {join_address(ghost, gport)}: {exc}") from exc
        if not bound:
            raise OSError(f"cannot listen on {join_address(ghost, gport)}")
        self._grpc.start()
        self.listen_address = join_address(host, data_port)
        self.grpc_listen_address = join_address(ghost, bound)
        adv_host = self.advertise[0] if self.advertise else host
        if adv_host in ("0.0.0.0", "::", ""):
            adv_host = socket.gethostname()
        adv_port = self.advertise[1] if self.advertise and self.advertise[1] else data_port
        self.data_address = join_address(adv_host, adv_port)
        self.grpc_address = join_address(adv_host, bound)

        self.metaserver.connect()
        if not self._register_until_done():
            return False
        loops = [("heartbeat", self._heartbeat_loop, ()), ("background", self._bg_loop, ())]
        if self.scrubber is not None:
            loops.append(("scrub", self.scrubber.run, self._scrub_timing))
        for name, target, args in loops:
            t = threading.Thread(target=target, args=args, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return True

    def stop(self) -> None:
        """Stop every thread and server; close the targets."""
        self._stop.set()
        self._wake.set()
        if self._data is not None:
            self._data.stop()
        if self._grpc is not None:
            self._grpc.stop(grace=1.0).wait(5)
        for t in self._threads + list(self._syncs.values()):
            t.join(timeout=10)
        self.metaserver.close()
        deadline = time.monotonic() + 5
        while self._data is not None and self._data.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        busy = any(t.is_alive() for t in self._syncs.values())
        if self._data is not None and self._data.connections or busy:
            log.warning("requests still running at shutdown; target stores left open")
            return
        for store in self._local:
            store.close()

    def request_stop(self) -> None:
        """Ask :meth:`start` and :meth:`wait` to return."""
        self._stop.set()
        self._wake.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`stop` is called (or ``timeout``); whether it was."""
        return self._stop.wait(timeout)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------------ metaserver

    def _register_once(self) -> None:
        req = cluster_pb2.RegisterNodeRequest(
            node_id=self.node_id,
            data_address=self.data_address,
            grpc_address=self.grpc_address,
            targets=self.reports(),
        )
        sent = time.monotonic()
        resp = self.metaserver.cluster.RegisterNode(req, timeout=RPC_TIMEOUT)
        if len(resp.target_ids) != len(self._local):
            raise RuntimeError(
                f"the metaserver returned {len(resp.target_ids)} target ids for "
                f"{len(self._local)} targets"
            )
        stores = {}
        for store, tid in zip(self._local, resp.target_ids, strict=True):
            if tid == 0 or tid in stores:
                raise RuntimeError(f"the metaserver returned an invalid target id {tid}")
            path = store.root / "target_id"
            if read_target_id(path) != tid:
                write_atomic(path, f"{tid}\n")
            stores[tid] = store
        self._target_ids = list(resp.target_ids)
        self._stores = stores
        for tid in stores:
            metrics.export_target(tid)
        self.set_routing(resp.routing)
        self._lease.extend(sent, resp.lease_seconds)
        self.metaserver.set_cluster_address(resp.cluster_address)
        log.info("registered node %s with targets %s", self.node_id, sorted(stores))

    def _register_until_done(self) -> bool:
        delay = 0.1
        while not self._stop.is_set():
            try:
                self._register_once()
                return True
            except grpc.RpcError as exc:
                log.warning("registration with %s failed: %s", self.meta_address, exc.details())
                if self.metaserver.follow(exc):
                    delay = 0.1
                    continue
            except Exception:
                log.exception("registration with %s failed", self.meta_address)
            self._stop.wait(delay)
            delay = min(delay * 2, 2.0)
        return False

    def heartbeat_once(self) -> None:
        """Send one heartbeat; register again when the metaserver asks."""
        req = cluster_pb2.HeartbeatRequest(
            node_id=self.node_id, targets=self.reports(), routing_version=self._view.version
        )
        sent = time.monotonic()
        resp = self.metaserver.heartbeat(req)
        if resp.reregister:
            log.warning("the metaserver does not know this node; registering again")
            self._register_once()
            return
        if resp.HasField("routing"):
            self.set_routing(resp.routing)
        self._lease.extend(sent, resp.lease_seconds)
        if self.scrubber is not None and resp.HasField("scrub"):
            self.scrubber.control(resp.scrub.paused, resp.scrub.start)

    def _heartbeat_following(self) -> None:
        """A heartbeat, sent on at once to the leader (or the next metaserver) where refused."""
        for _ in range(len(self.meta_addresses) + 1):
            try:
                self.heartbeat_once()
                return
            except grpc.RpcError as exc:
                if not self.metaserver.follow(exc):
                    raise
        self.heartbeat_once()

    def _heartbeat_loop(self) -> None:
        failing = False
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self._heartbeat_following()
                if failing:
                    log.warning("heartbeats reach the metaserver again")
                failing = False
            except grpc.RpcError as exc:
                if not failing:
                    log.warning("heartbeat failed: %s", exc.details())
                failing = True
            except Exception:
                log.exception("heartbeat failed")
            self._wake.wait(self.heartbeat_interval)
            if self._wake.is_set():
                self._stop.wait(0.05)  # coalesce bursts of routing refresh requests

    # ------------------------------------------------------------------ background work

    def _report_damaged(self, target_id: int, meta) -> None:
        """Tell the metaserver that a local chunk is damaged, so the target gets resynced."""
        req = cluster_pb2.ReportLostChunkRequest(
            chain_id=self._view.chain_of(target_id),
            target_id=target_id,
            inode=meta.inode,
            index=meta.index,
            length=meta.length,
        )
        try:
            self.metaserver.node_calls().ReportLostChunk(req, timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:  # readers report it again when they meet it
            log.warning("could not report damaged chunk %d:%d: %s", meta.inode, meta.index, exc)

    def background_once(self) -> None:
        """One round of garbage collection and resync scheduling."""
        view = self._view
        stores = dict(self._stores)
        # A target still being resynced collects once it serves: a copy of a chunk its source
        # had not collected yet could otherwise arrive after the target collected the inode.
        serving = {t: store for t, store in stores.items() if view.state(t) == SERVING}
        lane = self.metaserver.lane
        try:
            run_gc_once(
                self.metaserver.node_calls(),
                serving,
                {t: view.chain_of(t) for t in serving},
                hold=self._data.replica.truncating,
            )
        except grpc.RpcError as exc:
            log.info("garbage collection round failed: %s", exc.details())
        except Exception as exc:
            if isinstance(exc, ValueError) and self.metaserver.lane is not lane:
                # the cluster address moved (a metaserver restart): its channel closed mid-round
                log.info("garbage collection round cut short: %s", exc)
            else:
                log.exception("garbage collection round failed")
        now = time.monotonic()
        for task in rp.sync_tasks(view, stores):
            running = self._syncs.get(task.chain_id)
            if running is not None and running.is_alive():
                continue
            if now < self._sync_retry_at.get(task.chain_id, 0):
                continue
            t = threading.Thread(
                target=self._run_sync,
                args=(task, stores[task.target_id]),
                name=f"resync-{task.chain_id}",
                daemon=True,
            )
            self._syncs[task.chain_id] = t
            t.start()

    def _run_sync(self, task: rp.SyncTask, store: ChunkStore) -> None:
        def should_stop() -> bool:
            chain = self._view.chains.get(task.chain_id)
            if self.fenced():
                return True
            return self._stop.is_set() or chain is None or chain.version != task.chain_version

        replica = self._data.replica  # the chunk locks every local update takes
        chain_label = str(task.chain_id)
        metrics.RESYNC_RUNNING.labels(chain_label).set(1)
        try:
            counts = sync_successor(
                store,
                chain_id=task.chain_id,
                chain_version=task.chain_version,
                target_id=task.target_id,
                successor_target_id=task.successor.target_id,
                successor_data_address=task.successor.data_address,
                successor_grpc_address=task.successor.grpc_address,
                should_stop=should_stop,
                hold=lambda inode, index: replica.chunk(task.target_id, inode, index),
                on_damaged=lambda meta: self._report_damaged(task.target_id, meta),
                keys=self.keys,
                tls=self.tls,
            )
            resp = self.metaserver.node_calls().SyncDone(
                cluster_pb2.SyncDoneRequest(
                    chain_id=task.chain_id,
                    chain_version=task.chain_version,
                    target_id=task.successor.target_id,
                ),
                timeout=RPC_TIMEOUT,
            )
            self.set_routing(resp.routing)
            metrics.RESYNCS.labels("done").inc()
            metrics.RESYNC_CHUNKS.labels(chain_label, "copied").inc(counts.get("copied", 0))
            metrics.RESYNC_CHUNKS.labels(chain_label, "removed").inc(counts.get("removed", 0))
            log.info(
                "target %d of chain %d is in sync (%s)",
                task.successor.target_id,
                task.chain_id,
                counts,
            )
            self._sync_retry_at.pop(task.chain_id, None)
        except Exception as exc:
            metrics.RESYNCS.labels("failed").inc()
            if not self._stop.is_set():
                log.warning(
                    "resync of target %d (chain %d) failed, retrying: %s",
                    task.successor.target_id,
                    task.chain_id,
                    exc,
                )
            self._sync_retry_at[task.chain_id] = time.monotonic() + 1.0
            self._wake.set()
        finally:
            metrics.RESYNC_RUNNING.labels(chain_label).set(0)

    def _bg_loop(self) -> None:
        while not self._stop.wait(self.background_interval):
            try:
                self.background_once()
            except Exception:
                log.exception("background round failed")
