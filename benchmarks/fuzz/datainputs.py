"""The data surface's inputs: random bytes, frames with lying contents, mutated frames."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from typing import Any

import crc32c
from google.protobuf.message import Message

from emberfs.common import framing
from emberfs.common.auth import CAPABILITY, MAC_SIZE, SERVER, SERVER_SECTION_SIZE, now_ms
from emberfs.common.framing import Op
from emberfs.proto import data_pb2

from .cluster import Env
from .frames import (
    BODY,
    FIELDS,
    LIMIT,
    REQUESTS,
    WIDTH,
    FrameParts,
    RawSection,
    patch_header,
    server_views,
)
from .guards import changes_real_chunks
from .scratch import SCRATCH_INODE
from .tally import Tally, hexcut
from .values import U16, U32, U64, MiB, pick, text, u32, u64


@dataclass
class DataInput:
    """One input of the data surface: bytes for one storage server."""

    kind: str
    server: int
    payload: bytes
    ragged: bool  # not exactly whole frames: the sender half-closes, the server must close
    has_data: bool = False

    @property
    def group(self) -> str:
        """Its time is added up by its kind."""
        return self.kind

    def example(self) -> dict:
        return {"server": f"storage-{self.server}", "ragged": self.ragged, **hexcut(self.payload)}

    @property
    def op(self) -> int | None:
        for op, _, _ in server_views(self.payload):
            return op
        return None


VALID_CHUNK_SIZES = (64 * 1024, 1 * MiB, 4 * MiB, 64 * MiB)
BAD_CHUNK_SIZES = (0, 1, 4096, 65535, 3 * MiB, 128 * MiB, U32)
OFFSETS = (0, 0, 0, 1, 4095, 4096, 65535, 65536, MiB, 4 * MiB - 1, 4 * MiB, 64 * MiB, U32)
LENGTHS = (0, 1, 100, 4096, 4096, 65536, 65537, MiB, 4 * MiB, 64 * MiB, 64 * MiB + 1, U32)


class DataInputs:
    """Makes the data surface's inputs for one thread.

    Parameters
    ----------
    env : Env
    rng : random.Random
    tally : Tally
        Counts the inputs replaced because they would change real chunks.
    """

    def __init__(self, env: Env, rng: random.Random, tally: Tally) -> None:
        self.env = env
        self.rng = rng
        self.tally = tally
        self.chains = [(c.chain_id, c.version, list(c.targets)) for c in env.routing.chains]
        self.targets = [t.target_id for t in env.routing.targets]
        self.server_cred = env.keys.server_credential()

    # ---------------------------------------------------------------- the input

    def next(self) -> DataInput:
        """The next input (never one whose server credential writes a real chunk)."""
        while True:
            item = self._make()
            if not changes_real_chunks(item.payload):
                return item
            self.tally.guard()

    def _make(self) -> DataInput:
        rng = self.rng
        kind = pick(rng, {"random": 0.04, "random_header": 0.05, "valid": 0.46, "mutated": 0.45})
        if kind == "random":
            return DataInput("random", self._server(), rng.randbytes(rng.randrange(1, 200)), True)
        if kind == "random_header":
            return self._random_header()
        parts, server = self.frame()
        if kind == "valid":
            return DataInput(
                f"valid_{self._label(parts)}", server, parts.encode(), False, bool(parts.data)
            )
        payload, ragged, name = self._mutate(parts)
        return DataInput(f"mutated_{name}", server, payload, ragged, bool(parts.data))

    def _label(self, parts: FrameParts) -> str:
        try:
            return Op(parts.op).name.lower()
        except ValueError:
            return "unknown_op"

    def _server(self) -> int:
        return self.rng.randrange(self.env.storage_count)

    def _random_header(self) -> DataInput:
        rng = self.rng
        values = (
            [framing.MAGIC, framing.VERSION]
            + [rng.getrandbits(8)]
            + [
                rng.getrandbits(16),
                rng.choice((0, rng.getrandbits(8), rng.getrandbits(32))),
                rng.choice((0, rng.getrandbits(12), rng.getrandbits(32))),
                rng.choice((0, framing.MIN_BLOCK, rng.getrandbits(32))),
                rng.choice((0, 25, rng.getrandbits(16))),
                rng.getrandbits(16),
            ]
        )
        body = BODY.pack(*values)
        raw = body + struct.pack("<I", crc32c.crc32c(body)) + rng.randbytes(rng.randrange(0, 300))
        return DataInput("random_header", self._server(), raw, True)

    # ---------------------------------------------------------------- a frame

    def frame(self) -> tuple[FrameParts, int]:
        """A whole frame with lying contents, and the server it goes to."""
        rng = self.rng
        op = pick(
            rng,
            {
                Op.READ: 0.32,
                Op.WRITE: 0.26,
                Op.WRITE_BATCH: 0.08,
                Op.TRUNCATE: 0.12,
                Op.PING: 0.12,
                0: 0.1,
            },
        )
        if op == 0:
            op = rng.choice((0, 6, 7, 64, 127, 255, rng.randrange(8, 128)))
        credential = pick(rng, {"none": 0.12, "capability": 0.38, "server": 0.38, "bad": 0.12})
        server_cred = credential == "server"
        chain_id, version, members = rng.choice(self.chains)
        target = self._target(members)
        writes = op in (Op.WRITE, Op.WRITE_BATCH)
        data = self._data() if writes or rng.random() < 0.03 else b""
        if op == Op.WRITE_BATCH and rng.random() < 0.9:
            meta, inode = self._batch(chain_id, version, target, server_cred, len(data), credential)
        else:
            meta, inode = self._meta(op, chain_id, version, target, server_cred)
        cred = self._credential(credential, inode, op)
        block = pick(rng, {framing.DEFAULT_BLOCK: 0.7, framing.MIN_BLOCK: 0.2, MiB: 0.1})
        at = self.env.server_of_target(target)
        server = at if at is not None and rng.random() < 0.85 else self._server()
        return FrameParts(op, meta, data, cred, block), server

    def _batch(
        self,
        chain_id: int,
        version: int,
        target: int,
        server_cred: bool,
        data_len: int,
        credential: str,
    ) -> tuple[bytes, int]:
        """A write batch's meta (lengths mostly adding up to ``data_len``) and its first inode."""
        rng = self.rng
        n = pick(rng, {1: 0.2, rng.randrange(2, 5): 0.6, rng.randrange(5, 40): 0.15, 300: 0.05})
        chain_version = self._chain_version(version)
        batch = data_pb2.ChunkWriteBatch()
        for _ in range(n):
            inode = self._inode(server_cred, Op.WRITE)
            batch.writes.append(self._write(chain_id, chain_version, target, inode))
        cuts = sorted(rng.randrange(data_len + 1) for _ in range(n - 1))
        lengths = [b - a for a, b in zip([0, *cuts], [*cuts, data_len], strict=True)]
        if rng.random() < 0.1:
            lengths = [rng.choice((0, 1, data_len, U32)) for _ in range(rng.randrange(n + 2))]
        batch.lengths.extend(lengths)
        if credential == "capability":
            for write in batch.writes:
                inode = write.chunk.inode
                if rng.random() < 0.1:
                    inode ^= 1
                # only chunks of scratch inodes may be written with a capability
                write = inode >= SCRATCH_INODE
                batch.capabilities.append(
                    self.env.keys.sign_capability(inode, read=True, write=write, ttl=600.0)
                )
        return batch.SerializeToString(), batch.writes[0].chunk.inode

    def _target(self, members: list[int]) -> int:
        rng = self.rng
        r = rng.random()
        if r < 0.55:
            return members[0]
        if r < 0.8:
            return rng.choice(members)
        if r < 0.9:
            return rng.choice(self.targets)
        return u32(rng)

    def _chain_version(self, version: int) -> int:
        rng = self.rng
        return pick(
            rng,
            {version: 0.65, 0: 0.15, version + 1: 0.05, max(0, version - 1): 0.05, u64(rng): 0.1},
        )

    def _inode(self, server_cred: bool, op: int) -> int:
        rng = self.rng
        if server_cred and op in (Op.WRITE, Op.TRUNCATE, Op.WRITE_BATCH):
            return self._scratch_inode()
        r = rng.random()
        if r < 0.35:
            return self.env.check_inode
        if r < 0.75:
            return self._scratch_inode()
        return rng.choice((0, 1, 2, self.env.check_inode + 1, U64, 1 << 63, rng.getrandbits(64)))

    def _scratch_inode(self) -> int:
        rng = self.rng
        if rng.random() < 0.9:
            return SCRATCH_INODE + rng.randrange(64)
        return rng.choice((U64, 1 << 63, SCRATCH_INODE + rng.getrandbits(40)))

    def _index(self, inode: int) -> int:
        rng = self.rng
        if inode == self.env.check_inode and rng.random() < 0.7:
            return rng.randrange(self.env.check_chunks + 1)
        return rng.choice((0, 0, 0, 1, 2, 3, 1000, U32, rng.getrandbits(32)))

    def _meta(
        self, op: int, chain_id: int, version: int, target: int, server_cred: bool
    ) -> tuple[bytes, int]:
        """The meta section of ``op`` (sometimes another op's, or random bytes) and its inode."""
        rng = self.rng
        inode = self._inode(server_cred, op)
        if op == Op.PING or op not in REQUESTS:
            if rng.random() < 0.7:
                return b"", inode
            return rng.randbytes(rng.randrange(1, 64)), inode
        if rng.random() < 0.04:  # random bytes: most do not decode, some decode to anything
            return rng.randbytes(rng.randrange(1, 128)), inode
        if rng.random() < 0.02:
            return rng.randbytes(rng.choice((framing.MAX_META, framing.MAX_META - 1))), inode
        chain_id = chain_id if rng.random() < 0.85 else u32(rng)
        chain_version = self._chain_version(version)
        if op == Op.READ:
            msg = self._read(chain_id, chain_version, target, inode)
        elif op == Op.WRITE:
            msg = self._write(chain_id, chain_version, target, inode)
        else:
            msg = self._truncate(chain_id, chain_version, target, inode)
        return msg.SerializeToString(), inode

    def _read(self, chain_id: int, chain_version: int, target: int, inode: int) -> Message:
        rng = self.rng
        small = rng.random() < 0.8
        return data_pb2.ChunkReadRequest(
            chain_id=chain_id,
            target_id=target,
            chunk=data_pb2.ChunkId(inode=inode, index=self._index(inode)),
            offset=rng.choice(OFFSETS),
            length=rng.choice(LENGTHS[:6]) if small else rng.choice(LENGTHS),
            chain_version=chain_version,
        )

    def _write(self, chain_id: int, chain_version: int, target: int, inode: int) -> Message:
        rng = self.rng
        sync = rng.random() < 0.15
        return data_pb2.ChunkWriteRequest(
            chain_id=chain_id,
            chain_version=chain_version,
            target_id=target,
            chunk=data_pb2.ChunkId(inode=inode, index=self._index(inode)),
            offset=rng.choice(OFFSETS) if rng.random() < 0.5 else 0,
            chunk_size=rng.choice(VALID_CHUNK_SIZES if rng.random() < 0.8 else BAD_CHUNK_SIZES),
            client_id=self._client_id(),
            request_id=rng.getrandbits(rng.choice((8, 32, 64))),
            update_version=pick(rng, {0: 0.5, rng.randrange(1, 100): 0.2, u64(rng): 0.3}),
            full_chunk=rng.random() < 0.15,
            base_version=pick(rng, {0: 0.6, rng.randrange(1, 100): 0.2, u64(rng): 0.2}),
            sync=sync,
            replace=rng.random() < (0.5 if sync else 0.05),
        )

    def _truncate(self, chain_id: int, chain_version: int, target: int, inode: int) -> Message:
        rng = self.rng
        n = pick(rng, {0: 0.5, rng.randrange(1, 6): 0.45, rng.choice((500, 2000)): 0.05})
        steps = [
            data_pb2.TruncateStep(
                index=self._index(inode),
                length=rng.choice(OFFSETS),
                version=u64(rng),
                base_version=u64(rng),
            )
            for _ in range(n)
        ]
        return data_pb2.ChunkTruncateRequest(
            chain_id=chain_id,
            chain_version=chain_version,
            target_id=target,
            inode=inode,
            length=pick(rng, {0: 0.3, rng.randrange(1, 10 * MiB): 0.4, u64(rng): 0.3}),
            chunk_size=rng.choice(VALID_CHUNK_SIZES if rng.random() < 0.8 else BAD_CHUNK_SIZES),
            stripe=rng.choice((0, 1, 2, 4, 256, 257, U32)),
            stripe_position=rng.choice((0, 1, 2, 3, U32)),
            client_id=self._client_id(),
            request_id=rng.getrandbits(64),
            steps=steps,
        )

    def _client_id(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.2:
            return ""
        if r < 0.75:
            return f"fuzz-{rng.randrange(16)}"
        if r < 0.8:
            return "x" * rng.choice((1000, 20_000))
        return text(rng)

    def _data(self) -> bytes:
        rng = self.rng
        n = pick(
            rng,
            {
                0: 0.1,
                rng.randrange(1, 4097): 0.6,
                rng.randrange(4097, 65537): 0.25,
                rng.randrange(65537, MiB + 1): 0.05,
            },
        )
        return rng.randbytes(n)

    def _credential(self, kind: str, inode: int, op: int) -> Any:
        rng = self.rng
        keys = self.env.keys
        if kind == "none":
            return None
        if kind == "server":
            if rng.random() < 0.9:
                return self.server_cred
            return self.env.keys.server_credential(rng.choice((-(10**9), 10**9, -now_ms())))
        if kind == "capability":
            which = pick(rng, {"own": 0.7, "other": 0.1, "expired": 0.1, "forged": 0.1})
            cap_inode = inode if which != "other" else inode ^ rng.choice((1, 1 << 40))
            # only chunks of scratch inodes may be written with a capability
            write = cap_inode >= SCRATCH_INODE and rng.random() < 0.8
            ttl = -1.0 if which == "expired" else 600.0
            token = keys.sign_capability(cap_inode, read=rng.random() < 0.9, write=write, ttl=ttl)
            if which == "forged":
                token = token[:-MAC_SIZE] + rng.randbytes(MAC_SIZE)
            return RawSection(bytes([CAPABILITY]) + token)
        return RawSection(self._bad_section())

    def _bad_section(self) -> bytes:
        rng = self.rng
        return pick(
            rng,
            {
                b"": 0.1,
                bytes([SERVER]): 0.1,
                bytes([SERVER]) + rng.randbytes(SERVER_SECTION_SIZE - 1): 0.2,
                bytes([SERVER]) + rng.randbytes(rng.randrange(1, 60)): 0.1,
                bytes([CAPABILITY]) + rng.randbytes(rng.randrange(0, 40)): 0.2,
                bytes([rng.choice((0, 3, 255))]) + rng.randbytes(rng.randrange(0, 30)): 0.1,
                rng.randbytes(rng.choice((framing.MAX_AUTH, framing.MAX_AUTH + 1))): 0.1,
                rng.randbytes(rng.randrange(1, 100)): 0.1,
            },
        )

    # ---------------------------------------------------------------- mutations

    def _mutate(self, parts: FrameParts) -> tuple[bytes, bool, str]:
        """A mutation of ``parts``: (bytes, whether ragged, the mutation's name)."""
        rng = self.rng
        name = rng.choice(
            (
                "flip",
                "flip_body",
                "truncate",
                "extend",
                "double",
                "lie",
                "lie_signed",
                "header_crc",
                "version",
                "magic",
                "op",
                "response_op",
                "status",
                "reserved",
            )
        )
        frame = parts.encode()
        if name in ("flip", "flip_body"):
            start = 0 if name == "flip" else framing.HEADER_SIZE
            return self._flip(frame, start), False, name
        if name == "truncate":
            return frame[: rng.randrange(1, len(frame))], True, name
        if name == "extend":
            return frame + rng.randbytes(rng.randrange(1, 64)), True, name
        if name == "double":
            other, _ = self.frame()
            return frame + other.encode(), True, name
        if name in ("lie", "lie_signed"):
            lie = rng.choice(("meta_len", "data_len", "auth_len", "block_size"))
            value = self._lie(lie, BODY.unpack_from(frame)[FIELDS.index(lie)])
            if name == "lie":
                return patch_header(frame, **{lie: value}), True, f"{name}_{lie}"
            parts.lies = {lie: value}
            return parts.encode(), True, f"{name}_{lie}"
        if name == "header_crc":
            crc = bytes(b ^ rng.randrange(1, 256) for b in frame[24:28])
            return frame[:24] + crc + frame[28:], False, name
        fields = {
            "version": {"version": rng.choice((0, 1, 3, 255))},
            "magic": {"magic": rng.getrandbits(32) | 1},
            "op": {"op": rng.choice((0, 5, 9, 100, 127))},
            "response_op": {"op": parts.op | framing.RESPONSE},
            "status": {"status": rng.randrange(1, U16 + 1)},
            "reserved": {"reserved": rng.randrange(1, U16 + 1)},
        }[name]
        if rng.random() < 0.5:
            return patch_header(frame, **fields), False, name
        parts.lies = fields
        return parts.encode(), False, f"{name}_signed"

    def _flip(self, frame: bytes, start: int) -> bytes:
        rng = self.rng
        if len(frame) <= start:
            start = 0
        out = bytearray(frame)
        for _ in range(rng.randrange(1, 9)):
            pos = rng.randrange(start, len(out))
            out[pos] ^= 1 << rng.randrange(8)
        return bytes(out)

    def _lie(self, name: str, true: int) -> int:
        rng = self.rng
        if rng.random() < 0.6:
            return max(0, true + rng.choice((-16, -4, -1, 1, 2, 4, 16, 100))) & WIDTH[name]
        limit = LIMIT[name]
        return (
            rng.choice((0, 1, limit, limit + 1, 1 << 31, WIDTH[name], framing.MIN_BLOCK - 1))
            & (WIDTH[name])
        )
