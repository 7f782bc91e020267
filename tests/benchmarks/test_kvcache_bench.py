"""The KV cache benchmark (``benchmarks.kvcache``): its checks of the data, and its quick form.

Nothing here asserts a speed: the run must complete, leave nothing behind, report every figure
as a positive number, and have checked every block it read against the bytes that were put.
"""

from __future__ import annotations

import importlib
import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

kv_bench = importlib.import_module("benchmarks.kvcache")
from tests.benchmarks.test_bench_smoke import run_bench  # noqa: E402

GETS = ["get_slab", "get_one_file", "get_files_cat", "get_files_readinto"]
PUTS = ["put_slab", "put_one_file", "put_files"]
EXISTS = [f"exists_{w}_{q}" for q in ("mixed", "all") for w in ("slab", "files_exists", "files_ls")]


def test_a_wrong_byte_or_a_miss_fails_the_check():
    pool = kv_bench.Pool(4096, 3, random.Random(1))
    _, expected = pool.batch()
    buffers = [bytearray(b) for b in expected]
    kv_bench.check_blocks("get", [4096] * 3, buffers, expected)
    with pytest.raises(kv_bench.DataError, match="block 1 of 3 missed"):
        kv_bench.check_blocks("get", [4096, None, 4096], buffers, expected)
    with pytest.raises(kv_bench.DataError, match="wrong bytes in block 2"):
        kv_bench.check_blocks("get", [4096, 4096, 4000], buffers, expected)
    buffers[0][17] ^= 1
    with pytest.raises(kv_bench.DataError, match="wrong bytes in block 0"):
        kv_bench.check_blocks("get", [4096] * 3, buffers, expected)
    # a read that wrote nothing into its buffer is seen: the buffer was overwritten before it
    kv_bench.poison(buffers)
    assert all(b == bytes([kv_bench.POISON]) * 4096 for b in buffers)
    with pytest.raises(kv_bench.DataError, match="wrong bytes in block 0"):
        kv_bench.check_blocks("get", [4096] * 3, buffers, expected)


def test_each_new_batch_holds_bytes_of_its_own():
    pool = kv_bench.Pool(4096, 4, random.Random(2))
    whole, stored = pool.batch()
    assert whole == b"".join(stored) and len(stored) == 4
    seen = set(stored)
    for _ in range(5):
        fresh_whole, fresh = pool.fresh()
        assert fresh_whole == b"".join(fresh) and all(len(b) == 4096 for b in fresh)
        assert not seen & set(fresh)
        seen |= set(fresh)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kvcache_bench_quick(tmp_path):
    out = tmp_path / "kvcache.json"
    work = tmp_path / "work"
    argv = [
        sys.executable,
        "-m",
        "benchmarks.kvcache",
        "--quick",
        "--json",
        str(out),
        "--workdir",
        str(work),
    ]
    proc = run_bench(argv, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert list(work.iterdir()) == []  # nothing is left behind

    config = doc["config"]
    assert config["quick"] is True and config["replicas"] == 3
    rounds, passes = config["rounds"], config["passes"]
    layout = config["layout"]
    assert layout["block_size"] == layout["bytes_per_token"] * layout["tokens_per_block"] > 0
    assert doc["machine"]["nproc"] > 0 and doc["machine"]["kernel"]
    assert doc["command"].startswith("python -m benchmarks.kvcache --quick")

    sizes = {"large": (layout["block_size"], config["blocks"])}
    sizes["small"] = (config["small_block_size"], config["small_blocks"])
    for name, (block_size, blocks) in sizes.items():
        case = doc["cases"][name]
        assert (case["block_size"], case["blocks"]) == (block_size, blocks)
        assert case["batch_bytes"] == block_size * blocks
        assert len(case["rounds"]) == rounds
        for r in case["rounds"]:
            assert set(r) == set(GETS + PUTS)
            for key in GETS + PUTS:
                fig = r[key]
                assert fig["bytes_per_s"] > 0 and fig["seconds"] > 0, (name, key)
                want = passes if key in GETS else 1
                assert fig["batches"] == want and fig["bytes"] == want * block_size * blocks
                assert fig["meta_calls"], (name, key)  # every one asks the metaserver
            # the metaserver calls of a batch: one lookup per get, a reservation and a commit
            assert r["get_slab"]["meta_calls"] == {"KvLookup": passes}
            assert r["put_slab"]["meta_calls"] == {"KvReserve": 1, "KvCommit": 1}
            assert r["get_files_readinto"]["meta_calls"] == {"Open": passes * blocks}
        for key in GETS + PUTS:
            assert case["figures"][key]["median"] > 0, (name, key)
        assert set(case["ratios"]) == {k for k, *_ in kv_bench.CASE_PAIRS}
        assert all(s["median"] > 0 for s in case["ratios"].values())
        # a block in the slab store makes no inode; a file per block makes one each
        assert case["inodes_per_block"]["slab"] == 0
        assert case["inodes_per_block"]["files"] == 1
        assert case["slab_files"] >= 1 and case["capacity_blocks"] >= blocks
        # every read was checked against what was put, block by block
        checked = doc["verified_blocks"][name]
        for key in GETS:
            assert checked[key] == blocks * passes * (rounds + config["warmup"]), (name, key)
        assert checked["put_slab"] == blocks * (rounds + config["warmup"])
        stats = doc["cache_stats"][name]
        assert stats["misses"] == 0 and stats["evictions"] == 0 and stats["hits"] > 0

    exists = doc["exists"]
    assert exists["keys"] == config["exists_keys"]
    assert exists["stored_prefix_of_mixed"] == config["exists_keys"] // 2
    for r in exists["rounds"]:
        assert set(r) == set(EXISTS)
        for key in EXISTS:
            assert r[key]["keys_per_s"] > 0 and r[key]["keys"] == passes * exists["keys"], key
    assert all(exists["figures"][k]["median"] > 0 for k in EXISTS)
    assert all(s["median"] > 0 for s in exists["ratios"].values())

    target = doc["target"]
    assert target["target"] == 0.8 and target["ratio"] > 0 and target["rounds"] == rounds
    assert 0 <= target["rounds_met"] <= rounds
    assert len(doc["other_processes"]) == rounds
    for heading in ("KV cache block store", "batch_get / readinto of one file", "metaserver calls"):
        assert heading in proc.stdout
    assert "round 1/1" in proc.stderr
