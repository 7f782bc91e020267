"""In-process tests of the data server: three DataServers, one target each, one chain."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from concurrent import futures

import grpc
import pytest

from emberfs.common import framing
from emberfs.common.framing import Op, Status
from emberfs.common.routing import RoutingView
from emberfs.proto import common_pb2, data_pb2
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.dataserver import DataServer
from emberfs.storageserver.resync import sync_successor
from emberfs.storageserver.service import StorageServicer, add_to_server

CS = 1024 * 1024  # chunk size of the tests' files
BS = framing.DEFAULT_BLOCK
S, Y, OFF = common_pb2.SERVING, common_pb2.SYNCING, common_pb2.OFFLINE

pytestmark = pytest.mark.timeout(60)


class Cluster:
    """Three targets (ids 1, 2, 3) on three data servers, chain 1 in that order."""

    def __init__(self, tmp_path, **server_kwargs):
        self.stores = {t: ChunkStore(tmp_path / f"target-{t}") for t in (1, 2, 3)}
        self.view = RoutingView()
        self.views: dict[int, RoutingView] = {}  # a server's own view, when not the cluster's
        self.servers = {
            t: DataServer(
                "127.0.0.1",
                0,
                stores=lambda t=t: {t: self.stores[t]},
                routing=lambda t=t: self.views.get(t, self.view),
                **server_kwargs,
            ).start()
            for t in (1, 2, 3)
        }
        self.chain_version = 0
        self.set_chain({1: S, 2: S, 3: S}, (1, 2, 3))

    def addr(self, t: int) -> tuple[str, int]:
        return self.servers[t].address

    def set_chain(self, states: dict[int, int], order: tuple[int, ...]) -> None:
        self.chain_version += 1
        routing = common_pb2.RoutingInfo(version=100 + self.chain_version)
        for t, st in states.items():
            host, port = self.addr(t)
            routing.targets.add(
                target_id=t, node_id=f"n{t}", data_address=f"{host}:{port}", state=st, chain_id=1
            )
        routing.chains.add(chain_id=1, version=self.chain_version, targets=list(order))
        self.view = RoutingView.from_proto(routing)

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        for store in self.stores.values():
            store.close()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def connect(addr) -> socket.socket:
    sock = socket.create_connection(addr, timeout=10)
    sock.settimeout(10)
    return sock


def exchange(addr_or_sock, op, msg, data=None):
    """Send one request; returns (status, response meta message or ErrorResponse, data)."""
    sock = addr_or_sock if isinstance(addr_or_sock, socket.socket) else connect(addr_or_sock)
    try:
        framing.send_frame(sock, op, msg.SerializeToString(), data)
        frame = framing.recv_frame(sock)
    finally:
        if sock is not addr_or_sock:
            sock.close()
    assert frame.header.op == op | framing.RESPONSE
    status = frame.header.status
    if status != Status.OK:
        return status, data_pb2.ErrorResponse.FromString(frame.meta), None
    resp_type = {
        Op.READ: data_pb2.ChunkReadResponse,
        Op.WRITE: data_pb2.ChunkWriteResponse,
        Op.TRUNCATE: data_pb2.ChunkTruncateResponse,
    }[op]
    return status, resp_type.FromString(frame.meta), frame.data


def write(
    c, data, *, target=1, inode=7, index=0, offset=0, version=None, client=("", 0), sock=None
):
    req = data_pb2.ChunkWriteRequest(
        chain_id=1,
        chain_version=c.chain_version if version is None else version,
        target_id=target,
        chunk=data_pb2.ChunkId(inode=inode, index=index),
        offset=offset,
        chunk_size=CS,
        client_id=client[0],
        request_id=client[1],
    )
    return exchange(sock or c.addr(target), Op.WRITE, req, data)


def read(c, target, *, inode=7, index=0, offset=0, length=CS, version=0, sock=None):
    req = data_pb2.ChunkReadRequest(
        chain_id=1,
        target_id=target,
        chunk=data_pb2.ChunkId(inode=inode, index=index),
        offset=offset,
        length=length,
        chain_version=version,
    )
    status, resp, data = exchange(sock or c.addr(target), Op.READ, req)
    if status != Status.OK:
        return status, resp
    data = bytes(data) if data is not None else b""
    return status, data[resp.skip : resp.skip + length]


def metas(c, inode=7, index=0):
    return [c.stores[t].meta(inode, index) for t in (1, 2, 3)]


def assert_replicas_equal(c, inode=7, index=0, targets=(1, 2, 3)):
    ms = [c.stores[t].meta(inode, index) for t in targets]
    assert all(m is not None and not m.pending_version for m in ms), ms
    assert len({(m.version, m.checksum, m.length) for m in ms}) == 1, ms
    return ms[0]


# ---------------------------------------------------------------- happy paths


def test_write_then_read_from_every_replica(cluster):
    data = os.urandom(300_000)
    status, resp, _ = write(cluster, data)
    assert status == Status.OK and resp.version == 1 and resp.chunk_length == len(data)
    for t in (1, 2, 3):
        status, got = read(cluster, t)
        assert status == Status.OK and got == data
    assert assert_replicas_equal(cluster).version == 1
    # the server counts a read after sending it: wait for the count rather than race it
    deadline = time.monotonic() + 5
    while any(cluster.servers[t].io_counters(t) != (len(data), len(data)) for t in (1, 2, 3)):
        assert time.monotonic() < deadline, [cluster.servers[t].io_counters(t) for t in (1, 2, 3)]
        time.sleep(0.01)


def test_partial_writes_and_block_widened_reads(cluster):
    base = os.urandom(3 * BS + 100)
    write(cluster, base)
    patch = os.urandom(5000)
    status, resp, _ = write(cluster, patch, offset=BS - 10)
    assert status == Status.OK and resp.version == 2
    expect = bytearray(base)
    expect[BS - 10 : BS - 10 + 5000] = patch
    for t in (1, 2, 3):
        assert read(cluster, t, offset=BS - 20, length=40)[1] == bytes(expect[BS - 20 : BS + 20])
        assert read(cluster, t, offset=3 * BS + 50, length=CS)[1] == bytes(expect[3 * BS + 50 :])
    # a write past the end leaves a hole of zeros
    status, resp, _ = write(cluster, b"tail", offset=CS - 4)
    assert status == Status.OK and resp.chunk_length == CS
    got = read(cluster, 3, offset=len(base), length=CS)[1]
    assert got == bytes(CS - 4 - len(base)) + b"tail"
    assert_replicas_equal(cluster)


def test_read_errors_and_edges(cluster):
    status, err = read(cluster, 2, inode=99)
    assert status == Status.NOT_FOUND
    write(cluster, b"x" * 1000)
    status, got = read(cluster, 2, offset=5000, length=10)
    assert status == Status.OK and got == b""
    status, err = read(cluster, 2, version=cluster.chain_version + 5)
    assert status == Status.STALE_CHAIN and err.routing_version == cluster.view.version
    status, err = read(cluster, 2, offset=CS * 64, length=1)
    assert status == Status.BAD_REQUEST
    # target 3 lives on another server
    req = data_pb2.ChunkReadRequest(chain_id=1, target_id=3, chunk=data_pb2.ChunkId(inode=7))
    assert exchange(cluster.addr(1), Op.READ, req)[0] == Status.NOT_SERVING
    # a replica holding a pending version does not serve reads
    cluster.stores[3].stage(7, 0, 9, 0, b"pending", chunk_size=CS)
    assert read(cluster, 3)[0] == Status.NOT_COMMITTED
    assert read(cluster, 2)[1] == b"x" * 1000


def test_syncing_target_serves_no_reads(cluster):
    write(cluster, b"abc")
    cluster.set_chain({1: S, 2: S, 3: Y}, (1, 2, 3))
    assert read(cluster, 3)[0] == Status.NOT_SERVING


def test_write_rules(cluster):
    assert write(cluster, b"a", target=2)[0] == Status.NOT_SERVING  # not the head
    status, err, _ = write(cluster, b"a", version=cluster.chain_version - 1)
    assert status == Status.STALE_CHAIN and err.routing_version == cluster.view.version
    assert write(cluster, b"a", offset=CS - 0)[0] == Status.BAD_REQUEST  # crosses the chunk
    assert write(cluster, None)[0] == Status.BAD_REQUEST  # empty
    assert write(cluster, b"a", inode=0)[0] == Status.BAD_REQUEST
    assert all(m is None for m in metas(cluster))


def test_forwarded_write_from_a_non_predecessor_is_refused(cluster):
    req = data_pb2.ChunkWriteRequest(
        chain_id=1,
        chain_version=cluster.chain_version,
        target_id=1,
        chunk=data_pb2.ChunkId(inode=7),
        chunk_size=CS,
        update_version=5,
        base_version=0,
    )
    assert exchange(cluster.addr(1), Op.WRITE, req, b"zz")[0] == Status.NOT_SERVING


def test_idempotent_retry_applies_once(cluster):
    first = write(cluster, b"hello", client=("c1", 41))
    again = write(cluster, b"hello", client=("c1", 41))
    assert first[0] == again[0] == Status.OK and first[1].version == again[1].version == 1
    assert write(cluster, b"hello", client=("c1", 42))[1].version == 2
    assert assert_replicas_equal(cluster).version == 2


def test_concurrent_writes_to_one_chunk_are_serialised(cluster):
    results = []

    def writer(k):
        with connect(cluster.addr(1)) as sock:
            for _ in range(10):
                status, resp, _ = write(cluster, bytes([k]) * 1000, offset=k * 1000, sock=sock)
                assert status == Status.OK
                results.append(resp.version)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(1, 41))
    meta = assert_replicas_equal(cluster)
    assert meta.version == 40
    assert read(cluster, 3, length=4000)[1] == b"".join(bytes([k]) * 1000 for k in range(4))


def test_different_chunks_written_in_parallel(cluster):
    blobs = {i: os.urandom(200_000) for i in range(8)}

    def writer(i):
        assert write(cluster, blobs[i], index=i)[0] == Status.OK

    threads = [threading.Thread(target=writer, args=(i,)) for i in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, blob in blobs.items():
        assert read(cluster, 2, index=i)[1] == blob
        assert_replicas_equal(cluster, index=i)


# ---------------------------------------------------------------- failures


def test_dead_successor_aborts_and_answers_retryable(cluster):
    write(cluster, b"v1" * 100)
    cluster.servers[3].stop()
    status, err, _ = write(cluster, b"v2" * 100)
    assert status in framing.RETRYABLE
    # nothing half-applied: no pending version anywhere, v1 still readable
    for t in (1, 2):
        m = cluster.stores[t].meta(7, 0)
        assert (m.version, m.pending_version) == (1, 0)
    assert read(cluster, 1)[1] == b"v1" * 100
    # the manager takes target 3 out; the shorter chain takes the write
    cluster.set_chain({1: S, 2: S, 3: OFF}, (1, 2, 3))
    status, resp, _ = write(cluster, b"v3" * 100)
    # version 2 was given up and never used again (nor the version of the head's repair, which
    # could not reach target 3 either)
    assert status == Status.OK and resp.version > 2
    assert_replicas_equal(cluster, targets=(1, 2))


def test_stale_successor_refuses_and_head_aborts(cluster):
    # the successors moved to a newer chain version than the head knows
    old = cluster.view
    cluster.set_chain({1: S, 2: S, 3: S}, (1, 2, 3))
    new = cluster.view
    cluster.views[1] = old
    status, err, _ = write(cluster, b"data", version=old.chains[1].version)
    assert status == Status.STALE_CHAIN
    assert all(m is None for m in metas(cluster))
    cluster.views[1] = new
    assert write(cluster, b"data")[0] == Status.OK


def test_lagging_replica_gets_the_full_chunk(cluster):
    base = os.urandom(2 * BS)
    write(cluster, base)
    cluster.set_chain({1: S, 2: S, 3: OFF}, (1, 2, 3))
    patch1 = os.urandom(100)
    write(cluster, patch1, offset=10)
    assert cluster.stores[3].meta(7, 0).version == 1
    # target 3 comes back in the chain with an old copy: partial updates do not fit
    cluster.set_chain({1: S, 2: S, 3: S}, (1, 2, 3))
    patch2 = os.urandom(100)
    status, resp, _ = write(cluster, patch2, offset=BS + 5)
    assert status == Status.OK
    expect = bytearray(base)
    expect[10:110] = patch1
    expect[BS + 5 : BS + 105] = patch2
    assert assert_replicas_equal(cluster).version == resp.version
    assert read(cluster, 3)[1] == bytes(expect)


def test_syncing_successor_gets_full_chunks_and_sync_copies(cluster):
    write(cluster, b"a" * 5000)
    cluster.set_chain({1: S, 2: S, 3: OFF}, (1, 2, 3))
    write(cluster, b"b" * 10, offset=100)
    cluster.set_chain({1: S, 2: S, 3: Y}, (1, 2, 3))
    status, resp, _ = write(cluster, b"c" * 10, offset=200)
    assert status == Status.OK
    expect = bytearray(b"a" * 5000)
    expect[100:110] = b"b" * 10
    expect[200:210] = b"c" * 10
    m3 = cluster.stores[3].meta(7, 0)
    assert m3.version == resp.version
    data, _ = cluster.stores[3].read_committed(7, 0)
    assert data == bytes(expect)
    # a resync copy older than what the target holds is ignored, a newer one applied
    copy = data_pb2.ChunkWriteRequest(
        chain_id=1,
        chain_version=cluster.chain_version,
        target_id=3,
        chunk=data_pb2.ChunkId(inode=7, index=5),
        chunk_size=4096,
        update_version=4,
        full_chunk=True,
        sync=True,
    )
    status, resp, _ = exchange(cluster.addr(3), Op.WRITE, copy, b"s" * 4096)
    assert status == Status.OK and resp.version == 4
    copy.update_version = 2
    status, resp, _ = exchange(cluster.addr(3), Op.WRITE, copy, b"t" * 4096)
    assert status == Status.OK and resp.version == 4
    assert cluster.stores[3].read_committed(7, 5)[0] == b"s" * 4096


# ---------------------------------------------------------------- truncation


def truncate(c, length, *, stripe=2, position=0, target=1, client=("m", 1)):
    req = data_pb2.ChunkTruncateRequest(
        chain_id=1,
        chain_version=c.chain_version,
        target_id=target,
        inode=7,
        length=length,
        chunk_size=CS,
        stripe=stripe,
        stripe_position=position,
        client_id=client[0],
        request_id=client[1],
    )
    return exchange(c.addr(target), Op.TRUNCATE, req)


def test_truncate_runs_down_the_chain(cluster):
    for index in (0, 2, 3, 4, 6):
        write(cluster, os.urandom(CS if index < 6 else 1000), index=index)
    status, resp, _ = truncate(cluster, 2 * CS + 500)
    # 2 cut to 500 bytes, 4 and 6 cut to nothing (kept, so their versions keep growing);
    # 3 is another chain's
    assert status == Status.OK and resp.chunks == 3
    for t in (1, 2, 3):
        s = cluster.stores[t]
        assert s.meta(7, 2).length == 500 and s.meta(7, 4).length == 0 and s.meta(7, 6).length == 0
        assert s.meta(7, 4).version == 2 and s.meta(7, 6).version == 2
        assert s.meta(7, 3) is not None and s.meta(7, 0).length == CS
    for index in (2, 4, 6):
        assert_replicas_equal(cluster, index=index)
    # a repeat (new request id) changes nothing
    status, resp, _ = truncate(cluster, 2 * CS + 500, client=("m", 2))
    assert status == Status.OK and resp.chunks == 0
    assert truncate(cluster, 0, stripe=2, position=2)[0] == Status.BAD_REQUEST


def test_truncate_with_dead_successor_is_retryable(cluster):
    write(cluster, os.urandom(1000), index=0)
    cluster.servers[2].stop()
    status, err, _ = truncate(cluster, 10, stripe=1)
    assert status in framing.RETRYABLE


# ---------------------------------------------------------------- bad input


def still_serves(c):
    assert write(c, b"ok")[0] == Status.OK
    assert read(c, 1, length=2)[1] == b"ok"


def assert_closed(sock):
    sock.settimeout(5)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass


def test_wrong_magic_closes_the_connection(cluster):
    with connect(cluster.addr(1)) as sock:
        raw = bytearray(framing.pack_header(Op.PING, 0, 0, 0, 0))
        raw[0] ^= 0xFF
        sock.sendall(raw)
        assert_closed(sock)
    still_serves(cluster)


def test_oversized_lengths_close_the_connection(cluster):
    for meta_len, data_len in ((framing.MAX_META + 1, 0), (0, framing.MAX_DATA + 1)):
        with connect(cluster.addr(1)) as sock:
            sock.sendall(framing.pack_header(Op.WRITE, 0, meta_len, data_len, BS))
            assert_closed(sock)
    still_serves(cluster)


def test_truncated_frame_and_garbage(cluster):
    with connect(cluster.addr(1)) as sock:
        sock.sendall(framing.pack_header(Op.WRITE, 0, 10, 100, BS)[:10])
    with connect(cluster.addr(1)) as sock:
        sock.sendall(os.urandom(4096))
        assert_closed(sock)
    still_serves(cluster)


def test_undecodable_meta_and_unknown_op_get_error_frames(cluster):
    with connect(cluster.addr(1)) as sock:
        framing.send_frame(sock, Op.READ, b"\xff\xff\xff")
        frame = framing.recv_frame(sock)
        assert frame.header.status == Status.BAD_REQUEST
        framing.send_frame(sock, 42, b"")
        assert framing.recv_frame(sock).header.status == Status.BAD_REQUEST
        framing.send_frame(sock, Op.PING, b"")
        assert framing.recv_frame(sock).header.status == Status.OK
        # the same connection still carries real requests
        assert write(cluster, b"same", sock=sock)[0] == Status.OK


def test_corrupt_block_gets_checksum_error(cluster):
    req = data_pb2.ChunkWriteRequest(
        chain_id=1,
        chain_version=cluster.chain_version,
        target_id=1,
        chunk=data_pb2.ChunkId(inode=7),
        chunk_size=CS,
    )
    with connect(cluster.addr(1)) as sock:
        framing.send_frame(sock, Op.WRITE, req.SerializeToString(), b"abc", crcs=[12345])
        frame = framing.recv_frame(sock)
        assert frame.header.status == Status.CHECKSUM
    assert all(m is None for m in metas(cluster))
    still_serves(cluster)


def test_response_frame_from_a_client_closes(cluster):
    with connect(cluster.addr(1)) as sock:
        framing.send_frame(sock, Op.PING | framing.RESPONSE, b"")
        assert_closed(sock)


def test_peer_stalling_mid_frame_is_dropped(tmp_path):
    c = Cluster(tmp_path, frame_timeout=0.5, idle_timeout=2.0)
    try:
        with connect(c.addr(1)) as stalled, connect(c.addr(1)) as idle:
            meta = b"\x00" * 20
            stalled.sendall(framing.pack_header(Op.WRITE, 0, len(meta), 1000, BS) + meta[:5])
            # everyone else is served meanwhile
            still_serves(c)
            t0 = time.monotonic()
            assert_closed(stalled)
            assert time.monotonic() - t0 < 4
            assert_closed(idle)  # silent connections go after the idle timeout
        still_serves(c)
    finally:
        c.close()


def _wait(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_reader_that_stops_reading_is_dropped(tmp_path):
    """A client that asks for chunks and never takes the answers holds no server thread."""
    c = Cluster(tmp_path, frame_timeout=0.5, idle_timeout=30.0)
    try:
        data = os.urandom(CS)
        assert write(c, data)[0] == Status.OK
        server = c.servers[3]
        before = server.connections  # the chain's forwarding connection from target 2
        with connect(c.addr(3)) as stuck:
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            req = data_pb2.ChunkReadRequest(
                chain_id=1, target_id=3, chunk=data_pb2.ChunkId(inode=7), length=CS
            ).SerializeToString()
            for _ in range(64):  # far more than the socket buffers of both ends hold
                framing.send_frame(stuck, Op.READ, req)
            _wait(lambda: server.connections == before + 1, 5)
            # the send stalls; within a few send limits the server gives the connection up
            _wait(lambda: server.connections == before, 15)
        assert read(c, 3) == (Status.OK, data)
    finally:
        c.close()


def test_connection_limit(tmp_path):
    c = Cluster(tmp_path, max_connections=2)
    try:
        a, b = connect(c.addr(1)), connect(c.addr(1))
        try:
            time.sleep(0.2)
            with connect(c.addr(1)) as extra:
                frame = framing.recv_frame(extra)
                assert frame.header.status == Status.BUSY
            framing.send_frame(a, Op.PING, b"")
            assert framing.recv_frame(a).header.status == Status.OK
        finally:
            a.close()
            b.close()
        deadline = time.monotonic() + 5
        while c.servers[1].connections and time.monotonic() < deadline:
            time.sleep(0.05)
        still_serves(c)
    finally:
        c.close()


def test_crc_table_mismatch_closes(cluster):
    # a header announcing data whose CRC table is cut short by a disconnect
    with connect(cluster.addr(1)) as sock:
        sock.sendall(framing.pack_header(Op.WRITE, 0, 0, 2 * BS, BS) + struct.pack("<I", 1))
    still_serves(cluster)


# ---------------------------------------------------------------- truncation after a given-up write


def give_up_next_write_at_the_head(c, error: OSError | None = None) -> None:
    """The head's next staging fails once its successors committed the update it forwarded."""
    store = c.stores[1]
    real = store.stage

    def failing(inode, index, version, *args, **kwargs):
        store.stage = real
        _wait(lambda: all(c.stores[t].meta(inode, index).version == version for t in (2, 3)), 10)
        raise error or OSError(28, "No space left on device")

    store.stage = failing


