"""Talking to an etcd cluster: what an etcd:// URL says (:class:`EtcdSettings`) and
synchronous calls to its v3 gRPC API that move between its endpoints (:class:`EtcdClient`).

The etcd v3 API is called through the gRPC bindings the ``aetcd`` package carries (generated
from etcd's own ``.proto`` files). A call goes to one endpoint and moves to the next when that
one is down, has no leader or times out, within one deadline for the whole call; a failure no
other endpoint would cure is a typed error (:func:`store_error`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import grpc

from emberfs.common import errors
from emberfs.common.addresses import split_address
from emberfs.metaserver.store.kv import (
    Conflict,
    TransactionTooLarge,
)

log = logging.getLogger(__name__)


DEFAULT_PREFIX = "/emberfs/"
DEFAULT_TIMEOUT = 5.0
DEFAULT_MAX_TXN_OPS = 128  # etcd's --max-txn-ops default
DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024  # etcd's --max-request-bytes default
REQUEST_MARGIN = 4096  # bytes of a request that are not keys and values

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.enable_retries", 0),
    # an endpoint that comes back is used again within a second, not after gRPC's
    # default backoff of up to two minutes
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 3000),
]

# Failures after which the same call may go to another endpoint: the endpoint is down,
# its member has no leader, or it did not answer in time. (A member that waited for a
# quorum past its own deadline answers UNKNOWN "context deadline exceeded".)
_FAILOVER_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
    }
)


def etcd_rpc():
    """etcd's v3 API messages and stubs (imported on first use: only servers on etcd need them)."""
    from aetcd.rpc import rpc_pb2, rpc_pb2_grpc

    return rpc_pb2, rpc_pb2_grpc


@dataclass(frozen=True)
class EtcdSettings:
    """What an ``etcd://`` URL says: endpoints, key prefix, limits and the call deadline."""

    endpoints: tuple[str, ...]
    prefix: bytes = DEFAULT_PREFIX.encode()
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def parse(cls, url: str) -> EtcdSettings:
        """``etcd://HOST:PORT[,HOST:PORT...][/PREFIX][?max_txn_ops=N&timeout=S]``.

        ValueError for anything else. The prefix always ends with ``/``.
        """
        parts = urlsplit(url)
        if parts.scheme != "etcd":
            raise ValueError(f"{url!r} is not an etcd:// URL")
        endpoints = tuple(e.strip() for e in parts.netloc.split(",") if e.strip())
        if not endpoints:
            raise ValueError(f"{url!r} names no etcd endpoint")
        for endpoint in endpoints:
            host, port = split_address(endpoint)
            if not host or not port:
                raise ValueError(f"etcd endpoint {endpoint!r} is not HOST:PORT")
        path = parts.path.strip("/")
        prefix = f"/{path}/" if path else DEFAULT_PREFIX
        query = parse_qs(parts.query, strict_parsing=False)
        unknown = set(query) - {"max_txn_ops", "max_request_bytes", "timeout"}
        if unknown:
            raise ValueError(f"unknown etcd URL parameters: {', '.join(sorted(unknown))}")

        def number(name: str, default, kind):
            if name not in query:
                return default
            try:
                value = kind(query[name][-1])
            except ValueError:
                raise ValueError(f"etcd URL parameter {name} is not a number") from None
            if not value > 0:
                raise ValueError(f"etcd URL parameter {name} must be positive")
            return value

        return cls(
            endpoints=endpoints,
            prefix=prefix.encode(),
            max_txn_ops=number("max_txn_ops", DEFAULT_MAX_TXN_OPS, int),
            max_request_bytes=number("max_request_bytes", DEFAULT_MAX_REQUEST_BYTES, int),
            timeout=number("timeout", DEFAULT_TIMEOUT, float),
        )

    @property
    def url(self) -> str:
        """The URL these settings came from (in its canonical form)."""
        text = f"etcd://{','.join(self.endpoints)}{self.prefix.decode().rstrip('/')}"
        params = []
        if self.max_txn_ops != DEFAULT_MAX_TXN_OPS:
            params.append(f"max_txn_ops={self.max_txn_ops}")
        if self.max_request_bytes != DEFAULT_MAX_REQUEST_BYTES:
            params.append(f"max_request_bytes={self.max_request_bytes}")
        if self.timeout != DEFAULT_TIMEOUT:
            params.append(f"timeout={self.timeout:g}")
        return text + ("/?" + "&".join(params) if params else "")


