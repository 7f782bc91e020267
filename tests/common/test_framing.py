from __future__ import annotations

import os
import random
import socket
import struct
import threading
import time

import crc32c
import pytest

from emberfs.common import framing
from emberfs.proto import data_pb2


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


def test_round_trip_with_data(pair):
    a, b = pair
    data = os.urandom(300 * 1024 + 17)
    meta = data_pb2.ChunkReadResponse(version=3, chunk_length=len(data)).SerializeToString()
    t = threading.Thread(
        target=framing.send_frame, args=(a, framing.Op.READ | framing.RESPONSE, meta, data)
    )
    t.start()
    frame = framing.recv_frame(b)
    t.join()
    assert frame.header.op == framing.Op.READ | framing.RESPONSE
    assert frame.header.is_response
    assert bytes(frame.data) == data
    assert len(frame.crcs) == framing.n_blocks(len(data), framing.DEFAULT_BLOCK)
    assert data_pb2.ChunkReadResponse.FromString(frame.meta).version == 3


def test_recv_into_caller_buffer(pair):
    a, b = pair
    data = os.urandom(128 * 1024)
    buf = bytearray(256 * 1024)
    t = threading.Thread(target=framing.send_frame, args=(a, framing.Op.WRITE, b"", data))
    t.start()
    frame = framing.recv_frame(b, into=memoryview(buf))
    t.join()
    assert frame.data.obj is buf
    assert buf[: len(data)] == data


def test_sendfile_frame(pair, tmp_path):
    a, b = pair
    data = os.urandom(200 * 1024)
    path = tmp_path / "chunk"
    path.write_bytes(data)
    crcs = framing.block_crcs(data[64 * 1024 :], framing.DEFAULT_BLOCK)
    fd = os.open(path, os.O_RDONLY)
    try:
        t = threading.Thread(
            target=framing.send_file_frame,
            args=(
                a,
                framing.Op.READ | framing.RESPONSE,
                b"m",
                fd,
                64 * 1024,
                len(data) - 64 * 1024,
                crcs,
                framing.DEFAULT_BLOCK,
            ),
        )
        t.start()
        frame = framing.recv_frame(b)
        t.join()
    finally:
        os.close(fd)
    assert frame.meta == b"m"
    assert bytes(frame.data) == data[64 * 1024 :]


def test_corrupted_block_is_detected(pair):
    a, b = pair
    data = bytearray(os.urandom(200 * 1024))
    crcs = framing.block_crcs(data)
    data[100 * 1024] ^= 0x01  # flip one bit after the checksums were taken
    t = threading.Thread(
        target=framing.send_frame, args=(a, framing.Op.WRITE, b"", data), kwargs={"crcs": crcs}
    )
    t.start()
    with pytest.raises(framing.ChecksumError) as info:
        framing.recv_frame(b)
    t.join()
    assert info.value.block == 1


def test_bad_magic(pair):
    a, b = pair
    a.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 10)
    with pytest.raises(framing.FrameError, match="magic"):
        framing.recv_frame(b)


def test_header_checksum(pair):
    a, b = pair
    raw = bytearray(framing.pack_header(framing.Op.READ, 0, 0, 0, 0))
    raw[8] ^= 0xFF
    a.sendall(bytes(raw))
    with pytest.raises(framing.FrameError, match="checksum"):
        framing.recv_frame(b)


@pytest.mark.parametrize(
    "meta_len,data_len,block",
    [(framing.MAX_META + 1, 0, 0), (0, framing.MAX_DATA + 1, framing.DEFAULT_BLOCK), (0, 10, 100)],
)
def test_oversized_or_invalid_lengths(pair, meta_len, data_len, block):
    a, b = pair
    a.sendall(framing.pack_header(framing.Op.WRITE, 0, meta_len, data_len, block))
    with pytest.raises(framing.FrameError):
        framing.recv_frame(b)


def test_peer_stops_mid_frame(pair):
    a, b = pair
    a.sendall(framing.pack_header(framing.Op.WRITE, 0, 4, 100_000, framing.DEFAULT_BLOCK) + b"ab")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(framing.FrameError, match="closed"):
        framing.recv_frame(b)


def test_peer_stalls_mid_frame_times_out(pair):
    a, b = pair
    b.settimeout(0.2)
    a.sendall(framing.pack_header(framing.Op.WRITE, 0, 4, 0, 0) + b"ab")
    with pytest.raises(socket.timeout):
        framing.recv_frame(b)


def test_buffer_too_small(pair):
    a, b = pair
    t = threading.Thread(target=framing.send_frame, args=(a, framing.Op.WRITE, b"", b"x" * 5000))
    t.start()
    with pytest.raises(framing.FrameError, match="fit"):
        framing.recv_frame(b, into=memoryview(bytearray(100)))
    t.join()


def test_error_frame(pair):
    a, b = pair
    framing.send_error(
        a, framing.Op.READ, framing.Status.STALE_CHAIN, "old chain", routing_version=9
    )
    frame = framing.recv_frame(b)
    assert frame.header.status == framing.Status.STALE_CHAIN
    err = data_pb2.ErrorResponse.FromString(frame.meta)
    assert err.routing_version == 9 and err.message == "old chain"
    assert framing.status_name(frame.header.status) == "STALE_CHAIN"
    assert framing.Status.STALE_CHAIN in framing.RETRYABLE


