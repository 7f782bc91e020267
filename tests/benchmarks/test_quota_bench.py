"""A smoke run of ``benchmarks/quotas.py``: it completes, every rate is sane, and the quota's
usage after the run is exactly what the run left in it (nothing here asserts a speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_quota_bench_smoke(tmp_path):
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.quotas", "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for phase in ("create", "small_files", "pipe", "write"):
        got = result[phase]
        assert len(got["plain"]) == len(got["quota"]) == len(got["plain2"]) == 2
        assert len(got["ratio"]) == len(got["control_ratio"]) == 2
        assert all(r > 0 for r in got["plain"] + got["quota"] + got["plain2"])
        assert got["median_ratio"] > 0 and got["median_control_ratio"] > 0
        # the metaserver worked for every item of every directory
        assert all(us > 0 for us in got["meta_us"]["quota"] + got["meta_us"]["plain"])
    usage = result["quota_usage"]
    assert usage["exact"] and usage["used_inodes"] == usage["expected_inodes"] > 0
