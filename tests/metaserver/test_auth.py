"""Client identities through real processes: tokens, the identity they give, and revocation."""

from __future__ import annotations

import concurrent.futures
import socket
import time

import grpc
import pytest

from emberfs.cli.admin import AdminClient
from emberfs.client.fs import EmberFileSystem
from emberfs.common import framing, grpcauth
from emberfs.common.framing import Op
from emberfs.common.routing import RoutingView
from emberfs.proto import common_pb2, data_pb2, meta_pb2, meta_pb2_grpc

TTL = 3.0  # the capability lifetime of this module's cluster


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    from tests.conftest import make_cluster

    cluster = make_cluster(
        tmp_path_factory,
        "identities",
        extra_meta_args=["--capability-ttl", str(TTL), "--max-pending-calls", "4"],
    )
    cluster.start(timeout=90)
    admin = EmberFileSystem(
        cluster.meta_address, token=cluster.admin_token, skip_instance_cache=True
    )
    try:
        yield cluster, admin
    finally:
        admin.close()
        cluster.stop()


def new_token(cluster, uid: int, gid: int, name: str) -> tuple[str, str]:
    made = AdminClient(cluster.admin_url, cluster.admin_token).post(
        "/api/v1/tokens", {"uid": uid, "gid": gid, "groups": [], "name": name}
    )
    return made["token"], made["id"]


def user_fs(cluster, token: str | None) -> EmberFileSystem:
    return EmberFileSystem(
        cluster.meta_address, token=token, skip_instance_cache=True, retry_timeout=2.0
    )


def read_tail(cluster, attr, credential) -> int:
    """The status of a read of ``attr``'s first chunk sent straight to its tail."""
    view = RoutingView.from_proto(cluster.routing())
    chain = view.chains[attr.layout.chains[0]]
    req = data_pb2.ChunkReadRequest(
        chain_id=chain.chain_id,
        target_id=chain.tail.target_id,
        chunk=data_pb2.ChunkId(inode=attr.inode, index=0),
        offset=0,
        length=4096,
    ).SerializeToString()
    host, port = chain.tail.data_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        framing.send_frame(sock, Op.READ, req, None, credential=credential)
        header, _, _ = framing.recv_head(sock)
        if header.data_len:
            framing.recv_exact(sock, header.data_len)
        return header.status


def test_no_token_or_an_unknown_one_is_refused_with_permission_error(secured, monkeypatch):
    cluster, _ = secured
    monkeypatch.delenv("EMBERFS_TOKEN")
    for token in (None, "emb1.000000000000.not-a-real-secret", "nonsense"):
        fs = user_fs(cluster, token)
        try:
            with pytest.raises(PermissionError):
                fs.ls("/")
        finally:
            fs.close()


def test_a_token_is_the_identity_the_permission_checks_use(secured):
    cluster, admin = secured
    admin.pipe_file("/root-only.bin", b"secret" * 1000)
    admin.client.meta.setattr("/root-only.bin", mode=0o600)
    admin.mkdir("/root-dir")
    admin.client.meta.setattr("/root-dir", mode=0o755)
    admin.mkdir("/home-1000")
    admin.client.meta.setattr("/home-1000", uid=1000, gid=1000)
    token, _ = new_token(cluster, 1000, 1000, "uid1000")
    fs = user_fs(cluster, token)
    try:
        with pytest.raises(PermissionError):
            fs.cat_file("/root-only.bin")
        with pytest.raises(PermissionError):
            fs.pipe_file("/root-dir/not-mine.bin", b"x")
        fs.pipe_file("/home-1000/mine.bin", b"hello")
        assert fs.info("/home-1000/mine.bin")["uid"] == 1000  # not what the client claims
        assert fs.cat_file("/home-1000/mine.bin") == b"hello"
    finally:
        fs.close()


