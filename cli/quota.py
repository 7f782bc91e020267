"""``emberfs quota``: set, show, list and remove directory quotas (docs/quotas.md).

    emberfs quota set PATH [--bytes SIZE] [--inodes N]
    emberfs quota get PATH [--json]
    emberfs quota ls [--json]
    emberfs quota rm PATH

Sizes take units as the other commands (``10G``, ``512MiB``, ``4096``); 0 is
no limit. ``set`` changes only the limits it is given (a new quota without
either only counts usage). A limit below the usage is applied all the same:
``set`` prints a warning line on stderr and exits 0. Only root (the admin
token) sets and removes quotas. Exit codes as the file commands': 1 for a
file error (not root, no such directory, no quota there), 2 wrong usage.
"""

from __future__ import annotations

import argparse
import json
import sys

from emberfs.cli.files import EXIT_OK, command_parser, filesystem, run_command
from emberfs.common.units import format_size, parse_size

HEADER = f"{'USED':>10} {'LIMIT':>10} {'USE%':>5}  {'INODES':>10} {'ILIMIT':>10} {'IUSE%':>5}  PATH"


def parse_count(text: str) -> int:
    """An inode count: a non-negative integer."""
    t = str(text).strip()
    if not t.isdigit():
        raise argparse.ArgumentTypeError(f"not an inode count: {text!r}")
    return int(t)


def _percent(used: int, limit: int) -> str:
    return f"{100 * used / limit:.0f}%" if limit else "-"


def line(q: dict) -> str:
    """One quota as a row under :data:`HEADER` (limit ``none``: 0, no limit)."""
    limit = format_size(q["max_bytes"]) if q["max_bytes"] else "none"
    ilimit = str(q["max_inodes"]) if q["max_inodes"] else "none"
    return (
        f"{format_size(q['used_bytes']):>10} {limit:>10} "
        f"{_percent(q['used_bytes'], q['max_bytes']):>5}  "
        f"{q['used_inodes']:>10} {ilimit:>10} {_percent(q['used_inodes'], q['max_inodes']):>5}  "
        f"{q['path']}"
    )


def over_limits(q: dict) -> list[str]:
    """What of a quota's usage is above its limit, in words (empty: nothing)."""
    out = []
    if q["max_bytes"] and q["used_bytes"] > q["max_bytes"]:
        out.append(
            f"{format_size(q['used_bytes'])}, above its byte limit of {format_size(q['max_bytes'])}"
        )
    if q["max_inodes"] and q["used_inodes"] > q["max_inodes"]:
        out.append(f"{q['used_inodes']} inodes, above its inode limit of {q['max_inodes']}")
    return out


def _inodes(n: int) -> str:
    return f"{n} inode" + ("" if n == 1 else "s")


def _show(quotas: list[dict], as_json: bool) -> None:
    if as_json:
        for q in quotas:
            print(json.dumps(q, sort_keys=True))
        return
    print(HEADER)
    for q in quotas:
        print(line(q))


def main(argv: list[str]) -> int:
    """``emberfs quota set|get|ls|rm``."""
    p = command_parser("quota", "Set, show, list and remove directory quotas.")
    sub = p.add_subparsers(dest="action", required=True)
    put = sub.add_parser("set", help="set or change a directory's limits (root only)")
    put.add_argument("path", help="a directory")
    put.add_argument(
        "--bytes", type=parse_size, help="byte limit, with units (10G, 512MiB); 0: none"
    )
    put.add_argument("--inodes", type=parse_count, help="inode limit; 0: none")
    get = sub.add_parser("get", help="show a directory's quota and usage")
    get.add_argument("path", help="a directory")
    get.add_argument("--json", action="store_true", help="a JSON object (byte counts exact)")
    ls = sub.add_parser("ls", help="list every quota, by path")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    rm = sub.add_parser("rm", help="remove a directory's quota (root only)")
    rm.add_argument("path", help="a directory")
    for parser in (put, get, ls, rm):  # the options also after the action
        parser.add_argument("--meta", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    holder: list = []

    def body() -> int:
        fs = filesystem(args, [args.path] if args.action != "ls" else [])
        holder.append(fs)
        if args.action == "set":
            q, over = fs.quota_set(args.path, args.bytes, args.inodes)
            _show([q], False)
            if over:
                sys.stdout.flush()
                print(
                    f"emberfs quota: warning: {q['path']} holds "
                    + " and ".join(over_limits(q))
                    + "; the limit is applied: what would grow it is refused (EDQUOT) "
                    "until usage drops below it",
                    file=sys.stderr,
                )
        elif args.action == "get":
            _show([fs.quota_get(args.path)], args.json)
        elif args.action == "ls":
            _show(fs.quota_list(), args.json)
        else:
            q = fs.quota_remove(args.path)
            print(
                f"removed the quota of {q['path']} "
                f"({format_size(q['used_bytes'])} in {_inodes(q['used_inodes'])})"
            )
        sys.stdout.flush()
        return EXIT_OK

    return run_command("quota", body, holder)
