"""The report: failures, a summary, the servers' logged tracebacks."""

from __future__ import annotations

import re

from emberfs.cli.localcluster import LocalCluster

from .tally import Tally
from .values import MiB


def mib(n: int) -> float:
    """Bytes in MiB, to a tenth."""
    return round(n / MiB, 1)


def slowest(tally: Tally, shown: int = 8) -> dict[str, dict]:
    """The groups (methods, routes, input kinds) that took the most time in all."""
    groups = sorted(tally.time_by_group.items(), key=lambda kv: -kv[1][1])[:shown]
    return {
        name: {"inputs": n, "seconds": round(total, 2), "mean_ms": round(1000 * total / n, 2)}
        for name, (n, total) in groups
    }


def log_tracebacks(cluster: LocalCluster, shown: int = 10) -> dict:
    """The tracebacks the servers logged, by process and by their last line (what was raised).

    gRPC's own "Exception deserializing message!" (a request that is not protobuf, which
    the fuzzer sends on purpose) is only counted. For every other kind the first
    traceback is kept whole.
    """
    out = {}
    for log in sorted((cluster.data_dir / "logs").glob("*.log")):
        body = log.read_text(errors="replace")
        blocks = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", body)
        undecodable = 0
        kinds: dict[str, dict] = {}
        for block in blocks:
            if "Traceback (most recent call last)" not in block:
                continue
            if "Exception deserializing message" in block:
                undecodable += 1
                continue
            raised = block.strip().splitlines()[-1][:300]
            entry = kinds.setdefault(raised, {"count": 0, "first": block.strip()[-6000:]})
            entry["count"] += 1
        if undecodable or kinds:
            top = sorted(kinds.items(), key=lambda kv: -kv[1]["count"])[:shown]
            out[log.stem] = {"undecodable_requests": undecodable, "tracebacks": dict(top)}
    return out


def failures(report: dict) -> list[str]:
    """What makes the run fail: a crash, a hang, damage (and a bug of the fuzzer itself)."""
    out = []
    for name, s in report.get("surfaces", {}).items():
        if s["crashes"]:
            out.append(f"{name}: {len(s['crashes'])} server process(es) exited")
        if s["hangs"]:
            out.append(f"{name}: {s['hangs']} hang(s)")
        if s["fuzzer_errors"]:
            out.append(f"{name}: the fuzzer failed ({len(s['fuzzer_errors'])} thread(s))")
    check = report.get("check", {})
    if not check.get("intact"):
        out.append("the check file does not read back identical")
    if not check.get("replicas_unchanged"):
        out.append("the check file's replicas changed")
    if not check.get("kv_intact"):
        out.append("the check KV cache's block does not read back identical")
    return out


def summary(report: dict) -> str:
    """A few lines that say what a report found."""
    lines = [f"fuzz: seed {report['seed']}, {report['total_seconds']} s, {report['result']}"]
    for name, s in report.get("surfaces", {}).items():
        growth = max(s["rss_growth_mib"].values(), default=0.0)
        top = ", ".join(f"{k} {v}" for k, v in list(s["statuses"].items())[:6])
        lines.append(
            f"  {name}: {s['inputs']} inputs in {s['seconds']} s ({s['inputs_per_second']}/s), "
            f"{len(s['crashes'])} crashes, {s['hangs']} hangs, {s['server_errors']} server errors, "
            f"max RSS growth {growth} MiB; {top}"
        )
    check = report.get("check", {})
    lines.append(
        f"  check file: intact {check.get('intact')}, replicas unchanged "
        f"{check.get('replicas_unchanged')}, targets serving {check.get('targets_serving')}, "
        f"KV cache block intact {check.get('kv_intact')}"
    )
    lines += [f"  FAILED: {f}" for f in report.get("failures", [])]
    return "\n".join(lines)
