"""Everyday programs on a real mount: coreutils, tar, dd, sqlite3 and Python's os functions.

Every test works in its own directory of one module-wide ``emberfs mount`` of the shared
cluster, and checks what it did through the mount against the fsspec client where the bytes
must agree.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import sqlite3
import stat
import subprocess

import pytest

from emberfs.client.fs import EmberFileSystem

pytestmark = pytest.mark.slow

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # renameat2(2) flags


def sh(cmd: str, cwd=None) -> str:
    done = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{cmd}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def efs(cluster):
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    yield fs
    fs.close()


def test_cp_cat_ls_stat_mv(mdir, efs, tmp_path):
    local, remote = mdir
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(9 * 1024 * 1024 + 17))  # three chunks, the last one partial
    sh(f"cp {src} {local}/a.bin")
    assert (
        sh(f"cat {local}/a.bin | sha256sum").split()[0]
        == hashlib.sha256(src.read_bytes()).hexdigest()
    )
    listing = sh(f"ls -l {local}")
    assert "a.bin" in listing and str(src.stat().st_size) in listing
    assert sh(f"stat -c '%s %F' {local}/a.bin").strip() == f"{src.stat().st_size} regular file"
    sh(f"mv {local}/a.bin {local}/b.bin")
    assert sorted(os.listdir(local)) == ["b.bin"]
    assert efs.cat_file(f"{remote}/b.bin") == src.read_bytes()


def test_tar_round_trip_and_rm_r(mdir, tmp_path):
    local, _ = mdir
    tree = tmp_path / "tree"
    for i in range(5):
        d = tree / f"d{i}" / "sub"
        d.mkdir(parents=True)
        (d / "f.txt").write_text(f"file {i}\n" * (i * 1000 + 1))
        (tree / f"d{i}" / "empty").touch()
    os.symlink("d0/sub/f.txt", tree / "link")
    sh(f"tar cf - -C {tmp_path} tree | tar xf - -C {local}")
    sh(f"diff -r --no-dereference {tree} {local}/tree")
    sh(f"tar cf {tmp_path}/back.tar -C {local} tree")
    out = tmp_path / "out"
    out.mkdir()
    sh(f"tar xf {tmp_path}/back.tar -C {out}")
    sh(f"diff -r --no-dereference {tree} {out}/tree")
    sh(f"rm -r {local}/tree")
    assert os.listdir(local) == []


def test_dd_truncate_and_holes(mdir, efs):
    local, remote = mdir
    sh(f"dd if=/dev/urandom of={local}/d.bin bs=1M count=6 conv=fsync status=none")
    assert os.stat(f"{local}/d.bin").st_size == 6 << 20
    sh(f"truncate -s 10M {local}/d.bin")
    data = efs.cat_file(f"{remote}/d.bin")
    assert len(data) == 10 << 20 and data[6 << 20 :] == bytes(4 << 20)
    sh(f"truncate -s 1000 {local}/d.bin")
    with open(f"{local}/d.bin", "rb") as f:
        assert f.read() == data[:1000]
    # a write far past the end leaves a hole that reads as zeros, through both clients
    sh(f"dd if=/dev/zero bs=1 count=0 seek=0 of={local}/d.bin status=none conv=notrunc")
    sh(f"printf xyz | dd of={local}/d.bin bs=1 seek=9000000 conv=notrunc status=none")
    got = efs.cat_file(f"{remote}/d.bin")
    assert len(got) == 9000003
    assert got[:1000] == data[:1000] and got[1000:9000000] == bytes(9000000 - 1000)
    assert got[-3:] == b"xyz"


def test_symlinks(mdir, efs):
    local, remote = mdir
    with open(f"{local}/target", "w") as f:
        f.write("pointed at")
    sh(f"ln -s target {local}/link")
    assert os.readlink(f"{local}/link") == "target"
    assert open(f"{local}/link").read() == "pointed at"
    assert stat.S_ISLNK(os.lstat(f"{local}/link").st_mode)
    assert efs.info(f"{remote}/link")["type"] == "file"  # fsspec follows it
    sh(f"ln -s /nowhere {local}/dangling")
    with pytest.raises(FileNotFoundError):
        open(f"{local}/dangling")


def test_python_os_functions(mdir, efs):
    local, remote = mdir
    p = f"{local}/f"
    fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o640)
    try:
        assert os.write(fd, b"hello world") == 11
        assert os.pread(fd, 5, 6) == b"world"  # reads what it wrote, not yet flushed
        os.pwrite(fd, b"W", 6)
        assert os.fstat(fd).st_size == 11
        os.ftruncate(fd, 5)
        assert os.pread(fd, 100, 0) == b"hello"
        os.fsync(fd)
        assert efs.cat_file(f"{remote}/f") == b"hello"
    finally:
        os.close(fd)
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_size == 5
    os.chmod(p, 0o600)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    os.chown(p, 1234, 5678)
    assert (os.stat(p).st_uid, os.stat(p).st_gid) == (1234, 5678)
    os.utime(p, ns=(1_500_000_000_000_000_000, 1_600_000_000_123_456_789))
    assert os.stat(p).st_mtime_ns == 1_600_000_000_123_456_789
    assert efs.info(f"{remote}/f")["mtime"] == pytest.approx(1_600_000_000.123456789)
    with open(p, "a") as f:
        f.write(" again")
    assert open(p).read() == "hello again"
    os.makedirs(f"{local}/x/y/z")
    os.rename(f"{local}/x", f"{local}/w")
    assert os.listdir(f"{local}/w/y") == ["z"]
    os.link(p, f"{local}/hard")
    assert os.stat(p).st_nlink == 2 and open(f"{local}/hard").read() == "hello again"
    vfs = os.statvfs(local)
    assert vfs.f_blocks > 0 and vfs.f_bavail > 0
    assert vfs.f_blocks * vfs.f_frsize == efs.statfs()["capacity"] // 4096 * 4096


def test_posix_errors(mdir):
    local, _ = mdir
    os.mkdir(f"{local}/d")
    open(f"{local}/d/f", "w").close()
    cases = [
        (errno.ENOENT, lambda: os.stat(f"{local}/missing")),
        (errno.ENOENT, lambda: open(f"{local}/nodir/f", "w")),
        (errno.EEXIST, lambda: os.mkdir(f"{local}/d")),
        (errno.EEXIST, lambda: os.open(f"{local}/d/f", os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
        (errno.ENOTEMPTY, lambda: os.rmdir(f"{local}/d")),
        (errno.ENOTDIR, lambda: os.listdir(f"{local}/d/f")),
        (errno.ENOTDIR, lambda: os.mkdir(f"{local}/d/f/g")),
        (errno.EISDIR, lambda: open(f"{local}/d", "w")),
        (errno.EISDIR, lambda: os.unlink(f"{local}/d")),
        (
            errno.ENOTEMPTY,
            lambda: (
                os.rename(f"{local}/d", f"{local}/e")
                or os.mkdir(f"{local}/d")
                or open(f"{local}/d/x", "w").close()
                or os.rename(f"{local}/e", f"{local}/d")
            ),
        ),
    ]
    for want, call in cases:
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == want, (want, info.value)


def test_eacces_for_another_user(cluster, mounter, tmp_path):
    """The kernel checks each caller against the mode bits (``default_permissions``)."""
    mp = mounter(cluster.meta_address, "--allow-other")
    base = os.path.join(str(mp), f"acc-{os.getpid()}")
    os.mkdir(base, 0o755)
    secret = f"{base}/secret"
    with open(secret, "w") as f:
        f.write("root only")
    os.chmod(secret, 0o600)
    script = (
        "import os, errno\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "out = []\n"
        f"for call in (lambda: open({secret!r}).read(), lambda: open({base!r} + '/new', 'w')):\n"
        "    try:\n"
        "        call(); out.append('ok')\n"
        "    except OSError as e:\n"
        "        out.append(errno.errorcode[e.errno])\n"
        f"out.append(str(len(os.listdir({base!r}))))\n"
        "print(' '.join(out))\n"
    )
    done = subprocess.run(["python", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["EACCES", "EACCES", "1"]


def test_sqlite_database(mdir, efs):
    local, remote = mdir
    db = f"{local}/app.db"
    con = sqlite3.connect(db)
    con.execute("create table runs (id integer primary key, loss real, tag text)")
    with con:
        con.executemany(
            "insert into runs (loss, tag) values (?, ?)",
            [(1.0 / (i + 1), f"step-{i}") for i in range(2000)],
        )
    con.execute("create index by_tag on runs(tag)")
    con.close()
    con = sqlite3.connect(db)
    assert con.execute("select count(*), min(id), max(id) from runs").fetchone() == (2000, 1, 2000)
    assert con.execute("select loss from runs where tag = 'step-3'").fetchone() == (0.25,)
    with con:
        con.execute("delete from runs where id > 1000")
    assert con.execute("pragma integrity_check").fetchone() == ("ok",)
    con.close()
    assert efs.cat_file(f"{remote}/app.db") == open(db, "rb").read()


def test_fsspec_and_mount_see_each_other(mdir, efs):
    local, remote = mdir
    efs.pipe_file(f"{remote}/from-fsspec", b"written by fsspec")
    assert open(f"{local}/from-fsspec", "rb").read() == b"written by fsspec"
    payload = os.urandom(5 * 1024 * 1024)
    with open(f"{local}/from-mount", "wb") as f:
        f.write(payload)
    assert efs.cat_file(f"{remote}/from-mount") == payload  # visible once close(2) returned
    assert sorted(efs.ls(remote, detail=False)) == [f"{remote}/from-fsspec", f"{remote}/from-mount"]


def _resident(path: str) -> int:
    """How many of the file's pages the kernel holds (mincore of a mapping of it)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec)


