"""The metaserver judges its storage servers and writers fairly: real processes.

A metaserver that was stopped, flooded with metadata calls or restarted must not
blame its storage servers or its clients for the silence it caused itself.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import threading
import time

import httpx
import pytest

from emberfs.client.fs import EmberFileSystem
from emberfs.common import grpcauth
from emberfs.proto import common_pb2, meta_pb2, meta_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HEARTBEAT_TIMEOUT = 2.0  # the cluster fixtures' default
MiB = 1024 * 1024


def watch_routing(cluster, before: common_pb2.RoutingInfo, seconds: float) -> None:
    """Read the routing for ``seconds``: every target serves and nothing changed, each time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert_unchanged(before, cluster.routing(timeout=30))
        time.sleep(0.1)


def assert_unchanged(before: common_pb2.RoutingInfo, now: common_pb2.RoutingInfo) -> None:
    offline = [t.target_id for t in now.targets if t.state != common_pb2.SERVING]
    assert offline == [], f"targets {offline} were declared down: {now}"
    assert [(c.chain_id, c.version) for c in now.chains] == [
        (c.chain_id, c.version) for c in before.chains
    ]
    assert now.version == before.version


def admin(cluster, route: str):
    resp = httpx.get(f"{cluster.admin_url}{route}", timeout=30)
    resp.raise_for_status()
    return resp.json()


def stalls_noticed(cluster) -> float:
    text = httpx.get(f"{cluster.admin_url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("emberfs_meta_stalls_total "):
            return float(line.split()[1])
    raise AssertionError("no emberfs_meta_stalls_total metric")


def test_a_stopped_metaserver_blames_no_storage_server_for_its_own_silence(private_cluster):
    c = private_cluster()
    before = c.wait_serving()
    c.meta.signal(signal.SIGSTOP)
    try:
        # the storage servers go on sending heartbeats that nobody reads
        time.sleep(3 * HEARTBEAT_TIMEOUT)
    finally:
        c.meta.signal(signal.SIGCONT)
    # the grace after the stall, and as long again
    watch_routing(c, before, 2 * HEARTBEAT_TIMEOUT)
    assert all(n["last_heartbeat_seconds"] < HEARTBEAT_TIMEOUT for n in admin(c, "/api/v1/nodes"))
    assert stalls_noticed(c) >= 1


def _flood(
    address: str, token: str, base: str, stop: threading.Event, depth: int, limit: int
) -> int:
    """Keep ``depth`` Create calls in flight until ``stop`` or ``limit`` calls; the calls answered."""
    ctx = common_pb2.RequestContext(client_id=base)
    options = [("grpc.use_local_subchannel_pool", 1)]
    with grpcauth.channel(address, token=token, options=options) as ch:
        stub = meta_pb2_grpc.MetaServiceStub(ch)
        pending = []
        answered = 0
        for n in itertools.count():
            if stop.is_set() or n >= limit:
                break
            req = meta_pb2.CreateRequest(ctx=ctx, path=f"{base}/f{n}", mode=0o644)
            pending.append(stub.Create.future(req, timeout=120))
            if len(pending) >= depth:
                pending.pop(0).exception()
                answered += 1
        for call in pending:
            call.exception()
            answered += 1
        return answered


def test_heartbeats_get_through_a_flood_of_metadata_calls(private_cluster):
    c = private_cluster()
    before = c.wait_serving()
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        for i in range(16):
            fs.mkdir(f"/flood{i}")
    finally:
        fs.close()
    stop = threading.Event()
    answered: list[int] = []
    threads = [
        threading.Thread(
            target=lambda i=i: answered.append(
                _flood(c.meta_address, c.admin_token, f"/flood{i}", stop, depth=256, limit=20000)
            )
        )
        for i in range(16)
    ]
    for t in threads:
        t.start()
    try:
        # several heartbeat timeouts of calls waiting for the metaserver's workers
        time.sleep(6 * HEARTBEAT_TIMEOUT)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=180)
    assert len(answered) == 16
    assert_unchanged(before, c.routing(timeout=30))


def test_a_write_session_outlives_a_restart_of_the_metaserver_until_its_client_renews(
    private_cluster,
):
    timeout = 6.0
    c = private_cluster(extra_meta_args=["--session-timeout", str(timeout)])
    # writers that renew only when the test says so
    fs = EmberFileSystem(c.meta_address, session_renew_interval=600.0, skip_instance_cache=True)
    gone = EmberFileSystem(c.meta_address, session_renew_interval=600.0, skip_instance_cache=True)
    files = []
    try:
        first, second = os.urandom(5 * MiB), os.urandom(3 * MiB)
        f = fs.open("/held", "wb")
        files.append(f)
        f.write(first)  # one chunk on storage, the rest in the client's buffer
        abandoned = gone.open("/abandoned", "wb")
        files.append(abandoned)
        abandoned.write(b"a" * 1000)
        held = (f.handle.inode, f.handle.session_id)
        left = (abandoned.handle.inode, abandoned.handle.session_id)

        def open_sessions() -> set[tuple[int, int]]:
            return {(s["inode"], s["session_id"]) for s in admin(c, "/api/v1/sessions")}

        assert open_sessions() == {held, left}
        c.kill_meta()
        # by the wall clock, both sessions were last renewed longer than the timeout ago
        time.sleep(timeout + 1.0)
        c.start_meta()
        # the metaserver sweeps its sessions every quarter timeout: two sweeps and more
        deadline = time.monotonic() + timeout / 2
        while time.monotonic() < deadline:
            assert open_sessions() == {held, left}, "a session expired at the restart"
            time.sleep(0.2)
        assert fs.client.meta.renew_sessions([held]) == set()
        f.write(second)
        f.close()
        assert fs.cat_file("/held") == first + second
        # a writer that never comes back loses its session once the grace is over
        deadline = time.monotonic() + 5 * timeout
        while left in open_sessions():
            assert time.monotonic() < deadline, "the abandoned session never expired"
            time.sleep(0.2)
        assert open_sessions() == set()
        with pytest.raises(OSError) as info:
            abandoned.close()
        assert info.value.errno == errno.ESTALE
        assert gone.info("/abandoned")["size"] == 0
    finally:
        for file in files:
            if not file.closed:
                try:
                    file.close()
                except OSError:
                    pass
        fs.close()
        gone.close()
