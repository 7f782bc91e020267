"""``emberfs fsck``: check a cluster's namespace and chunks, and repair what can be.

::

    emberfs fsck                 # check (metadata, checksums and that chunk files exist)
    emberfs fsck --deep          # also read every block of every replica against its CRC32C
    emberfs fsck --repair        # fix what can be fixed (needs the admin token)
    emberfs fsck --json          # one JSON document for scripts

It asks the metaserver's admin API (``--admin`` or ``EMBERFS_ADMIN``), which
runs the check (:mod:`emberfs.metaserver.consistency.fsck`) and answers with what it found, as JSON
lines, once the check is over.
Exit status: 0 when the cluster is clean (or ``--repair`` fixed everything it
found), 1 when damage remains, 2 when the check could not run.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.markup import escape

from emberfs.cli.admin import AdminClient, AdminError, add_api_arguments

TIMEOUT = 3600.0  # seconds the answer may take in all (a deep check reads every replica)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="emberfs fsck", description="Check an EmberFS cluster's namespace and chunks."
    )
    add_api_arguments(p, "for --repair")
    p.add_argument(
        "--deep", action="store_true", help="read and check every block of every replica"
    )
    p.add_argument("--repair", action="store_true", help="fix what can be fixed")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p.parse_args(argv)


def _line(f: dict) -> str:
    where = escape(f.get("path") or f"inode {f['inode']}")
    if "index" in f:
        where += f" chunk {f['index']}"
    text = f"[bold]{f['kind']}[/bold] {where}: {escape(f['detail'])}"
    if f.get("repair"):
        style = "green" if f["repair"] == "done" else "red"
        text += f" [{style}]({escape(f['repair'])})[/{style}]"
    return text


def main(argv: list[str] | None = None) -> int:
    """Run ``emberfs fsck``; the exit code."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    console = Console()
    client = AdminClient(args.admin, args.token, tls_ca=args.tls_ca)
    query = "?deep=true" if args.deep else ""
    path = ("/api/v1/fsck/repair" if args.repair else "/api/v1/fsck") + query
    findings: list[dict] = []
    summary = error = None
    try:
        for item in client.stream("POST" if args.repair else "GET", path, timeout=TIMEOUT):
            if "finding" in item:
                findings.append(item["finding"])
                if not args.json:
                    console.print(_line(item["finding"]), highlight=False)
            elif "summary" in item:
                summary = item["summary"]
            elif "error" in item:
                error = item["error"]
    except AdminError as exc:
        error = str(exc)
    if summary is None and error is None:
        error = "the answer ended before its summary"
    if args.json:
        print(json.dumps({"findings": findings, "summary": summary, "error": error}, indent=2))
    if error is not None:
        if not args.json:
            print(f"emberfs fsck: {error}", file=sys.stderr)
        return 2
    if not args.json:
        s = summary
        kinds = ", ".join(f"{n} {k}" for k, n in s["findings"].items()) or "no damage"
        console.print(
            f"{s['files']} files, {s['chunks']} chunks ({s['replicas']} replicas) checked"
            + (f", {s['bytes_verified']} bytes read" if s["deep"] else "")
            + f" in {s['seconds']:.1f} s: {kinds}"
            + (f"; {s['repaired']} repaired, {s['unrepaired']} not" if s["repair"] else ""),
            highlight=False,
        )
        if s["skipped_targets"]:
            console.print(f"not checked (not serving): targets {s['skipped_targets']}")
    return 1 if summary["unrepaired"] else 0
