"""The metadata benchmark on etcd and RocksDB (``benchmarks.meta_ha``): its quick form, end to end.

Nothing here asserts a speed: the run must complete, and report every figure with sane values
(positive rates, a failover measured in which the lead moved, database sizes that grew).
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

meta_ha = importlib.import_module("benchmarks.meta_ha")
from tests.benchmarks.test_bench_smoke import run_bench  # noqa: E402

SETUPS = {"rocksdb", "etcd", "etcd2"}
FORMS = {"1x1", "8x1", "8x2"}


def test_forms_split_only_thread_counts_the_processes_divide():
    forms = meta_ha.forms_of([1, 8, 6], 4)
    assert [f.key for f in forms] == ["1x1", "8x1", "6x1", "8x4"]
    assert forms[-1].label == "8 threads in 4 processes"
    assert [f.key for f in meta_ha.forms_of([1, 8], 1)] == ["1x1", "8x1"]


def test_processes_measured_together_add_up_batch_by_batch():
    def report(batches: list[float], cpu_per_s: float) -> dict:
        return {
            "calls": 10,
            "batch_seconds": {op: batches for op in meta_ha.OPS},
            "client_cpu_per_s": {**dict.fromkeys(meta_ha.OPS, cpu_per_s), "list": cpu_per_s},
            "list_entries": 50,
            "list_calls": 4,
            "list_seconds": sum(batches),
        }

    # each batch lasted as long as the slower of the two processes: 2 + 3 seconds
    out = meta_ha.combine([report([1.0, 3.0], 0.5), report([2.0, 1.0], 1.0)])
    assert out["create_per_s"] == pytest.approx(20 / 5)
    assert out["list_calls_per_s"] == pytest.approx(8 / 4)
    assert out["list_entries_per_s"] == pytest.approx(8 * 50 / 4)
    # CPU seconds of both (0.5 x 4 + 1.0 x 3) per second of the aggregate
    assert out["client_cpu_per_s"]["create"] == pytest.approx(5 / 5)
    alone = meta_ha.combine([report([1.0, 3.0], 0.5)])
    assert alone["ping_per_s"] == pytest.approx(10 / 4)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_meta_ha_quick(tmp_path):
    if shutil.which("etcd") is None:
        pytest.skip("needs the etcd server (apt-get install etcd-server)")
    out = tmp_path / "meta-ha.json"
    argv = [
        sys.executable,
        "-m",
        "benchmarks.meta_ha",
        "--quick",
        "--json",
        str(out),
        "--workdir",
        str(tmp_path / "work"),
    ]
    proc = run_bench(argv, timeout=360)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["config"]["quick"] is True
    # nothing is left behind
    assert list((tmp_path / "work").iterdir()) == []

    rates = doc["rates"]
    assert set(rates["setups"]) == SETUPS and set(rates["forms"]) == FORMS
    assert rates["setups"]["etcd2"]["metaservers"] == 2
    for name in SETUPS:
        for form in FORMS:
            res = rates["results"][name][form]
            assert len(res["rounds"]) == doc["config"]["rounds"]
            assert all(res["median"][k] > 0 for k in meta_ha.RATES), (name, form, res["median"])
            assert res["list_entries"] == doc["config"]["list_entries"]
            assert res["client_cpu_per_s"] > 0
        # one client process: the metaservers' own time per call comes with the rates
        assert set(rates["results"][name]["1x1"]["rounds"][0]["handler_us"]) == set(meta_ha.OPS)
    for what in ("etcd_vs_rocksdb", "etcd2_vs_etcd"):
        assert set(rates["ratios"][what]) == FORMS
        assert all(s["median"] > 0 for s in rates["ratios"][what]["8x2"].values())
    assert all(set(rates["processes_vs_one"][name]) == {"8x2"} for name in SETUPS)

    fail = doc["failover"]
    assert len(fail["runs"]) == doc["config"]["failovers"]
    for run in fail["runs"]:
        # the lead moved to the survivor, which said so; both clients went on creating
        assert run["leads_after_s"] > 0
        assert run["leader_after"] == run["survivor"] != run["killed"]
        for client in ("client_on_killed", "client_on_survivor"):
            seen = run[client]
            assert seen["errors"] == 0, seen["error_samples"]
            assert seen["creates_after_kill"] > 0
            assert seen["longest_gap_s"] > 0
    assert fail["median"]["leads_after_s"] > 0 and fail["median"]["longest_gap_s"] > 0

    size = doc["etcd_size"]
    stages = size["stages"]
    assert list(stages) == [
        "fresh",
        "created",
        "compacted",
        "defragmented",
        "without_retry_records",
    ]
    assert stages["created"]["db_size"] > stages["fresh"]["db_size"] > 0
    # defragmentation returns what compaction freed; pruned retry records free more
    assert stages["defragmented"]["db_size"] <= stages["compacted"]["db_size"]
    assert stages["without_retry_records"]["db_size"] <= stages["defragmented"]["db_size"]
    for stage, per in size["bytes_per_file"].items():
        assert per["db_size"] > 0 and per["db_size_in_use"] > 0, stage
        assert all(n > 0 for n in size["files_in_quota"][stage].values())
    assert size["keys_per_file"]["INOD"] >= 1 and size["keys_per_file"]["DENT"] >= 1

    for heading in ("metadata rates per second", "failover: kill -9", "etcd database"):
        assert heading in proc.stdout
