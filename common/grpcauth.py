"""Authenticated gRPC: channels that present credentials, and the servers' check of them.

A call between servers carries a server credential (:meth:`ClusterKeys.call_signer
<emberfs.common.auth.ClusterKeys.call_signer>`: a MAC of the method, the time,
a nonce and the request's bytes); a client's call carries its token
(``authorization: Bearer <token>``). :class:`AuthInterceptor` checks them on
the servers before a handler runs, by the rule of each method
(:data:`SERVER_ONLY`, :data:`EITHER`, everything else of ``MetaService``:
a token). For a token it puts the token's identity in the request's context
(uid, gid, groups), so the permission checks use that identity and never what
the client claims.

With TLS (:class:`TLSFiles`) the same credentials travel encrypted.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from emberfs.common import errors
from emberfs.common.auth import CALL_KEY, TOKEN_KEY, AuthError, ClusterKeys, ServerCallSigner

#: methods only servers may call
SERVER_ONLY = frozenset(
    {
        "/emberfs.ClusterService/RegisterNode",
        "/emberfs.ClusterService/Heartbeat",
        "/emberfs.ClusterService/SyncDone",
        "/emberfs.ClusterService/FetchGC",
        "/emberfs.ClusterService/AckGC",
        "/emberfs.StorageService/ListChunks",
        "/emberfs.StorageService/RemoveChunks",
        "/emberfs.StorageService/TargetStats",
    }
)
#: methods that servers and clients (with a token) may call
EITHER = frozenset(
    {
        "/emberfs.ClusterService/GetRouting",
        # a client that found a replica lacking data; the metaserver checks the claim itself
        "/emberfs.ClusterService/ReportLostChunk",
    }
)
_CLIENT_SERVICE = "/emberfs.MetaService/"


@dataclass(frozen=True)
class TLSFiles:
    """Paths of PEM files: a server's certificate and key, and the CA that clients trust."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        if not (self.cert and self.key):
            raise ValueError("TLS needs a certificate and a key")
        pair = (Path(self.key).read_bytes(), Path(self.cert).read_bytes())
        return grpc.ssl_server_credentials([pair])

    def channel_credentials(self) -> grpc.ChannelCredentials:
        ca = Path(self.ca).read_bytes() if self.ca else None
        return grpc.ssl_channel_credentials(root_certificates=ca)


class _Details(
    collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials")),
    grpc.ClientCallDetails,
):
    pass