class ReplicasDiffer(AssertionError):
    """Replicas of a chunk hold other versions or other bytes after a write they all acknowledged."""


@pytest.mark.parametrize("length", [500, 1500])
def test_truncate_after_an_aborted_update_keeps_replicas_equal(cluster, length):
    # The head numbers the cuts and its successors apply its steps; those whose content is not
    # the head's (they committed the update the head gave up) get the cut chunks whole.
    assert write(cluster, b"a" * 1000)[0] == Status.OK  # v1 everywhere
    give_up_next_write_at_the_head(cluster)
    # the head's repair does not get through (as when its successor is unreachable meanwhile)
    cluster.servers[1].replica.repair_plan = lambda plan, meta: None
    assert write(cluster, b"b" * 2000)[0] == Status.NO_SPACE  # v2 on targets 2 and 3 only
    assert [m.version for m in metas(cluster)] == [1, 2, 2]
    assert truncate(cluster, length, stripe=1)[0] == Status.OK
    status, resp, _ = write(cluster, b"c" * 10)
    assert status == Status.OK
    expect = (b"c" * 10 + b"a" * 990)[:length] if length < 1000 else b"c" * 10 + b"a" * 990
    held = {t: (cluster.stores[t].meta(7, 0).version, read(cluster, t)[1]) for t in (1, 2, 3)}
    assert held[1] == (resp.version, expect)  # the head holds what the client wrote
    if held[2] != held[1] or held[3] != held[1]:
        raise ReplicasDiffer(
            {t: (version, data[:16], len(data)) for t, (version, data) in held.items()}
        )


