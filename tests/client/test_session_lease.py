"""Write-session leases against real processes: a killed writer does not hold a file forever."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import requests

from emberfs.client.fs import EmberFileSystem
from emberfs.client.handles import OpenHandle, SessionLeases
from emberfs.proto import common_pb2

SESSION_TIMEOUT = 3.0

CHILD = textwrap.dedent(
    """
    import sys, time
    from emberfs.client.fs import EmberFileSystem

    fs = EmberFileSystem(sys.argv[1], session_renew_interval=1.0, skip_instance_cache=True)
    f = fs.open(sys.argv[2], "wb")
    f.write(b"x" * (5 * 1024 * 1024))
    f.flush(force=True)
    print("WROTE", flush=True)
    time.sleep(120)
    """
)


def get(cluster, route: str):
    resp = requests.get(f"{cluster.admin_url}{route}", timeout=5)
    resp.raise_for_status()
    return resp.json()


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def lease_cluster(private_cluster):
    return private_cluster(
        storage_servers=3, extra_meta_args=["--session-timeout", str(SESSION_TIMEOUT)]
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_killed_writer_session_expires_and_unlinked_file_is_collected(lease_cluster):
    cluster = lease_cluster
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, cluster.meta_address, "/victim"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "WROTE"
        (session,) = get(cluster, "/api/v1/sessions")
        inode = fs.client.meta.stat("/victim").inode
        assert session["inode"] == inode
        # the child renews while it lives: the session outlives the timeout
        time.sleep(SESSION_TIMEOUT + 1.5)
        assert [s["inode"] for s in get(cluster, "/api/v1/sessions")] == [inode]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        fs.rm("/victim")
        assert get(cluster, "/api/v1/sessions") != []  # the dead writer still holds it
        wait_for(lambda: get(cluster, "/api/v1/sessions") == [], 10, "the session to expire")
        # the expiry dropped the inode and queued its chunks; GC then drains the queue
        with pytest.raises(FileNotFoundError):
            fs.client.meta.stat("/victim")
        wait_for(lambda: get(cluster, "/api/v1/gc") == [], 40, "the GC queue to drain")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        fs.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_live_writer_keeps_its_session_and_a_lapsed_one_gets_estale(lease_cluster):
    cluster = lease_cluster
    live = EmberFileSystem(
        cluster.meta_address, session_renew_interval=1.0, skip_instance_cache=True
    )
    lapsing = EmberFileSystem(
        cluster.meta_address, session_renew_interval=60.0, skip_instance_cache=True
    )
    try:
        f = live.open("/live", "wb")
        g = lapsing.open("/lapsing", "wb")
        f.write(b"a" * 1000)
        g.write(b"b" * 1000)
        time.sleep(2 * SESSION_TIMEOUT + 1)
        f.write(b"c" * 1000)
        f.close()
        assert live.cat_file("/live") == b"a" * 1000 + b"c" * 1000
        with pytest.raises(OSError) as info:
            g.close()
        assert info.value.errno == errno.ESTALE
        assert "expired" in str(info.value)
        assert lapsing.info("/lapsing")["size"] == 0  # never synced: the recorded length
        assert get(cluster, "/api/v1/sessions") == []
    finally:
        live.close()
        lapsing.close()


def test_lease_keeper_renews_in_one_call_and_marks_expired_handles():
    calls: list[list[tuple[int, int]]] = []
    renewed = threading.Event()

    def renew(pairs):
        calls.append(sorted(pairs))
        renewed.set()
        return {(2, 20)}

    leases = SessionLeases(renew, interval=0.05)
    a = OpenHandle("/a", common_pb2.InodeAttr(inode=1), 10)
    b = OpenHandle("/b", common_pb2.InodeAttr(inode=2), 20)
    c = OpenHandle("/c", common_pb2.InodeAttr(inode=3), 30)
    try:
        for h in (a, b, c):
            leases.register(h)
        leases.unregister(c)
        assert renewed.wait(5)
        wait_for(lambda: b.expired, 5, "the expired mark")
        assert calls[0] == [(1, 10), (2, 20)]
        assert not a.expired and not c.expired
    finally:
        leases.stop()
    with pytest.raises(ValueError):
        SessionLeases(renew, interval=0)


def test_write_to_an_expired_handle_raises_estale(fs, base):
    f = fs.open(f"{base}/x", "wb")
    try:
        f.handle.expired = True
        with pytest.raises(OSError) as info:
            f.write(b"z" * (f.handle.chunk_size + 1))
        assert info.value.errno == errno.ESTALE
        f.handle.expired = False  # the server still has the session: close ends it
    finally:
        f.close()
    assert fs.info(f"{base}/x")["size"] == 0


def test_a_handle_closed_while_its_renewal_is_answered_is_not_called_expired(caplog):
    """The renewal races the close: the metaserver says the session is gone because it closed."""
    a = OpenHandle("/a", common_pb2.InodeAttr(inode=1), 10)
    leases: list[SessionLeases] = []

    def renew(pairs):
        leases[0].unregister(a)  # the close ends the session while the renewal runs
        return set(pairs)

    leases.append(SessionLeases(renew, interval=3600))
    try:
        leases[0].register(a)
        with caplog.at_level("WARNING"):
            leases[0].renew_now()
        assert not a.expired
        assert "expired" not in caplog.text
    finally:
        leases[0].stop()


def test_pipe_of_many_files_logs_no_expired_sessions(private_cluster, caplog):
    c = private_cluster()
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True, session_renew_interval=0.01)
    try:
        with caplog.at_level("WARNING"):
            for batch in range(3):
                fs.pipe({f"/many/{batch}-{i}": b"x" * 100 for i in range(500)})
        assert "expired" not in caplog.text
    finally:
        fs.close()
