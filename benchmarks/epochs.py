"""Training epochs through the client's disk cache, beside the local disk's own read speed.

Run from the repository root::

    python -m benchmarks.epochs                       # 4 GiB in 16 shards, 3 rounds
    python -m benchmarks.epochs --total 8GiB --shard 512MiB --rounds 1 --json run.json
    python -m benchmarks.epochs --smoke               # 64 MiB, one round (a test runs it)

A dataset of shard files is written once to a
:class:`~emberfs.cli.localcluster.LocalCluster` (3 storage servers, R = 3) and,
byte for byte, to a local directory on the same disk. Every round then reads
all of it four times, each time in a fresh process that reads the shards one
after another with ``readinto`` of a ``--buffer`` (4 MiB) buffer:

* **local disk**: the local copy with plain ``open``/``readinto``, the disk's
  own speed for these bytes;
* **epoch 1 without the cache** and **epoch 1 with the cache** (emptied
  first; the two take turns going first): the fill of the cache happens in the
  reader's background, and its time to write the last fills after the reads is
  reported apart (``fill_wait_s``), as are fills skipped;
* **epoch 2 from the cache**, which must read nothing from the storage
  servers: their ``emberfs_storage_read_bytes_total`` before and after;
* epoch 1 without and with the cache once more with the servers' chunk files
  in memory (**servers warm**): here the servers and the cache share one disk,
  which a cluster's clients do not, so this pair shows the cost of filling
  the cache apart from that disk's (its ratio has no target).

Each read reports its reader process's CPU time (``cpu_s``, and per GiB).

The machine has more memory than a default dataset, so a dataset larger than
memory is simulated: before every read the page cache of every copy of the
bytes (the local copy, the storage servers' chunk files, the cache's files)
is synced and evicted with ``posix_fadvise(POSIX_FADV_DONTNEED)``, and each
read reports what the machine read from its disk meanwhile (``pgpgin``), which
shows whether the eviction held. The ratios, each the median of one per round:
epoch 2 / local disk (target >= 0.9), epoch 1 with / without the cache
(target >= 0.95), and the servers' bytes read during epoch 2 (target 0).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import compare, mount  # noqa: E402
from benchmarks.figures import ratio_text, summary  # noqa: E402

GB = 1e9
MiB = 1 << 20
TARGETS = {"epoch2_vs_disk": 0.9, "epoch1_cache_vs_none": 0.95}
KINDS = ("disk", "epoch1_none", "epoch1_cache", "epoch2", "warm_none", "warm_cache")
NAMES = {
    "disk": "local disk (the same bytes)",
    "epoch1_none": "epoch 1, no cache",
    "epoch1_cache": "epoch 1, filling the cache",
    "epoch2": "epoch 2, from the cache",
    "warm_none": "epoch 1, no cache, servers warm",
    "warm_cache": "epoch 1, filling, servers warm",
}


def log(message: str) -> None:
    print(f"[epochs] {message}", file=sys.stderr, flush=True)


# the reader process ---------------------------------------------------------------------
def read_all(args) -> dict:
    """Read every path once with ``readinto``; seconds, bytes and the cache's counters."""
    buf = bytearray(args.buffer)
    total = 0
    fs = None
    if args.local:
        start = time.perf_counter()
        for p in args.paths:
            with open(p, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    total += n
        seconds = time.perf_counter() - start
    else:
        from emberfs.client.fs import EmberFileSystem

        fs = EmberFileSystem(
            args.meta,
            skip_instance_cache=True,
            cache_dir=args.cache_dir,
            cache_size=args.cache_size or None,
        )
        start = time.perf_counter()
        for p in args.paths:
            with fs.open(p, "rb") as f:
                while n := f.readinto(buf):
                    total += n
        seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = {
        "seconds": seconds,
        "bytes": total,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "cache": None,
        "fill_wait_s": 0.0,
    }
    if fs is not None and fs.client.cache is not None:
        waited = time.perf_counter()
        fs.client.cache.flush(timeout=600)
        out["fill_wait_s"] = time.perf_counter() - waited
        out["cache"] = fs.metrics()["disk_cache"]
    return out


def run_reader(paths: list[str], *, local: bool, meta: str = "", cache_dir: str = "",
               cache_size: int = 0, buffer: int = 4 * MiB) -> dict:  # fmt: skip
    """One reader process; its report, with the disk's reads while it ran."""
    import subprocess

    argv = [sys.executable, "-m", "benchmarks.epochs", "--read", "--buffer", str(buffer)]
    if local:
        argv.append("--local")
    else:
        argv += ["--meta", meta, "--cache-dir", cache_dir, "--cache-size", str(cache_size)]
    before = compare.disk_read_bytes()
    done = subprocess.run(
        argv + ["--"] + paths,
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if done.returncode != 0:
        raise RuntimeError(f"reader failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["disk_read_bytes"] = compare.disk_read_since(before)
    report["bytes_per_s"] = report["bytes"] / report["seconds"]
    return report


# the page cache --------------------------------------------------------------------------
def files_under(*roots: Path) -> list[Path]:
    out = []
    for root in roots:
        if root.exists():
            out.extend(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    return out


def evict(paths: list[Path]) -> int:
    """Write out and drop the page cache of ``paths``; the bytes they hold."""
    os.sync()
    total = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def server_read_bytes(cluster) -> float:
    """Chunk bytes every storage server has sent to readers (its ``/metrics``)."""
    total = 0.0
    for i in range(cluster.storage_servers):
        with urllib.request.urlopen(cluster.storage_metrics_url(i), timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("emberfs_storage_read_bytes_total"):
                    total += float(line.split()[-1])
    return total


# the run ---------------------------------------------------------------------------------
def write_dataset(fs, local_dir: Path, shards: int, shard: int) -> tuple[list[str], list[str]]:
    """``shards`` files of ``shard`` random bytes, in EmberFS and in ``local_dir``."""
    remote, local = [], []
    piece = 64 * MiB
    for i in range(shards):
        r, lp = f"/epochs/shard-{i:05d}.tar", local_dir / f"shard-{i:05d}.tar"
        with fs.open(r, "wb") as out, open(lp, "wb") as copy:
            left = shard
            while left:
                data = os.urandom(min(piece, left))
                out.write(data)
                copy.write(data)
                left -= len(data)
            copy.flush()
            os.fsync(copy.fileno())
        remote.append(r)
        local.append(str(lp))
    return remote, local


def one_round(n: int, cluster, remote, local, cache_dir: Path, roots, args) -> dict:
    """The reads of one round, each after the page cache of every copy was evicted.

    The two ``warm_*`` reads are epoch 1 again with the servers' chunk files
    in memory (only the local copy and the cache's files evicted): as when the
    servers' disks are not this machine's, which is what the first epoch's
    cost of filling the cache is measured against apart from the one disk
    that the servers and the cache share here.
    """
    from emberfs.client.diskcache import DiskCache

    out: dict = {}
    servers = files_under(cluster.data_dir)

    def measure(kind: str, **kw) -> None:
        warm = kind.startswith("warm")
        evicted = evict(files_under(*roots[:1], *roots[2:]) if warm else files_under(*roots))
        if warm:
            compare.warm_files(servers)
        before = server_read_bytes(cluster)
        paths = local if kind == "disk" else remote
        rep = run_reader(paths, buffer=args.buffer, **kw)
        rep["server_read_bytes"] = server_read_bytes(cluster) - before
        rep["evicted_bytes"] = evicted
        out[kind] = rep
        disk = rep["disk_read_bytes"]
        log(
            f"round {n}: {NAMES[kind]}: {rep['bytes_per_s'] / GB:.3f} GB/s, "
            f"from disk {'?' if disk is None else f'{disk / MiB:.0f} MiB'}, "
            f"reader CPU {rep['cpu_s']:.2f} s, "
            f"servers sent {rep['server_read_bytes'] / MiB:.0f} MiB"
        )

    meta = cluster.meta_address
    cached = {"meta": meta, "cache_dir": str(cache_dir), "cache_size": args.cache_size}

    def epoch_one(kind: str) -> None:
        if kind.endswith("none"):
            measure(kind, local=False, meta=meta, cache_dir="")
            return
        if DiskCache.found(str(cache_dir)):
            DiskCache(str(cache_dir), None).clear()
        measure(kind, local=False, **cached)

    measure("disk", local=True)
    for pair in (("warm_none", "warm_cache"), ("epoch1_none", "epoch1_cache")):
        for kind in pair if n % 2 == 0 else pair[::-1]:  # the two take turns going first
            epoch_one(kind)
    measure("epoch2", local=False, **cached)
    return out


def ratios(rounds: list[dict]) -> dict:
    return {
        "epoch2_vs_disk": summary(
            [r["epoch2"]["bytes_per_s"] / r["disk"]["bytes_per_s"] for r in rounds]
        ),
        "epoch1_cache_vs_none": summary(
            [r["epoch1_cache"]["bytes_per_s"] / r["epoch1_none"]["bytes_per_s"] for r in rounds]
        ),
        "warm_cache_vs_none": summary(
            [r["warm_cache"]["bytes_per_s"] / r["warm_none"]["bytes_per_s"] for r in rounds]
        ),
    }


def print_report(doc: dict) -> None:
    print(f"\n{doc['command']}")
    d = doc["dataset"]
    print(
        f"dataset: {d['shards']} shards of {d['shard_bytes'] / MiB:.0f} MiB "
        f"({d['bytes'] / (1 << 30):.2f} GiB); the page cache of every copy evicted before "
        f"each read; {doc['rounds_run']} rounds"
    )
    print(
        f"{'':32} {'GB/s (median, range)':>22} {'from disk':>10} {'servers sent':>13} "
        f"{'reader CPU s/GiB':>17}"
    )
    for kind in KINDS:
        s = doc["throughput"][kind]
        rng = f"({s['min'] / GB:.2f}-{s['max'] / GB:.2f})" if s["rounds"] > 1 else ""
        disk = doc["disk_read_bytes"][kind]
        sent = doc["server_read_bytes"][kind]
        print(
            f"{NAMES[kind]:32} {s['median'] / GB:>10.3f} {rng:>11} "
            f"{'?' if disk is None else f'{disk / MiB:.0f} MiB':>10} {sent / MiB:>9.0f} MiB "
            f"{doc['cpu_s_per_gib'][kind]:>17.2f}"
        )
    f = doc["fills"]
    print(
        f"fills in epoch 1: {f['fills']} chunks, {f['fill_bytes'] / MiB:.0f} MiB, "
        f"{f['fill_skips']} skipped, {f['fill_errors']} failed; "
        f"the last written {f['fill_wait_s']:.2f} s after the reads"
    )
    for key, what in (
        ("epoch2_vs_disk", "epoch 2 / local disk"),
        ("epoch1_cache_vs_none", "epoch 1 with / without the cache"),
    ):
        t = doc["targets"][key]
        met = "met" if t["met"] else "NOT met"
        print(f"{what:40} {ratio_text(t['ratio']):>18}  target >= {t['target']}  {met}")
    print(
        f"{'(epoch 1 with / without, servers warm)':40} "
        f"{ratio_text(doc['ratios']['warm_cache_vs_none']):>18}  no target"
    )
    t = doc["targets"]["epoch2_server_reads"]
    print(
        f"{'storage server bytes read in epoch 2':40} {t['bytes']:>17.0f}   target 0  "
        f"{'met' if t['met'] else 'NOT met'}"
    )


def main(argv: list[str] | None = None) -> int:
    from emberfs.common.units import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--total", type=parse_size, default=4 << 30, help="dataset bytes (4GiB)")
    p.add_argument("--shard", type=parse_size, default=256 * MiB, help="shard bytes (256MiB)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of four reads (default 3)")
    p.add_argument("--buffer", type=parse_size, default=4 * MiB, help="readinto buffer (4MiB)")
    p.add_argument("--cache-size", type=parse_size, default=0, help="default: 2 x the dataset")
    p.add_argument("--smoke", action="store_true", help="64 MiB in 4 shards, one round")
    p.add_argument("--json", metavar="PATH", help="write every figure here")
    p.add_argument("--workdir", default=None, help="where the cluster, copy and cache live")
    p.add_argument("--read", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--local", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--meta", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.read:
        print(json.dumps(read_all(args)))
        return 0
    if args.smoke:
        args.total, args.shard, args.rounds = 64 * MiB, 16 * MiB, 1
    if args.rounds < 1 or args.shard < 1 or args.total < args.shard:
        p.error("--rounds and --shard must be positive, --total at least one shard")
    shards = args.total // args.shard
    total = shards * args.shard
    args.cache_size = args.cache_size or 2 * total

    def on_sigterm(signum, frame):
        raise SystemExit(143)  # unwinds through the finally blocks that stop the servers

    signal.signal(signal.SIGTERM, on_sigterm)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="emberfs-epochs-", dir=args.workdir))
    compare.check_disk(workdir, 3 * total + total + args.cache_size // 2 + 512 * MiB)
    doc: dict = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": mount.machine(),
        "command": " ".join(
            ["python -m benchmarks.epochs", *(argv if argv is not None else sys.argv[1:])]
        ),
        "dataset": {"shards": shards, "shard_bytes": args.shard, "bytes": total},
    }
    cluster = None
    try:
        from emberfs.client.fs import EmberFileSystem

        cluster = mount.start_cluster(workdir)
        local_dir = workdir / "local"
        local_dir.mkdir()
        cache_dir = workdir / "cache"
        fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True, cache_dir="")
        log(f"writing {shards} shards of {args.shard / MiB:.0f} MiB to EmberFS and to {local_dir}")
        remote, local = write_dataset(fs, local_dir, shards, args.shard)
        fs.close()
        roots = (local_dir, cluster.data_dir, cache_dir)
        rounds = [
            one_round(n, cluster, remote, local, cache_dir, roots, args) for n in range(args.rounds)
        ]
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    doc["rounds_run"] = len(rounds)
    doc["throughput"] = {k: summary([r[k]["bytes_per_s"] for r in rounds]) for k in KINDS}
    doc["disk_read_bytes"] = {
        k: None if any(r[k]["disk_read_bytes"] is None for r in rounds)
        else sorted(r[k]["disk_read_bytes"] for r in rounds)[len(rounds) // 2]
        for k in KINDS
    }  # fmt: skip
    doc["server_read_bytes"] = {k: max(r[k]["server_read_bytes"] for r in rounds) for k in KINDS}
    fills = [r["epoch1_cache"]["cache"] for r in rounds]
    doc["fills"] = {
        name: max(f[name] for f in fills)
        for name in ("fills", "fill_bytes", "fill_skips", "fill_errors")
    }
    doc["fills"]["fill_wait_s"] = max(r["epoch1_cache"]["fill_wait_s"] for r in rounds)
    doc["epoch2_cache"] = [r["epoch2"]["cache"] for r in rounds]
    found = ratios(rounds)
    doc["ratios"] = found
    doc["cpu_s_per_gib"] = {
        k: statistics.median(r[k]["cpu_s"] / (r[k]["bytes"] / (1 << 30)) for r in rounds)
        for k in KINDS
    }
    doc["targets"] = {
        key: {"target": target, "ratio": found[key], "met": found[key]["median"] >= target}
        for key, target in TARGETS.items()
    }
    sent = doc["server_read_bytes"]["epoch2"]
    doc["targets"]["epoch2_server_reads"] = {"bytes": sent, "met": sent == 0}
    doc["rounds"] = rounds
    print_report(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
        print(f"\nresults: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
