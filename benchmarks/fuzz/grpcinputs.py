"""The gRPC surface's inputs: protobuf messages of random and boundary values, and raw bytes."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor as pbd
from google.protobuf import message_factory, text_format
from google.protobuf.message import DecodeError, Message

from emberfs.common.auth import CALL_KEY, TOKEN_KEY, now_ms
from emberfs.proto import cluster_pb2, meta_pb2, storage_pb2

from .cluster import Env
from .guards import NO_SERVER_CREDENTIAL, PATH_FIELDS, grpc_safe
from .scratch import CHECK_DIR, CHECK_PATH, SCRATCH_DIR, SCRATCH_INODE
from .tally import Tally, hexcut
from .values import I64_MAX, I64_MIN, U32, U64, pick, text, u32, u64

SERVICES = (
    (meta_pb2, "MetaService"),
    (cluster_pb2, "ClusterService"),
    (storage_pb2, "StorageService"),
)


@dataclass(frozen=True)
class Method:
    """One gRPC method."""

    path: str  # /emberfs.MetaService/Stat
    service: str
    name: str
    request: type
    response: type


def all_methods() -> list[Method]:
    """Every method of the three gRPC services."""
    out = []
    for module, service in SERVICES:
        sd = module.DESCRIPTOR.services_by_name[service]
        for m in sd.methods:
            out.append(
                Method(
                    f"/{sd.full_name}/{m.name}",
                    service,
                    m.name,
                    message_factory.GetMessageClass(m.input_type),
                    message_factory.GetMessageClass(m.output_type),
                )
            )
    return out


@dataclass
class GrpcInput:
    """One gRPC input: raw request bytes for a method at an address, with a credential."""

    kind: str
    method: Method
    address: str
    raw: bytes
    credential: str
    metadata: list[tuple[str, str]]
    shown: Message | None = None  # the message, when the input was built as one

    @property
    def group(self) -> str:
        """Its time is added up by its method."""
        return self.method.path

    def example(self) -> dict:
        out = {
            "method": self.method.path,
            "address": self.address,
            "credential": self.credential,
            "request": hexcut(self.raw),
        }
        if self.shown is not None:
            out["message"] = text_format.MessageToString(self.shown, as_utf8=True)[:4000]
        return out


class MessageGen:
    """Protobuf messages of random and boundary values, from their descriptors."""

    def __init__(self, env: Env, rng: random.Random) -> None:
        self.env = env
        self.rng = rng
        self.targets = [t.target_id for t in env.routing.targets]
        self.chains = [c.chain_id for c in env.routing.chains]
        self.nodes = sorted({t.node_id for t in env.routing.targets})

    def message(self, desc: pbd.Descriptor, safe: bool, depth: int = 0) -> Message:
        msg = message_factory.GetMessageClass(desc)()
        for fd in desc.fields:
            if self.rng.random() < 0.3:
                continue
            if fd.is_repeated:
                getattr(msg, fd.name).extend(self._values(fd, safe, depth))
            elif fd.type == pbd.FieldDescriptor.TYPE_MESSAGE:
                getattr(msg, fd.name).CopyFrom(self.value(fd, safe, depth))
            else:
                setattr(msg, fd.name, self.value(fd, safe, depth))
        return msg

    def _values(self, fd: pbd.FieldDescriptor, safe: bool, depth: int) -> list:
        """The values of a repeated field; a long one repeats a few values over and over."""
        n = self._count(fd)
        distinct = [self.value(fd, safe, depth) for _ in range(min(n, 8))]
        return [distinct[i % len(distinct)] for i in range(n)] if n else []

    def _count(self, fd: pbd.FieldDescriptor) -> int:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return 0
        if r < 0.95:
            return rng.randrange(1, 4)
        if r < 0.995 or fd.type == pbd.FieldDescriptor.TYPE_MESSAGE:
            return rng.choice((100, 1000, 5000))
        return rng.choice((20_000, 100_000))

    def value(self, fd: pbd.FieldDescriptor, safe: bool, depth: int) -> Any:
        special = self._by_name(fd, safe)
        if special is not None:
            return special
        rng = self.rng
        t = fd.type
        T = pbd.FieldDescriptor
        if t == T.TYPE_MESSAGE:
            return self.message(fd.message_type, safe, depth + 1)
        if t in (T.TYPE_UINT32, T.TYPE_FIXED32):
            return u32(rng)
        if t in (T.TYPE_UINT64, T.TYPE_FIXED64):
            return u64(rng)
        if t in (T.TYPE_INT32, T.TYPE_SINT32, T.TYPE_SFIXED32):
            return rng.choice((0, -1, 1, -(1 << 31), (1 << 31) - 1, rng.getrandbits(31)))
        if t in (T.TYPE_INT64, T.TYPE_SINT64, T.TYPE_SFIXED64):
            return rng.choice(
                (0, -1, 1, I64_MIN, I64_MAX, rng.getrandbits(63), -rng.getrandbits(63))
            )
        if t in (T.TYPE_DOUBLE, T.TYPE_FLOAT):
            return rng.choice((0.0, -0.0, 1.5, float("nan"), float("inf"), -float("inf"), 1e300))
        if t == T.TYPE_BOOL:
            return rng.random() < 0.5
        if t == T.TYPE_ENUM:
            valid = [v.number for v in fd.enum_type.values]
            return rng.choice(valid) if rng.random() < 0.8 else rng.choice((-1, 99, (1 << 31) - 1))
        if t == T.TYPE_STRING:
            return self._string()
        return rng.randbytes(rng.choice((0, 1, 16, 300)))

    def _string(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.002:
            return "s" * rng.choice((1 << 20, 5 << 20))  # past the server's 4 MiB message limit
        return text(rng)

    def _by_name(self, fd: pbd.FieldDescriptor, safe: bool) -> Any:
        rng = self.rng
        name = fd.name
        if name in PATH_FIELDS:
            return self.path(safe)
        if name == "target" and fd.containing_type.name == "SymlinkRequest":
            return self.symlink_target(safe)
        if name == "start_after":
            after = rng.choice(("", "a", "zzz", text(rng)))
            return after.encode() if fd.type == pbd.FieldDescriptor.TYPE_BYTES else after
        if name == "cache_id":
            r = rng.random()
            if r < 0.6:
                return self.env.scratch_cache
            if r < 0.8:
                return self.env.check_cache
            return rng.choice((0, 1, U64, rng.getrandbits(20)))
        if name == "inode":
            return self.inode(safe, fd.containing_type.full_name)
        if name in ("target_id", "target_ids") and rng.random() < 0.7 and self.targets:
            return rng.choice(self.targets)
        if name in ("chain_id", "chains", "chain_table") and rng.random() < 0.7 and self.chains:
            return rng.choice(self.chains)
        if name == "node_id" and rng.random() < 0.5 and self.nodes:
            return rng.choice(self.nodes)
        if name == "gc_ids" and safe:
            return SCRATCH_INODE + rng.getrandbits(20)
        if name == "flags":
            return rng.choice((0, 1, 2, 3, 7, 9, 11, 17, 31, 32, 255, U32))
        if name == "mode":
            return rng.choice((0, 0o644, 0o755, 0o7777, 0o170000, U32))
        if name == "limit":
            return rng.choice((0, 1, 2, 10, 1000, 10000, 10001, U32))
        return None

    def path(self, safe: bool) -> str:
        rng = self.rng
        tail = "/".join(self._name() for _ in range(rng.choice((1, 1, 2, 3))))
        r = 0.0 if safe else rng.random()
        if r < 0.7:
            return f"{SCRATCH_DIR}/{tail}"
        if r < 0.8:
            return rng.choice((CHECK_PATH, CHECK_DIR, "/", "", SCRATCH_DIR))
        if r < 0.9:
            return rng.choice(("relative/" + tail, "//" + tail, "/./x", "/../x", "/a\x00b"))
        return "/" + text(rng, rng.choice((10, 300, 5000)))

    NAMES = ("a", "b", "c", "d", "d/e", "s", ".", "..", "x" * 255, "x" * 256, "é", "😀", " ", "-")

    def _name(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.7:
            return rng.choice(self.NAMES)
        if r < 0.85:
            return f"f{rng.randrange(50)}"
        if r < 0.9:
            return "a\x00b"
        return text(rng, rng.choice((1, 8, 40))).replace("/", "_") or "n"

    def symlink_target(self, safe: bool) -> str:
        rng = self.rng
        options = ["a", "d", "d/e", f"{SCRATCH_DIR}/b", ".", "s", "x" * 5000, ""]
        if not safe:
            options += ["/", "..", "../..", CHECK_PATH, "/a\x00b"]
        return rng.choice(options)

    def inode(self, safe: bool, message: str) -> int:
        rng = self.rng
        if message.startswith("emberfs.") and message.split(".")[1] in (
            "RemoveChunksRequest",
            "ReportLostChunkRequest",
        ):
            if safe or rng.random() < 0.5:
                return SCRATCH_INODE + rng.randrange(64)
            return rng.choice((0, 1, self.env.check_inode, U64))
        if rng.random() < 0.6 and self.env.scratch_inodes:
            return rng.choice(self.env.scratch_inodes)
        value = rng.choice((0, 1, 2, U64, 1 << 63, rng.getrandbits(20), self.env.check_inode))
        return value + 10**6 if safe and value in self.env.protected else value


class RawGen:
    """Request bytes that no protobuf library would make."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def raw(self, encoded: bytes) -> tuple[str, bytes]:
        rng = self.rng
        kind = rng.choice(
            ("random", "flip", "truncate", "append", "utf8", "varint", "length", "groups", "wire")
        )
        if kind == "random":
            return kind, rng.randbytes(rng.choice((0, 1, 2, 8, 64, 512)))
        if kind == "flip" and encoded:
            out = bytearray(encoded)
            for _ in range(rng.randrange(1, 5)):
                out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
            return kind, bytes(out)
        if kind == "truncate" and encoded:
            return kind, encoded[: rng.randrange(len(encoded))]
        if kind == "utf8":  # a string field (2 is a path in most requests) that is not UTF-8
            bad = rng.choice((b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"/a\x80"))
            return kind, encoded + _tag(rng.choice((1, 2, 3)), 2) + _varint(len(bad)) + bad
        if kind == "varint":  # an overlong varint (11 bytes) for a low field
            return kind, encoded + _tag(rng.randrange(1, 6), 0) + b"\xff" * 10 + b"\x01"
        if kind == "length":  # a length past the end
            return kind, encoded + _tag(rng.randrange(1, 6), 2) + _varint(
                rng.choice((10, U32))
            ) + b"x"
        if kind == "groups":  # nested groups past any recursion limit
            depth = rng.choice((50, 101, 1000, 20_000))
            field = rng.randrange(1, 20)
            return kind, _tag(field, 3) * depth + _tag(field, 4) * depth
        if kind == "wire":  # wire types 6 and 7 do not exist
            return kind, encoded + _tag(rng.randrange(1, 100), rng.choice((6, 7))) + b"\x00"
        return "append", encoded + _tag(rng.choice((99, 536870911)), 0) + _varint(
            rng.getrandbits(64)
        )


