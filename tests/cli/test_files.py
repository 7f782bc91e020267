"""The file commands of the ``emberfs`` CLI, run as real subprocesses."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from emberfs.cli.processes import emberfs_command

MiB = 1024 * 1024


@pytest.fixture
def run(cluster):
    def run(*args, env_meta=True, input=None, timeout=60):
        env = dict(os.environ)
        env.pop("EMBERFS_META", None)
        if env_meta:
            env["EMBERFS_META"] = cluster.meta_address
        return subprocess.run(
            emberfs_command() + list(args),
            capture_output=True,
            env=env,
            input=input,
            timeout=timeout,
        )

    return run


@pytest.fixture
def base(run):
    path = f"/cli-{uuid.uuid4().hex[:10]}"
    assert run("mkdir", path).returncode == 0
    yield path
    run("rm", "-r", "-f", path)


def test_put_cat_get_roundtrip(run, base, tmp_path):
    data = os.urandom(9 * MiB + 5)
    local = tmp_path / "in.bin"
    local.write_bytes(data)
    r = run("put", str(local), f"{base}/x.bin")
    assert r.returncode == 0, r.stderr
    r = run("cat", f"{base}/x.bin")
    assert r.returncode == 0 and r.stdout == data
    out = tmp_path / "out.bin"
    r = run("get", f"{base}/x.bin", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == data


def test_cat_pipes_into_a_reader(run, base, tmp_path, cluster):
    data = os.urandom(3 * MiB)
    (tmp_path / "s.tar").write_bytes(data)
    assert run("put", str(tmp_path / "s.tar"), f"{base}/s.tar").returncode == 0
    env = dict(os.environ, EMBERFS_META=cluster.meta_address)
    cmd = " ".join(emberfs_command() + ["cat", f"{base}/s.tar"])
    r = subprocess.run(f"{cmd} | head -c 100", shell=True, capture_output=True, env=env, timeout=60)
    assert r.stdout == data[:100]
    assert b"Traceback" not in r.stderr


def test_ls_stat_mkdir_mv_rm(run, base, cluster):
    assert run("mkdir", f"{base}/a/b").returncode == 1  # no -p: parent missing
    assert run("mkdir", "-p", f"{base}/a/b").returncode == 0
    assert run("mkdir", "-p", f"{base}/a/b").returncode == 0
    r = run("put", "/dev/null", f"{base}/a/empty")
    assert r.returncode == 0, r.stderr
    r = run("ls", f"{base}/a")
    assert r.stdout.decode().split() == ["b/", "empty"]
    r = run("ls", "-l", f"{base}/a")
    assert "drwx" in r.stdout.decode() and "-rw-" in r.stdout.decode()
    r = run("stat", f"{base}/a/empty")
    assert "type: file" in r.stdout.decode() and "size: 0" in r.stdout.decode()
    r = run("stat", "--json", f"{base}/a")
    assert '"type": "directory"' in r.stdout.decode()
    assert run("mv", f"{base}/a/empty", f"{base}/a/b").returncode == 0
    assert run("ls", f"{base}/a/b").stdout.decode().split() == ["empty"]
    # a URL carries the metaserver address; no environment needed
    url = f"emberfs://{cluster.meta_address}{base}/a/b"
    assert run("ls", url, env_meta=False).stdout.decode().split() == ["empty"]
    r = run("rm", f"{base}/a")
    assert r.returncode == 1 and b"is a directory" in r.stderr
    assert run("rm", "-r", f"{base}/a").returncode == 0
    assert run("ls", base).stdout == b""


def test_put_get_trees(run, base, tmp_path):
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "f1").write_bytes(b"one")
    (src / "sub" / "f2").write_bytes(os.urandom(5 * MiB))
    r = run("put", str(src), f"{base}/tree")
    assert r.returncode == 1 and b"use -r" in r.stderr
    r = run("put", "-r", "--progress", str(src), f"{base}/tree")
    assert r.returncode == 0, r.stderr
    assert run("cat", f"{base}/tree/f1").stdout == b"one"
    out = tmp_path / "back"
    r = run("get", "-r", f"{base}/tree", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "sub" / "f2").read_bytes() == (src / "sub" / "f2").read_bytes()


@pytest.mark.parametrize(
    "args, code, message",
    [
        (("cat", "/no/such/file"), 1, b"No such file"),
        (("ls", "/no/such/dir"), 1, b"No such file"),
        (("stat", "/no/such"), 1, b"No such file"),
        (("rm", "/no/such"), 1, b"No such file"),
        (("mv", "/no/such", "/elsewhere"), 1, b"No such file"),
        (("get", "/no/such", "/tmp/x"), 1, b"No such file"),
        (("put", "/no/such/local", "/x"), 1, b"No such file"),
    ],
)
def test_clear_errors(run, args, code, message):
    r = run(*args)
    assert r.returncode == code
    assert message.lower() in r.stderr.lower()
    assert b"Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_exists_and_not_a_directory_errors(run, base, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    assert run("put", str(tmp_path / "f"), f"{base}/f").returncode == 0
    r = run("mkdir", f"{base}/f")
    assert r.returncode == 1 and b"exists" in r.stderr.lower()
    r = run("ls", f"{base}/f/below")
    assert r.returncode == 1 and b"not a directory" in r.stderr.lower()
    assert b"Traceback" not in r.stderr


def test_unreachable_cluster(run):
    r = run("ls", "--meta", "127.0.0.1:1", "--timeout", "1", "/", env_meta=False)
    assert r.returncode == 3
    assert b"cannot reach" in r.stderr and b"127.0.0.1:1" in r.stderr
    assert b"Traceback" not in r.stderr


def test_usage_errors(run):
    r = run("cat")
    assert r.returncode == 2 and b"usage" in r.stderr
    r = run("ls", "--help")
    assert r.returncode == 0 and b"--meta" in r.stdout
