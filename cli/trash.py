"""``emberfs trash``: list, restore and purge the entries removals kept.

    emberfs trash ls [--user UID | --all-users] [--json]
    emberfs trash restore ENTRY... | --all  [--to PATH]
    emberfs trash purge ENTRY... | --all [--older-than AGE]

An entry is named by the id ``trash ls`` shows. Exit codes as the file
commands': 1 for a file error (an entry that is not the caller's, a restore
onto a name that exists, a parent directory that is gone), 2 wrong usage.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys

from emberfs.cli.files import EXIT_OK, command_parser, filesystem, run_command

_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "": 86400}


def parse_age(text: str) -> datetime.timedelta:
    """``AGE`` as a duration: a number with ``s``, ``m``, ``h`` or ``d`` (days, the default)."""
    found = _AGE.match(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age such as 30m, 12h or 7d")
    return datetime.timedelta(seconds=float(found.group(1)) * _UNIT[found.group(2)])


def _entry_ids(values: list[str]) -> list[int]:
    ids = []
    for value in values:
        if not value.isdigit():
            raise ValueError(f"{value!r} is not a trash entry id (see 'emberfs trash ls')")
        ids.append(int(value))
    return ids


def _line(entry: dict) -> str:
    removed = entry["removed"].strftime("%Y-%m-%d %H:%M:%S")
    kind = entry["type"] + (f" ({entry['entries']} entries)" if entry["entries"] > 1 else "")
    return f"{entry['entry']:>12}  {removed}  uid {entry['uid']:<6} {kind:<24} {entry['path']}"


def _public(entry: dict) -> dict:
    return {**entry, "removed": entry["removed"].isoformat()}


def main(argv: list[str]) -> int:
    """``emberfs trash ls|restore|purge``."""
    p = command_parser("trash", "List, restore and purge removed entries kept in the trash.")
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("ls", help="list the trash entries, oldest first")
    who = ls.add_mutually_exclusive_group()
    who.add_argument("--user", type=int, help="another uid's entries (root only)")
    who.add_argument("--all-users", action="store_true", help="every uid's entries (root only)")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    restore = sub.add_parser("restore", help="put entries back where they were (all or none)")
    restore.add_argument("entries", nargs="*", help="entry ids from 'emberfs trash ls'")
    restore.add_argument("--all", action="store_true", help="every entry of yours")
    restore.add_argument("--to", default="", help="restore the one entry at this path instead")
    purge = sub.add_parser("purge", help="delete entries for real (their space is freed)")
    purge.add_argument("entries", nargs="*", help="entry ids from 'emberfs trash ls'")
    purge.add_argument("--all", action="store_true", help="every entry of yours")
    purge.add_argument(
        "--older-than", type=parse_age, help="only entries removed longer ago (30m, 12h, 7d)"
    )
    for parser in (ls, restore, purge):  # the options also after the action
        parser.add_argument("--meta", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.action != "ls" and bool(args.entries) == args.all:
        p.error(f"{args.action}: name entries or give --all (not both)")
    if args.action == "restore" and args.to and args.all:
        p.error("restore: --to takes one entry, not --all")
    holder: list = []

    def body() -> int:
        fs = filesystem(args, [])
        holder.append(fs)
        if args.action == "ls":
            for entry in fs.trash_list(args.user, args.all_users):
                print(json.dumps(_public(entry)) if args.json else _line(entry))
        elif args.action == "restore":
            for entry in fs.trash_restore(_entry_ids(args.entries), args.all, args.to):
                print(f"restored {entry['entry']} to {entry['path']}")
        else:
            before = None
            if args.older_than is not None:
                before = datetime.datetime.now(datetime.UTC) - args.older_than
            purged = fs.trash_purge(_entry_ids(args.entries), args.all, before)
            print(f"purged {purged} entr{'y' if purged == 1 else 'ies'}")
        sys.stdout.flush()
        return EXIT_OK

    return run_command("trash", body, holder)
