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

from emberfs.client.chunkio import ChunkIO
from emberfs.client.datapath import DataClient
from emberfs.client.retry import RequestIds
from emberfs.client.routing import RoutingCache
from emberfs.common import framing
from emberfs.common.framing import Op, Status
from emberfs.common.wire import ConnectionPool
from emberfs.proto import common_pb2, data_pb2

CHUNK = 256 * 1024


class ScriptedServer:
    """A framed-protocol server whose answers come from ``rule(op, request, data)``.

    A rule that returns None closes the connection instead of answering.
    """

    def __init__(self, rule) -> None:
        self.rule = rule
        self.requests: list = []
        self.connections = 0
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
            self.connections += 1
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
                answer = self.rule(frame.header.op, req, data)
                if answer is None:  # the rule drops the connection
                    return
                status, meta, payload, crcs = answer
                try:
                    framing.send_frame(
                        conn,
                        frame.header.op | framing.RESPONSE,
                        meta,
                        payload,
                        status=status,
                        crcs=crcs,
                    )
                except OSError:  # the client closed the connection
                    return

    def close(self):
        self.sock.close()


def ok_read(content: bytes):
    def rule(op, req, data):
        piece = content[req.offset : req.offset + req.length]
        meta = data_pb2.ChunkReadResponse(
            version=1, chunk_length=len(content), data_offset=req.offset, chunk=req.chunk
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
    client.read(ChunkIO.over(7, 1, 0, offset, out))
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


def test_a_replica_without_the_chunk_does_not_hide_it_on_another(make_client):
    """``NOT_FOUND`` from one replica is a hole only when every serving replica says so."""
    content = os.urandom(CHUNK)
    missing = ScriptedServer(refuse(Status.NOT_FOUND))
    holder = ScriptedServer(ok_read(content))
    _, client = make_client([missing, holder])
    for _ in range(4):  # the replicas are asked in turn: each comes first at times
        assert read(client) == content
    assert missing.requests  # the replica without it was asked too
    # a replica that cannot be reached leaves the question open: retried, not zeros
    dead = ScriptedServer(lambda op, req, data: None)  # closes without answering
    _, client = make_client([ScriptedServer(refuse(Status.NOT_FOUND)), dead], read_timeout=1)
    with pytest.raises(OSError) as exc:
        read(client)
    assert exc.value.errno == errno.EIO


def answers_for(content: bytes, chunk_index: int = 0, shift: int = 0):
    """A replica that answers every read with ``content`` of chunk ``chunk_index``, ``shift``
    bytes further on, and says so in the answer; its CRCs match the bytes it sends."""

    def rule(op, req, data):
        at = req.offset + shift
        meta = data_pb2.ChunkReadResponse(
            version=1,
            chunk_length=len(content),
            data_offset=at,
            chunk=data_pb2.ChunkId(inode=req.chunk.inode, index=chunk_index),
        ).SerializeToString()
        return Status.OK, meta, content[at : at + req.length] or None, None

    return rule


@pytest.mark.parametrize("wrong", ["chunk", "offset"])
def test_an_answer_for_another_read_is_never_returned(make_client, wrong):
    """Its CRCs hold, so only the chunk and offset it names tell it from the right one."""
    content = os.urandom(CHUNK)
    other = answers_for(os.urandom(CHUNK), 1) if wrong == "chunk" else answers_for(content, 0, 4096)
    stray, good = ScriptedServer(other), ScriptedServer(ok_read(content))
    _, client = make_client([stray, good])
    for _ in range(4):  # the replicas are asked in turn: the stray one comes first at times
        assert read(client, 8192) == content[:8192]
    assert stray.requests
    # a sent read (one connection per server, answers in order) checks it too
    _, client = make_client([ScriptedServer(other)])
    first, second = sent(client, range(2))
    assert finish(first) is None and finish(second) is None  # both fall back to fetches
    assert client.lanes.sent() == 0


def test_unaligned_read_uses_skip(make_client):
    content = os.urandom(CHUNK)
    block = framing.DEFAULT_BLOCK

    def widened(op, req, data):
        first = req.offset // block * block
        end = min(len(content), -(-(req.offset + req.length) // block) * block)
        meta = data_pb2.ChunkReadResponse(
            version=1,
            chunk_length=len(content),
            data_offset=first,
            skip=req.offset - first,
            chunk=req.chunk,
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
    resp = client.write(ChunkIO.over(7, 1, 0, 0, b"x" * 5000, chunk_size=CHUNK))
    assert resp.version == 3
    ids = {(r.client_id, r.request_id) for r in server.requests}
    assert len(server.requests) == 3 and len(ids) == 1
    assert all(r.target_id == 1 and r.chunk_size == CHUNK for r in server.requests)


def test_a_chain_without_room_raises_enospc_at_once(make_client):
    server = ScriptedServer(refuse(Status.NO_SPACE))
    cluster, client = make_client([server], write_timeout=30)
    with pytest.raises(OSError) as exc:
        client.write(ChunkIO.over(7, 1, 0, 0, b"x" * 5000, chunk_size=CHUNK))
    assert exc.value.errno == errno.ENOSPC and "chain 7" in str(exc.value)
    assert len(server.requests) == 1 and cluster.fetches == 1  # not retried


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
        assert client.write(ChunkIO.over(7, 1, 0, 0, b"abc", chunk_size=CHUNK)).chunk_length == 3
    finally:
        timer.cancel()
    assert cluster.fetches > 1


# reads sent ahead (start_read): one connection per server, answers in order

PIECE = 64 * 1024


@pytest.fixture
def one_server(make_client):
    """(content, server, client): one scripted server holding ``content`` as chunk 0."""
    content = os.urandom(CHUNK)
    server = ScriptedServer(ok_read(content))
    _, client = make_client([server])
    return content, server, client


def sent(client, pieces, size=PIECE):
    """Start reads of ``pieces`` (indexes of ``size``-byte pieces of chunk 0)."""
    return [client.start_read(ChunkIO(7, 1, 0, k * size, size)) for k in pieces]


def finish(pending, size=PIECE):
    out = bytearray(size)
    ok = pending.finish_into(memoryview(out))
    return bytes(out) if ok else None


def pool_idle(pool) -> bool:
    """Every open connection is idle in the pool."""
    return pool.all_idle()


def test_reads_sent_to_one_server_share_one_connection(one_server):
    content, server, client = one_server
    pending = sent(client, range(4))
    assert all(p is not None for p in pending)
    # the server's sent reads are limited (half the connections one server may have)
    assert client.start_read(ChunkIO(7, 1, 0, 0, PIECE)) is None
    for k, p in enumerate(pending):
        assert finish(p) == content[k * PIECE : (k + 1) * PIECE]
    assert server.connections == 1 and len(server.requests) == 4
    assert pool_idle(client.pool) and client.lanes.sent() == 0
    # the next reads reuse the same (idle) connection
    assert finish(sent(client, [3])[0]) == content[3 * PIECE :]
    assert server.connections == 1


def test_sent_reads_finished_out_of_order(one_server):
    content, server, client = one_server
    first, second, third = sent(client, range(3))
    # the third's answer comes after the first two: they are kept for their own calls
    assert finish(third) == content[2 * PIECE : 3 * PIECE]
    assert finish(first) == content[:PIECE]
    assert finish(second) == content[PIECE : 2 * PIECE]
    assert server.connections == 1
    assert pool_idle(client.pool) and client.lanes.sent() == 0


def test_cancelled_sent_reads_are_dropped_and_the_connection_kept(one_server):
    content, server, client = one_server
    first, second, third = sent(client, range(3))
    second.cancel()
    assert finish(first) == content[:PIECE]
    assert finish(third) == content[2 * PIECE : 3 * PIECE]
    assert finish(second) is None  # cancelled: nothing to receive any more
    assert server.connections == 1 and pool_idle(client.pool)
    assert finish(sent(client, [1])[0]) == content[PIECE : 2 * PIECE]
    assert server.connections == 1


def test_a_connection_whose_answers_nobody_wants_is_closed(one_server):
    content, server, client = one_server
    for p in sent(client, range(3)):
        p.cancel()
    assert client.lanes.sent() == 0
    assert client.pool.connections(server.address) == 0  # closed, not pooled with answers in it
    assert finish(sent(client, [0])[0]) == content[:PIECE]
    assert server.connections == 2


def test_a_broken_connection_fails_its_sent_reads_and_they_are_fetched(make_client):
    content = os.urandom(CHUNK)
    answered = []

    def once(op, req, data):
        if answered:
            return None  # the connection closes after the first answer
        answered.append(req)
        return ok_read(content)(op, req, data)

    flaky = ScriptedServer(once)
    _, client = make_client([flaky])
    first, second, third = sent(client, range(3))
    assert finish(first) == content[:PIECE]
    assert finish(second) is None and finish(third) is None
    assert client.pool.is_bad(flaky.address)
    assert client.lanes.sent() == 0
    assert client.pool.connections(flaky.address) == 0


def test_sent_reads_from_two_threads_share_a_connection(one_server):
    content, server, client = one_server
    results: dict[int, bytes | None] = {}
    errors: list[BaseException] = []

    def reader(k: int) -> None:
        try:
            for _ in range(20):
                p = client.start_read(ChunkIO(7, 1, 0, k * PIECE, PIECE))
                if p is None:
                    continue
                results[k] = finish(p)
                assert results[k] == content[k * PIECE : (k + 1) * PIECE]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(results) == 4
    assert pool_idle(client.pool) and client.lanes.sent() == 0


def test_a_kept_answer_is_verified_when_it_is_used(make_client):
    content = os.urandom(CHUNK)

    def first_corrupt(op, req, data):
        status, meta, payload, _ = ok_read(content)(op, req, data)
        if req.offset != 0:
            return status, meta, payload, None
        bad = bytearray(payload)
        bad[100] ^= 0xFF  # the CRCs sent are of the good data
        return status, meta, bytes(bad), framing.block_crcs(payload)

    server = ScriptedServer(first_corrupt)
    _, client = make_client([server])
    first, second = sent(client, range(2))
    assert finish(second) == content[PIECE : 2 * PIECE]  # the first's answer is kept meanwhile
    assert finish(first) is None  # and found corrupt when it is used
    assert client.pool.is_bad(server.address)


def test_an_error_in_the_middle_of_an_answer_closes_the_connection(one_server):
    content, server, client = one_server
    first, second = sent(client, range(2))
    with pytest.raises(TypeError):  # a read-only buffer: the answer is left half read
        first.finish_into(memoryview(bytes(PIECE)))
    assert client.pool.connections(server.address) == 0
    assert finish(second) is None  # its connection is gone: the caller fetches it instead
    assert read(client, PIECE, PIECE) == content[PIECE : 2 * PIECE]
    assert client.lanes.sent() == 0
