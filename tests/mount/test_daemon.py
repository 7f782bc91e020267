"""``emberfs mount`` behaves like a mount: checks, daemon, clean unmounts, metaserver outages."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time

import pytest

from emberfs.cli.processes import emberfs_command
from emberfs.client.fs import EmberFileSystem
from tests.mount.conftest import unmount

pytestmark = pytest.mark.slow


def _daemon_pid(mountpoint: str) -> int:
    """The process serving ``mountpoint`` (the one whose command line names it)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"mount" in args and mountpoint.encode() in args:
            return int(pid)
    raise AssertionError(f"no process serves {mountpoint}")


def _wait_unmounted(mountpoint: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while os.path.ismount(mountpoint):
        assert time.monotonic() < deadline, f"{mountpoint} is still mounted"
        time.sleep(0.05)


def test_refuses_bad_mountpoints_and_an_unreachable_cluster(cluster, mounter, tmp_path):
    missing = mounter.command(tmp_path / "missing", cluster.meta_address, check=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "file").touch()
    full = mounter.command(busy, cluster.meta_address, check=False)
    assert full.returncode == 2 and "not empty" in full.stderr
    afile = mounter.command(busy / "file", cluster.meta_address, check=False)
    assert afile.returncode == 2 and "not a directory" in afile.stderr
    mp = mounter.mountpoint()
    away = mounter.command(mp, "127.0.0.1:1", "--meta-timeout", "1", check=False)
    assert away.returncode == 3 and "cannot reach" in away.stderr
    assert not os.path.ismount(mp)
    mounted = mounter(cluster.meta_address)
    again = mounter.command(mounted, cluster.meta_address, check=False)
    assert again.returncode == 2 and "mountpoint already" in again.stderr


def test_umount_command_and_sigterm_unmount_cleanly(cluster, mounter):
    mp = str(mounter(cluster.meta_address))
    name = f"sig-{os.getpid()}"
    done = subprocess.run(emberfs_command() + ["umount", mp], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not os.path.ismount(mp)
    gone = subprocess.run(emberfs_command() + ["umount", mp], capture_output=True, text=True)
    assert gone.returncode == 2 and "not mounted" in gone.stderr

    # SIGTERM with a file open and written but not closed: the daemon unmounts, and what
    # was written is there with its length, as a close would have left it
    mounter.command(mp, cluster.meta_address)
    payload = os.urandom(5 * 1024 * 1024 + 3)
    f = open(os.path.join(mp, name), "wb")  # noqa: SIM115
    try:
        f.write(payload)
        f.flush()  # into the mount's buffers; no fsync, no close
        pid = _daemon_pid(mp)
        os.kill(pid, signal.SIGTERM)
        _wait_unmounted(mp)
        deadline = time.monotonic() + 20
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}"), "the daemon did not exit"
    finally:
        try:
            f.close()
        except OSError:
            pass
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        assert fs.cat_file(f"/{name}") == payload
    finally:
        fs.close()


def test_metaserver_outage_gives_eio_then_recovers(private_cluster, mounter):
    c = private_cluster(storage_servers=2, replicas=2)
    mp = str(mounter(c.meta_address, "--meta-timeout", "2", "--attr-timeout", "0"))
    with open(f"{mp}/before", "wb") as f:
        f.write(b"x" * 1000)
    c.kill_meta()
    t0 = time.monotonic()
    with pytest.raises(OSError) as info:
        os.stat(f"{mp}/before")
    assert info.value.errno == errno.EIO
    assert time.monotonic() - t0 < 30
    with pytest.raises(OSError) as info:
        open(f"{mp}/new", "wb")
    assert info.value.errno == errno.EIO
    c.start_meta()
    deadline = time.monotonic() + 30
    while True:
        try:
            assert os.stat(f"{mp}/before").st_size == 1000
            break
        except OSError:
            assert time.monotonic() < deadline, "the mount did not recover"
            time.sleep(0.2)
    with open(f"{mp}/after", "wb") as f:
        f.write(b"y" * 10)
    assert open(f"{mp}/after", "rb").read() == b"y" * 10
    assert not os.path.exists(f"{mp}/new")  # the failed create left nothing

    # with --on-outage block a call waits for the metaserver instead of failing
    blocking = str(mounter(c.meta_address, "--on-outage", "block", "--attr-timeout", "0"))
    c.kill_meta()
    result: list = []

    def stat_it() -> None:
        try:
            result.append(os.stat(f"{blocking}/after").st_size)
        except OSError as exc:
            result.append(exc)

    waiter = threading.Thread(target=stat_it, daemon=True)
    waiter.start()
    waiter.join(5)
    assert waiter.is_alive() and not result, result  # still waiting, not failed
    c.start_meta()
    waiter.join(60)
    assert result == [10]
    for m in (mp, blocking):  # while their cluster still runs
        unmount(m)
