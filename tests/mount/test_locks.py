"""fcntl and flock locks across two mounts of one cluster (separate daemon processes).

The lockers are processes of their own (:class:`Locker`): each holds a file open on
one mount and takes, waits for and releases locks as the test tells it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import make_cluster
from tests.mount.conftest import unmount
from tests.mount.test_daemon import _daemon_pid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE = 3.0  # the cluster's lock lease timeout

LOCKER = r"""
import errno, fcntl, os, sys
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
print(os.getpid(), flush=True)
for line in sys.stdin:
    cmd = line.split()
    try:
        if cmd[0] == "flock":
            op = {"EX": fcntl.LOCK_EX, "SH": fcntl.LOCK_SH, "UN": fcntl.LOCK_UN}[cmd[1]]
            fcntl.flock(fd, op | (fcntl.LOCK_NB if "nb" in cmd else 0))
        elif cmd[0] == "lockf":
            op = {"EX": fcntl.LOCK_EX, "SH": fcntl.LOCK_SH, "UN": fcntl.LOCK_UN}[cmd[1]]
            op |= fcntl.LOCK_NB if "nb" in cmd else 0
            fcntl.lockf(fd, op, int(cmd[3]), int(cmd[2]))
        elif cmd[0] == "close-other":
            os.close(os.open(path, os.O_RDONLY))
        print("ok", flush=True)
    except OSError as exc:
        print("err", exc.errno, flush=True)
"""

APPENDER = r"""
import fcntl, os, sys
path, name, lines = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, "ab", buffering=0) as f:
    for i in range(lines):
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0, os.SEEK_END)  # someone may have appended while this one waited
        f.write(f"{name} {i:05d}\n".encode())
        fcntl.flock(f, fcntl.LOCK_UN)
"""


class Locker:
    """A process holding ``path`` open (read-write) and locking it on command."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LOCKER, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = int(self._line(20))

    def _line(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        return self.proc.stdout.readline().strip()

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 20.0) -> str | None:
        """The answer to the last command ("ok", "err N"), None while it has none."""
        return self._line(timeout)

    def do(self, cmd: str) -> str:
        self.send(cmd)
        out = self.answer()
        assert out is not None, f"{cmd}: no answer"
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def lock_cluster(tmp_path_factory):
    c = make_cluster(
        tmp_path_factory,
        "locks",
        storage_servers=2,
        replicas=2,
        extra_meta_args=["--lock-lease-timeout", str(LEASE)],
    )
    c.start(timeout=90)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def mounts(lock_cluster, mounter):
    """Two mounts of one cluster: two daemons, as on two machines."""
    return [mounter(lock_cluster.meta_address) for _ in range(2)]


@pytest.fixture
def paths(mounts):
    """One new file, as each mount names it."""
    name = f"lock-{uuid.uuid4().hex[:10]}"
    with open(os.path.join(mounts[0], name), "wb") as f:
        f.write(b"x" * 4096)
    return [os.path.join(mp, name) for mp in mounts]


@pytest.fixture
def lockers():
    made: list[Locker] = []

    def make(path: str) -> Locker:
        made.append(Locker(path))
        return made[-1]

    yield make
    for locker in made:
        locker.stop()


WOULD_BLOCK = f"err {errno.EAGAIN}"


def test_flock_exclusive_and_shared_across_mounts(paths, lockers):
    a, b = lockers(paths[0]), lockers(paths[1])
    assert a.do("flock EX") == "ok"
    assert b.do("flock EX nb") == WOULD_BLOCK
    assert b.do("flock SH nb") == WOULD_BLOCK
    with open(paths[1], "rb") as f:  # this process, on the other mount, too
        with pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert a.do("flock SH") == "ok"  # converted to shared
    assert b.do("flock SH nb") == "ok"
    assert a.do("flock EX nb") == WOULD_BLOCK
    assert b.do("flock UN") == "ok"
    assert a.do("flock EX nb") == "ok"
    # a blocking request waits, and gets the lock once the holder lets go
    b.send("flock EX")
    assert b.answer(2.0) is None
    started = time.monotonic()
    assert a.do("flock UN") == "ok"
    assert b.answer(10.0) == "ok"
    assert time.monotonic() - started < 2.0


