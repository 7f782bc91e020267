"""Request frames of the data port: built with lying headers, patched, read back as a server would."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import crc32c

from emberfs.common import framing
from emberfs.common.framing import Op
from emberfs.proto import data_pb2

from .values import U16, U32

BODY = struct.Struct("<IBBHIIIHH")  # a header before its CRC
FIELDS = ("magic", "version", "op", "status", "meta_len", "data_len", "block_size", "auth_len")
FIELDS += ("reserved",)
WIDTH = dict(zip(FIELDS, (U32, 0xFF, 0xFF, U16, U32, U32, U32, U16, U16), strict=True))
LIMIT = {
    "meta_len": framing.MAX_META,
    "data_len": framing.MAX_DATA,
    "auth_len": framing.MAX_AUTH,
    "block_size": framing.MAX_DATA,
}
REQUESTS = {
    Op.READ: data_pb2.ChunkReadRequest,
    Op.WRITE: data_pb2.ChunkWriteRequest,
    Op.TRUNCATE: data_pb2.ChunkTruncateRequest,
    Op.WRITE_BATCH: data_pb2.ChunkWriteBatch,
}


@dataclass
class FrameParts:
    """What a request frame is made of; ``lies`` are header fields that say otherwise (signed)."""

    op: int
    meta: bytes = b""
    data: bytes = b""
    cred: Any = None
    block_size: int = framing.DEFAULT_BLOCK
    lies: dict[str, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The frame's bytes, its credential signing the header as it is (lies included)."""
        table = b""
        if self.data:
            crcs = framing.block_crcs(self.data, self.block_size)
            table = struct.pack(f"<{len(crcs)}I", *crcs)
        values = {
            "magic": framing.MAGIC,
            "version": framing.VERSION,
            "op": self.op,
            "status": 0,
            "meta_len": len(self.meta),
            "data_len": len(self.data),
            "block_size": self.block_size if self.data else 0,
            "auth_len": self.cred.length if self.cred is not None else 0,
            "reserved": 0,
        }
        values.update(self.lies)
        body = BODY.pack(*(values[f] & WIDTH[f] for f in FIELDS))
        auth = self.cred.section(body, self.meta, table) if self.cred is not None else b""
        return body + struct.pack("<I", crc32c.crc32c(body)) + auth + self.meta + table + self.data


class RawSection:
    """An auth section of given bytes (malformed credentials)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.length = len(raw)

    def section(self, body: bytes, meta: bytes, table: bytes) -> bytes:
        return self.raw


def patch_header(frame: bytes, **fields: int) -> bytes:
    """``frame`` with header ``fields`` changed and its header CRC made right again."""
    values = dict(zip(FIELDS, BODY.unpack_from(frame), strict=True))
    values.update(fields)
    body = BODY.pack(*(values[f] & WIDTH[f] for f in FIELDS))
    return body + struct.pack("<I", crc32c.crc32c(body)) + frame[framing.HEADER_SIZE :]


def server_views(payload: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """(op, auth section, meta section) of each frame a server would read from ``payload``."""
    pos = 0
    while len(payload) - pos >= framing.HEADER_SIZE:
        try:
            h = framing.unpack_header(payload[pos : pos + framing.HEADER_SIZE])
        except framing.FrameError:
            return
        start = pos + framing.HEADER_SIZE
        if start + h.auth_len + h.meta_len > len(payload):
            return
        auth = payload[start : start + h.auth_len]
        meta = payload[start + h.auth_len : start + h.auth_len + h.meta_len]
        yield h.op, auth, meta
        pos = start + h.auth_len + h.meta_len + 4 * h.n_blocks + h.data_len
