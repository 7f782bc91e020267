"""The command line: ``python -m benchmarks.fuzz``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cluster import CouldNotRun
from .report import summary
from .runner import SURFACES, Options, run

DESCRIPTION = (
    "Fuzzing of the live servers: the data port, every gRPC method and the admin REST API."
)
EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=DESCRIPTION)
    p.add_argument(
        "--surface",
        default=",".join(SURFACES),
        help="comma-separated surfaces to fuzz: data, grpc, rest (default: all, in that order)",
    )
    p.add_argument("--inputs", type=int, default=20_000, help="inputs per surface (default 20000)")
    p.add_argument("--seed", type=int, default=1, help="seed of every generator (default 1)")
    p.add_argument("--json", action="store_true", help="print the JSON report (else a summary)")
    p.add_argument("--report", type=Path, help="also write the JSON report to this file")
    p.add_argument("--data-dir", type=Path, help="where the cluster's temporary directory goes")
    p.add_argument("--keep", action="store_true", help="keep the cluster's directory (and logs)")
    args = p.parse_args(argv)
    surfaces = tuple(s.strip() for s in args.surface.split(",") if s.strip())
    unknown = [s for s in surfaces if s not in SURFACES]
    if unknown or not surfaces:
        p.error(f"--surface: choose from {', '.join(SURFACES)}")
    if args.inputs < 1:
        p.error("--inputs must be at least 1")
    args.surfaces = surfaces
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer from the command line; the exit code."""
    args = parse_args(argv)
    options = Options(args.surfaces, args.inputs, args.seed, args.data_dir, args.keep, 30.0)
    print(f"fuzz: seed {args.seed}, {args.inputs} inputs per surface", file=sys.stderr)
    try:
        report = run(options)
    except CouldNotRun as exc:
        print(json.dumps({"result": "could not run", "seed": args.seed, "error": str(exc)}))
        return EXIT_COULD_NOT_RUN
    text_report = json.dumps(report, indent=2, default=str)
    if args.report is not None:
        args.report.write_text(text_report + "\n")
    print(text_report if args.json else summary(report))
    return EXIT_FAILED if report["failures"] else EXIT_OK
