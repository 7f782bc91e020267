"""The framed TCP protocol of the bulk data path.

Chunk reads, writes, truncation and chain forwarding travel here rather than
on gRPC (see docs/protocol.md for why and for the byte layout). Both storage
servers and the client import this module; nothing else frames data.

A frame is a fixed 28-byte header, an auth section (a request's
credentials, see :mod:`emberfs.common.auth`; empty in answers), a meta section
(a small protobuf message from ``data.proto``), a table of CRC32C values (one
per ``block_size`` bytes of data) and the data itself::

    magic u32 | version u8 | op u8 | status u16 | meta_len u32 | data_len u32
    | block_size u32 | auth_len u16 | reserved u16 | header_crc u32   (little-endian)

A receiver reads everything before the data first (all of it bounded by the
limits below), so it can check credentials and the request before it gives
the data a buffer.

Senders use ``os.sendfile`` (from a chunk file) or one ``sendall`` per buffer;
receivers ``recv_into`` a preallocated buffer and verify every block's CRC.
"""

from __future__ import annotations

import enum
import functools
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import crc32c

MAGIC = 0x46424D45  # b"EMBF" little-endian
VERSION = 2
HEADER = struct.Struct("<IBBHIIIHHI")
HEADER_SIZE = HEADER.size  # 28
_HEADER_BODY = struct.Struct("<IBBHIIIHH")

MAX_AUTH = 1024
MAX_META = 64 * 1024
MAX_DATA = 64 * 1024 * 1024
MIN_BLOCK = 4 * 1024
DEFAULT_BLOCK = 64 * 1024
RESPONSE = 0x80


class Op(enum.IntEnum):
    READ = 1
    WRITE = 2
    TRUNCATE = 3
    PING = 4
    WRITE_BATCH = 5


class Status(enum.IntEnum):
    OK = 0
    NOT_FOUND = 1  # the chunk does not exist on this target
    STALE_CHAIN = 2  # the sender's chain version is not the receiver's: refresh routing
    NOT_COMMITTED = 3  # this replica holds a pending version: read another replica or the tail
    CHECKSUM = 4  # a block's CRC32C did not match
    BAD_REQUEST = 5  # malformed or out-of-range request
    NOT_SERVING = 6  # the target cannot serve this (not in the chain, not serving, not head)
    INTERNAL = 7
    BUSY = 8  # too many requests in flight; retry later
    NO_SPACE = 9  # a replica's file system has no room for the update: not retried
    DENIED = 10  # credentials missing, wrong, expired, or not covering the request


RETRYABLE = frozenset(
    {Status.STALE_CHAIN, Status.NOT_COMMITTED, Status.CHECKSUM, Status.NOT_SERVING, Status.BUSY}
)


class FrameError(Exception):
    """The peer sent something that is not a valid frame (or stopped mid-frame)."""


class ChecksumError(FrameError):
    def __init__(self, block: int):
        super().__init__(f"CRC32C mismatch in block {block}")
        self.block = block


@dataclass(slots=True)
class Header:
    op: int
    status: int
    meta_len: int
    data_len: int
    block_size: int
    auth_len: int = 0
    body: bytes = b""  # the header's bytes before its CRC (what a server credential signs)
    auth: bytes = b""  # the auth section, once received
    table: bytes = b""  # the CRC table as received (what a server credential signs)

    @property
    def is_response(self) -> bool:
        return bool(self.op & RESPONSE)

    @property
    def n_blocks(self) -> int:
        return n_blocks(self.data_len, self.block_size)


def n_blocks(data_len: int, block_size: int) -> int:
    if data_len == 0:
        return 0
    return (data_len + block_size - 1) // block_size


def block_crcs(data, block_size: int = DEFAULT_BLOCK) -> list[int]:
    """CRC32C of each ``block_size`` slice of ``data`` (the last may be short)."""
    mv = memoryview(data).cast("B")
    return [crc32c.crc32c(mv[i : i + block_size]) for i in range(0, len(mv), block_size)]


