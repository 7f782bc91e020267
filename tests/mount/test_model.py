"""The mount against the local file system: one random sequence of POSIX calls on both.

Every call goes to a fresh directory of the mount and to a local directory (``tmp_path``) in
lockstep, and both must answer the same: the return value, or the errno of the OSError raised
(exact values), and for a read the same bytes. The calls: ``open`` with every access mode and
combinations of ``O_CREAT``, ``O_EXCL``, ``O_TRUNC`` and ``O_APPEND``; ``pread``, ``pwrite``,
``read``, ``write`` and ``lseek`` on a pool of descriptors kept open across calls (each opened
on both sides at once), at offsets up to ~10 MiB, past the end (holes) and across the 4 MiB
chunk boundaries, writes of up to 200 KiB; ``ftruncate`` and ``truncate`` growing and
shrinking; ``fsync`` and ``close``, after which ``os.stat`` of the name must agree;
``rename`` (over files, into other directories, of directories, onto non-empty ones),
``unlink``, ``mkdir``, ``rmdir``, ``os.listdir``, ``stat``/``lstat``, ``symlink`` and
``readlink``. The namespace is small (11 names in up to three directories) so that names
collide and calls fail often. A read through one descriptor must see the writes of every
descriptor of the file, flushed or not. Every ``CHECK_EVERY`` calls the two trees must be
the same (names, types, sizes, symlink targets), and at the end their file contents too,
once with the descriptors still open and once after closing them.

CI form: 10,000 calls from seed 1 (about 30 s on 2 cores). Long form, more calls, other seeds::

    EMBERFS_MODEL_OPS=300000 EMBERFS_MODEL_SEED=7 python -m pytest tests/mount/test_model.py

Each call is drawn from the seed and the local side's state alone, so a seed replays the
same sequence: a failure names the call's index, the call, both results, the calls before
it and the command that replays it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import stat
from collections import Counter, deque
from dataclasses import dataclass

import pytest

OPS = int(os.environ.get("EMBERFS_MODEL_OPS", "10000"))
SEED = int(os.environ.get("EMBERFS_MODEL_SEED", "1"))

KiB = 1024
MiB = 1024 * KiB
CHUNK = 4 * MiB  # the default chunk size: writes and reads cross its boundaries
MAX_WRITE = 200 * KiB
MAX_READ = 256 * KiB
MAX_OFFSET = 10 * MiB
MAX_OPEN = 6  # descriptors open at once (each on both sides)
HISTORY = 20  # calls shown before a failing one
CHECK_EVERY = 500  # calls between two comparisons of the trees (without contents)

DIRS = ("x", "y", "x/y")
# the names every call picks from: files, directories and symlinks come and go on all of them
PATHS = ("a", "b", "c", "x", "y", "x/a", "x/b", "x/y", "y/a", "y/b", "x/y/a")
# relative targets only (both trees must resolve them alike), some dangling, some loops
TARGETS = ("a", "b", "x", "x/a", "y/b", "gone", ".")
UP_TARGETS = ("../a", "../x", "../y/b")  # for links below the top, never out of the tree

pytestmark = [pytest.mark.slow, pytest.mark.timeout(max(300, OPS // 20))]

FLAG_NAMES = (
    (os.O_CREAT, "O_CREAT"),
    (os.O_EXCL, "O_EXCL"),
    (os.O_TRUNC, "O_TRUNC"),
    (os.O_APPEND, "O_APPEND"),
)
ACCESS_NAMES = {os.O_RDONLY: "O_RDONLY", os.O_WRONLY: "O_WRONLY", os.O_RDWR: "O_RDWR"}
WHENCE_NAMES = {os.SEEK_SET: "SEEK_SET", os.SEEK_CUR: "SEEK_CUR", os.SEEK_END: "SEEK_END"}


def flag_names(flags: int) -> str:
    names = [ACCESS_NAMES[flags & os.O_ACCMODE]]
    names += [name for bit, name in FLAG_NAMES if flags & bit]
    return "|".join(names)


def kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return f"mode {mode:o}"


def stat_view(st: os.stat_result) -> tuple:
    """What both sides must agree on: the type, and the size of all but directories."""
    k = kind(st.st_mode)
    return (k,) if k == "dir" else (k, st.st_size)


def shown(result) -> str:
    """A result for a message: ``-> value`` or ``-> ENOENT``; bytes by length and digest."""
    ok, value = result
    if not ok:
        return f"{errno.errorcode.get(value, value)}"
    if isinstance(value, bytes):
        return f"{len(value)} bytes (sha1 {hashlib.sha1(value).hexdigest()[:12]})"
    return repr(value)


def first_difference(a: bytes, b: bytes) -> str:
    n = min(len(a), len(b))
    at = next((i for i in range(n) if a[i] != b[i]), n)
    return (
        f"first difference at byte {at} of the read: "
        f"local {a[at : at + 16].hex() or 'EOF'}, mount {b[at : at + 16].hex() or 'EOF'}"
    )


def tree(root: str, contents: bool) -> dict[str, tuple]:
    """Every name under ``root`` (not following symlinks): type, size, target, digest."""
    out: dict[str, tuple] = {}

    def walk(rel: str) -> None:
        for name in sorted(os.listdir(os.path.join(root, rel))):
            r = f"{rel}/{name}" if rel else name
            p = os.path.join(root, r)
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):
                out[r] = ("dir",)
                walk(r)
            elif stat.S_ISLNK(st.st_mode):
                out[r] = ("symlink", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                digest = None
                if contents:
                    h = hashlib.sha256()
                    with open(p, "rb") as f:
                        while block := f.read(MiB):
                            h.update(block)
                    digest = h.hexdigest()[:16]
                out[r] = ("file", st.st_size, digest)
            else:
                out[r] = (kind(st.st_mode),)

    walk("")
    return out


@dataclass
class Open:
    """A file open on both sides: the n-th successful open, with its two descriptors."""

    id: int
    path: str
    flags: int
    fds: tuple[int, int]  # (local, mount)
    ino: int  # the local side's inode number: which file it is

    @property
    def writable(self) -> bool:
        return self.flags & os.O_ACCMODE != os.O_RDONLY

    def __str__(self) -> str:
        return f"#{self.id} {self.path!r} {flag_names(self.flags)}"


class Model:
    """Draws calls from ``rng`` and runs each on the local side (0) and the mount (1)."""

    def __init__(self, local: str, mounted: str, seed: int) -> None:
        self.roots = (local, mounted)
        self.seed = seed
        self.rng = random.Random(seed)
        self.data = self.rng.randbytes(MiB + MAX_WRITE)  # writes take slices of it
        self.open: dict[int, Open] = {}
        self.opened = 0
        self.calls = 0
        self.history: deque[str] = deque(maxlen=HISTORY)
        self.counts: Counter[str] = Counter()
        self.stray: list[int] = []  # descriptors of a failed comparison, closed at the end
        self.ops = (
            (self.op_open, 10),
            (self.op_close, 6),
            (self.op_pwrite, 14),
            (self.op_write, 5),
            (self.op_pread, 14),
            (self.op_read, 4),
            (self.op_lseek, 3),
            (self.op_ftruncate, 4),
            (self.op_fsync, 3),
            (self.op_fstat, 4),
            (self.op_truncate, 3),
            (self.op_rename, 6),
            (self.op_unlink, 4),
            (self.op_mkdir, 3),
            (self.op_rmdir, 2),
            (self.op_clear, 2),
            (self.op_listdir, 3),
            (self.op_stat, 5),
            (self.op_symlink, 3),
            (self.op_readlink, 2),
        )
        self._ops = [op for op, _ in self.ops]
        self._weights = [w for _, w in self.ops]

    # running a call on both sides --------------------------------------------------------
    def at(self, side: int, path: str) -> str:
        return os.path.join(self.roots[side], path)

    def both(self, desc: str, fn, key=None):
        """Run ``fn(side)`` on both sides; fail unless the results agree; return them."""
        index = self.calls
        self.calls += 1
        results = []
        for side in (0, 1):
            try:
                results.append((True, fn(side)))
            except OSError as exc:
                results.append((False, exc.errno))
        seen = [(ok, key(v) if ok and key else v) for ok, v in results]
        if seen[0] != seen[1]:
            self.fail(index, desc, seen)
        self.history.append(f"#{index} {desc} -> {shown(seen[0])}")
        return results

    def fail(self, index: int, desc: str, seen) -> None:
        lines = [
            f"call #{index} (seed {self.seed}) differs: {desc}",
            f"  local: {shown(seen[0])}",
            f"  mount: {shown(seen[1])}",
        ]
        if all(ok and isinstance(v, bytes) for ok, v in seen):
            lines.append("  " + first_difference(seen[0][1], seen[1][1]))
        lines.append(f"open: {', '.join(str(o) for o in self.open.values()) or 'none'}")
        lines.append(f"the {len(self.history)} calls before it:")
        lines += [f"  {h}" for h in self.history]
        lines.append(self.replay(index + 1))
        pytest.fail("\n".join(lines), pytrace=False)

    def replay(self, ops: int) -> str:
        return (
            f"replay: EMBERFS_MODEL_SEED={self.seed} EMBERFS_MODEL_OPS={ops} "
            "python -m pytest tests/mount/test_model.py"
        )

    def run(self, ops: int) -> None:
        while self.calls < ops:
            op = self.rng.choices(self._ops, self._weights)[0]
            self.counts[op.__name__[3:]] += 1
            op()
            if self.calls // CHECK_EVERY != (self.calls - 1) // CHECK_EVERY:
                self.check_trees(contents=False)

    def check_trees(self, contents: bool, when: str = "") -> None:
        local, mounted = (tree(root, contents) for root in self.roots)
        if local == mounted:
            return
        diff = [
            f"  {name}: local {local.get(name)}, mount {mounted.get(name)}"
            for name in sorted(set(local) | set(mounted))
            if local.get(name) != mounted.get(name)
        ]
        lines = [f"the trees differ after call #{self.calls - 1} (seed {self.seed}){when}:"]
        lines += diff
        lines.append(f"the {len(self.history)} calls before:")
        lines += [f"  {h}" for h in self.history]
        lines.append(self.replay(self.calls))
        pytest.fail("\n".join(lines), pytrace=False)

    def close_all(self) -> None:
        for o in list(self.open.values()):
            self.close(o)

    def abandon(self) -> None:
        """Close whatever is still open, without comparing (after a failure)."""
        for fd in [fd for o in self.open.values() for fd in o.fds] + self.stray:
            try:
                os.close(fd)
            except OSError:
                pass
        self.open.clear()

    # drawing arguments ------------------------------------------------------------------
    def path(self) -> str:
        return self.rng.choice(PATHS)

    def local_size(self, o: Open) -> int:
        return os.fstat(o.fds[0]).st_size

    def offset(self, size: int, inside: float = 0.0) -> int:
        """Inside the file, at or past its end, across a chunk boundary, anywhere."""
        rng = self.rng
        if rng.random() < inside:  # inside the file, about a third of the time near a chunk start
            at = rng.randint(0, size)
            if rng.random() < 0.3:
                at = at // CHUNK * CHUNK + rng.randint(-MAX_READ, 4 * KiB)
            return max(0, min(at, size))
        r = rng.random()
        if r < 0.3:
            at = rng.randint(0, size)
        elif r < 0.42:
            at = size
        elif r < 0.57:
            at = size + rng.randint(1, 256 * KiB)
        elif r < 0.72:
            at = CHUNK * rng.randint(1, 2) + rng.randint(-MAX_WRITE, MAX_WRITE)
        elif r < 0.87:
            at = rng.randint(0, MAX_OFFSET)
        else:
            at = rng.randint(0, 64 * KiB)
        return max(0, min(at, MAX_OFFSET))

    def length(self, most: int) -> int:
        rng = self.rng
        r = rng.random()
        if r < 0.05:
            return rng.choice((0, most))
        if r < 0.4:
            return rng.randint(1, 4 * KiB)
        if r < 0.75:
            return rng.randint(4 * KiB, 64 * KiB)
        return rng.randint(64 * KiB, most)

    def new_size(self, size: int) -> int:
        """A length to cut or grow a file to."""
        rng = self.rng
        return rng.choice(
            (
                0,
                size // 2,
                max(0, size - rng.randint(1, 100 * KiB)),
                size + rng.randint(1, 100 * KiB),
                rng.randint(0, MAX_OFFSET),
                CHUNK + rng.randint(-4 * KiB, 4 * KiB),
            )
        )

    def pick_open(self) -> Open | None:
        if not self.open:
            return None
        return self.open[self.rng.choice(sorted(self.open))]

    def payload(self, n: int) -> tuple[int, memoryview]:
        start = self.rng.randint(0, len(self.data) - n)
        return start, memoryview(self.data)[start : start + n]

    # calls on descriptors ---------------------------------------------------------------
    def op_open(self) -> None:
        rng = self.rng
        if len(self.open) >= MAX_OPEN:
            self.close(self.pick_open())
        # a file open already, half the time: its descriptors then share their writes
        reopen = self.open and rng.random() < 0.5
        path = self.pick_open().path if reopen else self.path()
        access = rng.choice((os.O_RDONLY, os.O_WRONLY, os.O_RDWR, os.O_RDWR))
        flags = access
        if rng.random() < 0.55:
            flags |= os.O_CREAT
            if rng.random() < 0.3:
                flags |= os.O_EXCL
        # O_RDONLY|O_TRUNC is left to the implementation by POSIX; Linux truncates, and so
        # does the mount.
        if rng.random() < 0.25:
            flags |= os.O_TRUNC
        if rng.random() < 0.25:
            flags |= os.O_APPEND

        def call(side: int):
            fd = os.open(self.at(side, path), flags, 0o644)
            self.stray.append(fd)
            st = os.fstat(fd)
            return fd, kind(st.st_mode), st.st_ino

        (ok, local), (_, mounted) = self.both(
            f"open({path!r}, {flag_names(flags)})", call, key=lambda r: r[1]
        )
        if not ok:
            return
        fds = (local[0], mounted[0])
        for fd in fds:
            self.stray.remove(fd)
        if local[1] != "file":  # a directory opened for reading: nothing to do with it
            for fd in fds:
                os.close(fd)
            return
        o = Open(self.opened, path, flags, fds, local[2])
        self.opened += 1
        self.open[o.id] = o

    def close(self, o: Open) -> None:
        del self.open[o.id]
        self.both(f"close({o})", lambda side: os.close(o.fds[side]))
        self.stat_after(o.path, "close")

    def stat_after(self, path: str, what: str) -> None:
        self.both(
            f"stat({path!r}) after {what}",
            lambda side: stat_view(os.stat(self.at(side, path))),
        )

    def op_close(self) -> None:
        o = self.pick_open()
        if o is None:
            return self.op_open()
        self.close(o)

    def op_pwrite(self) -> None:
        o = self.pick_open()
        if o is None:
            return self.op_open()
        offset = self.offset(self.local_size(o))
        start, data = self.payload(self.length(MAX_WRITE))
        self.both(
            f"pwrite({o}, data[{start}:{start + len(data)}] ({len(data)} bytes), {offset})",
            lambda side: os.pwrite(o.fds[side], data, offset),
        )

    def op_write(self) -> None:
        o = self.pick_open()
        if o is None:
            return self.op_open()
        start, data = self.payload(self.length(MAX_WRITE))
        self.both(
            f"write({o}, data[{start}:{start + len(data)}] ({len(data)} bytes))",
            lambda side: os.write(o.fds[side], data),
        )

    def op_pread(self) -> None:
        o = self.pick_open()
        if o is None:
            return self.op_open()
        offset = self.offset(self.local_size(o), inside=0.5)
        n = self.length(MAX_READ)
        self.both(f"pread({o}, {n}, {offset})", lambda side: os.pread(o.fds[side], n, offset))

    def op_read(self) -> None:
        o = self.pick_open()
        if o is None:
            return self.op_open()
        n = self.length(MAX_READ)
        self.both(f"read({o}, {n})", lambda side: os.read(o.fds[side], n))

    def op_lseek(self) -> None:
        o = self.pick_open()
        if o is None:
            return self.op_open()
        whence = self.rng.choice(tuple(WHENCE_NAMES))
        if whence == os.SEEK_SET:
            offset = self.offset(self.local_size(o))
        else:
            offset = self.rng.randint(-MAX_WRITE, MAX_WRITE)
        self.both(
            f"lseek({o}, {offset}, {WHENCE_NAMES[whence]})",
            lambda side: os.lseek(o.fds[side], offset, whence),
        )

    def op_ftruncate(self) -> None:
        o = self.pick_open()
        if o is None:
            return self.op_open()
        length = self.new_size(self.local_size(o))
        self.both(f"ftruncate({o}, {length})", lambda side: os.ftruncate(o.fds[side], length))

    def op_fsync(self) -> None:
        o = self.pick_open()
        if o is None:
            return self.op_open()
        self.both(f"fsync({o})", lambda side: os.fsync(o.fds[side]))
        if not self.unlinked(o):
            self.both(f"fstat({o}) after fsync", lambda side: os.fstat(o.fds[side]).st_size)
        self.stat_after(o.path, "fsync")

    def unlinked(self, o: Open) -> bool:
        """True when the file of ``o`` has no name left.

        ``fstat`` of such a file is ESTALE on the mount (libfuse's path-based API has no path
        to ask for; docs/mount.md), while reads, writes and ``ftruncate`` work.
        """
        return os.fstat(o.fds[0]).st_nlink == 0

    def op_fstat(self) -> None:
        o = self.pick_open()
        if o is None:
            return self.op_open()
        if self.unlinked(o):
            return
        self.both(f"fstat({o})", lambda side: stat_view(os.fstat(o.fds[side])))

    # calls on names ---------------------------------------------------------------------
    def local_file(self, path: str) -> int | None:
        """The inode of the regular file at ``path`` on the local side (None if not a file)."""
        try:
            st = os.lstat(self.at(0, path))
        except OSError:
            return None
        return st.st_ino if stat.S_ISREG(st.st_mode) else None

    def close_readers(self, path: str, keep: int | None = None) -> None:
        """Close the read-only descriptors of the file a call may unlink, on both sides.

        EmberFS keeps an unlinked file's data only while a write open of it exists: a
        read-only descriptor of an unlinked file may read ESTALE or EIO (while POSIX keeps
        the data until the last close). So before an ``unlink`` or a ``rename`` over a file
        its read-only descriptors are closed (even if the call then fails); its write
        descriptors stay open and keep working on the unlinked file.
        """
        ino = self.local_file(path)
        if ino is None or ino == keep:
            return
        for o in [o for o in self.open.values() if o.ino == ino and not o.writable]:
            self.close(o)

    def op_truncate(self) -> None:
        path = self.path()
        ino = self.local_file(path)
        size = os.lstat(self.at(0, path)).st_size if ino is not None else 0
        length = self.new_size(size)
        self.both(
            f"truncate({path!r}, {length})",
            lambda side: os.truncate(self.at(side, path), length),
        )

    def op_rename(self) -> None:
        src, dst = self.path(), self.path()
        self.close_readers(dst, keep=self.local_file(src))
        (ok, _), _ = self.both(
            f"rename({src!r}, {dst!r})",
            lambda side: os.rename(self.at(side, src), self.at(side, dst)),
        )
        for o in self.open.values() if ok else ():  # later messages name the file where it is now
            if o.path == src or o.path.startswith(src + "/"):
                o.path = dst + o.path[len(src) :]

    def op_unlink(self) -> None:
        self.unlink(self.path())

    def unlink(self, path: str) -> None:
        self.close_readers(path)
        self.both(f"unlink({path!r})", lambda side: os.unlink(self.at(side, path)))

    def op_mkdir(self) -> None:
        path = self.rng.choice(DIRS) if self.rng.random() < 0.8 else self.path()
        self.both(f"mkdir({path!r})", lambda side: os.mkdir(self.at(side, path), 0o755))

    def op_rmdir(self) -> None:
        path = self.rng.choice(DIRS) if self.rng.random() < 0.6 else self.path()
        self.rmdir(path)

    def rmdir(self, path: str) -> None:
        self.both(f"rmdir({path!r})", lambda side: os.rmdir(self.at(side, path)))

    def op_clear(self) -> None:
        """Remove a directory and all below it, one ``unlink`` or ``rmdir`` call at a time.

        Renames move names out of reach of ``PATHS`` and directories fill up; this keeps the
        namespace small enough for files to be created and found again.
        """
        path = self.rng.choice(PATHS)
        try:
            st = os.lstat(self.at(0, path))
        except OSError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode):
            return self.rmdir(path)
        self.clear(path)

    def clear(self, path: str) -> None:
        for name in sorted(os.listdir(self.at(0, path))):
            below = f"{path}/{name}"
            if stat.S_ISDIR(os.lstat(self.at(0, below)).st_mode):
                self.clear(below)
            else:
                self.unlink(below)
        self.rmdir(path)

    def op_listdir(self) -> None:
        path = self.rng.choice(("",) + DIRS + PATHS)
        self.both(f"listdir({path!r})", lambda side: sorted(os.listdir(self.at(side, path))))

    def op_stat(self) -> None:
        path = self.path()
        if self.rng.random() < 0.5:
            self.both(f"lstat({path!r})", lambda side: stat_view(os.lstat(self.at(side, path))))
        else:
            self.both(f"stat({path!r})", lambda side: stat_view(os.stat(self.at(side, path))))

    def op_symlink(self) -> None:
        path = self.path()
        target = self.rng.choice(TARGETS + (UP_TARGETS if "/" in path else ()))
        self.both(
            f"symlink({target!r}, {path!r})",
            lambda side: os.symlink(target, self.at(side, path)),
        )

    def op_readlink(self) -> None:
        path = self.path()
        self.both(f"readlink({path!r})", lambda side: os.readlink(self.at(side, path)))


def test_random_calls_agree_with_the_local_file_system(mdir, tmp_path):
    probe = os.path.join(mdir[0], "probe")
    with open(probe, "wb"):
        pass
    # the offsets and sizes are chosen for this chunk size (st_blksize is the chunk size)
    assert os.stat(probe).st_blksize == CHUNK
    os.unlink(probe)
    local = tmp_path / "local"
    local.mkdir()
    model = Model(str(local), mdir[0], SEED)
    try:
        model.run(OPS)
        model.check_trees(contents=True, when=" (descriptors open)")
        model.close_all()
        model.check_trees(contents=True, when=" (all closed)")
    finally:
        model.abandon()
    counts = ", ".join(f"{name} {n}" for name, n in sorted(model.counts.items()))
    print(f"{model.calls} calls from seed {SEED}: {counts}")
    assert model.calls >= OPS