class _Credentials(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds a server credential (signed per call) or a client token to every call."""

    def __init__(self, signer: ServerCallSigner | None, token: str | None) -> None:
        self._signer = signer
        self._token = token_metadata(token)

    def _details(self, details: grpc.ClientCallDetails, request: Any) -> _Details:
        metadata = list(details.metadata or ())
        if self._signer is not None:
            raw = request.SerializeToString(deterministic=True)
            metadata.append(self._signer.metadata(details.method, raw))
        metadata.extend(self._token)
        return _Details(details.method, details.timeout, metadata, details.credentials)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details, request), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details, request), request)


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents ``token`` (none without one)."""
    return ((TOKEN_KEY, f"Bearer {token}"),) if token else ()


def channel(
    address: str,
    *,
    keys: ClusterKeys | None = None,
    token: str | None = None,
    tls: TLSFiles | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A channel to ``address`` whose calls carry a server credential (``keys``) or ``token``."""
    opts = list(options)
    if tls is not None and tls.ca is not None:
        raw = grpc.secure_channel(address, tls.channel_credentials(), options=opts)
    else:
        raw = grpc.insecure_channel(address, options=opts)
    if keys is None and not token:
        return raw
    signer = keys.call_signer() if keys is not None else None
    return grpc.intercept_channel(raw, _Credentials(signer, token))


def add_port(server: grpc.Server, address: str, tls: TLSFiles | None = None) -> int:
    """Bind ``server`` to ``address`` (with TLS when ``tls`` has a certificate); the port."""
    if tls is not None and tls.cert:
        return server.add_secure_port(address, tls.server_credentials())
    return server.add_insecure_port(address)


class MethodWrapper(grpc.ServerInterceptor):
    """An interceptor that wraps each unary method's handler once and keeps the wrapper.

    grpcio asks the interceptors for the handler of every call; building the
    wrapper once per method (for the handler the inner interceptors return)
    keeps that out of every call's cost. Subclasses define :meth:`wrap`.
    """

    def __init__(self) -> None:
        self._kept: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        raise NotImplementedError

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method
        kept = self._kept.get(method)
        if kept is not None and kept[0] is handler:
            return kept[1]
        wrapped = self.wrap(method, handler)
        self._kept[method] = (handler, wrapped)  # only methods the server has: bounded
        return wrapped


class DecodeInHandler(MethodWrapper):
    """Decodes every request in its handler instead of in grpcio; install it first.

    grpcio keeps the call of a request that its deserializer fails on (about
    16 KiB each, for good): anyone who reaches the port could grow the server
    without bound with requests that do not decode. Decoded here, such a request
    is answered ``INVALID_ARGUMENT`` (errno EINVAL) and nothing is kept.
    """

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.request_deserializer is None:
            return handler
        decode = handler.request_deserializer
        behavior = handler.unary_unary

        def decoded(raw: bytes, context: grpc.ServicerContext):
            try:
                request = decode(raw)
            except Exception as exc:
                err = errors.InvalidArgument(f"the request does not decode: {exc}")
                context.set_trailing_metadata(((errors.ERRNO_KEY, str(err.errno)),))
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, err.message)
            return behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            decoded, request_deserializer=None, response_serializer=handler.response_serializer
        )


def server_interceptors(*inner: grpc.ServerInterceptor) -> list[grpc.ServerInterceptor]:
    """The interceptors of an EmberFS gRPC server: request decoding first, then ``inner``."""
    return [DecodeInHandler(), *inner]


def _refuse(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    err = errors.PermissionDenied(message)
    context.set_trailing_metadata(((errors.ERRNO_KEY, str(err.errno)),))
    context.abort(code, message)


class AuthInterceptor(MethodWrapper):
    """Refuses calls without valid credentials before their handler runs.

    Parameters
    ----------
    keys : ClusterKeys
        The cluster's keys (server credentials).
    resolve_token : callable, optional
        ``resolve_token(token)`` -> an identity with ``uid``, ``gid`` and
        ``groups``, or None for an unknown or revoked token. Without it no
        token is accepted (a storage server's services are for servers only).
    """

    def __init__(
        self, keys: ClusterKeys, resolve_token: Callable[[str], Any] | None = None
    ) -> None:
        super().__init__()
        self._keys = keys
        self._resolve = resolve_token

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        behavior = handler.unary_unary
        server_ok = (
            method in SERVER_ONLY or method in EITHER or not method.startswith(_CLIENT_SERVICE)
        )
        token_ok = self._resolve is not None and (
            method in EITHER or method.startswith(_CLIENT_SERVICE)
        )

        def guarded(request, context):
            metadata = dict(context.invocation_metadata() or ())
            credential = metadata.get(CALL_KEY)
            bearer = metadata.get(TOKEN_KEY, "")
            if credential is not None:
                if not server_ok:
                    _refuse(context, grpc.StatusCode.PERMISSION_DENIED, "not a server call")
                raw = request.SerializeToString(deterministic=True)
                try:
                    self._keys.check_call(method, raw, credential)
                except AuthError as exc:
                    _refuse(context, grpc.StatusCode.UNAUTHENTICATED, str(exc))
                return behavior(request, context)
            if not token_ok:
                _refuse(
                    context, grpc.StatusCode.UNAUTHENTICATED, "this call needs a server credential"
                )
            if not bearer.startswith("Bearer ") or not bearer[7:].strip():
                _refuse(
                    context,
                    grpc.StatusCode.UNAUTHENTICATED,
                    "no token: give the client a token (EMBERFS_TOKEN, the token option, or "
                    "the client config file)",
                )
            identity = self._resolve(bearer[7:].strip())
            if identity is None:
                _refuse(context, grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked token")
            ctx = (
                getattr(request, "ctx", None)
                if "ctx" in request.DESCRIPTOR.fields_by_name
                else None
            )
            if ctx is not None:
                ctx.uid = identity.uid
                ctx.gid = identity.gid
                del ctx.groups[:]
                ctx.groups.extend(identity.groups)
            return behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
