"""What a directory quota costs: creates and writes in a quota directory beside a plain one.

Run from the repository root::

    python -m benchmarks.quotas                  # 2000 files, 512 MiB written, 6 rounds
    python -m benchmarks.quotas --json run.json
    python -m benchmarks.quotas --smoke          # tiny sizes, 2 rounds (a test runs it)

One :class:`~emberfs.cli.localcluster.LocalCluster` (3 storage servers, R =
3) and one client. Each round does every phase three times: in a directory
without a quota, in one with a quota (limits far above what the round writes,
so every charge and check is made and none refuses), and in a second one
without, the control; they take turns going first, so the machine's noise
weighs on all alike:

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
and as the median (the target is >= 0.97: a quota costs at most 3%), beside
the control's ratio plain2 / plain, which a quota does not touch: how far it
strays from 1 is the machine's noise, the bound of what a run can resolve.
The metaserver's own time per item (its ``MetaService`` handlers, from its
``/metrics``) is reported for each directory too: what a quota adds to the
metaserver's work, which the noise of the client and the disks does not blur
as much. After the last round the quota's usage is checked against the bytes
and files the rounds left in it.
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

from benchmarks.meta_rate import handler_totals
from emberfs.cli.localcluster import LocalCluster
from emberfs.client.fs import EmberFileSystem

MiB = 1 << 20
PHASES = ("create", "small_files", "pipe", "write")
DIRS = ("plain", "quota", "plain2")


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


def _handler_seconds(metrics_url: str | None) -> float:
    """Seconds the metaserver has spent in its ``MetaService`` handlers so far."""
    if metrics_url is None:
        return 0.0
    return sum(seconds for seconds, _ in handler_totals(metrics_url).values())


def measure(fs: EmberFileSystem, rounds: int, files: int, write: int, metrics_url=None) -> dict:
    """Every phase in each directory, ``rounds`` times; rates, ratios and the metaserver's time."""
    for which in DIRS:
        fs.mkdir(f"/bench-{which}")
    fs.quota_set("/bench-quota", max_bytes=1 << 50, max_inodes=1 << 40)
    out: dict = {
        p: {
            **{w: [] for w in DIRS},
            "ratio": [],
            "control_ratio": [],
            "meta_us": {w: [] for w in DIRS},
        }
        for p in PHASES
    }
    for r in range(rounds):
        for phase in PHASES:
            rates = {}
            order = DIRS[r % 3 :] + DIRS[: r % 3]  # each goes first as often
            for which in order:
                d = f"/bench-{which}/r{r}-{phase}"
                fs.mkdir(d)
                handled = _handler_seconds(metrics_url)
                start = time.perf_counter()
                items, nbytes = RUNS[phase](fs, d, files, write)
                took = time.perf_counter() - start
                handled = _handler_seconds(metrics_url) - handled
                rates[which] = (nbytes / MiB if phase == "write" else items) / took
                out[phase][which].append(round(rates[which], 1))
                out[phase]["meta_us"][which].append(round(handled / items * 1e6, 1))
            out[phase]["ratio"].append(round(rates["quota"] / rates["plain"], 3))
            out[phase]["control_ratio"].append(round(rates["plain2"] / rates["plain"], 3))
            out[phase]["unit"] = "MiB_per_s" if phase == "write" else "items_per_s"
    for phase in PHASES:
        got = out[phase]
        got["median_ratio"] = statistics.median(got["ratio"])
        got["median_control_ratio"] = statistics.median(got["control_ratio"])
        if metrics_url is not None:
            plain = statistics.median(got["meta_us"]["plain"] + got["meta_us"]["plain2"])
            got["meta_us_median"] = {
                "plain": plain,
                "quota": statistics.median(got["meta_us"]["quota"]),
            }
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
                result = measure(
                    fs, args.rounds, args.files, args.write, cluster.admin_url + "/metrics"
                )
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
