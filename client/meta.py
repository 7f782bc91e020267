"""The client's control plane: gRPC stubs for the metaserver and request contexts.

:class:`MetaClient` owns a gRPC channel to the metaserver (``MetaService``
and ``ClusterService`` share it). The channel is created lazily and belongs to
the process that created it: after ``os.fork`` the child builds its own
(gRPC channels are not fork-safe) and gets a fresh client id, so request ids
of parent and child never collide in the metaserver's idempotency table.
Every call goes through :func:`emberfs.client.retry.retry` and carries the
request ids of :class:`~emberfs.client.retry.RequestIds`.

Given several metaservers (``h1:p1,h2:p2``: metaservers sharing one etcd
store), the client talks to one and moves to the next when a call to it fails
in a way that another may not (it is gone, does not answer in time, or cannot
reach the store). The retry keeps its request id, and the idempotency records
live in the shared store, so a mutating call retried on another metaserver is
applied once.

Concurrent namespace changes of one client ride together: while a write
open, a create or a close of some thread is in flight, the same calls of
other threads wait and then go as one batch call (``BatchWriteOpen``,
``BatchCreate``, ``BatchClose``; :class:`~emberfs.client.combiner.Combiner`),
each item with a request id and an answer of its own. A call made alone is sent alone, so a
single thread sees the latency of one call, and many threads share round
trips and WAL syncs.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator, Sequence

import grpc

from emberfs.client import config
from emberfs.client.capabilities import Capabilities
from emberfs.client.combiner import Combiner
from emberfs.client.retry import RequestIds, retry
from emberfs.common import errors, grpcauth
from emberfs.common.addresses import split_addresses
from emberfs.common.grpcauth import TLSFiles
from emberfs.proto import cluster_pb2, cluster_pb2_grpc, common_pb2, meta_pb2, meta_pb2_grpc

#: Paths (or sessions) per ``BatchOpen``, ``BatchWriteOpen``, ``BatchClose`` or
#: ``BatchRemove`` call (the metaserver takes up to 10000).
BATCH_OPEN = 1000

# Channels of a parent process, kept referenced in a forked child so their
# finalisers never run there (closing a channel inherited across fork is unsafe).
_INHERITED: list[object] = []


class MetaClient:
    """Stubs for ``MetaService`` and ``ClusterService`` on one metaserver.

    Parameters
    ----------
    address : str
        ``host:port`` of the metaserver, or several, comma-separated
        (metaservers of one shared store, tried in turn).
    timeout : float, default 30.0
        Deadline of each call in seconds.
    retry_timeout : float, default 30.0
        How long calls are retried while the metaserver is unavailable.
    ids : RequestIds or None
        Client and request ids; a new set when None.
    token : str or None
        The client's token, sent with every call; None reads ``EMBERFS_TOKEN``,
        then the client config file.
    tls_ca : str or None
        CA certificate (PEM path) of a metaserver that speaks TLS.
    interceptors : tuple
        gRPC client interceptors wrapped around every channel (tracing, or
        faults injected by tests).

    Attributes
    ----------
    capabilities : Capabilities
        The chunk capabilities of the files opened through this client.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 30.0,
        retry_timeout: float = 30.0,
        ids: RequestIds | None = None,
        token: str | None = None,
        tls_ca: str | None = None,
        interceptors: tuple = (),
    ) -> None:
        self.addresses = split_addresses(address)
        self.interceptors = tuple(interceptors)
        self._current = 0  # the metaserver calls go to
        self.token = token if token is not None else config.default_token()
        # sent with every call (as call metadata: a channel interceptor costs every call more)
        self._metadata = grpcauth.token_metadata(self.token)
        self.tls = TLSFiles(ca=tls_ca) if tls_ca else None
        self.capabilities = Capabilities(self.authorize)
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.ids = ids or RequestIds()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._channels: dict[int, grpc.Channel] = {}
        self._stub_pairs: dict[
            int, tuple[meta_pb2_grpc.MetaServiceStub, cluster_pb2_grpc.ClusterServiceStub]
        ] = {}
        self._uid = os.getuid()
        self._gid = os.getgid()
        self._groups = [g for g in os.getgroups() if g != self._gid]
        self._combiners: dict[tuple, Combiner] = {}

    # channel -----------------------------------------------------------------
    @property
    def address(self) -> str:
        """The metaserver calls go to now."""
        return self.addresses[self._current]

    def _stubs(
        self, index: int | None = None
    ) -> tuple[meta_pb2_grpc.MetaServiceStub, cluster_pb2_grpc.ClusterServiceStub]:
        if self._pid != os.getpid():
            raise RuntimeError("a MetaClient cannot be used across fork; make a new one")
        index = self._current if index is None else index
        pair = self._stub_pairs.get(index)
        if pair is not None:
            return pair
        with self._lock:
            if index not in self._stub_pairs:
                channel = grpcauth.channel(
                    self.addresses[index],
                    tls=self.tls,
                    options=[
                        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                        ("grpc.enable_retries", 0),
                        # a metaserver that comes back is reached again within a second
                        ("grpc.initial_reconnect_backoff_ms", 100),
                        ("grpc.min_reconnect_backoff_ms", 100),
                        ("grpc.max_reconnect_backoff_ms", 1000),
                    ],
                )
                self._channels[index] = channel
                if self.interceptors:
                    channel = grpc.intercept_channel(channel, *self.interceptors)
                self._stub_pairs[index] = (
                    meta_pb2_grpc.MetaServiceStub(channel),
                    cluster_pb2_grpc.ClusterServiceStub(channel),
                )
            return self._stub_pairs[index]

    def _fail_over(self, failed: int) -> None:
        """Calls to metaserver ``failed`` fail: send them to the next one (if any)."""
        if len(self.addresses) > 1:
            with self._lock:
                if self._current == failed:
                    self._current = (failed + 1) % len(self.addresses)

    def close(self) -> None:
        """Close the channels (in the process that created them)."""
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
            self._stub_pairs.clear()
        for channel in channels:
            if self._pid == os.getpid():
                channel.close()
            else:
                _INHERITED.append(channel)

    def abandon(self) -> None:
        """Drop the channels without closing them (used in a forked child)."""
        with self._lock:
            _INHERITED.extend(self._channels.values())
            self._channels.clear()
            self._stub_pairs.clear()

    # calls -------------------------------------------------------------------
    def context(self, ids: int = 1) -> common_pb2.RequestContext:
        """A request context with the next request id (the first of ``ids`` reserved)."""
        return common_pb2.RequestContext(
            client_id=self.ids.client_id,
            request_id=self.ids.next(ids),
            uid=self._uid,
            gid=self._gid,
            groups=self._groups,
        )

    def _call(self, service: str, method: str, request, path: str | None = None):
        """Call ``method`` with retries; failures become builtin OSError subclasses."""

        tried = [self._current]

        def once():
            tried[0] = index = self._current
            stub = self._stubs(index)[0 if service == "meta" else 1]
            return getattr(stub, method)(request, timeout=self.timeout, metadata=self._metadata)

        try:
            return retry(
                once, timeout=self.retry_timeout, on_retry=lambda exc: self._fail_over(tried[0])
            )
        except grpc.RpcError as exc:
            raise errors.from_grpc(exc, path) from None

    def meta(self, method: str, request, path: str | None = None):
        """Call a ``MetaService`` method (with retries and error mapping)."""
        return self._call("meta", method, request, path)

    def cluster(self, method: str, request):
        """Call a ``ClusterService`` method (with retries and error mapping)."""
        return self._call("cluster", method, request)

    # MetaService helpers -----------------------------------------------------
    def stat(self, path: str, follow: bool = True) -> common_pb2.InodeAttr:
        """Attributes of ``path``."""
        req = meta_pb2.StatRequest(ctx=self.context(), path=path, follow=follow)
        return self.meta("Stat", req, path).attr

    def stat_inode(self, inode: int, path: str | None = None) -> common_pb2.InodeAttr:
        """Attributes of inode ``inode`` (``path`` names it in errors)."""
        req = meta_pb2.StatRequest(ctx=self.context(), inode=inode)
        return self.meta("Stat", req, path).attr

    def _combined(self, key: tuple, item, send):
        """``item`` sent by the :class:`Combiner` of ``key`` (made with ``send`` once)."""
        combiner = self._combiners.get(key)
        if combiner is None:
            with self._lock:
                combiner = self._combiners.setdefault(key, Combiner(send))
        return combiner.call(item)

    def open(self, path: str, flags: int, mode: int = 0o644) -> meta_pb2.OpenResponse:
        """Open ``path`` (one round trip: attributes, layout, write session).

        Write opens of several threads at once go together (``BatchWriteOpen``).
        """
        if flags & (meta_pb2.OPEN_WRITE | meta_pb2.OPEN_APPEND | meta_pb2.OPEN_TRUNCATE):

            def send(paths: list[str]) -> list:
                if len(paths) == 1:
                    return [self._open_one(paths[0], flags, mode)]
                return self.batch_write_open(paths, flags, mode)

            return self._combined(("open", flags, mode), path, send)
        return self._open_one(path, flags, mode)

    def _open_one(self, path: str, flags: int, mode: int) -> meta_pb2.OpenResponse:
        req = meta_pb2.OpenRequest(ctx=self.context(), path=path, flags=flags, mode=mode)
        return self._opened(self.meta("Open", req, path))

    def create(self, path: str, mode: int = 0o644, exclusive: bool = False) -> common_pb2.InodeAttr:
        """Create the file ``path`` (a non-exclusive create of an existing file returns it).

        Creates of several threads at once go together (``BatchCreate``).
        """

        def send(items: list[tuple[str, int]]) -> list:
            if len(items) == 1:
                ((p, m),) = items
                req = meta_pb2.CreateRequest(
                    ctx=self.context(), path=p, mode=m, exclusive=exclusive
                )
                return [self.meta("Create", req, p).attr]
            return self._batched(
                "BatchCreate",
                items,
                [p for p, _ in items],
                lambda part: meta_pb2.BatchCreateRequest(
                    ctx=self.context(len(part)),
                    items=[
                        meta_pb2.CreateRequest(path=p, mode=m, exclusive=exclusive) for p, m in part
                    ],
                ),
                lambda r: r.attr,
            )

        return self._combined(("create", exclusive), (path, mode), send)

    def authorize(self, inode: int, session_id: int = 0) -> bytes:
        """A fresh chunk capability for ``inode`` (read; write through ``session_id``)."""
        req = meta_pb2.AuthorizeRequest(ctx=self.context(), inode=inode, session_id=session_id)
        return self.meta("Authorize", req).capability

    def _opened(self, resp: meta_pb2.OpenResponse) -> meta_pb2.OpenResponse:
        if resp.attr.type == common_pb2.FILE:  # only files have chunks, and capabilities
            self.capabilities.learn(resp.capability, resp.session_id)
        return resp

    def _read_opened(self, result: meta_pb2.BatchStatResult) -> common_pb2.InodeAttr:
        if result.attr.type == common_pb2.FILE:
            self.capabilities.learn(result.capability)
        return result.attr

    def batch_open(self, paths: Sequence[str]) -> list[common_pb2.InodeAttr | OSError]:
        """Read-only opens of many paths, :data:`BATCH_OPEN` to a round trip.

        One entry per path, in order: its attributes (layout and size
        included), or the OSError subclass a single read-only open would raise.
        """
        return self._batched(
            "BatchOpen",
            paths,
            paths,
            lambda part: meta_pb2.BatchOpenRequest(ctx=self.context(), paths=part),
            self._read_opened,
        )

    def batch_write_open(
        self,
        paths: Sequence[str],
        flags: int,
        mode: int = 0o644,
        reserve: dict[str, int] | None = None,
    ) -> list[meta_pb2.OpenResponse | OSError]:
        """Write opens of many paths with ``flags``, :data:`BATCH_OPEN` to a round trip.

        One entry per path, in order: what ``Open`` returns, or the OSError
        subclass it would raise. Each path has a request id of its own, so a
        retried call opens nothing twice. ``reserve``: path -> the length to be
        written, reserved in the file's quota at the open (EDQUOT for that path).
        """
        return self._batched(
            "BatchWriteOpen",
            paths,
            paths,
            lambda part: meta_pb2.BatchWriteOpenRequest(
                ctx=self.context(len(part)),
                paths=part,
                flags=flags,
                mode=mode,
                reserve=[reserve[p] for p in part] if reserve else (),
            ),
            lambda r: self._opened(r.opened),
        )

    def batch_close(
        self, items: Sequence[tuple[int, int, int, bool]], paths: Sequence[str]
    ) -> list[common_pb2.InodeAttr | OSError]:
        """End many write sessions, :data:`BATCH_OPEN` to a round trip.

        ``items`` are ``(inode, session_id, length, wrote)`` as for
        :meth:`close_file`, ``paths`` name them in errors. One entry per item,
        in order: the file's attributes, or the OSError subclass ``Close``
        would raise.
        """
        return self._batched(
            "BatchClose",
            items,
            paths,
            lambda part: meta_pb2.BatchCloseRequest(
                ctx=self.context(len(part)),
                items=[
                    meta_pb2.CloseItem(inode=n, session_id=s, length=length, wrote=w)
                    for n, s, length, w in part
                ],
            ),
            lambda r: r.attr,
        )

    def _batched(self, method: str, items: Sequence, paths: Sequence[str], request, value) -> list:
        """``method`` over ``items``, :data:`BATCH_OPEN` to a call: per item its value or OSError.

        ``request(part)`` makes the request of a list of items, ``value(result)``
        picks what a successful item's result gives, ``paths`` name the items
        in errors.
        """
        out: list = []
        for i in range(0, len(items), BATCH_OPEN):
            part = list(items[i : i + BATCH_OPEN])
            results = self.meta(method, request(part)).results
            if len(results) != len(part):
                raise OSError(errno.EIO, f"{method} answered for the wrong number of items")
            for path, r in zip(paths[i : i + BATCH_OPEN], results, strict=True):
                out.append(errors.oserror(r.errno, "", path) if r.errno else value(r))
        return out

    def close_file(
        self, inode: int, session_id: int, length: int, wrote: bool, path: str | None = None
    ) -> common_pb2.InodeAttr:
        """End a write session, making the length exact when ``wrote``.

        Closes of several threads at once go together (``BatchClose``).
        """
        return self._combined(("close",), (inode, session_id, length, wrote, path), self._close)

    def _close(self, items: list[tuple]) -> list:
        if len(items) == 1:
            ((inode, session_id, length, wrote, path),) = items
            req = meta_pb2.CloseRequest(
                ctx=self.context(), inode=inode, session_id=session_id, length=length, wrote=wrote
            )
            return [self.meta("Close", req, path).attr]
        return self.batch_close([i[:4] for i in items], [i[4] for i in items])

    def sync(
        self, inode: int, session_id: int, length: int, path: str | None = None
    ) -> common_pb2.InodeAttr:
        """Make the length exact while the session stays open."""
        req = meta_pb2.SyncRequest(
            ctx=self.context(), inode=inode, session_id=session_id, length=length
        )
        return self.meta("Sync", req, path).attr

    def renew_sessions(self, sessions: list[tuple[int, int]]) -> set[tuple[int, int]]:
        """Renew the leases of ``(inode, session_id)`` write sessions in one call.

        Returns the sessions the metaserver no longer has (expired or closed).
        """
        req = meta_pb2.RenewSessionsRequest(
            ctx=self.context(),
            sessions=[meta_pb2.SessionRef(inode=i, session_id=s) for i, s in sessions],
        )
        resp = self.meta("RenewSessions", req)
        return {(ref.inode, ref.session_id) for ref in resp.expired}

    def list(self, path: str, page: int = 2000) -> Iterator[meta_pb2.DirEntry]:
        """Every entry of directory ``path``, page by page, with attributes."""
        start_after = ""
        while True:
            req = meta_pb2.ListRequest(
                ctx=self.context(), path=path, start_after=start_after, limit=page
            )
            resp = self.meta("List", req, path)
            yield from resp.entries
            if not resp.more or not resp.entries:
                return
            start_after = resp.entries[-1].name

    def mkdir(self, path: str, parents: bool, mode: int = 0o755) -> common_pb2.InodeAttr:
        req = meta_pb2.MkdirRequest(ctx=self.context(), path=path, mode=mode, parents=parents)
        return self.meta("Mkdir", req, path).attr

    def remove(
        self, path: str, recursive: bool = False, directory: bool = False, skip_trash: bool = False
    ) -> int:
        """Remove ``path``; ``skip_trash`` deletes it even when the metaserver keeps a trash."""
        req = meta_pb2.RemoveRequest(
            ctx=self.context(),
            path=path,
            recursive=recursive,
            directory=directory,
            skip_trash=skip_trash,
        )
        return self.meta("Remove", req, path).removed

    def batch_remove(
        self,
        paths: Sequence[str],
        recursive: bool = False,
        inodes: Sequence[int] = (),
        skip_trash: bool = False,
    ) -> list[int | OSError]:
        """Remove many paths in order, :data:`BATCH_OPEN` to a round trip.

        One entry per path: the number of entries removed, or the OSError
        subclass ``Remove`` would raise. ``inodes`` (one per path) removes
        each path only while it names that inode (FileNotFoundError otherwise);
        ``skip_trash`` as for :meth:`remove`.
        """
        items = list(zip(paths, inodes, strict=True)) if inodes else [(p, 0) for p in paths]
        return self._batched(
            "BatchRemove",
            items,
            paths,
            lambda part: meta_pb2.BatchRemoveRequest(
                ctx=self.context(len(part)),
                paths=[p for p, _ in part],
                recursive=recursive,
                inodes=[i for _, i in part] if inodes else [],
                skip_trash=skip_trash,
            ),
            lambda r: r.removed,
        )

    def rename(
        self, src: str, dst: str, no_replace=False, exchange=False, skip_trash=False
    ) -> common_pb2.InodeAttr:
        """Move ``src`` to ``dst``; with ``exchange`` swap the two (both must exist).

        ``skip_trash`` deletes a replaced ``dst`` even when the metaserver keeps a trash.
        """
        req = meta_pb2.RenameRequest(ctx=self.context(), src=src, dst=dst, no_replace=no_replace)
        req.exchange, req.skip_trash = exchange, skip_trash
        return self.meta("Rename", req, src).attr

    def truncate(self, path: str, length: int, inode: int = 0) -> common_pb2.InodeAttr:
        """Set the length of the file at ``path``, or of inode ``inode`` (``path`` names it)."""
        req = meta_pb2.TruncateRequest(ctx=self.context(), path=path, length=length, inode=inode)
        return self.meta("Truncate", req, path).attr

    def setattr(self, path: str, **fields) -> common_pb2.InodeAttr:
        req = meta_pb2.SetAttrRequest(ctx=self.context(), path=path, **fields)
        return self.meta("SetAttr", req, path).attr

    def symlink(self, path: str, target: str) -> common_pb2.InodeAttr:
        req = meta_pb2.SymlinkRequest(ctx=self.context(), path=path, target=target)
        return self.meta("Symlink", req, path).attr

    def hardlink(self, src: str, dst: str) -> common_pb2.InodeAttr:
        """A second name ``dst`` for the file ``src``."""
        req = meta_pb2.HardlinkRequest(ctx=self.context(), src=src, dst=dst)
        return self.meta("Hardlink", req, dst).attr

    def statfs(self, path: str = "") -> meta_pb2.StatFsResponse:
        """Capacity and usage; with ``path``, those of the quota over it where one applies."""
        return self.meta("StatFs", meta_pb2.StatFsRequest(ctx=self.context(), path=path), path)

    def ping(self) -> None:
        self.meta("Ping", meta_pb2.PingRequest())

    # ClusterService ----------------------------------------------------------
    def routing(self, known_version: int = 0) -> common_pb2.RoutingInfo:
        """The cluster's routing info (targets, chains)."""
        req = cluster_pb2.GetRoutingRequest(known_version=known_version)
        return self.cluster("GetRouting", req).routing
