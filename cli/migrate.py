"""``emberfs migrate``: move a stopped cluster's metadata between RocksDB and etcd.

::

    emberfs migrate --from rocksdb:/var/lib/emberfs/meta --to etcd://e1:2379,e2:2379/emberfs
    emberfs migrate --from etcd://e1:2379/emberfs --to rocksdb:/var/lib/emberfs/meta-new
    emberfs migrate --from ... --to ... --dry-run    # what would be copied, and its checksum

A store is ``rocksdb:PATH`` (PATH is the metaserver's ``--data-dir``; the
database is ``PATH/meta``) or the ``etcd://`` URL a metaserver's ``--kv``
takes. The copy, its refusals and its verification are
:mod:`emberfs.metaserver.store.migration`'s; this module parses the arguments and
prints what it found. Output goes to stdout (progress and errors to stderr);
the two ``sha256`` lines are meant for scripts.
"""

from __future__ import annotations

import argparse
import sys
import time

from emberfs.metaserver.store.migration.errors import MigrationError, Refused
from emberfs.metaserver.store.migration.migrate import migrate_stores
from emberfs.metaserver.store.migration.stores import StoreLocation
from emberfs.metaserver.store.migration.tally import Tally, counts_text, prefix_name

EXIT_STATUS = """\
exit status:
  0  the copy is made and verified (with --dry-run: it could be made)
  1  the copy is made but does not verify (checksums or inode counts differ, or the
     source changed meanwhile): do not use the destination
  2  refused or failed, nothing usable written: bad arguments, a metaserver seems to
     run on a store, the destination is not empty, the source is empty or missing, a
     store cannot be reached, or a write failed (then empty the destination)
"""

PROGRESS_INTERVAL = 5.0  # seconds between two progress lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="emberfs migrate",
        description="Copy a stopped cluster's whole metadata store from one engine to another\n"
        "(RocksDB <-> etcd) and verify the copy by a checksum of both sides.\n"
        "Stop every metaserver on both stores first.",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="SRC",
        help="the store to copy: rocksdb:PATH (a metaserver's --data-dir) or "
        "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]",
    )
    p.add_argument(
        "--to",
        dest="destination",
        required=True,
        metavar="DST",
        help="the empty store to copy into (rocksdb:PATH or an etcd:// URL)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check, and print what would be copied and the source's checksum, writing nothing",
    )
    args = p.parse_args(argv)
    try:
        args.source = StoreLocation.parse(args.source)
        args.destination = StoreLocation.parse(args.destination)
    except ValueError as exc:
        p.error(str(exc))
    return args


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _print_survey(tally: Tally) -> None:
    print(f"{'prefix':<8} {'keys':>10} {'bytes':>14}")
    for prefix in sorted(tally.prefixes):
        n, nbytes = tally.prefixes[prefix]
        print(f"{prefix_name(prefix):<8} {n:>10} {nbytes:>14}")
    print(f"inodes: {counts_text(tally.inodes)}")


def _sha_line(role: str, tally: Tally) -> str:
    return f"{role} sha256 {tally.sha256} keys {tally.keys} bytes {tally.bytes}"


class _Progress:
    """Prints what has been written every :data:`PROGRESS_INTERVAL` seconds, on stderr."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def __call__(self, keys: int, nbytes: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_INTERVAL:
            self.last = now
            print(f"copied {keys} of {total} keys ({_size(nbytes)})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run ``emberfs migrate``; the exit code (see :data:`EXIT_STATUS`)."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    print(f"from {args.source}")
    print(f"to   {args.destination}")
    try:
        result = migrate_stores(
            args.source, args.destination, dry_run=args.dry_run, progress=_Progress()
        )
    except Refused as exc:
        print(f"emberfs migrate: refused: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a failed copy, a store that cannot be reached
        detail = str(exc) if isinstance(exc, MigrationError) else f"{type(exc).__name__}: {exc}"
        print(f"emberfs migrate: {detail}", file=sys.stderr)
        return 2

    planned = result.planned
    if result.dry_run:
        print(f"would copy {planned.keys} keys, {planned.bytes} bytes ({_size(planned.bytes)}):")
        _print_survey(planned)
        if args.destination.etcd is not None:
            print("the inode counts would be rebuilt on the destination")
        print(_sha_line("source", planned))
        print("dry run: nothing written")
        return 0

    print(
        f"copied {result.copied.keys} keys, {result.copied.bytes} bytes "
        f"({_size(result.copied.bytes)}); the copy and its verification took "
        f"{result.seconds:.1f} s:"
    )
    _print_survey(result.copied)
    if result.inode_counts is not None:
        print(f"inode counts rebuilt on the destination: {counts_text(result.inode_counts)}")
    print(_sha_line("source", result.source))
    print(_sha_line("destination", result.destination))
    if result.verified:
        print("verified: the checksums match")
        return 0
    for problem in result.problems:
        print(f"emberfs migrate: NOT VERIFIED: {problem}", file=sys.stderr)
    return 1
