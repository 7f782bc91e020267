"""``emberfs bench``: the built-in benchmark, in the spirit of ``juicefs bench``.

Against a running cluster (``--meta HOST:PORT`` or ``EMBERFS_META``) or a
temporary local one (``--local``: a :class:`~emberfs.cli.localcluster.LocalCluster`
in a temporary directory, stopped at the end), it runs seven phases in a
directory of its own:

1. write big files (``--big-files`` per thread, ``--big-file-size`` each),
   one operation per ``--block-size`` written;
2. read them back sequentially (one operation per block read);
3. write small files (``--small-files`` per thread, ``--small-file-size`` each),
   one ``pipe_file`` each;
4. write as many other small files with one ``pipe`` of a dict per thread (one
   metaserver call opens them all and one closes them, and their chunks are
   written together); its latency is that of the whole call;
5. read the small files of phase 3 whole, one ``cat_file`` each;
6. read them again with one ``cat`` of each thread's list (one metaserver call
   opens them all, and their chunks are fetched in parallel); its latency is
   that of the whole call;
7. stat the small files of phase 3.

Every phase runs ``--threads`` threads. Progress shows while it runs (rich
when installed, plain lines otherwise), then a table of throughput and
per-operation latency (avg / p50 / p99); ``--json`` prints the results as one
JSON document instead. The benchmark directory is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from emberfs.common.units import parse_size


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass
class PhaseResult:
    """What one phase measured.

    Attributes
    ----------
    name : str
    ops : int
        Operations timed (blocks for big files, files for small ones, stat calls).
    bytes : int
        Bytes moved (0 for stat).
    seconds : float
        Wall time of the phase.
    latencies : list of float
        Seconds of each timed call: one per operation, except in the batch
        phase, where one call reads a thread's whole list of files.
    """

    name: str
    ops: int = 0
    bytes: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        """The phase as plain numbers (MiB/s, ops/s, latency in ms)."""
        lat = sorted(self.latencies)

        def pct(p: float) -> float:
            if not lat:
                return 0.0
            return lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))] * 1000

        secs = max(self.seconds, 1e-9)
        return {
            "name": self.name,
            "ops": self.ops,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
            "mib_per_s": round(self.bytes / secs / (1 << 20), 3),
            "ops_per_s": round(self.ops / secs, 3),
            "latency_ms": {
                "avg": round(statistics.fmean(lat) * 1000, 4) if lat else 0.0,
                "p50": round(pct(50), 4),
                "p99": round(pct(99), 4),
            },
        }


class _Progress:
    """A progress bar per phase: rich when available and wanted, else plain lines."""

    def __init__(self, enabled: bool, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._rich = None
        self._lock = threading.Lock()
        if enabled:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                )

                self._rich = Progress(
                    TextColumn("{task.description:<18}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=Console(file=self.stream),
                    transient=False,
                )
            except ImportError:
                self._rich = None
        self._task = None
        self._total = 0
        self._done = 0
        self._name = ""
        self._next_line = 0.0

    def __enter__(self) -> _Progress:
        if self._rich is not None:
            self._rich.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._rich is not None:
            self._rich.stop()

    def phase(self, name: str, total: int) -> None:
        self._name, self._total, self._done = name, total, 0
        if self._rich is not None:
            self._task = self._rich.add_task(name, total=total)
        elif self.enabled:
            print(f"{name}: 0/{total}", file=self.stream, flush=True)
            self._next_line = time.monotonic() + 1.0

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self._done += n
            done = self._done
        if self._rich is not None:
            self._rich.update(self._task, advance=n)
        elif self.enabled and (time.monotonic() >= self._next_line or done == self._total):
            self._next_line = time.monotonic() + 1.0
            print(f"{self._name}: {done}/{self._total}", file=self.stream, flush=True)


@dataclass
class BenchConfig:
    """The benchmark's parameters (see ``emberfs bench --help``)."""

    directory: str = "/__emberfs_bench__"
    big_file_size: int = 1 << 30
    big_files: int = 1
    block_size: int = 1 << 20
    small_file_size: int = 128 << 10
    small_files: int = 100
    threads: int = 1


def _run_threads(threads: int, work: Callable[[int], None]) -> float:
    """Run ``work(i)`` for each thread index; seconds of wall time."""
    started = time.perf_counter()
    if threads == 1:
        work(0)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="emberfs-bench") as pool:
            for fut in [pool.submit(work, i) for i in range(threads)]:
                fut.result()
    return time.perf_counter() - started


