"""``emberfs cache stats|clear`` and ``emberfs warmup``: a client's local disk cache.

The cache directory is ``--cache-dir``, else ``EMBERFS_CACHE_DIR``, else the
client config file's ``cache_dir`` (:mod:`emberfs.client.config`).

* ``emberfs cache stats [--json]``: what the cache holds and what every
  process that used it counted (hits, misses, bytes, fills, evictions, errors).
* ``emberfs cache clear``: remove every entry and zero the counters.
* ``emberfs warmup PATH...``: read the files (directories: every file under
  them) into the cache ahead of a job; chunks cached already are skipped.

Exit codes as the file commands: 0 done, 1 an error (a path, the cache
directory), 2 wrong usage or no cache named, 3 the cluster could not be reached.
"""

from __future__ import annotations

import argparse
import json
import sys

from emberfs.cli.files import EXIT_USAGE, command_parser, filesystem, run_command
from emberfs.client import config
from emberfs.common.units import format_size, parse_size

NO_CACHE = (
    "no disk cache named: give --cache-dir, set EMBERFS_CACHE_DIR, "
    "or cache_dir in the client config file"
)


def _cache_dir(args) -> str | None:
    directory, _ = config.cache_settings(args.cache_dir, None)
    if not directory:
        print(f"emberfs {args.command}: {NO_CACHE}", file=sys.stderr)
        return None
    return directory


def _stats_lines(s: dict) -> list[str]:
    hits, misses = s["hits"], s["misses"]
    ratio = f" ({100 * hits / (hits + misses):.1f} % of reads)" if hits + misses else ""
    limit = format_size(s["limit"]) if s["limit"] else "not set"
    return [
        f"directory    {s['directory']}",
        f"in use       {format_size(s['used'])} in {s['entries']} chunks (limit {limit})",
        f"hits         {hits}{ratio}, {format_size(s['hit_bytes'])} read from the cache",
        f"misses       {misses}, {format_size(s['miss_bytes'])} read from the cluster",
        f"fills        {s['fills']}, {format_size(s['fill_bytes'])} written; "
        f"{s['fill_skips']} skipped (busy or full), {s['fill_errors']} failed",
        f"evictions    {s['evictions']}, {format_size(s['evicted_bytes'])}",
        f"corrupt      {s['corrupt']} entries dropped",
    ]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="emberfs cache", description="Inspect or clear the local disk cache of file chunks."
    )
    sub = p.add_subparsers(dest="command", required=True)
    stats = sub.add_parser("stats", help="what the cache holds and what its users counted")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    sub.add_parser("clear", help="remove every entry and zero the counters")
    for s in (stats, sub.choices["clear"]):
        s.add_argument("--cache-dir", help="the cache directory (default: the client's)")
    args = p.parse_args(argv)
    directory = _cache_dir(args)
    if directory is None:
        return EXIT_USAGE

    def body() -> int:
        from emberfs.client.diskcache import DiskCache

        if not DiskCache.found(directory):
            print(f"emberfs cache: {directory} holds no disk cache", file=sys.stderr)
            return 1
        cache = DiskCache(directory, None)
        if args.command == "clear":
            n = cache.clear()
            print(f"removed {n} chunks from {cache.directory}")
            return 0
        s = cache.stats()
        print(json.dumps(s) if args.json else "\n".join(_stats_lines(s)))
        return 0

    return run_command("cache", body, [])


def main_warmup(argv: list[str]) -> int:
    p = command_parser("warmup", "Read files into the local disk cache ahead of a job.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories (recursive)")
    p.add_argument("--cache-dir", help="the cache directory (default: the client's)")
    p.add_argument("--cache-size", type=parse_size, help="its limit, e.g. 100G (default: 10G)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    args.command = "warmup"
    if _cache_dir(args) is None:
        return EXIT_USAGE
    holder: list = []

    def body() -> int:
        from emberfs.client.warmup import describe, warm

        fs = filesystem(args, args.paths, cache_dir=args.cache_dir, cache_size=args.cache_size)
        holder.append(fs)
        report = warm(fs.client, args.paths)
        if args.json:
            print(json.dumps(report.as_dict()))
        else:
            print(describe(report, fs.client.cache.limit))
        return 1 if report.failed else 0

    return run_command("warmup", body, holder)
