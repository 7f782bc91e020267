"""``emberfs quota``, run as real subprocesses against a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from emberfs.cli.admin import AdminClient
from emberfs.cli.processes import emberfs_command

MiB = 1024 * 1024


@pytest.fixture
def run(cluster):
    def run(*args, token=None):
        env = dict(os.environ, EMBERFS_META=cluster.meta_address)
        if token:
            env["EMBERFS_TOKEN"] = token
        return subprocess.run(
            emberfs_command() + list(args), capture_output=True, text=True, env=env, timeout=60
        )

    return run


@pytest.fixture
def base(fs):
    path = f"/cliquota-{uuid.uuid4().hex[:10]}"
    fs.mkdir(path)
    yield path
    fs.rm(path, recursive=True)


def test_set_get_ls_rm(run, fs, base):
    fs.pipe_file(f"{base}/a", b"x" * MiB)
    r = run("quota", "set", base, "--bytes", "10MiB", "--inodes", "100")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "USED" in r.stdout and "ILIMIT" in r.stdout
    row = r.stdout.splitlines()[1].split()
    assert row == ["1", "MiB", "10", "MiB", "10%", "1", "100", "1%", base]
    assert fs.quota_get(base)["max_bytes"] == 10 * MiB

    r = run("quota", "get", base, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got == {
        "path": base,
        "inode": got["inode"],
        "max_bytes": 10 * MiB,
        "max_inodes": 100,
        "used_bytes": MiB,
        "used_inodes": 1,
    }
    # only the limit given changes; 0 removes one
    r = run("quota", "set", base, "--inodes", "0")
    assert r.returncode == 0, r.stderr
    assert fs.quota_get(base)["max_bytes"] == 10 * MiB
    r = run("quota", "get", base)
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[6:8] == ["none", "-"]

    r = run("quota", "ls")
    assert r.returncode == 0, r.stderr
    assert any(ln.endswith(f" {base}") for ln in r.stdout.splitlines())
    r = run("quota", "ls", "--json")
    listed = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [q for q in listed if q["path"] == base] == [fs.quota_get(base)]

    r = run("quota", "rm", base)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"removed the quota of {base} (1 MiB in 1 inode)"
    with pytest.raises(FileNotFoundError):
        fs.quota_get(base)


def test_a_limit_below_usage_is_applied_with_a_warning(run, fs, base):
    fs.pipe_file(f"{base}/a", b"x" * (3 * MiB))
    fs.pipe_file(f"{base}/b", b"y")
    r = run("quota", "set", base, "--bytes", "2M", "--inodes", "1")
    assert r.returncode == 0, r.stderr
    assert base in r.stdout
    warning = r.stderr.strip()
    assert warning.startswith(f"emberfs quota: warning: {base} holds 3 MiB, above its byte")
    assert "2 inodes, above its inode limit of 1" in warning and "EDQUOT" in warning
    q = fs.quota_get(base)
    assert (q["max_bytes"], q["max_inodes"]) == (2 * MiB, 1)
    with pytest.raises(OSError):
        fs.pipe_file(f"{base}/c", b"z")


def test_errors_are_one_line_and_a_nonzero_exit(run, cluster, fs, base):
    fs.pipe_file(f"{base}/file", b"f")
    r = run("quota", "get", base)
    assert (
        r.returncode == 1
        and r.stderr.strip() == f"emberfs quota: {base}: no quota on this directory"
    )
    r = run("quota", "rm", base)
    assert r.returncode == 1 and "no quota on this directory" in r.stderr
    r = run("quota", "set", f"{base}/missing", "--bytes", "1G")
    assert r.returncode == 1 and f"{base}/missing" in r.stderr, r.stderr
    r = run("quota", "set", f"{base}/file", "--bytes", "1G")
    assert r.returncode == 1 and "not a directory" in r.stderr.lower(), r.stderr
    for bad in (["--bytes", "lots"], ["--bytes", "-1"], ["--inodes", "1.5"], ["--inodes", "1k"]):
        r = run("quota", "set", base, *bad)
        assert r.returncode == 2 and "quota set" in r.stderr, (bad, r.stderr)
    assert run("quota", "frob", base).returncode == 2
    assert run("quota", "get").returncode == 2

    user = AdminClient(cluster.admin_url, cluster.admin_token).post(
        "/api/v1/tokens", {"uid": 1000, "gid": 1000, "groups": [], "name": f"q-{uuid.uuid4()}"}
    )["token"]
    r = run("quota", "set", base, "--bytes", "1G", token=user)
    assert r.returncode == 1 and "only root sets quotas" in r.stderr, r.stderr
    with pytest.raises(FileNotFoundError):
        fs.quota_get(base)  # nothing was set
    assert run("quota", "set", base, "--bytes", "1G").returncode == 0
    r = run("quota", "rm", base, token=user)
    assert r.returncode == 1 and "only root removes quotas" in r.stderr, r.stderr
    r = run("quota", "get", base, token=user)  # anyone may read a quota
    assert r.returncode == 0 and base in r.stdout, r.stderr
