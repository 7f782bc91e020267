"""The ``emberfs kvcache`` commands, run as real subprocesses against the shared cluster."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from emberfs.cli.ports import free_port
from emberfs.cli.processes import emberfs_command
from emberfs.kvcache import KVCache, PutStatus

KiB = 1024


@pytest.fixture
def run(cluster):
    def run(*args, env_meta=True, timeout=60):
        env = dict(os.environ)
        env.pop("EMBERFS_META", None)
        if env_meta:
            env["EMBERFS_META"] = cluster.meta_address
        return subprocess.run(
            emberfs_command() + ["kvcache", *args],
            capture_output=True,
            env=env,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def path(fs):
    """A path for a cache (or a plain directory), removed after the test."""
    where = f"/kvcli-{uuid.uuid4().hex[:10]}"
    yield where
    if fs.exists(where):
        fs.rm(where, recursive=True)


def rows(text: str) -> dict[str, str]:
    """The ``label  value`` lines of a command's output."""
    out = {}
    for line in text.splitlines():
        label, _, value = line.partition("  ")
        out[label] = value.strip()
    return out


def test_plan_of_a_70b_model(run):
    args = ["plan", "--layers", "80", "--hidden", "8192", "--users", "10", "--context", "32768"]
    r = run(*args)
    assert r.returncode == 0, r.stderr
    shown = rows(r.stdout)
    assert shown["per token"] == "2,621,440 bytes (2.5 MiB, 2.62 MB)"
    assert shown["per block"] == "41,943,040 bytes (40 MiB, 41.9 MB): 16 tokens"
    assert shown["contexts"] == "10 users x 32,768 tokens"
    assert shown["total"] == "858,993,459,200 bytes (800 GiB, 859 GB)"
    assert shown["blocks"] == "20,480"
    r = run(*args, "--json")
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)
    assert figures["bytes_per_token"] == 2_621_440 == 5 * 2**19
    assert figures["block_size"] == 16 * 2_621_440
    assert figures["total_bytes"] == 858_993_459_200 == 800 * 2**30
    assert figures["blocks"] == 10 * 32768 // 16


