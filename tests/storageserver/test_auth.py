"""Forged frames and forged calls against a cluster with authentication, through real processes.

Each attack of the threat model is tried as someone on the network would try
it: without credentials, with the wrong cluster secret, or with a real
client's capability used beyond what it allows. Each is refused, and the
chunk or cluster state is the same afterwards.
"""

from __future__ import annotations

import os
import socket

import grpc
import pytest

from emberfs.client.fs import EmberFileSystem
from emberfs.common import framing, grpcauth, wire
from emberfs.common.auth import CapabilityCredential, ClusterKeys, generate_secret
from emberfs.common.framing import Op
from emberfs.common.routing import RoutingView
from emberfs.proto import cluster_pb2, cluster_pb2_grpc, data_pb2, storage_pb2, storage_pb2_grpc
from tests.client.test_lost_data import chunk_metas

CHUNK = 1024 * 1024


def exchange(address: str, op: int, meta: bytes, data=None, credential=None):
    """Send one request frame on a new connection; the answer's (status, meta)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        framing.send_frame(sock, op, meta, data, credential=credential)
        header, answer, _ = framing.recv_head(sock)
        if header.data_len:
            framing.recv_exact(sock, header.data_len)
        return header.status, answer


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    from tests.conftest import make_cluster

    cluster = make_cluster(tmp_path_factory, "auth", extra_meta_args=["--capability-ttl", "30"])
    cluster.start(timeout=90)
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        yield cluster, fs
    finally:
        fs.close()
        cluster.stop()


def a_file(fs, path: str, size: int = 2 * CHUNK) -> tuple[bytes, dict]:
    """Write ``size`` random bytes to ``path``; the bytes and the file's inode, chunk size, chains."""
    data = os.urandom(size)
    fs.makedirs("/auth", exist_ok=True)
    fs.pipe_file(path, data)
    attr = fs.client.meta.stat(path)
    info = {
        "ino": attr.inode,
        "chunk_size": attr.layout.chunk_size,
        "chains": list(attr.layout.chains),
    }
    return data, info


def chain_of_chunk(cluster, info: dict, index: int):
    view = RoutingView.from_proto(cluster.routing())
    chain_id = info["chains"][index % len(info["chains"])]
    return view, view.chains[chain_id]


def capability(cluster, inode: int, *, read=True, write=False) -> CapabilityCredential:
    keys = ClusterKeys.from_file(cluster.secret_file)
    return CapabilityCredential(keys.sign_capability(inode, read=read, write=write, ttl=60))


def test_a_forged_write_to_a_tail_is_refused_and_changes_nothing(secured):
    cluster, fs = secured
    data, info = a_file(fs, "/auth/tail.bin")
    inode = info["ino"]
    view, chain = chain_of_chunk(cluster, info, 0)
    tail = chain.tail
    before = chunk_metas(cluster, inode, 0)
    forged = data_pb2.ChunkWriteRequest(
        chain_id=chain.chain_id,
        chain_version=chain.version,
        target_id=tail.target_id,
        chunk=data_pb2.ChunkId(inode=inode, index=0),
        offset=0,
        chunk_size=info["chunk_size"],
        client_id="attacker",
        request_id=1,
        update_version=2**64 - 1,
        full_chunk=True,
    ).SerializeToString()
    junk = b"x" * 4096
    wrong = ClusterKeys([generate_secret().encode()]).server_credential()
    for credential in (None, wrong, capability(cluster, inode, write=True)):
        status, _ = exchange(tail.data_address, Op.WRITE, forged, junk, credential)
        assert status == framing.Status.DENIED, credential
    assert chunk_metas(cluster, inode, 0) == before
    assert fs.cat_file("/auth/tail.bin") == data
    fs.pipe_file("/auth/tail.bin", data[::-1])  # the chain still takes real writes
    assert fs.cat_file("/auth/tail.bin") == data[::-1]


def test_a_truncation_sent_to_a_head_is_refused(secured):
    cluster, fs = secured
    data, info = a_file(fs, "/auth/cut.bin")
    inode = info["ino"]
    view, chain = chain_of_chunk(cluster, info, 0)
    req = data_pb2.ChunkTruncateRequest(
        chain_id=chain.chain_id,
        chain_version=chain.version,
        target_id=chain.head.target_id,
        inode=inode,
        length=0,
        chunk_size=info["chunk_size"],
        stripe=len(info["chains"]),
        stripe_position=0,
        client_id="attacker",
        request_id=7,
    ).SerializeToString()
    before = chunk_metas(cluster, inode, 0)
    for credential in (None, capability(cluster, inode, write=True)):
        status, _ = exchange(chain.head.data_address, Op.TRUNCATE, req, None, credential)
        assert status == framing.Status.DENIED
    assert chunk_metas(cluster, inode, 0) == before
    assert fs.cat_file("/auth/cut.bin") == data


