"""The data path's replica choice, failover and retries, against scripted storage servers.

Each scripted server speaks the real framed protocol (emberfs.common.framing)
and answers by a per-test rule, so the rare answers of a real cluster (a
pending version, a corrupted block, a stale chain) are checked deterministically.
"""

from __future__ import annotations

import errno
import os
import socket
import threading

import pytest

from emberfs.client.datapath import ConnectionPool, DataClient
from emberfs.client.meta import RequestIds
from emberfs.client.routing import RoutingCache
from emberfs.common import framing
from emberfs.common.framing import Op, Status
from emberfs.proto import common_pb2, data_pb2

CHUNK = 256 * 1024


class ScriptedServer:
    """A framed-protocol server whose answers come from ``rule(op, request, data)``."""

    def __init__(self, rule) -> None:
        self.rule = rule
        self.requests: list = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            while True:
                try:
                    frame = framing.recv_frame(conn)
                except (framing.FrameError, OSError):
                    return
                if frame.header.op == Op.READ:
                    req = data_pb2.ChunkReadRequest.FromString(frame.meta)
                else:
                    req = data_pb2.ChunkWriteRequest.FromString(frame.meta)
                self.requests.append(req)
                data = bytes(frame.data) if frame.data is not None else b""
                status, meta, payload, crcs = self.rule(frame.header.op, req, data)
                framing.send_frame(
                    conn,
                    frame.header.op | framing.RESPONSE,
                    meta,
                    payload,
                    status=status,
                    crcs=crcs,
                )

    def close(self):
        self.sock.close()


def ok_read(content: bytes):
    def rule(op, req, data):
        piece = content[req.offset : req.offset + req.length]
        meta = data_pb2.ChunkReadResponse(
            version=1, chunk_length=len(content), data_offset=req.offset
        ).SerializeToString()
        return Status.OK, meta, piece or None, None

    return rule


def refuse(status):
    def rule(op, req, data):
        err = data_pb2.ErrorResponse(code=status, message=Status(status).name)
        return status, err.SerializeToString(), None, None

    return rule


class Cluster:
    """Routing for one chain over scripted servers (head first)."""

    def __init__(self, servers, version=1):
        self.servers = servers
        self.version = version
        self.fetches = 0
        self.states = [common_pb2.SERVING] * len(servers)

    def routing(self):
        self.fetches += 1
        targets = [
            common_pb2.TargetInfo(target_id=i + 1, data_address=s.address, state=self.states[i])
            for i, s in enumerate(self.servers)
        ]
        chain = common_pb2.ChainInfo(
            chain_id=7, version=self.version, targets=[t.target_id for t in targets]
        )
        return common_pb2.RoutingInfo(version=self.version, targets=targets, chains=[chain])


@pytest.fixture
def make_client():
    made = []

    def make(servers, **kwargs):
        cluster = Cluster(servers)
        pool = ConnectionPool(connect_timeout=2, io_timeout=5)
        client = DataClient(
            RoutingCache(cluster.routing, min_interval=0),
            RequestIds(),
            pool,
            read_timeout=kwargs.get("read_timeout", 10),
            write_timeout=kwargs.get("write_timeout", 10),
        )
        made.append((pool, servers))
        return cluster, client

    yield make
    for pool, servers in made:
        pool.close()
        for s in servers:
            s.close()


def read(client, length=CHUNK, offset=0):
    out = bytearray(length)
    client.read_chunk(7, 1, 0, offset, memoryview(out))
    return bytes(out)


def test_not_committed_goes_to_another_replica(make_client):
    content = os.urandom(CHUNK)
    pending = ScriptedServer(refuse(Status.NOT_COMMITTED))
    tail = ScriptedServer(ok_read(content))
    _, client = make_client([pending, tail])
    for _ in range(4):
        assert read(client) == content


def test_corrupted_block_is_never_returned(make_client):
    content = os.urandom(CHUNK)

    def corrupt(op, req, data):
        status, meta, payload, _ = ok_read(content)(op, req, data)
        bad = bytearray(payload)
        bad[70000] ^= 0xFF  # the stored CRCs are of the good data
        return status, meta, bytes(bad), framing.block_crcs(payload)

    bad, good = ScriptedServer(corrupt), ScriptedServer(ok_read(content))
    _, client = make_client([bad, good])
    for _ in range(4):
        assert read(client) == content


