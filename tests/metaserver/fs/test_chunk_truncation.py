"""truncate_chunks against a framed-protocol peer that records what it receives.

The storage side of OP_TRUNCATE is tested with the storage server; here the
peer checks what the metaserver sends, and answers with scripted statuses to
drive the retry and error paths.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from emberfs.common import errors, framing
from emberfs.common.framing import Op, Status
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.fs.chunk_truncation import truncate_chunks
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import cluster_pb2, common_pb2, data_pb2


class Peer:
    """Accepts connections; answers each truncate with the next scripted status."""

    def __init__(self, script: list[int]):
        self.script = list(script)
        self.requests: list[data_pb2.ChunkTruncateRequest] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                frame = framing.recv_frame(conn)
                assert frame.header.op == Op.TRUNCATE
                req = data_pb2.ChunkTruncateRequest.FromString(frame.meta)
                self.requests.append(req)
                status = self.script.pop(0) if self.script else Status.OK
                if status == Status.OK:
                    resp = data_pb2.ChunkTruncateResponse(chunks=1)
                    framing.send_frame(
                        conn, Op.TRUNCATE | framing.RESPONSE, resp.SerializeToString()
                    )
                else:
                    framing.send_error(conn, Op.TRUNCATE, status, "scripted")

    def close(self) -> None:
        self.sock.close()


def cluster_on(addresses: list[str]) -> ClusterManager:
    """One single-target node per address, R=1: chain i+1 has its head at addresses[i]."""
    cm = ClusterManager(MemoryEngine(), replicas=1)
    for i, address in enumerate(addresses):
        cm.register_node(
            cluster_pb2.RegisterNodeRequest(
                node_id=f"n{i}",
                data_address=address,
                grpc_address="127.0.0.1:1",
                targets=[cluster_pb2.TargetReport()],
            )
        )
    return cm


def attr(chains: list[int]) -> common_pb2.InodeAttr:
    return common_pb2.InodeAttr(
        inode=77,
        type=common_pb2.FILE,
        layout=common_pb2.Layout(chunk_size=1 << 20, stripe=len(chains), chains=chains),
    )


@pytest.fixture
def peers():
    made: list[Peer] = []

    def make(script=()):
        p = Peer(list(script))
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def test_each_chain_head_gets_its_stripe_position(peers):
    a, b = peers(), peers()
    cm = cluster_on([a.address, b.address])
    truncate_chunks(cm, attr([2, 1]), 5 << 20, 99, timeout=5)
    (ra,), (rb,) = a.requests, b.requests
    assert (rb.chain_id, rb.stripe_position, ra.chain_id, ra.stripe_position) == (2, 0, 1, 1)
    for r in (ra, rb):
        assert r.inode == 77 and r.length == 5 << 20 and r.chunk_size == 1 << 20
        assert r.stripe == 2 and r.chain_version == 1 and r.client_id == "metaserver"
    assert ra.target_id == 1 and rb.target_id == 2
    assert ra.request_id == rb.request_id == 99  # one cut, one id (heads key answers by target)


def test_retryable_statuses_are_retried_with_the_same_request_id(peers):
    a = peers([Status.STALE_CHAIN, Status.NOT_SERVING])
    cm = cluster_on([a.address])
    truncate_chunks(cm, attr([1]), 0, timeout=5)
    assert len(a.requests) == 3
    assert len({r.request_id for r in a.requests}) == 1


def test_bad_request_is_not_retried(peers):
    a = peers([Status.BAD_REQUEST])
    cm = cluster_on([a.address])
    with pytest.raises(errors.InvalidArgument):
        truncate_chunks(cm, attr([1]), 0, timeout=5)
    assert len(a.requests) == 1


def test_unreachable_head_gives_unavailable_after_the_timeout():
    s = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there now
    cm = cluster_on([address])
    start = time.monotonic()
    with pytest.raises(errors.Unavailable):
        truncate_chunks(cm, attr([1]), 0, timeout=0.5)
    assert 0.4 < time.monotonic() - start < 3


def test_chain_without_a_serving_target_gives_unavailable(peers):
    a = peers()
    cm = cluster_on([a.address])
    clock_cm = ClusterManager(cm.engine, replicas=1, heartbeat_timeout=0.01)
    time.sleep(0.05)
    clock_cm.check_timeouts()  # the only target is now lastsrv: no head
    assert clock_cm.routing().targets[0].state == common_pb2.LASTSRV
    with pytest.raises(errors.Unavailable):
        truncate_chunks(clock_cm, attr([1]), 0, timeout=0.3)
    assert a.requests == []


def test_unknown_chain_is_an_internal_error(peers):
    cm = cluster_on([peers().address])
    with pytest.raises(errors.Internal):
        truncate_chunks(cm, attr([9]), 0, timeout=1)
