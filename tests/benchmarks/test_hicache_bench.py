"""The SGLang HiCache benchmark (``benchmarks.hicache``): its checks of the data, and its smoke run.

Nothing here asserts a speed: the run must check every page it read against the bytes stored,
go through a hybrid model's pools, report every figure as a positive number, and clean up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import hicache
from tests.benchmarks.test_bench_smoke import run_bench

ROOT = Path(__file__).resolve().parents[2]


def test_a_miss_or_a_wrong_byte_fails_the_check():
    pages = [torch.arange(16, dtype=torch.uint8) for _ in range(3)]
    hicache.check("get", [p.clone() for p in pages], pages)
    hicache.check("get", [True, True, True], pages)
    with pytest.raises(hicache.DataError, match="page 1 missed"):
        hicache.check("get", [pages[0], None, pages[2]], pages)
    with pytest.raises(hicache.DataError, match="page 0 missed"):
        hicache.check("get", [False, True, True], pages)
    wrong = pages[2].clone()
    wrong[5] ^= 1
    with pytest.raises(hicache.DataError, match="wrong bytes in page 2"):
        hicache.check("get", [pages[0], pages[1], wrong], pages)


def test_hicache_bench_smoke_run(tmp_path):
    pytest.importorskip("sglang.srt.mem_cache.hicache_storage", reason="SGLang (tests/engines.txt)")
    out = tmp_path / "hicache.json"
    done = run_bench(
        [sys.executable, "-m", "benchmarks.hicache", "--smoke", "--workdir", str(tmp_path),
         "--json", str(out)],
        timeout=300,
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["gb_per_s"]) == {"v1", "flat", "v1_via_flat"}
    for figure in result["gb_per_s"].values():
        assert figure["rounds"] == 1 and figure["min"] > 0
    assert result["ratios"]["v1/flat"]["median"] > 0
    assert result["hybrid"] == {"pages": 8, "pools": ["kv", "mamba", "indexer"], "verified": True}
    assert "hybrid pools" in done.stdout
    assert list(tmp_path.iterdir()) == [out]  # the work directory is gone, cluster stopped