def test_stale_chain_refreshes_routing(make_client):
    content = os.urandom(CHUNK)
    state = {"version": 1}

    def versioned(op, req, data):
        if req.chain_version != state["version"]:
            return refuse(Status.STALE_CHAIN)(op, req, data)
        return ok_read(content)(op, req, data)

    servers = [ScriptedServer(versioned), ScriptedServer(versioned)]
    cluster, client = make_client(servers)
    assert read(client) == content
    state["version"] = cluster.version = 2
    assert read(client) == content
    assert cluster.fetches >= 2
    assert servers[0].requests[-1].chain_version == 2 or servers[1].requests[-1].chain_version == 2


def test_dead_replica_fails_over(make_client):
    content = os.urandom(CHUNK)
    dead = ScriptedServer(ok_read(content))
    dead.close()  # connections are refused from now on
    _, client = make_client([dead, ScriptedServer(ok_read(content))])
    for _ in range(3):
        assert read(client) == content


def test_missing_and_short_chunks_read_as_zeros(make_client):
    short = os.urandom(1000)
    _, client = make_client([ScriptedServer(ok_read(short))])
    assert read(client, 4096) == short + bytes(3096)
    _, client = make_client([ScriptedServer(refuse(Status.NOT_FOUND))])
    assert read(client, 4096) == bytes(4096)


def test_unaligned_read_uses_skip(make_client):
    content = os.urandom(CHUNK)
    block = framing.DEFAULT_BLOCK

    def widened(op, req, data):
        first = req.offset // block * block
        end = min(len(content), -(-(req.offset + req.length) // block) * block)
        meta = data_pb2.ChunkReadResponse(
            version=1, chunk_length=len(content), data_offset=first, skip=req.offset - first
        ).SerializeToString()
        return Status.OK, meta, content[first:end], None

    _, client = make_client([ScriptedServer(widened)])
    assert read(client, 5000, offset=70001) == content[70001:75001]


def test_bad_request_everywhere_is_an_error_at_once(make_client):
    _, client = make_client([ScriptedServer(refuse(Status.BAD_REQUEST))] * 1, read_timeout=30)
    with pytest.raises(OSError) as exc:
        read(client)
    assert exc.value.errno == errno.EIO


def test_no_serving_replica_times_out(make_client):
    cluster, client = make_client([ScriptedServer(refuse(Status.NOT_SERVING))], read_timeout=1)
    with pytest.raises(OSError) as exc:
        read(client)
    assert exc.value.errno == errno.EIO and cluster.fetches > 1


def test_write_retries_with_the_same_request_id(make_client):
    answers = [Status.STALE_CHAIN, Status.BUSY, Status.OK]

    def head(op, req, data):
        status = answers.pop(0)
        if status != Status.OK:
            return refuse(status)(op, req, data)
        resp = data_pb2.ChunkWriteResponse(version=3, chunk_length=len(data))
        return Status.OK, resp.SerializeToString(), None, None

    server = ScriptedServer(head)
    _, client = make_client([server])
    resp = client.write_chunk(7, 1, 0, 0, b"x" * 5000, CHUNK)
    assert resp.version == 3
    ids = {(r.client_id, r.request_id) for r in server.requests}
    assert len(server.requests) == 3 and len(ids) == 1
    assert all(r.target_id == 1 and r.chunk_size == CHUNK for r in server.requests)


def test_write_waits_for_a_serving_head(make_client):
    server = ScriptedServer(
        lambda op, req, data: (
            Status.OK,
            data_pb2.ChunkWriteResponse(version=1, chunk_length=len(data)).SerializeToString(),
            None,
            None,
        )
    )
    cluster, client = make_client([server], write_timeout=5)
    cluster.states = [common_pb2.OFFLINE]
    timer = threading.Timer(0.5, lambda: cluster.states.__setitem__(0, common_pb2.SERVING))
    timer.start()
    try:
        assert client.write_chunk(7, 1, 0, 0, b"abc", CHUNK).chunk_length == 3
    finally:
        timer.cancel()
    assert cluster.fetches > 1
