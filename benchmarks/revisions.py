"""Two revisions of EmberFS measured by one benchmark, their runs taking turns on one machine.

Run from the repository root::

    python -m benchmarks.revisions 592c8c0 --rounds 3 -- --sizes 1GiB --repeat 1 --no-seaweed
    python -m benchmarks.revisions v0.1 HEAD --bench mount --rounds 2 -- --no-juicefs

Each revision (``OLD``; ``NEW``, by default the working tree as it is) gets a
checkout of its own (``git worktree``) and a virtual environment that sees the
installed dependencies and imports ``emberfs`` from that checkout. Then the
benchmark (``python -m benchmarks.<bench> ARGS``, run from the revision's own
checkout) runs ``--rounds`` times for each, old and new taking turns and
going first in turn, so both meet the same machine. Every ratio the
benchmark reports (its JSON's ``ratios``, and the small files' rates of
``benchmarks.compare``) is summarised as the median over rounds of each
revision, with new/old beside it. Figures within a few percent of 1.0 are
the machine's noise, not a change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def checkout(rev: str | None, where: Path) -> Path:
    """A checkout of ``rev`` under ``where`` (None: the working tree itself)."""
    if rev is None:
        return ROOT
    path = where / f"rev-{rev.replace('/', '_')}"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), rev], check=True
    )
    return path


def environment(tree: Path, where: Path) -> Path:
    """The python of a virtual environment importing ``emberfs`` from ``tree``."""
    if tree == ROOT:
        return Path(sys.executable)
    env = where / f"venv-{tree.name}"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env)
    python = env / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(tree)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return python


def run_once(bench: str, python: Path, tree: Path, args: list[str], out: Path) -> dict:
    """One run of the benchmark; its JSON document."""
    out.mkdir(parents=True, exist_ok=True)
    if bench == "compare":  # it writes its JSON into the folder --out names
        cmd = [*args, "--out", str(out)]
    else:
        cmd = [*args, "--json", str(out / f"{bench}.json")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(python), "-m", f"benchmarks.{bench}", *cmd], cwd=tree, env=env, check=True)
    found = sorted(out.glob("*.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(found[-1].read_text())


def figures(doc: dict) -> dict[str, float]:
    """The figures to compare: the ratios, and the small files' rates of benchmarks.compare."""
    out = {k: v for k, v in (doc.get("ratios") or {}).items() if isinstance(v, int | float)}
    small = doc.get("small_files") or {}
    for k, v in (small.get("files_per_s") or {}).items():
        if k.startswith("emberfs_"):
            out[f"small_{k.removeprefix('emberfs_')}_files_per_s"] = v
    meta = doc.get("meta_1") or {}
    for k in ("create_per_s", "stat_per_s"):
        if k in meta:
            out[f"meta_{k}"] = meta[k]
    return out


def summary(old: list[dict], new: list[dict]) -> list[tuple[str, float, float, float]]:
    """``(figure, old median, new median, new/old)`` of the figures both revisions gave."""
    keys = sorted(set.intersection(*(set(figures(d)) for d in old + new)))
    rows = []
    for k in keys:
        a = statistics.median(figures(d)[k] for d in old)
        b = statistics.median(figures(d)[k] for d in new)
        rows.append((k, a, b, b / a if a else float("nan")))
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args_end = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", help="the revision to compare against (a commit, tag or branch)")
    p.add_argument("new", nargs="?", default=None, help="the new revision (the working tree)")
    p.add_argument("--bench", default="compare", help="benchmarks.<BENCH> (compare, mount)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each revision (default 3)")
    p.add_argument("--json", metavar="PATH", help="write the runs and the summary here")
    opts = p.parse_args(argv[:args_end])
    bench_args = argv[args_end + 1 :]
    if opts.rounds < 1:
        p.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="emberfs-revisions-") as tmp:
        where = Path(tmp)
        trees = {"old": checkout(opts.old, where), "new": checkout(opts.new, where)}
        try:
            pythons = {side: environment(tree, where) for side, tree in trees.items()}
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for r in range(opts.rounds):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for side in order:
                    print(f"round {r + 1}/{opts.rounds}: {side}", file=sys.stderr, flush=True)
                    out = where / f"out-{side}-{r}"
                    doc = run_once(opts.bench, pythons[side], trees[side], bench_args, out)
                    runs[side].append(doc)
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(
                        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                        check=False,
                    )
    rows = summary(runs["old"], runs["new"])
    width = max((len(k) for k, *_ in rows), default=10)
    print(f"{'figure':<{width}}  {'old':>12}  {'new':>12}  new/old")
    for k, a, b, ratio in rows:
        print(f"{k:<{width}}  {a:>12.4g}  {b:>12.4g}  {ratio:7.3f}")
    if opts.json:
        doc = {
            "bench": opts.bench,
            "old": opts.old,
            "new": opts.new or "working tree",
            "args": bench_args,
            "rounds": opts.rounds,
            "summary": [
                {"figure": k, "old": a, "new": b, "new_vs_old": ratio} for k, a, b, ratio in rows
            ],
            "runs": runs,
        }
        Path(opts.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
