"""Schemathesis over the admin API's OpenAPI document: no 5xx, every response as documented.

It runs against the shared cluster, whose metaserver has no admin token: the
steering routes are fuzzed too, and must refuse every request (403) whatever
the fuzzer sends, and change nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("schemathesis")


def st_command() -> list[str]:
    script = Path(sys.executable).parent / "st"
    if script.exists():
        return [str(script)]
    found = shutil.which("st")
    if found:
        return [found]
    pytest.skip("the schemathesis command 'st' is not installed")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_openapi_fuzzing_finds_no_server_errors(cluster, tmp_path):
    before = httpx.get(f"{cluster.admin_url}/api/v1/chains", timeout=10).json()
    proc = subprocess.run(
        st_command()
        + [
            "run",
            f"{cluster.admin_url}/openapi.json",
            "--checks",
            "not_a_server_error,response_schema_conformance,status_code_conformance",
            "--max-examples",
            "30",
            "--header",
            "Authorization: Bearer wrong-token",
            "--seed",
            "1",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    tested = re.search(r"Tested: (\d+)", out)
    cases = re.search(r"(\d+) generated, (\d+) passed", out)
    assert tested and int(tested.group(1)) >= 15, out[-3000:]
    assert cases and int(cases.group(1)) == int(cases.group(2)) > 100, out[-3000:]
    after = httpx.get(f"{cluster.admin_url}/api/v1/chains", timeout=10).json()
    assert after == before