def test_flock_goes_with_its_open_file_and_its_process(paths, lockers):
    a, b = lockers(paths[0]), lockers(paths[1])
    assert a.do("flock EX") == "ok"
    assert a.do("close-other") == "ok"  # another descriptor: the flock lock stays
    assert b.do("flock EX nb") == WOULD_BLOCK
    b.send("flock EX")
    assert b.answer(1.0) is None
    a.stop()  # the process exits: its open file is released, and the lock with it
    assert b.answer(10.0) == "ok"


def getlk(fd: int, start: int, length: int) -> tuple[int, int, int, int]:
    """F_GETLK for a write lock of ``[start, start + length)``: (type, start, len, pid)."""
    fmt = "hhqqi4x"
    arg = struct.pack(fmt, fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
    kind, _, got_start, got_len, pid = struct.unpack(fmt, fcntl.fcntl(fd, fcntl.F_GETLK, arg))
    return kind, got_start, got_len, pid


def test_fcntl_ranges_getlk_and_close(paths, lockers):
    a, b = lockers(paths[0]), lockers(paths[1])
    assert a.do("lockf EX 0 100") == "ok"  # bytes 0..99
    assert b.do("lockf EX 50 10 nb") in (WOULD_BLOCK, f"err {errno.EACCES}")
    assert b.do("lockf EX 100 100 nb") == "ok"  # 100..199 is free
    fd = os.open(paths[1], os.O_RDWR)
    try:
        assert getlk(fd, 0, 10) == (fcntl.F_WRLCK, 0, 100, a.pid)
        assert getlk(fd, 150, 1) == (fcntl.F_WRLCK, 100, 100, b.pid)
        assert getlk(fd, 300, 0)[0] == fcntl.F_UNLCK
        # an unlock in the middle splits the holder's lock
        assert a.do("lockf UN 40 20") == "ok"
        assert getlk(fd, 40, 20)[0] == fcntl.F_UNLCK
        assert getlk(fd, 30, 20) == (fcntl.F_WRLCK, 0, 40, a.pid)
        assert getlk(fd, 60, 1) == (fcntl.F_WRLCK, 60, 40, a.pid)
        # a blocking request for the whole file waits for both holders
        b.send("lockf EX 0 0")
        assert b.answer(1.5) is None
        assert a.do("close-other") == "ok"  # POSIX: any close drops the process's locks
        assert b.answer(10.0) == "ok"
        assert getlk(fd, 0, 0) == (fcntl.F_WRLCK, 0, 0, b.pid)
    finally:
        os.close(fd)


def test_a_killed_mount_loses_its_locks_after_the_lease(lock_cluster, mounter, paths, lockers):
    doomed = mounter(lock_cluster.meta_address)
    name = os.path.basename(paths[0])
    holder = lockers(os.path.join(doomed, name))
    assert holder.do("flock EX") == "ok"
    assert holder.do("lockf EX 0 0") == "ok"
    b = lockers(paths[1])
    assert b.do("flock EX nb") == WOULD_BLOCK
    os.kill(_daemon_pid(doomed), signal.SIGKILL)
    killed = time.monotonic()
    try:
        b.send("flock EX")
        assert b.answer(LEASE + 15) == "ok"
        waited = time.monotonic() - killed
        assert b.do("lockf EX 0 0 nb") == "ok"
    finally:
        holder.stop()
        unmount(doomed)
    assert LEASE * 0.5 < waited < LEASE + 10, waited


def test_appends_under_flock_from_both_mounts_lose_no_line(paths):
    lines = 40
    procs = [
        subprocess.Popen([sys.executable, "-c", APPENDER, paths[i % 2], f"w{i}", str(lines)])
        for i in range(4)
    ]
    for proc in procs:
        assert proc.wait(240) == 0
    with open(paths[1], "rb") as f:
        got = f.read()
    assert got.startswith(b"x" * 4096)
    text = got[4096:].decode().splitlines()
    assert len(text) == 4 * lines
    assert sorted(text) == sorted(f"w{i} {n:05d}" for i in range(4) for n in range(lines))


def test_interrupted_wait_answers_eintr(paths, lockers):
    a = lockers(paths[0])
    assert a.do("flock EX") == "ok"
    # the handler raises, so Python does not retry the interrupted flock(2)
    script = (
        "import fcntl, signal, sys, time\n"
        "class Alarm(Exception): pass\n"
        "def ring(*args): raise Alarm()\n"
        "signal.signal(signal.SIGALRM, ring)\n"
        "f = open(sys.argv[1], 'rb')\n"
        "t = time.monotonic()\n"
        "signal.setitimer(signal.ITIMER_REAL, 1.0)\n"
        "try:\n"
        "    fcntl.flock(f, fcntl.LOCK_EX)\n"
        "    print('granted')\n"
        "except Alarm:\n"
        "    print('interrupted', time.monotonic() - t)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, paths[1]], capture_output=True, text=True, timeout=30
    )
    word, waited = done.stdout.split()
    assert word == "interrupted", done.stdout + done.stderr
    assert 0.9 < float(waited) < 4.0
    # the interrupted request left no lock behind
    b = lockers(paths[1])
    assert a.do("flock UN") == "ok"
    assert b.do("flock EX nb") == "ok"


def test_a_revoked_token_gets_permission_error(lock_cluster, mounter, paths):
    from emberfs.cli.admin import AdminClient

    admin = AdminClient(lock_cluster.admin_url, lock_cluster.admin_token)
    made = admin.post(
        "/api/v1/tokens", {"uid": 1000, "gid": 1000, "groups": [], "name": "lock-leaver"}
    )
    os.chmod(paths[0], 0o666)
    user_mount = mounter(lock_cluster.meta_address, "--token", made["token"])
    fd = os.open(os.path.join(user_mount, os.path.basename(paths[0])), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        admin.delete(f"/api/v1/tokens/{made['id']}")
        deadline = time.monotonic() + 15
        while True:  # the metaserver's token cache holds an answer for a moment
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except PermissionError as exc:
                assert exc.errno == errno.EACCES
                break
            assert time.monotonic() < deadline, "the revoked token still takes locks"
            time.sleep(0.2)
        with pytest.raises(PermissionError):
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 10, 0)
    finally:
        os.close(fd)
        unmount(user_mount)


def test_two_metaservers_on_etcd_share_the_locks(private_cluster, mounter, lockers):
    """Each mount talks to its own metaserver; the locks, their waits and leases are one."""
    c = private_cluster(
        kv="etcd",
        metaservers=2,
        storage_servers=2,
        replicas=2,
        # a metaserver that takes the lead judges leases only after its outage grace
        extra_meta_args=["--lock-lease-timeout", str(LEASE), "--store-outage-grace", "2"],
    )
    one, two = (mounter(f"{c.host}:{port}") for port in c.meta_ports)
    name = f"lock-{uuid.uuid4().hex[:10]}"
    open(os.path.join(one, name), "wb").close()
    a, b = lockers(os.path.join(one, name)), lockers(os.path.join(two, name))
    assert a.do("lockf EX 0 0") == "ok"
    assert b.do("lockf SH 0 0 nb") in (WOULD_BLOCK, f"err {errno.EACCES}")
    b.send("lockf SH 0 0")  # waits on the other metaserver
    assert b.answer(1.5) is None
    started = time.monotonic()
    assert a.do("lockf UN 0 0") == "ok"
    assert b.answer(10.0) == "ok"
    assert time.monotonic() - started < 2.0
    # a mount that dies: whichever metaserver leads ends its lease
    assert b.do("flock EX") == "ok"
    os.kill(_daemon_pid(two), signal.SIGKILL)
    try:
        a.send("flock EX")
        assert a.answer(LEASE + 15) == "ok"
    finally:
        unmount(two)
