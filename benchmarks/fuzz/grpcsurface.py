"""The gRPC surface: calls on every method of MetaService, ClusterService and StorageService."""

from __future__ import annotations

import random

import grpc
from google.protobuf.message import DecodeError

from . import timeouts
from .cluster import Env
from .grpcinputs import GrpcInput, GrpcInputs, Method, all_methods
from .surface import Outcome, Surface
from .tally import Tally
from .values import MiB


class GrpcLinks:
    """Channels to every server address, shared by the threads, and every method's callable.

    Inputs that may make a server drop the whole HTTP/2 connection (malformed or
    oversized metadata, messages past the size limit) go on channels of their own, so
    the other threads' calls do not wait for a reconnection.
    """

    OPTIONS = (
        ("grpc.max_receive_message_length", 256 * MiB),
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 500),
    )

    def __init__(self, env: Env, methods: list[Method]) -> None:
        cluster = env.cluster
        addresses = [cluster.meta_address] + [
            cluster.storage_grpc_address(i) for i in range(env.storage_count)
        ]
        self._channels = {
            (a, rough): grpc.insecure_channel(a, options=self.OPTIONS)
            for a in addresses
            for rough in (False, True)
        }
        self._callables = {
            (a, rough, m.path): ch.unary_unary(m.path)
            for (a, rough), ch in self._channels.items()
            for m in methods
        }

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def send(self, item: GrpcInput) -> bytes | grpc.RpcError:
        """The answer's bytes, or the error the call ended in."""
        rough = item.credential == "malformed" or len(item.raw) > MiB
        fn = self._callables[(item.address, rough, item.method.path)]
        try:
            return fn(item.raw, timeout=timeouts.CALL_TIMEOUT, metadata=item.metadata)
        except grpc.RpcError as exc:
            return exc


class SharedLink:
    """A thread's use of the channels that the threads share: closing it leaves them open."""

    def __init__(self, links: GrpcLinks) -> None:
        self.links = links

    def send(self, item: GrpcInput) -> bytes | grpc.RpcError:
        return self.links.send(item)

    def close(self) -> None:
        """Nothing: the surface closes the channels when its threads are done."""


def grpc_outcome(exc: grpc.RpcError) -> Outcome:
    """The label of a failed call; a hang for a deadline, a server error for UNKNOWN/INTERNAL."""
    code = exc.code()
    details = exc.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Outcome(code.name, hang=f"no answer in {timeouts.CALL_TIMEOUT} s")
    if code == grpc.StatusCode.INTERNAL and "deserializ" in details:
        return Outcome("INTERNAL (undecodable request)")
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS):
        return Outcome(code.name, error=details[:2000])
    return Outcome(code.name)


class GrpcSurface(Surface):
    """Every method of MetaService, ClusterService and StorageService, on shared channels."""

    name = "grpc"
    threads = 6

    def start(self) -> None:
        self.links = GrpcLinks(self.env, all_methods())

    def finish(self) -> None:
        self.links.close()

    def inputs(self, rng: random.Random, tally: Tally) -> GrpcInputs:
        return GrpcInputs(self.env, rng, tally, all_methods())

    def link(self) -> SharedLink:
        return SharedLink(self.links)

    def judge(self, item: GrpcInput, answer: bytes | grpc.RpcError) -> Outcome:
        """A failed call by its code (:func:`grpc_outcome`); an answer must decode."""
        if isinstance(answer, grpc.RpcError):
            return grpc_outcome(answer)
        try:
            item.method.response.FromString(answer)
        except DecodeError as exc:
            return Outcome("OK", error=f"undecodable answer: {exc}")
        return Outcome("OK")
