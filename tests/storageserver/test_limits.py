"""Limits that hold under abuse, through real processes: slow peers, lying lengths, floods."""

from __future__ import annotations

import os
import socket
import time

import pytest

from emberfs.client.fs import EmberFileSystem
from emberfs.common import framing
from emberfs.common.auth import CapabilityCredential, ClusterKeys
from emberfs.common.framing import Op

FRAME_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    from tests.conftest import make_cluster

    cluster = make_cluster(
        tmp_path_factory,
        "limits",
        extra_storage_args=[
            "--frame-timeout",
            str(FRAME_TIMEOUT),
            "--max-connections",
            "12",
            "--forward-reserve",
            "4",
        ],
    )
    cluster.start(timeout=90)
    try:
        yield cluster
    finally:
        cluster.stop()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def test_a_slow_sender_is_dropped_after_the_frame_deadline_and_readers_carry_on(limited):
    cluster = limited
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    data = os.urandom(3 << 20)
    fs.pipe_file("/slow.bin", data)
    header = framing.pack_header(Op.PING, 0, 0, 0, 0)
    lorises = [connect(cluster.storage_address(i)) for i in range(len(cluster.storage))]
    started = time.monotonic()
    try:
        closed_at = {}
        sent = 0
        while len(closed_at) < len(lorises) and time.monotonic() - started < 4 * FRAME_TIMEOUT:
            for i, sock in enumerate(lorises):
                if i in closed_at or sent >= len(header) - 1:
                    continue
                try:
                    sock.sendall(header[sent : sent + 1])  # one byte at a time, never the last
                except OSError:
                    closed_at[i] = time.monotonic() - started
            sent += 1
            assert fs.cat_file("/slow.bin") == data  # a well-behaved reader is served meanwhile
            time.sleep(0.3)
            for i, sock in enumerate(lorises):
                if i in closed_at:
                    continue
                sock.settimeout(0.01)
                try:
                    if sock.recv(1) == b"":
                        closed_at[i] = time.monotonic() - started
                except (TimeoutError, BlockingIOError):
                    pass
                except OSError:
                    closed_at[i] = time.monotonic() - started
        assert len(closed_at) == len(lorises), "a slow sender kept its connection"
        assert max(closed_at.values()) < FRAME_TIMEOUT + 2.0
    finally:
        for sock in lorises:
            sock.close()
        fs.close()


def test_a_lying_length_gets_no_buffer_before_its_credentials_are_checked(limited):
    cluster = limited
    address = cluster.storage_address(0)
    pid = cluster.storage[0].proc.pid
    before = rss(pid)
    meta = b"\x08\x01"
    socks = []
    try:
        for _ in range(40):  # 40 x 64 MiB declared: 2.5 GiB if it were allocated
            sock = connect(address)
            sock.sendall(
                framing.pack_header(Op.WRITE, 0, len(meta), framing.MAX_DATA, framing.DEFAULT_BLOCK)
                + meta
                + b"\0" * (4 * (framing.MAX_DATA // framing.DEFAULT_BLOCK))
            )
            socks.append(sock)
        for sock in socks:
            # answered (DENIED) before a byte of the payload was sent, then closed
            header, _, _ = framing.recv_head(sock)
            assert header.status == framing.Status.DENIED
            assert sock.recv(1) == b""
        assert rss(pid) - before < 64 << 20
    finally:
        for sock in socks:
            sock.close()


def ping(sock: socket.socket, credential) -> int:
    framing.send_frame(sock, Op.PING, b"", None, credential=credential)
    return framing.recv_head(sock)[0].status


def test_a_flood_of_client_connections_leaves_the_forwards_their_reserve(limited):
    cluster = limited
    keys = ClusterKeys.from_file(cluster.secret_file)
    client = CapabilityCredential(keys.sign_capability(1, read=True, write=False, ttl=300))
    flood: list[socket.socket] = []
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True, max_connections=1)
    try:
        # every server: all but one of the clients' 8 connections held by a flood
        for i in range(len(cluster.storage)):
            for _ in range(7):
                sock = connect(cluster.storage_address(i))
                assert ping(sock, client) == framing.Status.OK
                flood.append(sock)
        # the chains' forwards open connections of their own, from the reserve
        data = os.urandom(5 << 20)
        fs.pipe_file("/under-flood.bin", data)
        assert fs.cat_file("/under-flood.bin") == data
        # one client too many is refused; a server still gets in
        extra = [connect(cluster.storage_address(0)) for _ in range(2)]
        flood.extend(extra)
        statuses = []
        for sock in extra:
            try:
                statuses.append(ping(sock, client))
            except (OSError, framing.FrameError):
                statuses.append("closed")
        assert framing.Status.BUSY in statuses
        server = connect(cluster.storage_address(0))
        flood.append(server)
        assert ping(server, keys.server_credential()) == framing.Status.OK
    finally:
        for sock in flood:
            sock.close()
        fs.close()


def test_frames_without_credentials_do_not_hold_connections(limited):
    cluster = limited
    socks = [connect(cluster.storage_address(1)) for _ in range(20)]
    try:
        for sock in socks:
            try:
                status = ping(sock, None)
            except (OSError, framing.FrameError):
                continue  # refused outright (no room)
            assert status in (framing.Status.DENIED, framing.Status.BUSY)
            sock.settimeout(5)
            try:
                assert sock.recv(1) == b""  # and the connection closed
            except ConnectionResetError:
                pass
    finally:
        for sock in socks:
            sock.close()
