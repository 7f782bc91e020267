"""``emberfs admin`` as a user runs it: a subprocess against a real cluster's admin API."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from emberfs.cli.ports import free_port
from emberfs.cli.processes import emberfs_command

TOKEN = os.environ["EMBERFS_ADMIN_TOKEN"]  # the suite's admin token (tests/conftest.py)


def admin(*args: str, url: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBERFS_ADMIN")}
    env["COLUMNS"] = "200"
    if token is not None:
        env["EMBERFS_ADMIN_TOKEN"] = token
    return subprocess.run(
        emberfs_command() + ["admin", "--admin", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_status_targets_chains_nodes_gc(cluster):
    url = cluster.admin_url
    out = admin("status", url=url)
    assert out.returncode == 0, out.stderr
    assert "healthy" in out.stdout and "6: 6 serving" in out.stdout and "2: 2 healthy" in out.stdout
    out = admin("targets", url=url)
    assert out.returncode == 0 and out.stdout.count("serving") == 6
    assert cluster.storage_address(0) in out.stdout
    out = admin("chains", url=url)
    assert out.returncode == 0 and "1:serving" in out.stdout.replace(" ", "")
    out = admin("nodes", url=url)
    assert out.returncode == 0 and out.stdout.count("yes") == 3
    out = admin("gc", url=url)
    assert out.returncode == 0 and "Pending GC items" in out.stdout
    assert admin("sessions", url=url).returncode == 0
    data = json.loads(admin("--json", "targets", url=url).stdout)
    assert len(data) == 6 and {t["state"] for t in data} == {"serving"}


def test_errors_are_one_line(cluster):
    out = admin("offline", "1", url=cluster.admin_url, token="whatever")
    assert out.returncode == 1
    assert out.stderr.strip() == "emberfs admin: 403 wrong admin token"
    out = admin("status", url=f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "cannot reach the admin API" in out.stderr
    out = admin("drain", "notanumber", url=cluster.admin_url)
    assert out.returncode == 2 and "invalid int value" in out.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_steering_with_the_token(private_cluster):
    c = private_cluster(env={"EMBERFS_ADMIN_TOKEN": TOKEN})
    url = c.admin_url
    out = admin("offline", "1", url=url)
    assert out.returncode == 1 and out.stderr.strip().startswith("emberfs admin: 401 ")
    out = admin("offline", "1", url=url, token="wrong")
    assert out.stderr.strip() == "emberfs admin: 403 wrong admin token"
    out = admin("offline", "1", url=url, token=TOKEN)
    assert out.returncode == 0, out.stderr
    assert "target 1 is offline" in out.stdout
    targets = json.loads(admin("--json", "targets", url=url).stdout)
    assert next(t for t in targets if t["id"] == 1)["state"] == "offline"
    out = admin("drain", "2", url=url, token=TOKEN)
    assert out.returncode == 1 and out.stderr.startswith("emberfs admin: 409 no free target")
    out = admin("drain", "99", url=url, token=TOKEN)
    assert out.stderr.strip() == "emberfs admin: 404 no target 99"
    out = admin("gc", "--run", url=url, token=TOKEN)
    assert out.returncode == 0 and "GC items" in out.stdout
    assert "degraded" in admin("status", url=url).stdout

    out = admin("scrub", "pause", url=url)
    assert out.returncode == 1 and out.stderr.strip().startswith("emberfs admin: 401 ")
    out = admin("scrub", "pause", url=url, token=TOKEN)
    assert out.returncode == 0 and "scrubbing is paused" in out.stdout, out.stderr
    out = admin("scrub", "start", url=url, token=TOKEN)
    assert out.returncode == 0 and "scrubbing is on" in out.stdout, out.stderr
    deadline = time.monotonic() + 60
    while True:  # the start reaches every server with a heartbeat answer; each runs a pass
        shown = json.loads(admin("--json", "scrub", url=url).stdout)
        if len(shown["targets"]) == 6 and all(t["passes"] >= 1 for t in shown["targets"]):
            break
        assert time.monotonic() < deadline, shown
        time.sleep(0.5)
    out = admin("scrub", url=url)
    assert out.returncode == 0 and out.stdout.count("idle") == 6, out.stdout
