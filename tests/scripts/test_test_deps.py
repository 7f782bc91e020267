"""scripts/test-deps.sh: what it does when it cannot install the system packages the tests use."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test-deps.sh"


@pytest.fixture
def no_tools(tmp_path):
    """A PATH with no chromium, no debootstrap, no docker, and an ``id`` that says "not root"."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_id = bin_dir / "id"
    fake_id.write_text("#!/bin/sh\necho 1000\n")
    fake_id.chmod(0o755)
    return {**os.environ, "PATH": str(bin_dir)}


def run(env) -> subprocess.CompletedProcess:
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run([bash, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def test_missing_tools_are_reported_and_tolerated_by_default(no_tools):
    no_tools.pop("EMBERFS_REQUIRE_ALL_TESTS", None)
    proc = run(no_tools)
    assert proc.returncode == 0, proc.stderr
    assert "missing" in proc.stderr and "debootstrap" in proc.stderr
    assert "will skip" in proc.stderr
    # no python either: the engines of tests/engines.txt cannot be installed, and that is said
    assert "engines of tests/engines.txt" in proc.stderr


def test_missing_tools_fail_when_every_test_is_required(no_tools):
    proc = run({**no_tools, "EMBERFS_REQUIRE_ALL_TESTS": "1"})
    assert proc.returncode != 0
    assert "debootstrap" in proc.stderr and "EMBERFS_REQUIRE_ALL_TESTS" in proc.stderr


def test_an_unreachable_docker_engine_fails_when_every_test_is_required(no_tools):
    """The other tools as this machine has them, but ``docker info`` fails."""
    bin_dir = Path(no_tools["PATH"])
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\nexit 1\n")
    docker.chmod(0o755)
    env = {**no_tools, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env["EMBERFS_REQUIRE_ALL_TESTS"] = "1"
    proc = run(env)
    assert proc.returncode != 0, proc.stderr
    # a tool this machine lacks fails first (``id`` says "not root": nothing is installed)
    assert "Docker engine is not reachable" in proc.stderr or "missing" in proc.stderr