def test_block_crcs_match_crc32c():
    data = os.urandom(150 * 1024)
    crcs = framing.block_crcs(data, 64 * 1024)
    assert crcs == [crc32c.crc32c(data[i : i + 65536]) for i in range(0, len(data), 65536)]
    framing.verify(data, crcs, 64 * 1024)
    with pytest.raises(framing.FrameError):
        framing.verify(data, crcs[:-1], 64 * 1024)


def test_header_layout_is_stable():
    raw = framing.pack_header(framing.Op.WRITE, 0, 7, 9, 65536, 25)
    assert len(raw) == 28
    magic, version, op, status, meta_len, data_len, block, auth, reserved, _ = struct.unpack(
        "<IBBHIIIHHI", raw
    )
    assert raw[:4] == b"EMBF"
    assert (version, op, status, meta_len, data_len, block, auth, reserved) == (
        2,
        2,
        0,
        7,
        9,
        65536,
        25,
        0,
    )


def test_credentials_ride_between_header_and_meta_and_are_received_whole(pair):
    a, b = pair

    class Fixed:
        length = 5

        def section(self, body, meta, table):
            assert len(body) == framing.HEADER_SIZE - 4 and meta == b"meta"
            assert len(table) == 4  # one block
            return b"creds"

    framing.send_frame(a, framing.Op.WRITE, b"meta", b"data", credential=Fixed())
    header, meta, crcs = framing.recv_head(b)
    assert (header.auth, meta, len(crcs)) == (b"creds", b"meta", 1)
    assert bytes(framing.recv_exact(b, header.data_len)) == b"data"


def test_an_oversized_auth_section_is_refused_before_it_is_read(pair):
    a, b = pair
    a.sendall(framing.pack_header(framing.Op.PING, 0, 0, 0, 0, framing.MAX_AUTH + 1))
    with pytest.raises(framing.FrameError, match="auth section"):
        framing.recv_frame(b)


def test_a_frame_deadline_holds_however_the_bytes_are_spaced(pair):
    a, b = pair
    raw = framing.pack_header(framing.Op.PING, 0, 0, 0, 0)

    def trickle():
        for byte in raw[:-1]:
            try:
                a.sendall(bytes([byte]))
            except OSError:  # the test is over and closed the socket
                return
            time.sleep(0.05)

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        framing.recv_head(b, deadline=time.monotonic() + 0.5)
    assert time.monotonic() - started < 1.0


def test_sendfile_frame_on_a_socket_with_timeout(tmp_path):
    """A socket with a timeout is non-blocking underneath; large files still go out whole."""
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    data = os.urandom(8 * 1024 * 1024)
    path = tmp_path / "big"
    path.write_bytes(data)
    crcs = framing.block_crcs(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        t = threading.Thread(
            target=framing.send_file_frame,
            args=(
                a,
                framing.Op.READ | framing.RESPONSE,
                b"",
                fd,
                0,
                len(data),
                crcs,
                framing.DEFAULT_BLOCK,
            ),
        )
        t.start()
        frame = framing.recv_frame(b)
        t.join()
    finally:
        os.close(fd)
        a.close()
        b.close()
    assert bytes(frame.data) == data


def test_sendfile_to_a_reader_that_never_reads_times_out(tmp_path):
    """A blocking socket with a send limit (how the storage server sends reads) ends the
    frame when the limit runs out, instead of waiting for the reader for ever."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 0, 300_000))
    a.settimeout(None)
    path = tmp_path / "big"
    data = os.urandom(16 << 20)  # far more than the socket buffers hold
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            framing.send_file_frame(
                a,
                framing.Op.READ | framing.RESPONSE,
                b"",
                fd,
                0,
                len(data),
                framing.block_crcs(data),
                framing.DEFAULT_BLOCK,
            )
        assert time.monotonic() - t0 < 5
    finally:
        os.close(fd)
        a.close()
        b.close()


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 65536, 3 * 65536 + 100, 4 << 20])
@pytest.mark.parametrize("block", [4096, 65536])
def test_combine_crcs_equals_the_crc_of_the_whole(size, block):
    data = random.Random(size * 7 + block).randbytes(size)
    crcs = framing.block_crcs(data, block)
    assert framing.combine_crcs(crcs, block, size) == crc32c.crc32c(data)


def test_combine_crcs_refuses_a_table_of_the_wrong_length():
    with pytest.raises(ValueError):
        framing.combine_crcs([1, 2], 4096, 4096)


def test_crc32c_combine_of_two_parts():
    a, b = b"emberfs " * 1000, b"chunk data" * 333
    joined = framing.crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b))
    assert joined == crc32c.crc32c(a + b)
    assert framing.crc32c_combine(crc32c.crc32c(a), 0, 0) == crc32c.crc32c(a)
    big = random.Random(3).randbytes(3 * (1 << 20) + 5)  # longer than one run of zeros
    joined = framing.crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(big), len(big))
    assert joined == crc32c.crc32c(a + big)


def test_odd_last_blocks_build_no_tables():
    """Small files end in short blocks of every length; only block sizes get a table."""
    framing.zeros_operator.cache_clear()
    rng = random.Random(5)
    for _ in range(40):
        size = rng.randrange(65536 + 1, 4 * 65536)
        data = rng.randbytes(size)
        assert framing.combine_crcs(framing.block_crcs(data), 65536, size) == crc32c.crc32c(data)
    data = rng.randbytes(5 * 6000 + 7)  # a block size that is no power of two
    assert framing.combine_crcs(framing.block_crcs(data, 6000), 6000, len(data)) == (
        crc32c.crc32c(data)
    )
    assert framing.zeros_operator.cache_info().currsize == 1