def test_page_cache_kept_for_unchanged_file_and_never_stale(cluster, mounter, mdir, efs):
    """A second open of an unchanged file reads from the page cache; a changed one never does."""
    local, remote = mdir
    path = f"{local}/epoch.bin"
    first = os.urandom(8 * 1024 * 1024)
    efs.pipe_file(f"{remote}/epoch.bin", first)
    with open(path, "rb") as f:
        assert f.read() == first
    pages = len(first) // 4096
    assert _resident(path) == pages  # kept after close, and by the next open
    with open(path, "rb") as f:
        assert f.read() == first
    assert _resident(path) == pages
    # changed through fsspec, same size: the next open drops the pages and reads the new bytes
    second = os.urandom(len(first))
    os.stat(path)  # the kernel holds the old attributes too
    efs.pipe_file(f"{remote}/epoch.bin", second)
    with open(path, "rb") as f:
        assert f.read() == second
    # grown through fsspec while the kernel caches the old size: read whole
    third = second + os.urandom(3 * 1024 * 1024)
    os.stat(path)
    efs.pipe_file(f"{remote}/epoch.bin", third)
    with open(path, "rb") as f:
        assert f.read() == third
    # shrunk by another mount of the same cluster
    other = mounter(cluster.meta_address)
    os.stat(path)
    with open(os.path.join(str(other), remote.lstrip("/"), "epoch.bin"), "r+b") as f:
        f.truncate(1000)
        f.seek(0)
        f.write(b"other mount")
    with open(path, "rb") as f:
        assert f.read() == b"other mount" + third[11:1000]