def test_plan_of_grouped_query_and_latent_layouts(run):
    # 32 layers, 8 KV heads of 128: 2 x 32 x 8 x 128 x 2 bytes = 128 KiB per token
    r = run("plan", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--json")
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)
    assert (figures["bytes_per_token"], figures["block_size"]) == (128 * KiB, 2 * KiB * KiB)
    assert "users" not in figures
    # one latent tensor of 576 in fp8, 64 tokens a block: 61 x 576 = 35,136 bytes per token
    args = ["--layers", "61", "--kv-heads", "1", "--head-dim", "576", "--kv", "1"]
    r = run("plan", *args, "--dtype", "FP8", "--tokens-per-block", "64")
    assert r.returncode == 0, r.stderr
    shown = rows(r.stdout)
    assert shown["per token"].startswith("35,136 bytes")
    assert shown["per block"].startswith(f"{64 * 35136:,} bytes")
    assert "one latent tensor, fp8 (1 byte)" in shown["model"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--hidden", "8192"), "need --layers"),
        (("--layers", "80"), "--layers needs --hidden"),
        (("--layers", "80", "--hidden", "8192", "--kv-heads", "8"), "not both"),
        (("--layers", "80", "--hidden", "8192", "--users", "10"), "go together"),
        (("--layers", "80", "--hidden", "8192", "--dtype", "int4"), "invalid choice"),
        (("--layers", "0", "--hidden", "8192"), "must be positive"),
    ],
)
def test_plan_usage_errors(run, args, message):
    r = run("plan", *args, env_meta=False)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_create_stats_ls_clear_rm(run, path, fs):
    r = run("create", path, "--block-size", "64KiB", "--capacity", "2MiB", "--slab-size", "1MiB")
    assert r.returncode == 0, r.stderr
    made = rows(r.stdout)
    assert made["KV cache"] == path
    assert made["block size"] == "65,536 bytes (64 KiB)"
    assert made["capacity"] == "32 blocks, 2,097,152 bytes (2 MiB)"
    assert made["slab files"] == "2 of up to 16 blocks"

    cache = KVCache(path, fs=fs)
    assert (cache.block_size, cache.capacity) == (64 * KiB, 32)
    keys = ["prompt/0", "prompt/1", b"\x00\xfe\xff"]
    blocks = [os.urandom(64 * KiB), os.urandom(1000), os.urandom(10 * KiB)]
    assert cache.batch_put(keys, blocks) == [PutStatus.STORED] * 3
    assert cache.batch_get(["prompt/0", "absent", b"\x00\xfe\xff"]) == [blocks[0], None, blocks[2]]

    r = run("stats", path, "--json")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    stored = sum(len(b) for b in blocks)
    assert stats == {
        "path": path,
        "block_size": 64 * KiB,
        "capacity_blocks": 32,
        "capacity_bytes": 2048 * KiB,
        "used_blocks": 3,
        "used_bytes": stored,
        "hits": 2,
        "misses": 1,
        "hit_rate": 2 / 3,
        "hit_bytes": 74 * KiB,
        "puts": 3,
        "put_bytes": stored,
        "evictions": 0,
        "slab_files": 2,
        "slabs_used": 1,
    }
    r = run("stats", path)
    assert r.returncode == 0, r.stderr
    shown = rows(r.stdout)
    assert shown["used"] == f"3 blocks (9.4%), {stored:,} bytes ({stored / KiB:.4g} KiB)"
    assert (shown["hits"], shown["misses"], shown["hit rate"]) == ("2", "1", "66.7%")
    assert shown["bytes read"] == "75,776 bytes (74 KiB)"
    assert shown["evictions"] == "0"

    r = run("ls", path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "00feff",
        f"{b'prompt/0'.hex()}  prompt/0",
        f"{b'prompt/1'.hex()}  prompt/1",
    ]
    r = run("ls", path, "--limit", "2")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2 and "more than 2 keys" in r.stderr
    r = run("ls", path, "--limit", "3")
    assert len(r.stdout.splitlines()) == 3 and r.stderr == ""

    r = run("clear", path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{path}: 3 blocks removed"
    assert cache.get("prompt/0") is None
    assert run("ls", path).stdout == ""
    after = json.loads(run("stats", path, "--json").stdout)
    assert (after["used_blocks"], after["used_bytes"], after["puts"]) == (0, 0, 3)
    assert (after["hits"], after["misses"]) == (2, 2)  # counters are since the cache was made
    assert fs.isdir(path) and len(fs.ls(path)) == 2  # the slab files stay

    r = run("rm", path)
    assert r.returncode == 0, r.stderr
    assert not fs.exists(path)
    r = run("stats", path)
    assert r.returncode == 1 and "no such file" in r.stderr.lower()


def test_create_from_a_model_layout(run, path, cluster, fs):
    # 2 x 2 layers x 2 KV heads x 64 x 2 bytes = 1 KiB per token: 16 KiB blocks
    layout = ["--layers", "2", "--kv-heads", "2", "--head-dim", "64"]
    url = f"emberfs://{cluster.meta_address}{path}"  # the address from the URL
    r = run("create", url, *layout, "--capacity", "256KiB", "--mode", "0700", env_meta=False)
    assert r.returncode == 0, r.stderr
    made = rows(r.stdout)
    assert made["block size"] == "16,384 bytes (16 KiB)"
    assert made["capacity"] == "16 blocks, 262,144 bytes (256 KiB)"
    assert fs.info(path)["mode"] & 0o7777 == 0o700
    info = json.loads(run("stats", path, "--json").stdout)
    assert (info["block_size"], info["capacity_blocks"]) == (16 * KiB, 16)
    r = run("create", path, *layout, "--capacity", "256KiB")
    assert r.returncode == 1 and "exists already" in r.stderr


def test_rounded_slots_are_shown(run, path):
    r = run("create", path, "--block-size", "5000", "--capacity", "80000")
    assert r.returncode == 0, r.stderr
    made = rows(r.stdout)
    assert made["slot size"] == "8,192 bytes (8 KiB) (whole pages)"
    assert made["capacity"] == "9 blocks, 45,000 bytes (43.95 KiB)"  # 80000 // 8192 slots


def test_errors(run, path, fs):
    fs.mkdir(path)
    fs.pipe(f"{path}/file", b"data")
    for sub in ("stats", "ls", "clear", "rm"):
        r = run(sub, path)
        assert r.returncode == 1, (sub, r.stderr)
        assert "not a KV cache" in r.stderr and "Traceback" not in r.stderr
    assert fs.cat(f"{path}/file") == b"data"  # rm removes only a KV cache
    r = run("stats", f"{path}/file")
    assert r.returncode == 1 and "not a KV cache directory" in r.stderr
    r = run("stats", f"{path}/none")
    assert r.returncode == 1 and "no such file" in r.stderr.lower()

    for bad in ("12 parsecs", "inf", "-4k"):
        r = run("create", f"{path}/c", "--block-size", bad, "--capacity", "1MiB")
        assert r.returncode == 2 and "size" in r.stderr and "Traceback" not in r.stderr
    r = run("create", f"{path}/c", "--block-size", "64KiB", "--capacity", "4KiB")
    assert r.returncode == 2 and "holds no block" in r.stderr
    r = run("create", f"{path}/c", "--capacity", "1MiB")
    assert r.returncode == 2 and "--block-size or the model's layout" in r.stderr
    args = ["--block-size", "4k", "--layers", "2", "--hidden", "64", "--capacity", "1MiB"]
    assert run("create", f"{path}/c", *args).returncode == 2
    r = run("create", f"{path}/c", "--block-size", "4k", "--capacity", "1MiB", "--mode", "9")
    assert r.returncode == 2 and "octal" in r.stderr
    assert not fs.exists(f"{path}/c")

    r = run("frobnicate")
    assert r.returncode == 2 and "unknown subcommand" in r.stderr
    r = run("stats", path, "--meta", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert r.returncode == 3 and "cannot reach the EmberFS cluster" in r.stderr
