"""``python -m benchmarks.revisions``: two revisions measured in turns, their figures side by side."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import revisions

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_figures_take_the_ratios_and_the_small_file_rates():
    doc = json.loads((DOCS / "performance-run.json").read_text())
    got = revisions.figures(doc)
    assert got["readinto_vs_raw"] == doc["ratios"]["readinto_vs_raw"]
    assert got["small_write_files_per_s"] == doc["small_files"]["files_per_s"]["emberfs_write"]
    assert got["meta_create_per_s"] == doc["meta_1"]["create_per_s"]
    assert not any(k.startswith("small_s3") for k in got)  # only EmberFS's own rates
    mount = revisions.figures(json.loads((DOCS / "mount-run.json").read_text()))
    assert "mount_warm_vs_fsspec_warm" in mount


def test_summary_is_the_median_of_each_side_and_new_over_old():
    base = {"ratios": {"read_vs_raw": 1.0, "only_old": 3.0}}
    old = [copy.deepcopy(base) for _ in range(3)]
    for d, v in zip(old, (0.5, 0.7, 0.6), strict=True):
        d["ratios"]["read_vs_raw"] = v
    new = [{"ratios": {"read_vs_raw": v}} for v in (0.9, 0.6, 0.66)]
    [(key, a, b, ratio)] = revisions.summary(old, new)
    assert key == "read_vs_raw" and a == 0.6 and b == 0.66
    assert ratio == pytest.approx(1.1)


@pytest.mark.slow
def test_a_revision_gets_a_checkout_and_an_environment_of_its_own(tmp_path):
    tree = revisions.checkout("HEAD", tmp_path)
    try:
        assert (tree / "client" / "core.py").exists() and tree != ROOT
        python = revisions.environment(tree, tmp_path)
        where = subprocess.run(
            [str(python), "-c", "import emberfs.client.fs as m; print(m.__file__)"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert Path(where).is_relative_to(tree), where  # that checkout's code, not this one's
        assert (python.parent / "emberfs").exists()  # its servers run that code too
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
        )
    # the working tree itself needs neither
    assert revisions.checkout(None, tmp_path) == revisions.ROOT
    assert revisions.environment(revisions.ROOT, tmp_path) == Path(sys.executable)


def test_bad_rounds_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        revisions.main(["HEAD", "--rounds", "0"])
    assert exc.value.code == 2 and "--rounds" in capsys.readouterr().err