def test_chunk_reads_sent_straight_to_storage_need_a_capability_for_that_file(secured):
    cluster, admin = secured
    admin.pipe_file("/root-only-2.bin", b"top secret" * 10000)
    admin.client.meta.setattr("/root-only-2.bin", mode=0o600)
    admin.makedirs("/pub", exist_ok=True)
    admin.pipe_file("/pub/open.bin", b"public" * 100)
    token, _ = new_token(cluster, 1000, 1000, "snooper")
    fs = user_fs(cluster, token)
    try:
        fs.cat_file("/pub/open.bin")  # the user's own, legitimate capability
        secret = admin.client.meta.stat("/root-only-2.bin")
        public = fs.client.meta.stat("/pub/open.bin")
        caps = fs.client.runtime().meta.capabilities
        own = caps.credential(public.inode, write=False)
        assert own is not None
        with pytest.raises(PermissionError):  # the metaserver will not give one
            fs.client.meta.authorize(secret.inode)
        for credential in (None, own):
            assert read_tail(cluster, secret, credential) == framing.Status.DENIED
    finally:
        fs.close()


def test_a_revoked_token_stops_at_once_and_its_capabilities_within_their_expiry(secured):
    cluster, admin = secured
    admin.makedirs("/shared", exist_ok=True)
    admin.pipe_file("/shared/data.bin", b"d" * 200_000)
    token, token_id = new_token(cluster, 1000, 1000, "leaver")
    fs = user_fs(cluster, token)
    try:
        assert fs.cat_file("/shared/data.bin") == b"d" * 200_000
        attr = fs.client.meta.stat("/shared/data.bin")
        credential = fs.client.runtime().meta.capabilities.credential(attr.inode, write=False)
        AdminClient(cluster.admin_url, cluster.admin_token).delete(f"/api/v1/tokens/{token_id}")
        revoked = time.monotonic()
        deadline = revoked + 10
        while True:  # the metaserver's token cache holds an answer for a moment
            try:
                fs.ls("/shared")
            except PermissionError:
                break
            assert time.monotonic() < deadline, "the revoked token still works"
            time.sleep(0.2)

        # the capability it got before still reads until it expires, and not after
        def status() -> int:
            return read_tail(cluster, attr, credential)

        while status() == framing.Status.OK:
            assert time.monotonic() - revoked < TTL + 5, "the capability outlived its expiry"
            time.sleep(0.2)
        assert status() == framing.Status.DENIED
    finally:
        fs.close()


def test_a_reader_renews_its_capability_past_its_expiry(secured):
    cluster, admin = secured
    admin.pipe_file("/long-read.bin", bytes(range(256)) * 40_000)
    with admin.open("/long-read.bin", "rb", block_size=1 << 20) as f:
        first = f.read(1 << 20)
        time.sleep(TTL + 0.5)  # the open's capability has expired meanwhile
        rest = f.read()
    assert first + rest == bytes(range(256)) * 40_000
    with admin.open("/long-write.bin", "wb") as f:
        f.write(b"a" * (5 << 20))
        time.sleep(TTL + 0.5)
        f.write(b"b" * (5 << 20))
    assert admin.cat_file("/long-write.bin") == b"a" * (5 << 20) + b"b" * (5 << 20)


def test_a_full_request_queue_answers_resource_exhausted_and_clients_retry(secured):
    cluster, admin = secured
    stub = meta_pb2_grpc.MetaServiceStub(
        grpcauth.channel(cluster.meta_address, token=cluster.admin_token)
    )
    req = meta_pb2.ListRequest(ctx=common_pb2.RequestContext(client_id="flood"), path="/")
    codes = []
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        futures = [pool.submit(lambda: stub.List.future(req, timeout=20)) for _ in range(400)]
        for fut in futures:
            try:
                fut.result().result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    # a client that meets it waits and retries rather than failing
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: admin.ls("/", detail=False), range(64)))
    assert all(r == results[0] for r in results)


def test_a_capability_credential_is_sent_only_for_a_secure_cluster(private_cluster):
    cluster = private_cluster(insecure=True)
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        fs.pipe_file("/x.bin", b"x" * 1000)
        assert fs.cat_file("/x.bin") == b"x" * 1000
        attr = fs.client.meta.stat("/x.bin")
        assert fs.client.runtime().meta.capabilities.credential(attr.inode, write=False) is None
    finally:
        fs.close()