def is_etcd_url(text: str) -> bool:
    return text.startswith("etcd://")


class EtcdClient:
    """Synchronous calls to an etcd cluster's v3 gRPC API, moving between its endpoints.

    One channel per endpoint, made on first use. :meth:`call` sends a request
    to the endpoint that answered last and, when it is down, has no leader or
    does not answer, to the next, until the call's deadline.
    """

    def __init__(self, endpoints: tuple[str, ...], timeout: float = DEFAULT_TIMEOUT) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = tuple(endpoints)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._channels: dict[int, grpc.Channel] = {}
        self._stubs: dict[tuple[int, str], object] = {}
        self._current = 0
        self._closed = False

    def stub(self, index: int, service: str):
        """The stub of ``service`` on endpoint ``index`` (its channel made on first use)."""
        key = (index, service)
        stub = self._stubs.get(key)
        if stub is not None:
            return stub
        _, rpc_grpc = etcd_rpc()
        with self._lock:
            if self._closed:
                raise errors.Unavailable("the metadata store's client is closed")
            channel = self._channels.get(index)
            if channel is None:
                channel = grpc.insecure_channel(self.endpoints[index], options=_CHANNEL_OPTIONS)
                self._channels[index] = channel
            stub = self._stubs.get(key)
            if stub is None:
                stub = getattr(rpc_grpc, f"{service}Stub")(channel)
                self._stubs[key] = stub
            return stub

    def call(
        self,
        service: str,
        method: str,
        request,
        *,
        timeout: float | None = None,
        stream: bool = False,
    ):
        """``service.method(request)`` on the first endpoint that answers; the response.

        ``stream``: a streaming method, sent ``request`` alone; its first answer
        is the response. A failure another endpoint would not cure raises its
        typed error (:func:`store_error`); no endpoint answering before the
        deadline raises :class:`~emberfs.common.errors.Unavailable`.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        start = self._current
        n = len(self.endpoints)
        last: grpc.RpcError | None = None
        attempt = 0
        while True:
            index = (start + attempt) % n
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                fn = getattr(self.stub(index, service), method)
                if stream:
                    response = next(iter(fn(iter([request]), timeout=left)), None)
                    if response is None:
                        raise errors.Unavailable(f"etcd's {method} stream ended without an answer")
                else:
                    response = fn(request, timeout=left)
            except grpc.RpcError as exc:
                if exc.code() not in _FAILOVER_CODES:
                    raise store_error(exc) from None
                last = exc
                attempt += 1
                if attempt % n == 0:
                    # every endpoint failed once: wait a moment before the next round
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                continue
            if index != self._current:
                log.info("etcd endpoint %s answers", self.endpoints[index])
                self._current = index
            return response
        detail = f"{last.code().name}: {last.details()}" if last is not None else "no answer"
        raise errors.Unavailable(
            f"the metadata store (etcd at {','.join(self.endpoints)}) is unavailable: {detail}"
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, {}
            self._stubs.clear()
        for channel in channels.values():
            channel.close()


def store_error(exc: grpc.RpcError) -> Exception:
    """The typed error of an etcd call's failure that no other endpoint would cure."""
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.OUT_OF_RANGE:
        # "required revision has been compacted" / "is a future revision": run again
        return Conflict(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.NoSpace(
            f"the metadata store (etcd) is full ({details}); compact and defragment it, or "
            "raise its --quota-backend-bytes"
        )
    if code == grpc.StatusCode.INVALID_ARGUMENT and (
        "too many operations" in details or "too large" in details
    ):
        return TransactionTooLarge(f"the metadata store (etcd) refused a transaction: {details}")
    return errors.Internal(f"the metadata store (etcd) failed: {code.name}: {details}")