def run_bench(fs, cfg: BenchConfig, progress: _Progress, keep: bool = False) -> list[PhaseResult]:
    """Run the seven phases against ``fs`` (an EmberFileSystem); returns their results.

    Files go under ``cfg.directory``/<a unique name>, removed at the end
    unless ``keep``.
    """
    root = f"{cfg.directory.rstrip('/')}/run-{uuid.uuid4().hex[:12]}"
    fs.makedirs(root, exist_ok=True)
    block = os.urandom(cfg.block_size) if cfg.block_size else b""
    small = os.urandom(cfg.small_file_size)
    big_paths = [[f"{root}/big-{t}-{k}" for k in range(cfg.big_files)] for t in range(cfg.threads)]
    small_paths = [
        [f"{root}/small-{t}-{k}" for k in range(cfg.small_files)] for t in range(cfg.threads)
    ]
    piped_paths = [
        [f"{root}/piped-{t}-{k}" for k in range(cfg.small_files)] for t in range(cfg.threads)
    ]
    blocks_per_file = -(-cfg.big_file_size // cfg.block_size) if cfg.block_size else 0
    results: list[PhaseResult] = []
    lock = threading.Lock()

    def record(res: PhaseResult, seconds: float, nbytes: int, ops: int = 1) -> None:
        with lock:
            res.latencies.append(seconds)
            res.ops += ops
            res.bytes += nbytes
        progress.advance(ops)

    try:
        if cfg.big_files and cfg.big_file_size:
            res = PhaseResult("write big files")
            progress.phase(res.name, cfg.threads * cfg.big_files * blocks_per_file)

            def write_big(t: int) -> None:
                for path in big_paths[t]:
                    with fs.open(path, "wb") as f:
                        left = cfg.big_file_size
                        while left:
                            piece = block if left >= len(block) else block[:left]
                            started = time.perf_counter()
                            f.write(piece)
                            record(res, time.perf_counter() - started, len(piece))
                            left -= len(piece)

            res.seconds = _run_threads(cfg.threads, write_big)
            results.append(res)

            res = PhaseResult("read big files")
            progress.phase(res.name, cfg.threads * cfg.big_files * blocks_per_file)

            def read_big(t: int) -> None:
                buf = bytearray(cfg.block_size)
                for path in big_paths[t]:
                    with fs.open(path, "rb") as f:
                        while True:
                            started = time.perf_counter()
                            n = f.readinto(buf)
                            if not n:
                                break
                            record(res, time.perf_counter() - started, n)

            res.seconds = _run_threads(cfg.threads, read_big)
            results.append(res)

        if cfg.small_files:
            res = PhaseResult("write small files")
            progress.phase(res.name, cfg.threads * cfg.small_files)

            def write_small(t: int) -> None:
                for path in small_paths[t]:
                    started = time.perf_counter()
                    fs.pipe_file(path, small)
                    record(res, time.perf_counter() - started, len(small))

            res.seconds = _run_threads(cfg.threads, write_small)
            results.append(res)

            res = PhaseResult("pipe small files (one call)")
            progress.phase(res.name, cfg.threads * cfg.small_files)

            def pipe_small(t: int) -> None:
                started = time.perf_counter()
                fs.pipe(dict.fromkeys(piped_paths[t], small))
                seconds = time.perf_counter() - started
                n = len(piped_paths[t])
                record(res, seconds, n * len(small), ops=n)

            res.seconds = _run_threads(cfg.threads, pipe_small)
            results.append(res)

            res = PhaseResult("read small files")
            progress.phase(res.name, cfg.threads * cfg.small_files)

            def read_small(t: int) -> None:
                for path in small_paths[t]:
                    started = time.perf_counter()
                    data = fs.cat_file(path)
                    record(res, time.perf_counter() - started, len(data))

            res.seconds = _run_threads(cfg.threads, read_small)
            results.append(res)

            res = PhaseResult("cat small files (one call)")
            progress.phase(res.name, cfg.threads * cfg.small_files)

            def cat_small(t: int) -> None:
                started = time.perf_counter()
                got = fs.cat(small_paths[t])
                seconds = time.perf_counter() - started
                record(res, seconds, sum(len(v) for v in got.values()), ops=len(got))

            res.seconds = _run_threads(cfg.threads, cat_small)
            results.append(res)

            res = PhaseResult("stat files")
            progress.phase(res.name, cfg.threads * cfg.small_files)

            def stat_small(t: int) -> None:
                for path in small_paths[t]:
                    started = time.perf_counter()
                    fs.info(path)
                    record(res, time.perf_counter() - started, 0)

            res.seconds = _run_threads(cfg.threads, stat_small)
            results.append(res)
    finally:
        if not keep:
            fs.rm(root, recursive=True, skip_trash=True)  # its own files: not for the trash
    return results


def render_table(results: list[dict], stream) -> None:
    """The results as a table (rich when available)."""
    headers = ["phase", "throughput", "ops/s", "avg ms", "p50 ms", "p99 ms", "ops", "seconds"]
    rows = []
    for r in results:
        lat = r["latency_ms"]
        thr = f"{r['mib_per_s']:.1f} MiB/s" if r["bytes"] else "-"
        rows.append(
            [
                r["name"],
                thr,
                f"{r['ops_per_s']:.1f}",
                f"{lat['avg']:.3f}",
                f"{lat['p50']:.3f}",
                f"{lat['p99']:.3f}",
                str(r["ops"]),
                f"{r['seconds']:.2f}",
            ]
        )
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
        print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)), file=stream)
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)), file=stream)
        return
    table = Table(title="emberfs bench")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(file=stream, width=None if stream.isatty() else 120).print(table)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="emberfs bench",
        description="Sequential read/write throughput and small-file/metadata rates of a cluster.",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--meta", help="metaserver HOST:PORT (default: $EMBERFS_META or 127.0.0.1:9400)"
    )
    where.add_argument(
        "--local",
        action="store_true",
        help="start a temporary local cluster (3 storage servers, R=3) and stop it at the end",
    )
    p.add_argument("--dir", default="/__emberfs_bench__", help="benchmark directory in EmberFS")
    p.add_argument("--big-file-size", type=parse_size, default=parse_size("1GiB"))
    p.add_argument("--big-files", type=int, default=1, help="big files per thread (default 1)")
    p.add_argument(
        "--block-size", type=parse_size, default=parse_size("1MiB"), help="I/O unit of big files"
    )
    p.add_argument("--small-file-size", type=parse_size, default=parse_size("128KiB"))
    p.add_argument("--small-files", type=int, default=100, help="small files per thread")
    p.add_argument("--threads", "-p", type=int, default=1, help="concurrent threads (default 1)")
    p.add_argument("--storage-servers", type=int, default=3, help="with --local (default 3)")
    p.add_argument("--replicas", type=int, default=3, help="with --local (default 3)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--keep", action="store_true", help="keep the benchmark files")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``emberfs bench``; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.threads < 1 or args.big_files < 0 or args.small_files < 0:
        print("emberfs bench: --threads must be >= 1, file counts >= 0", file=sys.stderr)
        return 2
    if args.big_files and args.big_file_size and args.block_size <= 0:
        print("emberfs bench: --block-size must be positive", file=sys.stderr)
        return 2
    cfg = BenchConfig(
        directory=args.dir,
        big_file_size=args.big_file_size,
        big_files=args.big_files,
        block_size=args.block_size,
        small_file_size=args.small_file_size,
        small_files=args.small_files,
        threads=args.threads,
    )
    cluster = None
    tmp = None
    from emberfs.client.fs import EmberFileSystem

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if args.local:
            from emberfs.cli.localcluster import LocalCluster

            tmp = tempfile.TemporaryDirectory(prefix="emberfs-bench-")
            cluster = LocalCluster(
                Path(tmp.name),
                storage_servers=args.storage_servers,
                replicas=args.replicas,
            )
            if not args.no_progress:
                print("starting a local cluster...", file=sys.stderr, flush=True)
            cluster.start()
            meta = cluster.meta_address
            token = cluster.admin_token
        else:
            meta = args.meta or None
            token = None
        fs = EmberFileSystem(meta=meta, token=token, skip_instance_cache=True, retry_timeout=10.0)
        try:
            fs.statfs()  # reaches the metaserver, or fails fast
        except OSError as exc:
            print(f"emberfs bench: cannot reach the metaserver {fs.meta}: {exc}", file=sys.stderr)
            return 3
        try:
            with _Progress(not args.no_progress) as progress:
                results = run_bench(fs, cfg, progress, keep=args.keep)
        finally:
            fs.close()
        summaries = [r.summary() for r in results]
        if args.json:
            doc = {
                "meta": fs.meta,
                "local": bool(args.local),
                "config": {
                    "big_file_size": cfg.big_file_size,
                    "big_files": cfg.big_files,
                    "block_size": cfg.block_size,
                    "small_file_size": cfg.small_file_size,
                    "small_files": cfg.small_files,
                    "threads": cfg.threads,
                    "replicas": args.replicas if args.local else None,
                },
                "results": summaries,
            }
            print(json.dumps(doc, indent=2))
        else:
            render_table(summaries, sys.stdout)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if cluster is not None:
            cluster.stop()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
