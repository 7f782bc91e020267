"""The checkpoint benchmark (``benchmarks.checkpoint``) with a tiny state dict, end to end.

Nothing here asserts a speed: the run must check what it loaded against what it saved and
report every figure and ratio as a positive number.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.benchmarks.test_bench_smoke import run_bench

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def test_checkpoint_bench_small_run(tmp_path):
    out = tmp_path / "ckpt.json"
    done = run_bench(
        [
            sys.executable,
            "-m",
            "benchmarks.checkpoint",
            "--size-mib",
            "80",
            "--rounds",
            "2",
            "--workdir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["size_bytes"] == 80 << 20
    names = {"save_local", "save_ember", "load_warm_local", "load_warm_ember"}
    assert names <= set(result["figures_gbps"])
    for figure in result["figures_gbps"].values():
        assert figure["rounds"] == 2 and figure["min"] > 0
    assert {"save", "load_warm"} <= set(result["ratios"])
    assert "EmberFS / local disk, save" in done.stdout
    assert list(tmp_path.iterdir()) == [out]  # the work directory is gone, cluster stopped