# CRC32C (reflected polynomial 0x82F63B78) is linear over GF(2): the CRC of
# A + B is the CRC of A carried through len(B) zero bytes, XOR the CRC of B.
# Carrying a CRC through n zero bytes is a 32x32 bit matrix. For the few
# lengths that recur (a frame's block size) it is kept as four 256-entry tables
# (one per byte of the CRC), so applying it costs four lookups; building them
# costs milliseconds of Python, so they are built only for block sizes that are
# powers of two, and any other length (the short last block of a frame, which
# differs from file to file) is carried by the CRC instruction itself over that
# many zero bytes instead: microseconds for a block.
_CRC32C_POLY = 0x82F63B78
_ZEROS = memoryview(bytes(1 << 20))


def _gf2_apply(matrix: list[int], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= matrix[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_apply(matrix, column) for column in matrix]


@functools.lru_cache(maxsize=16)
def zeros_operator(n: int) -> tuple[tuple[int, ...], ...]:
    """Tables of the map "CRC register after ``n`` more zero bytes" (n >= 1)."""
    op = [_CRC32C_POLY] + [1 << i for i in range(31)]  # one zero bit
    for _ in range(3):  # one zero byte
        op = _gf2_square(op)
    result: list[int] | None = None
    while n:
        if n & 1:
            result = op if result is None else [_gf2_apply(op, c) for c in result]
        n >>= 1
        if n:
            op = _gf2_square(op)
    assert result is not None
    tables = []
    for byte in range(4):
        columns = result[8 * byte : 8 * byte + 8]
        tables.append(tuple(_gf2_apply(columns, v) for v in range(256)))
    return tuple(tables)


def crc32c_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC32C of ``A + B`` from ``crc32c(A)``, ``crc32c(B)`` and ``len(B)``.

    Any length: ``crc32c(A + zeros) ^ crc32c(zeros) ^ crc32c(B)``, both
    zero runs hashed by the CRC instruction.
    """
    if len_b <= 0:
        return crc_a
    with_a, alone = crc_a, 0
    while len_b:
        piece = _ZEROS[: min(len_b, len(_ZEROS))]
        with_a = crc32c.crc32c(piece, with_a)
        alone = crc32c.crc32c(piece, alone)
        len_b -= len(piece)
    return with_a ^ alone ^ crc_b


def combine_crcs(crcs, block_size: int, data_len: int) -> int:
    """CRC32C of whole data from the CRC32C of its ``block_size`` blocks.

    Equal to ``crc32c.crc32c(data)`` without reading the data again.
    """
    if len(crcs) != n_blocks(data_len, block_size):
        raise ValueError("CRC table does not match the data length")
    if not crcs:
        return 0
    total = crcs[0]
    last = len(crcs) - 1
    if data_len == (last + 1) * block_size:
        last += 1  # the last block is whole: combined like the others
    if block_size & (block_size - 1) == 0:
        # the tables inline: a storage server combines every chunk it stages
        t0, t1, t2, t3 = zeros_operator(block_size)
        for i in range(1, last):
            total = (
                t0[total & 0xFF]
                ^ t1[(total >> 8) & 0xFF]
                ^ t2[(total >> 16) & 0xFF]
                ^ t3[total >> 24]
                ^ crcs[i]
            )
    else:
        for i in range(1, last):
            total = crc32c_combine(total, crcs[i], block_size)
    if 0 < last < len(crcs):
        total = crc32c_combine(total, crcs[last], data_len - last * block_size)
    return total


def verify(data, crcs, block_size: int) -> None:
    """Raise :class:`ChecksumError` at the first block whose CRC32C differs."""
    mv = memoryview(data).cast("B")
    if len(crcs) != n_blocks(len(mv), block_size):
        raise FrameError("CRC table does not match the data length")
    for i, expected in enumerate(crcs):
        if crc32c.crc32c(mv[i * block_size : (i + 1) * block_size]) != expected:
            raise ChecksumError(i)


def header_body(
    op: int, status: int, meta_len: int, data_len: int, block_size: int, auth_len: int = 0
) -> bytes:
    """A header's bytes before its CRC."""
    return _HEADER_BODY.pack(
        MAGIC, VERSION, op, status, meta_len, data_len, block_size, auth_len, 0
    )


def pack_header(
    op: int, status: int, meta_len: int, data_len: int, block_size: int, auth_len: int = 0
) -> bytes:
    body = header_body(op, status, meta_len, data_len, block_size, auth_len)
    return body + struct.pack("<I", crc32c.crc32c(body))


def unpack_header(raw: bytes) -> Header:
    if len(raw) != HEADER_SIZE:
        raise FrameError(f"a header is {HEADER_SIZE} bytes, not {len(raw)}")
    magic, version, op, status, meta_len, data_len, block_size, auth_len, _, hcrc = HEADER.unpack(
        raw
    )
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic:#x}")
    if crc32c.crc32c(raw[: HEADER_SIZE - 4]) != hcrc:
        raise FrameError("header checksum mismatch")
    if version != VERSION:
        raise FrameError(f"unsupported protocol version {version}")
    if auth_len > MAX_AUTH:
        raise FrameError(f"auth section of {auth_len} bytes exceeds {MAX_AUTH}")
    if meta_len > MAX_META:
        raise FrameError(f"meta section of {meta_len} bytes exceeds {MAX_META}")
    if data_len > MAX_DATA:
        raise FrameError(f"data section of {data_len} bytes exceeds {MAX_DATA}")
    if data_len and (block_size < MIN_BLOCK or block_size > MAX_DATA):
        raise FrameError(f"invalid block size {block_size}")
    return Header(op, status, meta_len, data_len, block_size, auth_len, raw[: HEADER_SIZE - 4])


def recv_exact_into(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill ``view`` from the socket; FrameError if the peer closes first.

    With a ``deadline`` (a ``time.monotonic()`` value) the whole receive must
    end by then (TimeoutError), however the peer spaces its bytes; it sets
    the socket's timeout.
    """
    got = 0
    total = len(view)
    while got < total:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the frame did not arrive in time ({got} of {total} bytes)")
            sock.settimeout(left)
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise FrameError(f"connection closed after {got} of {total} bytes")
        got += n


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    buf = bytearray(n)
    if n:
        recv_exact_into(sock, memoryview(buf), deadline)
    return buf


def _crc_table(crcs) -> bytes:
    return struct.pack(f"<{len(crcs)}I", *crcs)


class Credential(Protocol):
    """What a request frame carries in its auth section (see :mod:`emberfs.common.auth`)."""

    length: int

    def section(self, body: bytes, meta: bytes, table: bytes) -> bytes:
        """The auth section of a frame with header ``body``, ``meta`` and CRC ``table``."""
        ...


def _head(
    op: int,
    status: int,
    meta: bytes,
    data_len: int,
    block_size: int,
    table: bytes,
    credential: Credential | None,
) -> bytes:
    """Everything of a frame before its data."""
    auth_len = credential.length if credential is not None else 0
    body = header_body(op, status, len(meta), data_len, block_size, auth_len)
    auth = credential.section(body, meta, table) if credential is not None else b""
    return body + struct.pack("<I", crc32c.crc32c(body)) + auth + meta + table


def send_frame(
    sock: socket.socket,
    op: int,
    meta: bytes = b"",
    data=None,
    *,
    status: int = Status.OK,
    block_size: int = DEFAULT_BLOCK,
    crcs: list[int] | None = None,
    credential: Credential | None = None,
) -> None:
    """Send one frame. CRCs of ``data`` are computed unless given."""
    if data is None:
        data_len, table = 0, b""
        block_size = 0
    else:
        data = memoryview(data).cast("B")
        data_len = len(data)
        if crcs is None:
            crcs = block_crcs(data, block_size)
        table = _crc_table(crcs)
    head = _head(op, status, meta, data_len, block_size, table, credential)
    if data_len and data_len <= 64 * 1024:
        sock.sendall(head + bytes(data))
        return
    sock.sendall(head)
    if data_len:
        sock.sendall(data)


def send_file_frame(
    sock: socket.socket,
    op: int,
    meta: bytes,
    fd: int,
    offset: int,
    length: int,
    crcs: list[int],
    block_size: int,
) -> None:
    """Send a frame whose data comes straight from a file with ``os.sendfile``.

    On a blocking socket, ``SO_SNDTIMEO`` bounds each stall (TimeoutError);
    on a socket with a timeout, that timeout does.
    """
    head = _head(op, Status.OK, meta, length, block_size, _crc_table(crcs), None)
    sock.sendall(head)
    sent = 0
    timeout = sock.gettimeout()
    while sent < length:
        try:
            n = os.sendfile(sock.fileno(), fd, offset + sent, length - sent)
        except BlockingIOError:
            if timeout is None:  # a blocking socket whose SO_SNDTIMEO ran out
                raise TimeoutError("timed out sending file data") from None
            # A socket with a timeout is non-blocking underneath: wait until it drains.
            _, writable, _ = select.select([], [sock], [], timeout)
            if not writable:
                raise TimeoutError("timed out sending file data") from None
            continue
        if n == 0:
            raise FrameError("file ended before the frame was sent")
        sent += n


def send_error(sock: socket.socket, op: int, status: int, message: str, **fields) -> None:
    from emberfs.proto import data_pb2

    err = data_pb2.ErrorResponse(code=int(status), message=message[:1000], **fields)
    send_frame(sock, op | RESPONSE, err.SerializeToString(), status=status)


@dataclass(slots=True)
class Frame:
    header: Header
    meta: bytes
    crcs: tuple[int, ...]
    data: memoryview | None


def recv_head(
    sock: socket.socket, deadline: float | None = None
) -> tuple[Header, bytes, tuple[int, ...]]:
    """Receive a frame up to its data: the header, auth section, meta section and CRC table.

    All of it is bounded (:data:`MAX_AUTH`, :data:`MAX_META`, and a CRC table
    of at most ``MAX_DATA / MIN_BLOCK`` entries). The auth section is kept in
    ``header.auth``, the CRC table's bytes in ``header.table``. The caller then receives ``header.data_len`` data bytes
    where it wants them (see :func:`recv_exact_into` for ``deadline``).
    """
    header = unpack_header(bytes(recv_exact(sock, HEADER_SIZE, deadline)))
    # auth, meta and CRC table arrive together: one receive where the socket allows
    nb = header.n_blocks
    rest = recv_exact(sock, header.auth_len + header.meta_len + 4 * nb, deadline)
    header.auth = bytes(rest[: header.auth_len])
    meta = bytes(rest[header.auth_len : header.auth_len + header.meta_len])
    crcs: tuple[int, ...] = ()
    if nb:
        header.table = bytes(rest[header.auth_len + header.meta_len :])
        crcs = struct.unpack_from(f"<{nb}I", header.table)
    return header, meta, crcs


def recv_frame(
    sock: socket.socket,
    into: memoryview | None = None,
    *,
    check: bool = True,
    alloc: Callable[[int], memoryview] | None = None,
) -> Frame:
    """Receive one frame, its data ``recv_into`` ``into`` when given (else a new buffer).

    ``alloc(n)``, when given and ``into`` is not, supplies the ``n``-byte data
    buffer (a receiver that reuses one buffer per connection saves zeroing and
    faulting in fresh memory for every frame).
    With ``check`` every block's CRC32C is verified (:class:`ChecksumError`).
    Raises FrameError on a malformed frame or a peer that stops mid-frame, and
    ``socket.timeout`` when the socket's timeout expires.
    """
    header, meta, crcs = recv_head(sock)
    data = None
    if header.data_len:
        if into is not None:
            if len(into) < header.data_len:
                raise FrameError(
                    f"{header.data_len} data bytes do not fit the {len(into)}-byte buffer"
                )
            data = into[: header.data_len]
        elif alloc is not None:
            data = alloc(header.data_len)
        else:
            data = memoryview(bytearray(header.data_len))
        recv_exact_into(sock, data)
        if check:
            verify(data, crcs, header.block_size)
    return Frame(header, meta, crcs, data)


def status_name(status: int) -> str:
    try:
        return Status(status).name
    except ValueError:
        return f"STATUS_{status}"
