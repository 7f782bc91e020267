"""What a directory quota costs: creates and writes in a quota directory beside a plain one.

Run from the repository root::

    python -m benchmarks.quotas                  # 2000 files, 512 MiB written, 6 rounds
    python -m benchmarks.quotas --json run.json
    python -m benchmarks.quotas --smoke          # tiny sizes, 2 rounds (a test runs it)

One :class:`~emberfs.cli.localcluster.LocalCluster` (3 storage servers, R =
3) and one client. Each round does every phase twice, in a directory without
a quota and in one with a quota (limits far above what the round writes, so
every charge and check is made and none refuses); the two take turns going
first, so the machine's noise weighs on both alike:

* **create**: ``touch`` of ``--files`` empty files, one after another (each a
  ``Create``: a transaction that charges an inode);
* **small files**: ``open``/``write``/``close`` of ``--files`` files of 4 KiB
  (each an ``Open`` with a reservation, a chunk write, a ``Close`` that settles
  the charge);
* **pipe**: the same files in one ``pipe`` call (``BatchWriteOpen`` with their
  lengths reserved, the chunks, ``BatchClose``);
* **write**: one file of ``--write`` bytes in 4 MiB ``write`` calls (the
  writer reserves ahead of its writes as the file grows).

For each phase the ratio quota / plain of the rates is reported per round
and as the median (the target is >= 0.97: a quota costs at most 3%). After
the last round the quota's usage is checked against the bytes and files the
rounds left in it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from emberfs.cli.localcluster import LocalCluster
from emberfs.client.fs import EmberFileSystem

MiB = 1 << 20
PHASES = ("create", "small_files", "pipe", "write")


def _create(fs: EmberFileSystem, d: str, n: int, _size: int) -> tuple[int, int]:
    for i in range(n):
        fs.touch(f"{d}/c{i}")
    return n, 0


def _small(fs: EmberFileSystem, d: str, n: int, _size: int) -> tuple[int, int]:
    data = os.urandom(4096)
    for i in range(n):
        with fs.open(f"{d}/s{i}", "wb") as f:
            f.write(data)
    return n, n * len(data)


def _pipe(fs: EmberFileSystem, d: str, n: int, _size: int) -> tuple[int, int]:
    data = os.urandom(4096)
    fs.pipe({f"{d}/p{i}": data for i in range(n)})
    return n, n * len(data)


def _write(fs: EmberFileSystem, d: str, _n: int, size: int) -> tuple[int, int]:
    block = os.urandom(4 * MiB)
    with fs.open(f"{d}/big", "wb") as f:
        left = size
        while left > 0:
            left -= f.write(block[: min(left, len(block))])
    return 1, size


RUNS = {"create": _create, "small_files": _small, "pipe": _pipe, "write": _write}


def measure(fs: EmberFileSystem, rounds: int, files: int, write: int) -> dict:
    """Every phase in both directories, ``rounds`` times; rates and ratios."""
    fs.mkdir("/bench-plain")
    fs.mkdir("/bench-quota")
    fs.quota_set("/bench-quota", max_bytes=1 << 50, max_inodes=1 << 40)
    out: dict = {p: {"plain": [], "quota": [], "ratio": []} for p in PHASES}
    for r in range(rounds):
        for phase in PHASES:
            unit = "items_per_s" if phase != "write" else "MiB_per_s"
            rates = {}
            order = ("plain", "quota") if r % 2 == 0 else ("quota", "plain")
            for which in order:
                d = f"/bench-{which}/r{r}-{phase}"
                fs.mkdir(d)
                start = time.perf_counter()
                items, nbytes = RUNS[phase](fs, d, files, write)
                took = time.perf_counter() - start
                rates[which] = (nbytes / MiB if phase == "write" else items) / took
                out[phase][which].append(round(rates[which], 1))
            out[phase]["ratio"].append(round(rates["quota"] / rates["plain"], 3))
            out[phase]["unit"] = unit
    for phase in PHASES:
        out[phase]["median_ratio"] = statistics.median(out[phase]["ratio"])
    q = fs.quota_get("/bench-quota")
    expect_inodes = rounds * (len(PHASES) + 3 * files + 1)
    expect_bytes = rounds * (2 * files * 4096 + write)
    out["quota_usage"] = {
        "used_bytes": q["used_bytes"],
        "used_inodes": q["used_inodes"],
        "expected_bytes": expect_bytes,
        "expected_inodes": expect_inodes,
        "exact": (q["used_bytes"], q["used_inodes"]) == (expect_bytes, expect_inodes),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--write", type=int, default=512 * MiB, help="bytes of the write phase")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 rounds")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    if args.smoke:
        args.files, args.write, args.rounds = 50, 8 * MiB, 2
    with tempfile.TemporaryDirectory(prefix="emberfs-quota-bench-") as tmp:
        cluster = LocalCluster(Path(tmp))
        cluster.start(timeout=120)
        try:
            fs = EmberFileSystem(
                cluster.meta_address, token=cluster.admin_token, skip_instance_cache=True
            )
            try:
                result = measure(fs, args.rounds, args.files, args.write)
            finally:
                fs.close()
        finally:
            cluster.stop()
    result["setup"] = {"files": args.files, "write_bytes": args.write, "rounds": args.rounds}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if result["quota_usage"]["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
