"""The suite's own settings (tests/conftest.py): skips fail when every test is required."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

SAMPLES = {
    "test_skips.py": """
import pytest

def test_runs():
    pass

def test_skip_call():
    pytest.skip("no frobnicator here")

@pytest.mark.skipif(True, reason="marked away")
def test_skipif():
    pass

def test_importorskip():
    pytest.importorskip("emberfs_no_such_module")

@pytest.fixture
def needs_tool():
    pytest.skip("the tool is missing")

def test_fixture_skip(needs_tool):
    pass

@pytest.mark.xfail(reason="a known failure", strict=True)
def test_expected_failure():
    assert False
""",
    "test_module_skip.py": """
import pytest

pytest.skip("the whole module needs a browser", allow_module_level=True)

def test_never_collected():
    pass
""",
}


@pytest.fixture
def sample(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    for name, text in SAMPLES.items():
        pytester.path.joinpath(name).write_text(text)
    return pytester


def test_skips_are_skips_by_default(sample, monkeypatch):
    monkeypatch.delenv("EMBERFS_REQUIRE_ALL_TESTS", raising=False)
    result = sample.runpytest("-p", "no:cacheprovider", "-ra")
    result.assert_outcomes(passed=1, skipped=5, xfailed=1)


@pytest.mark.parametrize("value", ["0", ""])
def test_zero_or_empty_does_not_require_all(sample, monkeypatch, value):
    monkeypatch.setenv("EMBERFS_REQUIRE_ALL_TESTS", value)
    result = sample.runpytest("-p", "no:cacheprovider", "test_skips.py")
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)


def test_every_skip_fails_with_its_reason_when_all_tests_are_required(sample, monkeypatch):
    monkeypatch.setenv("EMBERFS_REQUIRE_ALL_TESTS", "1")
    result = sample.runpytest("-p", "no:cacheprovider", "test_skips.py")
    # skips in the test body fail it; skips while setting it up are errors; xfail stays xfail
    result.assert_outcomes(passed=1, failed=2, errors=2, xfailed=1)
    for reason in (
        "no frobnicator here",
        "marked away",
        "emberfs_no_such_module",
        "the tool is missing",
    ):
        result.stdout.fnmatch_lines([f"*EMBERFS_REQUIRE_ALL_TESTS is set*{reason}*"])
    assert result.ret != 0


def test_a_module_skipped_at_collection_fails_when_all_tests_are_required(sample, monkeypatch):
    monkeypatch.setenv("EMBERFS_REQUIRE_ALL_TESTS", "1")
    result = sample.runpytest("-p", "no:cacheprovider", "test_module_skip.py")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*EMBERFS_REQUIRE_ALL_TESTS is set*the whole module needs a browser*"]
    )
    assert result.ret != 0
