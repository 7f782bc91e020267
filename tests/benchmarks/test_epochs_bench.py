"""The epochs benchmark (``benchmarks.epochs``) in its smoke form.

Nothing here asserts a speed: the run must complete, read every byte each time, fill the cache
with every chunk in the first epoch, read nothing from the storage servers in the second, and
report each figure and ratio.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.test_bench_smoke import run_bench  # noqa: E402

MiB = 1 << 20


@pytest.mark.slow
def test_smoke_run_fills_in_epoch_one_and_reads_no_server_in_epoch_two(tmp_path):
    out = tmp_path / "epochs.json"
    done = run_bench(
        [sys.executable, "-m", "benchmarks.epochs", "--smoke", "--json", str(out)], timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["dataset"] == {"shards": 4, "shard_bytes": 16 * MiB, "bytes": 64 * MiB}
    (rnd,) = doc["rounds"]
    for kind in ("disk", "epoch1_none", "epoch1_cache", "epoch2", "warm_none", "warm_cache"):
        assert rnd[kind]["bytes"] == 64 * MiB and rnd[kind]["bytes_per_s"] > 0
        assert rnd[kind]["evicted_bytes"] >= 64 * MiB  # every copy's page cache was dropped
    assert rnd["epoch1_none"]["server_read_bytes"] >= 64 * MiB
    assert rnd["epoch1_none"]["cache"] is None
    filled = rnd["epoch1_cache"]["cache"]
    assert filled["fills"] == filled["misses"] == 16 and filled["fill_bytes"] == 64 * MiB
    assert filled["fill_skips"] == filled["fill_errors"] == 0
    second = rnd["epoch2"]["cache"]
    assert second["hits"] == 16 and second["misses"] == 0 and second["hit_bytes"] == 64 * MiB
    assert rnd["epoch2"]["server_read_bytes"] == 0
    assert doc["targets"]["epoch2_server_reads"] == {"bytes": 0, "met": True}
    for key in ("epoch2_vs_disk", "epoch1_cache_vs_none"):
        assert doc["targets"][key]["ratio"]["median"] > 0
    assert rnd["warm_cache"]["cache"]["fills"] == 16 and doc["cpu_s_per_gib"]["epoch2"] > 0
    assert "epoch 2 / local disk" in done.stdout
    assert "storage server bytes read in epoch 2" in done.stdout
