"""What integrity costs: the scrubber's speed and its toll on reads, and fsck at scale.

::

    python -m benchmarks.integrity scrub-speed [--chunks 256] [--chunk-size 4MiB]
    python -m benchmarks.integrity scrub-cost [--size 1GiB] [--rounds 3]
    python -m benchmarks.integrity fsck-scale [--files 100000] [--data-files 10000]

* ``scrub-speed``: one target's committed chunks verified by a scrub pass at no
  rate limit, against a plain pass that reads the same chunk files and computes
  one CRC32C over each (GB/s, page cache dropped before each pass where allowed).
* ``scrub-cost``: a local cluster whose scrubbers run pass after pass at their
  rate (default 32 MB/s); whole-file reads of a ``--size`` file (each in a
  fresh process, :mod:`benchmarks.reader`) in rounds that alternate scrubbing
  running and paused (``POST /api/v1/scrub/pause|start``); the ratio of the
  medians.
* ``fsck-scale``: a local cluster with ``--files`` files in directories of
  1,000 (``--data-files`` of them holding ``--data-size`` bytes, the rest
  empty); ``fsck`` through the admin API, timed, with the metaserver's resident
  memory sampled every 20 ms (peak minus the level before the check).

Each prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from emberfs.cli.bench import parse_size

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
GB = 1e9
TOKEN = "integrity-bench"


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# ------------------------------------------------------------------ scrub speed


def scrub_speed(args) -> dict:
    import crc32c

    from emberfs.storageserver.chunkfiles import pread_all
    from emberfs.storageserver.chunkstore import ChunkStore
    from emberfs.storageserver.scrub import Scrubber

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        store = ChunkStore(Path(tmp) / "t", direct_io=False)
        try:
            block = os.urandom(args.chunk_size)
            for i in range(args.chunks):
                store.install(1, i, 1, block[i % 7 :] + block[: i % 7])
            total = args.chunks * args.chunk_size
            cold = drop_caches()
            t0 = time.perf_counter()
            stats = Scrubber(lambda: {1: store}, 1e15, lambda t, m: None, threading.Event())
            passed = stats.scrub_pass()
            scrub_s = time.perf_counter() - t0
            assert passed.bytes == total and passed.damaged == 0
            drop_caches()
            t0 = time.perf_counter()
            for i in range(args.chunks):
                with store.committed_file(1, i) as (fd, meta):
                    crc32c.crc32c(pread_all(fd, 0, meta.length))
            plain_s = time.perf_counter() - t0
        finally:
            store.close()
    return {
        "bytes": total,
        "chunk_size": args.chunk_size,
        "cold": cold,
        "scrub_gb_s": round(total / scrub_s / GB, 3),
        "plain_crc32c_gb_s": round(total / plain_s / GB, 3),
        "scrub_to_plain": round(plain_s / scrub_s, 3),
    }


# ------------------------------------------------------------------ clusters


def start_cluster(data_dir: Path, storage_args: list[str]):
    from emberfs.cli.localcluster import LocalCluster

    c = LocalCluster(
        data_dir,
        heartbeat_timeout=5.0,
        extra_storage_args=storage_args,
        env={"EMBERFS_ADMIN_TOKEN": TOKEN},
    )
    c.start(timeout=120)
    return c


def post(url: str) -> None:
    req = urllib.request.Request(url, method="POST", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def scrub_cost(args) -> dict:
    sys.path.insert(0, str(HERE.parent))
    from emberfs.client.fs import EmberFileSystem

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rate = str(args.rate)
        c = start_cluster(
            Path(tmp),
            ["--scrub-rate", rate, "--scrub-interval", "1", "--scrub-delay", "0"],
        )
        try:
            fs = EmberFileSystem(c.meta_address, token=c.admin_token, skip_instance_cache=True)
            block = os.urandom(64 * MiB)
            with fs.open("/cost.bin", "wb") as f:
                for _ in range(args.size // len(block)):
                    f.write(block)
            fs.close()
            rates: dict[str, list[float]] = {"running": [], "paused": []}
            for r in range(args.rounds):
                for state in ("paused", "running") if r % 2 else ("running", "paused"):
                    post(
                        c.admin_url
                        + ("/api/v1/scrub/pause" if state == "paused" else "/api/v1/scrub/start")
                    )
                    time.sleep(3)  # every server heard it with a heartbeat answer
                    out = subprocess.run(
                        [
                            sys.executable,
                            str(HERE / "reader.py"),
                            "--meta",
                            c.meta_address,
                            "--path",
                            "/cost.bin",
                            "--mode",
                            "read",
                        ],
                        capture_output=True,
                        text=True,
                        timeout=900,
                        cwd=HERE.parent,
                    )
                    if out.returncode:
                        raise RuntimeError(out.stderr[-2000:])
                    report = json.loads(out.stdout.strip().splitlines()[-1])
                    rates[state].append(report["bytes"] / report["seconds"])
            with urllib.request.urlopen(c.admin_url + "/api/v1/scrub", timeout=10) as resp:
                shown = json.load(resp)
        finally:
            c.stop()
    running, paused = statistics.median(rates["running"]), statistics.median(rates["paused"])
    return {
        "size": args.size,
        "scrub_rate_mb_s": args.rate,
        "rounds": args.rounds,
        "read_gb_s_running": [round(x / GB, 3) for x in rates["running"]],
        "read_gb_s_paused": [round(x / GB, 3) for x in rates["paused"]],
        "ratio_running_to_paused": round(running / paused, 3),
        "scrub_passes": sum(t["passes"] for t in shown["targets"]),
    }


def fsck_scale(args) -> dict:
    from emberfs.client.fs import EmberFileSystem

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        c = start_cluster(Path(tmp), ["--scrub-rate", "0"])
        try:
            fs = EmberFileSystem(c.meta_address, token=c.admin_token, skip_instance_cache=True)
            data = os.urandom(args.data_size)
            t0 = time.perf_counter()
            for start in range(0, args.files, 1000):
                fs.pipe(
                    {
                        f"/scale/d{start // 1000:04d}/f{i:07d}": (
                            data if i < args.data_files else b""
                        )
                        for i in range(start, min(start + 1000, args.files))
                    }
                )
            create_s = time.perf_counter() - t0
            fs.close()
            pid = c.meta.proc.pid
            time.sleep(2)
            base = rss(pid)
            peak = [base]
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.02):
                    peak[0] = max(peak[0], rss(pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            t0 = time.perf_counter()
            lines = []
            url = c.admin_url + "/api/v1/fsck" + ("?deep=true" if args.deep else "")
            with urllib.request.urlopen(url, timeout=3600) as resp:
                for line in resp:
                    lines.append(json.loads(line))
            fsck_s = time.perf_counter() - t0
            done.set()
            sampler.join()
        finally:
            c.stop()
    summary = lines[-1].get("summary") or lines[-1]
    return {
        "files": args.files,
        "data_files": args.data_files,
        "data_size": args.data_size,
        "deep": args.deep,
        "create_s": round(create_s, 1),
        "fsck_s": round(fsck_s, 2),
        "metaserver_rss_before_mib": round(base / MiB, 1),
        "metaserver_rss_peak_mib": round(peak[0] / MiB, 1),
        "metaserver_rss_added_mib": round((peak[0] - base) / MiB, 1),
        "summary": summary,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.integrity", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--dir", default=None, help="where the temporary data goes (default: the system's)"
    )
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("scrub-speed")
    s.add_argument("--chunks", type=int, default=256)
    s.add_argument("--chunk-size", type=parse_size, default=4 * MiB)
    s = sub.add_parser("scrub-cost")
    s.add_argument("--size", type=parse_size, default=1 << 30)
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--rate", type=float, default=32.0, help="scrub MB/s per server")
    s = sub.add_parser("fsck-scale")
    s.add_argument("--files", type=int, default=100_000)
    s.add_argument("--data-files", type=int, default=10_000)
    s.add_argument("--data-size", type=parse_size, default=4096)
    s.add_argument("--deep", action="store_true")
    args = p.parse_args(argv)
    run = {"scrub-speed": scrub_speed, "scrub-cost": scrub_cost, "fsck-scale": fsck_scale}
    print(json.dumps(run[args.what](args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