def test_a_capability_reaches_only_its_own_file_and_access(secured):
    cluster, fs = secured
    mine, _ = a_file(fs, "/auth/mine.bin", CHUNK)
    theirs, info = a_file(fs, "/auth/theirs.bin", CHUNK)
    mine_info = {"ino": fs.info("/auth/mine.bin")["ino"]}
    view, chain = chain_of_chunk(cluster, info, 0)
    target = chain.tail
    read = data_pb2.ChunkReadRequest(
        chain_id=chain.chain_id,
        target_id=target.target_id,
        chunk=data_pb2.ChunkId(inode=info["ino"], index=0),
        offset=0,
        length=4096,
    ).SerializeToString()
    # the right file's capability reads; another file's, a write-only one or none do not
    assert (
        exchange(target.data_address, Op.READ, read, None, capability(cluster, info["ino"]))[0]
        == framing.Status.OK
    )
    for credential in (
        None,
        capability(cluster, mine_info["ino"]),
        capability(cluster, info["ino"], read=False, write=True),
    ):
        assert exchange(target.data_address, Op.READ, read, None, credential)[0] == (
            framing.Status.DENIED
        )
    # a read capability does not write
    head = chain.head
    write = data_pb2.ChunkWriteRequest(
        chain_id=chain.chain_id,
        chain_version=chain.version,
        target_id=head.target_id,
        chunk=data_pb2.ChunkId(inode=info["ino"], index=0),
        offset=0,
        chunk_size=info["chunk_size"],
        client_id="reader",
        request_id=1,
    ).SerializeToString()
    status, _ = exchange(
        head.data_address, Op.WRITE, write, b"y" * 100, capability(cluster, info["ino"])
    )
    assert status == framing.Status.DENIED
    assert fs.cat_file("/auth/theirs.bin") == theirs


def test_an_expired_or_altered_capability_is_refused(secured):
    cluster, fs = secured
    _, info = a_file(fs, "/auth/expiry.bin", CHUNK)
    view, chain = chain_of_chunk(cluster, info, 0)
    read = data_pb2.ChunkReadRequest(
        chain_id=chain.chain_id,
        target_id=chain.tail.target_id,
        chunk=data_pb2.ChunkId(inode=info["ino"], index=0),
        offset=0,
        length=4096,
    ).SerializeToString()
    keys = ClusterKeys.from_file(cluster.secret_file)
    expired = keys.sign_capability(info["ino"], read=True, write=False, ttl=-1)
    good = keys.sign_capability(info["ino"], read=True, write=False, ttl=60)
    altered = bytearray(good)
    altered[1] ^= 1  # another inode, same MAC
    for token in (expired, bytes(altered), good[:-1]):
        status, answer = exchange(
            chain.tail.data_address, Op.READ, read, None, CapabilityCredential(token)
        )
        assert status == framing.Status.DENIED, data_pb2.ErrorResponse.FromString(answer)


def storage_stub(address: str, keys=None):
    return storage_pb2_grpc.StorageServiceStub(grpcauth.channel(address, keys=keys))


