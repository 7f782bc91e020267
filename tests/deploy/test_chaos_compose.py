"""The chaos checker on the docker compose cluster: partitions of storage containers.

A short run (4 faults; the long form is the command itself, see docs/reliability.md) of
``python -m benchmarks.chaos --mode compose`` with the three partition kinds only (a storage container cut from everything, from the metaserver, from its chain
peers): it brings its own compose project up and down, and may find no violation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _unavailable() -> str | None:
    """Why this test cannot run here, or None when it can."""
    for tool in ("docker", "nsenter", "iptables"):
        if shutil.which(tool) is None:
            return f"the {tool} command is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info failed: {exc}"
    if info.returncode != 0:
        return "the Docker engine is not reachable (docker info failed)"
    if os.geteuid() != 0:
        return "iptables in a container's network namespace needs root"
    return None


_SKIP_REASON = _unavailable()

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.skipif(_SKIP_REASON is not None, reason=_SKIP_REASON or ""),
    pytest.mark.timeout(1800),
]


def test_chaos_partitions_on_the_compose_cluster(tmp_path):
    out = tmp_path / "summary.json"
    argv = [
        sys.executable,
        "-m",
        "benchmarks.chaos",
        "--mode",
        "compose",
        "--fault-kinds",
        "partition_all,partition_meta,partition_peers",
        "--faults",
        "4",
        "--clients",
        "2",
        "--seed",
        "6",
        "--data-dir",
        str(tmp_path / "run"),
        "--json-out",
        str(out),
    ]
    env = dict(os.environ, EMBERFS_PYTHON=sys.executable)
    env.pop("EMBERFS_META", None)
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, err = proc.communicate(timeout=1600)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: it takes its compose project down, then exits
        _, err = proc.communicate(timeout=180)
        pytest.fail(f"the checker did not finish:\n{err[-4000:]}")
    assert proc.returncode in (0, 1), f"the checker could not run:\n{err[-4000:]}"
    summary = json.loads(out.read_text())
    kinds = summary["faults"]["by_kind"]
    assert set(kinds) <= {"partition_all", "partition_meta", "partition_peers"}
    assert summary["faults"]["total"] >= 4
    assert summary["violations"]["by_kind"] == {}, err[-6000:]
    assert proc.returncode == 0
