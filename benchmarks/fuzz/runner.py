"""The run: a cluster, its surfaces in threads under the monitor, the report."""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .check import check_state, chunk_counts, replica_snapshot
from .cluster import Env, prepare, start_cluster
from .data import DataSurface
from .grpcsurface import GrpcSurface
from .monitor import Monitor, Prober
from .report import failures, log_tracebacks, mib, slowest
from .rest import RestSurface
from .surface import Job, Surface
from .tally import Tally

SURFACE_TYPES: dict[str, type[Surface]] = {
    "data": DataSurface,
    "grpc": GrpcSurface,
    "rest": RestSurface,
}
SURFACES = tuple(SURFACE_TYPES)


def run_threads(tally: Tally, jobs: list[Job], stop: threading.Event) -> None:
    """Run ``fn(tally, rng, count, stop)`` for every ``(fn, count, rng)`` in threads."""

    def guarded(fn: Callable, count: int, rng: random.Random) -> None:
        try:
            fn(tally, rng, count, stop)
        except Exception:  # the fuzzer's own bug: reported, never taken for the server's
            tally.fuzzer_error(traceback.format_exc())

    threads = [
        threading.Thread(target=guarded, args=job, name=f"fuzz-{tally.surface}-{i}", daemon=True)
        for i, job in enumerate(jobs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_surface(
    env: Env, prober: Prober, name: str, inputs: int, seed: int, progress: float | None = None
) -> dict:
    """Run one surface under the monitor; its part of the report."""
    tally = Tally(name)
    stop = threading.Event()
    before, cpu_before = env.rss(), env.cpu()
    monitor = Monitor(env, prober, tally, stop, progress).start()
    started = time.perf_counter()
    try:
        surface = SURFACE_TYPES[name](env)
        surface.start()
        try:
            run_threads(tally, surface.jobs(inputs, seed), stop)
        finally:
            surface.finish()
        threads = surface.threads
    finally:
        seconds = time.perf_counter() - started
        monitor.finish()
    after, cpu_after = env.rss(), env.cpu()
    return {
        "inputs": tally.inputs,
        "threads": threads,
        "seconds": round(seconds, 1),
        "inputs_per_second": round(tally.inputs / seconds, 1) if seconds else 0.0,
        "guarded": tally.guarded,
        "crashes": tally.crashes,
        "hangs": tally.hangs,
        "hang_examples": tally.hang_examples,
        "server_errors": tally.errors,
        "server_error_examples": tally.error_examples,
        "statuses": dict(tally.statuses.most_common()),
        "kinds": dict(sorted(tally.kinds.items())),
        "rss_before_mib": {k: mib(v) for k, v in before.items()},
        "rss_after_mib": {k: mib(v) for k, v in after.items()},
        "rss_growth_mib": {k: mib(after[k] - before[k]) for k in before},
        "cpu_seconds": {k: round(cpu_after[k] - cpu_before[k], 1) for k in cpu_before},
        "slowest": slowest(tally),
        "fuzzer_errors": tally.fuzzer_errors,
    }


@dataclass
class Options:
    """What to run: surfaces, inputs per surface, seed and where the cluster's data goes."""

    surfaces: tuple[str, ...] = SURFACES
    inputs: int = 20_000
    seed: int = 1
    data_dir: Path | None = None
    keep: bool = False
    progress: float | None = None  # seconds between progress lines on stderr


def run(options: Options) -> dict:
    """Start a cluster, fuzz its surfaces, check its state; the report."""
    started = time.perf_counter()
    parent = options.data_dir
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="emberfs-fuzz-", dir=parent))
    cluster = start_cluster(workdir / "cluster")
    report: dict[str, Any] = {
        "seed": options.seed,
        "inputs_per_surface": options.inputs,
        "data_dir": str(workdir),
    }
    try:
        env, content = prepare(cluster, options.seed)
        replicas = replica_snapshot(env)
        prober = Prober(env)
        try:
            report["rss_start_mib"] = {k: mib(v) for k, v in env.rss().items()}
            report["chunks_start"] = chunk_counts(env)
            report["surfaces"] = {
                s: run_surface(env, prober, s, options.inputs, options.seed, options.progress)
                for s in options.surfaces
            }
        finally:
            prober.close()
        report["check"] = check_state(env, content, replicas)
        report["rss_end_mib"] = {k: mib(v) for k, v in env.rss().items()}
        report["chunks_end"] = chunk_counts(env)  # scratch chunks the inputs made
        report["log_tracebacks"] = log_tracebacks(cluster)
    finally:
        cluster.stop()
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    report["failures"] = failures(report)
    report["result"] = "failed" if report["failures"] else "ok"
    return report