# ---------------------------------------------------------------- resync racing writes


def resync_3_from_2(c, grpc_address: str) -> dict:
    """Target 2 copies chunk 7:0 and the rest to the syncing target 3, as its node does."""
    host, port = c.addr(3)
    return sync_successor(
        c.stores[2],
        chain_id=1,
        chain_version=c.chain_version,
        target_id=2,
        successor_target_id=3,
        successor_data_address=f"{host}:{port}",
        successor_grpc_address=grpc_address,
        hold=lambda inode, index: c.servers[2].replica.chunk(2, inode, index),
    )


@pytest.fixture
def storage_service_3(cluster):
    """Target 3's StorageService (resync lists and removes its chunks through it)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_to_server(StorageServicer("n3", lambda: {3: cluster.stores[3]}, lambda t: 1), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait(10)


def in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except Exception as exc:  # reported by the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_write_caught_by_a_chain_change_is_refused_or_reaches_the_returning_replica(
    cluster, storage_service_3
):
    c = cluster
    assert write(c, b"a" * 100)[0] == Status.OK
    c.set_chain({1: S, 2: S, 3: OFF}, (1, 2, 3))  # target 3 goes away
    assert write(c, b"b" * 100)[0] == Status.OK  # on targets 1 and 2 only
    # A write accepted under this version waits for the chunk on target 2 ...
    held = c.servers[2].replica.chunk(2, 7, 0)
    held.__enter__()
    writer, wrote = in_thread(write, c, b"c" * 100)
    _wait(lambda: c.stores[1].meta(7, 0).pending_version, 10)  # the head forwarded it
    # ... while target 3 comes back and target 2 resyncs it
    c.set_chain({1: S, 2: S, 3: Y}, (1, 2, 3))
    syncer, synced = in_thread(resync_3_from_2, c, storage_service_3)
    syncer.join(2)  # a resync that does not wait for the chunk is done by now
    held.__exit__(None, None, None)
    writer.join(20)
    syncer.join(20)
    assert "error" not in synced, synced
    status = wrote["value"][0]
    # acknowledged: the returning replica has it; refused (the chain moved on): the client retries
    if status == Status.OK:
        assert c.stores[3].read_committed(7, 0)[0] == b"c" * 100
    else:
        assert status == Status.STALE_CHAIN
    assert_replicas_equal(c, targets=(2, 3))


def test_resync_never_removes_a_chunk_written_while_it_runs(cluster, storage_service_3):
    c = cluster
    c.set_chain({1: S, 2: S, 3: Y}, (1, 2, 3))  # target 3 syncs from target 2
    store = c.stores[2]
    real = store.stage
    release = threading.Event()

    def slow_stage(*args, **kwargs):  # target 2 stages after it forwarded to target 3
        release.wait(20)
        return real(*args, **kwargs)

    store.stage = slow_stage
    writer, wrote = in_thread(write, c, b"new chunk" * 10)
    _wait(lambda: (m := c.stores[3].meta(7, 0)) is not None and m.version, 10)
    syncer, synced = in_thread(resync_3_from_2, c, storage_service_3)
    syncer.join(2)  # a resync that does not wait for the chunk is done by now
    release.set()
    writer.join(20)
    syncer.join(20)
    store.stage = real
    assert "error" not in synced, synced
    assert wrote["value"][0] == Status.OK
    assert c.stores[3].read_committed(7, 0)[0] == b"new chunk" * 10  # acknowledged: everywhere
    assert_replicas_equal(c)


def test_a_write_the_head_gives_up_after_forwarding_leaves_the_replicas_alike(cluster):
    assert write(cluster, b"a" * 1000)[0] == Status.OK  # v1 everywhere
    give_up_next_write_at_the_head(cluster, OSError(5, "Input/output error"))
    assert write(cluster, b"b" * 2000)[0] == Status.INTERNAL  # targets 2 and 3 committed v2
    # the head put its own content back, above the given-up version
    assert [m.version for m in metas(cluster)] == [3, 3, 3]
    for t in (1, 2, 3):
        assert cluster.stores[t].read_committed(7, 0)[0] == b"a" * 1000
    assert write(cluster, b"c" * 10)[0] == Status.OK
    assert_replicas_equal(cluster)


# ---------------------------------------------------------------- write batches


def batch_request(c, items, *, target=1, client="", first_id=0, chain_id=1):
    """An OP_WRITE_BATCH of ``items`` ((inode, index, offset, data) each) and its data."""
    batch = data_pb2.ChunkWriteBatch()
    for k, (inode, index, offset, data) in enumerate(items):
        batch.writes.add(
            chain_id=chain_id,
            chain_version=c.chain_version,
            target_id=target,
            chunk=data_pb2.ChunkId(inode=inode, index=index),
            offset=offset,
            chunk_size=CS,
            client_id=client,
            request_id=first_id + k if first_id else 0,
        )
        batch.lengths.append(len(data))
    return batch, b"".join(d for *_, d in items)


def write_batch(c, items, **kwargs):
    """Send a write batch to the head: (status, [ChunkWriteResult] or ErrorResponse)."""
    batch, data = batch_request(c, items, **kwargs)
    with connect(c.addr(kwargs.get("target", 1))) as sock:
        framing.send_frame(sock, Op.WRITE_BATCH, batch.SerializeToString(), data or None)
        frame = framing.recv_frame(sock)
    assert frame.header.op == Op.WRITE_BATCH | framing.RESPONSE
    if frame.header.status != Status.OK:
        return frame.header.status, data_pb2.ErrorResponse.FromString(frame.meta)
    return Status.OK, list(data_pb2.ChunkWriteBatchResponse.FromString(frame.meta).results)


def test_a_write_batch_reaches_every_replica(cluster):
    items = [(100 + k, k % 2, 0, os.urandom(1000 + 70_000 * k)) for k in range(5)]
    status, results = write_batch(cluster, items)
    assert status == Status.OK and [r.status for r in results] == [Status.OK] * 5
    for (inode, index, _, data), result in zip(items, results, strict=True):
        assert result.written.version == 1 and result.written.chunk_length == len(data)
        assert assert_replicas_equal(cluster, inode, index).version == 1
        for t in (1, 2, 3):
            assert read(cluster, t, inode=inode, index=index) == (Status.OK, data)


def test_a_retried_write_batch_applies_each_write_once(cluster):
    items = [(200 + k, 0, 0, os.urandom(5000)) for k in range(4)]
    first = write_batch(cluster, items, client="c1", first_id=10)
    again = write_batch(cluster, items, client="c1", first_id=10)
    assert first[0] == again[0] == Status.OK
    assert [r.written.version for r in first[1]] == [r.written.version for r in again[1]] == [1] * 4
    for inode, *_ in items:
        assert assert_replicas_equal(cluster, inode).version == 1
    # a single write retried with one of the batch's request ids gets the batch's answer
    status, resp, _ = write(cluster, items[1][3], inode=201, client=("c1", 11))
    assert status == Status.OK and resp.version == 1


def test_a_write_batch_answers_each_write_apart(cluster):
    write(cluster, b"x" * 100, inode=300)
    past_end = (301, 0, CS - 10, b"y" * 100)  # crosses the chunk size
    status, results = write_batch(cluster, [(300, 0, 50, b"z" * 10), past_end, (302, 0, 0, b"w")])
    assert status == Status.OK
    assert [r.status for r in results] == [Status.OK, Status.BAD_REQUEST, Status.OK]
    assert results[1].message
    assert read(cluster, 2, inode=300) == (Status.OK, b"x" * 50 + b"z" * 10 + b"x" * 40)
    assert metas(cluster, inode=301) == [None, None, None]
    assert assert_replicas_equal(cluster, 302).length == 1


@pytest.mark.parametrize(
    "change",
    ["lengths", "twice", "two chains", "sync", "empty"],
)
def test_malformed_write_batches_are_refused_whole(cluster, change):
    items = [(400, 0, 0, b"a" * 10), (401, 0, 0, b"b" * 10)]
    batch, data = batch_request(cluster, items)
    if change == "lengths":
        batch.lengths[0] += 1
    elif change == "twice":
        batch.writes[1].chunk.inode = 400
    elif change == "two chains":
        batch.writes[1].chain_id = 2
    elif change == "sync":
        batch.writes[1].sync = True
    else:
        del batch.writes[:]
        del batch.lengths[:]
        data = b""
    with connect(cluster.addr(1)) as sock:
        framing.send_frame(sock, Op.WRITE_BATCH, batch.SerializeToString(), data or None)
        frame = framing.recv_frame(sock)
    assert frame.header.status == Status.BAD_REQUEST
    assert metas(cluster, inode=400) == metas(cluster, inode=401) == [None, None, None]
    still_serves(cluster)


def test_a_write_batch_gives_a_lagging_replica_whole_chunks(cluster):
    bases = {inode: os.urandom(2 * BS) for inode in (500, 501)}
    for inode, base in bases.items():
        write(cluster, base, inode=inode)
    cluster.set_chain({1: S, 2: S, 3: OFF}, (1, 2, 3))
    write(cluster, b"p" * 100, inode=500, offset=10)  # target 3 misses it
    cluster.set_chain({1: S, 2: S, 3: S}, (1, 2, 3))
    status, results = write_batch(cluster, [(500, 0, BS + 5, b"q" * 100), (501, 0, 7, b"r" * 9)])
    assert status == Status.OK and [r.status for r in results] == [Status.OK, Status.OK]
    expect = bytearray(bases[500])
    expect[10:110] = b"p" * 100
    expect[BS + 5 : BS + 105] = b"q" * 100
    assert assert_replicas_equal(cluster, 500).version == results[0].written.version
    assert read(cluster, 3, inode=500) == (Status.OK, bytes(expect))
    assert read(cluster, 3, inode=501)[1] == bases[501][:7] + b"r" * 9 + bases[501][16:]


def test_a_write_batch_with_a_dead_successor_leaves_nothing_pending(cluster):
    write(cluster, b"v1" * 100, inode=600)
    cluster.servers[3].stop()
    status, results = write_batch(cluster, [(600, 0, 0, b"v2" * 100), (601, 0, 0, b"n" * 10)])
    assert status == Status.OK
    assert all(r.status in framing.RETRYABLE for r in results), results
    for t in (1, 2):
        m = cluster.stores[t].meta(600, 0)
        assert (m.version, m.pending_version) == (1, 0)
        assert cluster.stores[t].meta(601, 0) is None
    cluster.set_chain({1: S, 2: S, 3: OFF}, (1, 2, 3))
    status, results = write_batch(cluster, [(600, 0, 0, b"v3" * 100), (601, 0, 0, b"n" * 10)])
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert assert_replicas_equal(cluster, 600, targets=(1, 2)).version > 2


def test_a_batched_write_the_head_gives_up_after_forwarding_leaves_the_replicas_alike(cluster):
    write(cluster, b"a" * 1000, inode=700)
    give_up_next_write_at_the_head(cluster, OSError(5, "Input/output error"))
    status, results = write_batch(cluster, [(700, 0, 0, b"b" * 1000), (701, 0, 0, b"c" * 10)])
    assert status == Status.OK
    assert results[0].status == Status.INTERNAL and results[1].status == Status.OK
    # the head put its committed content back on the chain above the given-up version
    m = assert_replicas_equal(cluster, 700)
    assert m.version > 2
    assert {read(cluster, t, inode=700)[1] for t in (1, 2, 3)} == {b"a" * 1000}
    assert_replicas_equal(cluster, 701)


@pytest.mark.parametrize("writes", [2, 0])
def test_a_corrupt_write_batch_gets_checksum_error(cluster, writes):
    batch, data = batch_request(cluster, [(800 + k, 0, 0, b"abc") for k in range(writes)])
    with connect(cluster.addr(1)) as sock:
        framing.send_frame(
            sock, Op.WRITE_BATCH, batch.SerializeToString(), data or b"abc", crcs=[12345]
        )
        frame = framing.recv_frame(sock)
        assert frame.header.status == Status.CHECKSUM
    assert metas(cluster, inode=800) == [None, None, None]
    still_serves(cluster)