def test_many_concurrent_readers(mdir, efs):
    local, remote = mdir
    blobs = {f"{remote}/r{i}": os.urandom(3 * 1024 * 1024 + i) for i in range(6)}
    efs.pipe(blobs)
    from concurrent.futures import ThreadPoolExecutor

    def read(name: str) -> bytes:
        with open(os.path.join(local, name.rsplit("/", 1)[1]), "rb") as f:
            return f.read()

    with ThreadPoolExecutor(12) as pool:
        names = list(blobs) * 2
        for name, got in zip(names, pool.map(read, names), strict=True):
            assert got == blobs[name]


def test_read_only_mount(cluster, mounter, efs, mdir):
    _, remote = mdir
    efs.pipe_file(f"{remote}/ro", b"fixed")
    mp = mounter(cluster.meta_address, "--read-only")
    here = os.path.join(str(mp), remote.lstrip("/"))
    assert open(f"{here}/ro", "rb").read() == b"fixed"
    for call in (
        lambda: open(f"{here}/ro", "wb"),
        lambda: os.mkdir(f"{here}/d"),
        lambda: os.unlink(f"{here}/ro"),
    ):
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == errno.EROFS


def test_descriptors_of_one_file_share_it(mdir):
    """Several descriptors of one file: sessions, lengths and reads stay right (regressions)."""
    local, _ = mdir
    p, q = f"{local}/shared", f"{local}/renamed"
    # a second open of a file open for writing leaves its session alone
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    r = os.open(p, os.O_RDONLY)
    os.write(fd, b"hello")
    os.fsync(fd)
    assert os.pread(r, 10, 0) == b"hello"
    os.close(r)
    # stat after close answers the length the writes made, also under a new name
    os.rename(p, q)
    os.stat(q)
    os.write(fd, b"x" * 100)
    os.close(fd)
    assert os.stat(q).st_size == 105 and open(q, "rb").read() == b"hello" + b"x" * 100
    fd = os.open(q, os.O_WRONLY)
    os.ftruncate(fd, 0)
    os.write(fd, b"y" * 100)
    os.close(fd)
    assert os.stat(q).st_size == 100
    # a write open right after the last writer closed, with a reader open meanwhile
    other = os.open(q, os.O_RDONLY)
    w1 = os.open(q, os.O_WRONLY)
    os.pwrite(w1, b"1" * 1000, 0)
    os.close(w1)
    w2 = os.open(q, os.O_WRONLY | os.O_APPEND)
    os.write(w2, b"2" * 1000)
    os.fsync(w2)
    os.close(w2)
    assert os.pread(other, 4000, 0) == b"1" * 1000 + b"2" * 1000
    os.close(other)
    # one read(2) the kernel splits into several requests sees every earlier write
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.pwrite(fd, b"h" * 100, 342228)
    os.pread(fd, 780, 0)
    os.pwrite(fd, b"a" * 3220, 17737)
    assert os.pread(fd, 170999, 0)[17737:20957] == b"a" * 3220
    os.close(fd)
    # O_RDONLY|O_TRUNC truncates, as Linux does
    os.close(os.open(q, os.O_RDONLY | os.O_TRUNC))
    assert os.stat(q).st_size == 0


