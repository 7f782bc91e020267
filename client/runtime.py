"""The part of a filesystem instance that belongs to one process: channel, sockets, threads.

A gRPC channel, data connections and a thread pool cannot cross ``os.fork``
(PyTorch DataLoader workers fork with the filesystem in hand).
:class:`Runtime` holds all of them, built from a client's options;
:class:`ProcessRuntime` hands every caller the runtime of its own process,
building one on first use and again in a forked child, where the parent's is
forgotten, never used or closed.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING

from emberfs.client.buffers import BlockPool
from emberfs.client.datapath import DataClient, LackingReplicas
from emberfs.client.handles import SessionLeases
from emberfs.client.meta import MetaClient
from emberfs.client.retry import RequestIds
from emberfs.client.routing import RoutingCache
from emberfs.common import wire
from emberfs.common.stalls import live_addresses

if TYPE_CHECKING:
    from emberfs.client.core import Client


class Runtime:
    """Everything that must not cross a fork: channel, sockets, threads.

    Parameters
    ----------
    client : Client
        Whose address, identity and options (timeouts, connections, workers,
        depths) it is built with.
    """

    def __init__(self, client: Client) -> None:
        opts = client.options
        self.pid = os.getpid()
        self.ids = RequestIds()
        self.meta = MetaClient(
            client.address,
            timeout=opts.rpc_timeout,
            retry_timeout=opts.retry_timeout,
            ids=self.ids,
            token=client.token,
            tls_ca=client.tls_ca,
            interceptors=opts.interceptors,
        )
        routing = self.routing = RoutingCache(self.meta.routing)
        self.pool = wire.ConnectionPool(
            connect_timeout=opts.connect_timeout,
            io_timeout=opts.io_timeout,
            max_per_address=opts.max_connections,
            # the servers the metaserver counts as up now (asked while a transfer stalls)
            live=lambda: live_addresses(routing.refresh(routing.get()).targets.values()),
            stall_check=opts.stall_check,
        )
        # replicas found without data another replica served, reported for repair
        self.lacking = LackingReplicas(partial(self.meta.cluster, "ReportLostChunk"))
        self.data = DataClient(
            self.routing,
            self.ids,
            self.pool,
            read_timeout=opts.read_timeout,
            write_timeout=opts.write_timeout,
            on_lacking=self.lacking,
            capabilities=self.meta.capabilities,
        )
        self.executor = ThreadPoolExecutor(opts.max_workers, thread_name_prefix="emberfs-io")
        # readahead block buffers, reused so a long read does not fault in fresh memory
        self.blocks = BlockPool((opts.readahead_depth + 2) * opts.default_block_size)
        # write-session lease renewal; its thread starts with the first open for write
        self.leases = SessionLeases(self.meta.renew_sessions, opts.session_renew_interval)

    def close(self) -> None:
        """Release it all (in a forked child: only forget the parent's channel)."""
        if self.pid != os.getpid():
            self.meta.abandon()
            return
        self.leases.stop()
        self.lacking.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.blocks.clear()
        self.pool.close()
        self.meta.close()


class ProcessRuntime:
    """The :class:`Runtime` of the calling process, built on first use.

    Parameters
    ----------
    client : Client
        The client a runtime is built for, when it is built.
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._rt: Runtime | None = None
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()

    def get(self) -> Runtime:
        """This process's runtime, built now if it has none (after a fork, or a close)."""
        rt = self._rt
        pid = os.getpid()
        if rt is not None and rt.pid == pid:
            return rt
        if self._lock_pid != pid:
            # a lock inherited across fork may be held by a thread that does not exist here
            self._lock = threading.Lock()
            self._lock_pid = pid
        with self._lock:
            rt = self._rt
            if rt is None or rt.pid != pid:
                if rt is not None:
                    rt.close()  # in a child: only forgets the parent's objects
                rt = self._rt = Runtime(self._client)
            return rt

    def current(self) -> Runtime | None:
        """This process's runtime if it has one, without building it."""
        rt = self._rt
        if rt is not None and rt.pid == os.getpid():
            return rt
        return None

    def close(self) -> None:
        """Release connections and threads; the next :meth:`get` builds a new runtime."""
        with self._lock:
            rt, self._rt = self._rt, None
        if rt is not None:
            rt.close()