def _varint(n: int) -> bytes:
    """``n`` as a protobuf varint."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field_number: int, wire: int) -> bytes:
    """A protobuf field key."""
    return _varint((field_number << 3) | wire)


class GrpcInputs:
    """Makes the gRPC surface's inputs for one thread."""

    def __init__(self, env: Env, rng: random.Random, tally: Tally, methods: list[Method]) -> None:
        self.env = env
        self.rng = rng
        self.tally = tally
        self.methods = methods
        self.messages = MessageGen(env, rng)
        self.raws = RawGen(rng)
        self.signer = env.keys.call_signer()
        cluster = env.cluster
        self.storage = [cluster.storage_grpc_address(i) for i in range(env.storage_count)]

    def next(self) -> GrpcInput:
        rng = self.rng
        method = rng.choice(self.methods)
        credential = self._credential(method)
        trusted = credential in ("admin", "server")
        kind = "message" if rng.random() < 0.75 else "raw"
        msg = self.messages.message(method.request.DESCRIPTOR, safe=trusted)
        if trusted and not grpc_safe(method, msg, self.env.protected, credential):
            self.tally.guard()
            credential, trusted = "wrong", False
        raw = msg.SerializeToString()
        shown: Message | None = msg
        if kind == "raw":
            sub, raw = self.raws.raw(raw)
            kind, shown = f"raw_{sub}", None
            if trusted and not self._raw_safe(method, raw, credential):
                self.tally.guard()
                credential = "wrong"
        return GrpcInput(
            f"{kind}",
            method,
            self._address(method),
            raw,
            credential,
            self._metadata(credential, method, raw),
            shown,
        )

    def _raw_safe(self, method: Method, raw: bytes, credential: str) -> bool:
        try:
            msg = method.request.FromString(raw)
        except DecodeError:
            return True  # the server cannot decode it either
        return grpc_safe(method, msg, self.env.protected, credential)

    def _credential(self, method: Method) -> str:
        weights = {
            "MetaService": {
                "none": 0.15,
                "wrong": 0.15,
                "malformed": 0.05,
                "server": 0.05,
                "admin": 0.6,
            },
            "ClusterService": {
                "none": 0.15,
                "wrong": 0.1,
                "malformed": 0.05,
                "admin": 0.25,
                "server": 0.45,
            },
            "StorageService": {
                "none": 0.15,
                "wrong": 0.1,
                "malformed": 0.05,
                "admin": 0.1,
                "server": 0.6,
            },
        }[method.service]
        credential = pick(self.rng, weights)
        if credential == "server" and method.name in NO_SERVER_CREDENTIAL:
            return "admin"
        return credential

    def _address(self, method: Method) -> str:
        rng = self.rng
        meta = self.env.cluster.meta_address
        if method.service == "StorageService":
            return rng.choice(self.storage) if rng.random() < 0.95 else meta
        return meta if rng.random() < 0.95 else rng.choice(self.storage)

    def _metadata(self, credential: str, method: Method, raw: bytes) -> list[tuple[str, str]]:
        rng = self.rng
        if credential == "admin":
            return [(TOKEN_KEY, f"Bearer {self.env.token}")]
        if credential == "wrong":
            return [(TOKEN_KEY, f"Bearer {os.urandom(rng.choice((1, 16, 64))).hex()}")]
        if credential == "server":
            try:  # the server checks the MAC over its own (deterministic) encoding
                canonical = method.request.FromString(raw).SerializeToString(deterministic=True)
            except DecodeError:
                canonical = raw
            return [self.signer.metadata(method.path, canonical)]
        if credential == "malformed":
            return [
                rng.choice(
                    (
                        (TOKEN_KEY, "Basic dXNlcjpwYXNz"),
                        (TOKEN_KEY, "Bearer "),
                        (TOKEN_KEY, "Bearer " + "x" * 8000),
                        (CALL_KEY, "garbage"),
                        (CALL_KEY, "1.2.3"),
                        (CALL_KEY, f"{now_ms()}.{os.urandom(12).hex()}.{'00' * 16}"),
                        (CALL_KEY, f"{now_ms() - 10**9}.n.{'zz' * 16}"),
                    )
                )
            ]
        return []