def test_attribute_changes_keep_the_length_of_unsynced_writes(mdir, efs):
    local, remote = mdir
    p = f"{local}/grow"
    payload = os.urandom(5 * 1024 * 1024 + 10)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, payload)
        assert os.pread(fd, 10, len(payload) - 10) == payload[-10:]  # sent, not yet synced
        os.chmod(p, 0o600)
        os.chown(p, 0, 0)
        assert os.fstat(fd).st_size == len(payload)
    finally:
        os.close(fd)
    assert os.stat(p).st_size == len(payload)
    assert efs.cat_file(f"{remote}/grow") == payload


def renameat2(old: str, new: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, old.encode(), at_fdcwd, new.encode(), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), old)


def test_renameat2_exchange_and_noreplace(mdir, efs):
    local, remote = mdir
    for name, content in (("new", b"new checkpoint"), ("cur", b"current checkpoint")):
        os.makedirs(f"{local}/{name}/shards")
        with open(f"{local}/{name}/shards/0", "wb") as f:
            f.write(content)
    renameat2(f"{local}/new", f"{local}/cur", RENAME_EXCHANGE)
    assert open(f"{local}/cur/shards/0", "rb").read() == b"new checkpoint"
    assert open(f"{local}/new/shards/0", "rb").read() == b"current checkpoint"
    assert efs.cat_file(f"{remote}/cur/shards/0") == b"new checkpoint"
    with pytest.raises(FileExistsError):
        renameat2(f"{local}/new", f"{local}/cur", RENAME_NOREPLACE)
    with pytest.raises(FileNotFoundError):
        renameat2(f"{local}/new", f"{local}/missing", RENAME_EXCHANGE)
    assert sorted(os.listdir(local)) == ["cur", "new"]