def test_forged_storage_and_cluster_calls_are_refused(secured):
    cluster, fs = secured
    _, info = a_file(fs, "/auth/calls.bin")
    inode = info["ino"]
    routing = cluster.routing()
    target = routing.targets[0]
    wrong = ClusterKeys([generate_secret().encode()])
    listed = {t.target_id: chunk_metas(cluster, inode, 0).get(t.target_id) for t in routing.targets}

    # RemoveChunks with an empty index list would delete every chunk of the inode
    for keys in (None, wrong):
        with pytest.raises(grpc.RpcError) as exc:
            storage_stub(target.grpc_address, keys).RemoveChunks(
                storage_pb2.RemoveChunksRequest(target_id=target.target_id, inode=inode), timeout=5
            )
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # a client's token does not make a server
    with pytest.raises(grpc.RpcError) as exc:
        storage_pb2_grpc.StorageServiceStub(
            grpcauth.channel(target.grpc_address, token=cluster.admin_token)
        ).ListChunks(storage_pb2.ListChunksRequest(target_id=target.target_id), timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED

    node_id = (cluster.data_dir / "storage-0" / "node_id").read_text().strip()
    calls = [
        ("SyncDone", cluster_pb2.SyncDoneRequest(chain_id=1, chain_version=1, target_id=1)),
        ("Heartbeat", cluster_pb2.HeartbeatRequest(node_id=node_id)),
        (
            "RegisterNode",
            cluster_pb2.RegisterNodeRequest(
                node_id=node_id,
                data_address="127.0.0.1:1",
                grpc_address="127.0.0.1:2",
            ),
        ),
    ]
    for token, keys in ((None, None), (cluster.admin_token, None), (None, wrong)):
        stub = cluster_pb2_grpc.ClusterServiceStub(
            grpcauth.channel(cluster.meta_address, keys=keys, token=token)
        )
        for method, req in calls:
            with pytest.raises(grpc.RpcError) as exc:
                getattr(stub, method)(req, timeout=5)
            assert exc.value.code() in (
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED,
            ), method
    after = cluster.routing()
    assert [(t.target_id, t.state, t.data_address) for t in after.targets] == [
        (t.target_id, t.state, t.data_address) for t in routing.targets
    ]
    assert {
        t.target_id: chunk_metas(cluster, inode, 0).get(t.target_id) for t in after.targets
    } == listed


def test_a_replayed_server_call_is_refused(secured):
    cluster, _ = secured
    keys = ClusterKeys.from_file(cluster.secret_file)
    target = cluster.routing().targets[0]
    req = storage_pb2.ListChunksRequest(target_id=target.target_id, limit=1)
    method = "/emberfs.StorageService/ListChunks"
    metadata = [keys.call_signer().metadata(method, req.SerializeToString(deterministic=True))]
    with grpc.insecure_channel(target.grpc_address) as channel:
        stub = storage_pb2_grpc.StorageServiceStub(channel)
        stub.ListChunks(req, metadata=metadata, timeout=5)  # the first time: fine
        with pytest.raises(grpc.RpcError) as exc:
            stub.ListChunks(req, metadata=metadata, timeout=5)
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # and the same credential on another request does not pass either
        other = storage_pb2.ListChunksRequest(target_id=target.target_id, limit=2)
        with pytest.raises(grpc.RpcError):
            stub.ListChunks(other, metadata=metadata, timeout=5)


def test_a_frame_whose_meta_was_altered_after_signing_is_refused(secured):
    cluster, _ = secured
    keys = ClusterKeys.from_file(cluster.secret_file)
    target = cluster.routing().targets[0]
    credential = keys.server_credential()
    body = framing.header_body(Op.PING, 0, 0, 0, 0, credential.length)
    section = credential.section(body, b"", b"")
    # a well-signed PING passes; the same section over another header does not
    raw = body + framing.struct.pack("<I", framing.crc32c.crc32c(body)) + section
    host, port = target.data_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(raw)
        assert framing.recv_head(sock)[0].status == framing.Status.OK
    meta = b"\x08\x01"
    body2 = framing.header_body(Op.PING, 0, len(meta), 0, 0, credential.length)
    raw2 = body2 + framing.struct.pack("<I", framing.crc32c.crc32c(body2)) + section + meta
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(raw2)
        assert framing.recv_head(sock)[0].status == framing.Status.DENIED


def test_wire_maps_denied(secured):
    cluster, _ = secured
    target = cluster.routing().targets[0]
    pool = wire.ConnectionPool()
    try:
        with pytest.raises(wire.Denied):
            wire.call(pool, target.data_address, Op.PING, b"")
    finally:
        pool.close()


def test_every_write_of_a_batch_needs_its_own_capability(secured):
    cluster, fs = secured
    one, info1 = a_file(fs, "/auth/batch-1.bin", CHUNK)
    two, info2 = a_file(fs, "/auth/batch-2.bin", CHUNK)
    view, chain = chain_of_chunk(cluster, info1, 0)
    if info2["chains"][0] != chain.chain_id:  # both first chunks on one chain: another file
        for k in range(3, 40):
            two, info2 = a_file(fs, f"/auth/batch-{k}.bin", CHUNK)
            if info2["chains"][0] == chain.chain_id:
                break
        else:
            pytest.skip("no second file on the first one's chain")
    head = chain.head

    def batch(capabilities) -> bytes:
        msg = data_pb2.ChunkWriteBatch(capabilities=capabilities, lengths=[100, 100])
        for i, info in enumerate((info1, info2)):
            msg.writes.add(
                chain_id=chain.chain_id,
                chain_version=chain.version,
                target_id=head.target_id,
                chunk=data_pb2.ChunkId(inode=info["ino"], index=0),
                chunk_size=info["chunk_size"],
                client_id="batcher",
                request_id=100 + i,
            )
        return msg.SerializeToString()

    def cap(info, **kwargs) -> CapabilityCredential:
        return capability(cluster, info["ino"], **({"write": True} | kwargs))

    first = cap(info1)
    for capabilities in (
        [],  # none but the frame's
        [first.token],  # fewer than the writes
        [first.token, cap(info1).token],  # the first file's for the second
        [first.token, cap(info2, write=False).token],  # a read-only one
        [first.token, b"forged" * 10],
    ):
        status, _ = exchange(
            head.data_address, Op.WRITE_BATCH, batch(capabilities), b"z" * 200, first
        )
        assert status == framing.Status.DENIED, capabilities
    assert fs.cat_file("/auth/batch-1.bin") == one
    status, answer = exchange(
        head.data_address,
        Op.WRITE_BATCH,
        batch([first.token, cap(info2).token]),
        b"z" * 200,
        first,
    )
    assert status == framing.Status.OK
    results = data_pb2.ChunkWriteBatchResponse.FromString(answer).results
    assert [r.status for r in results] == [framing.Status.OK] * 2
