"""The chaos checker: its model and schedule (pure), and a short run on a local cluster.

The short run is the checker's CI form: real processes, at least 12 faults (kill -9,
SIGSTOP shorter and longer than the heartbeat timeout, metaserver restarts), and no
violation may be found.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

model = importlib.import_module("benchmarks.chaos_model")
faults = importlib.import_module("benchmarks.chaos_faults")
cluster = importlib.import_module("benchmarks.chaos_cluster")

KiB = 1024


# the content scheme ----------------------------------------------------------------------------
def test_pattern_is_the_same_bytes_from_any_start():
    whole = model.pattern_bytes(7, 3, 0, 5000)
    assert model.pattern_bytes(7, 3, 1234, 4321) == whole[1234:4321]
    assert model.pattern_bytes(7, 3, 17, 17) == b""
    assert model.pattern_bytes(7, model.ZERO, 10, 30) == bytes(20)


def test_a_cell_names_its_file_write_and_offset():
    cell = model.pattern_bytes(42, 9, 4096, 4096 + model.CELL)
    assert model.decode_cell(cell) == (42, 9, 4096)
    assert model.decode_cell(bytes(model.CELL)) is None
    broken = bytearray(cell)
    broken[5] ^= 1
    assert model.decode_cell(bytes(broken)) is None
    # two writes of one file at one offset differ
    assert model.pattern_bytes(42, 9, 0, 64) != model.pattern_bytes(42, 10, 0, 64)


# the map of write ids ------------------------------------------------------------------------
def test_content_map_assigns_adds_and_merges():
    m = model.ContentMap()
    m.assign(10, 20, 1)
    m.add(15, 30, 2)
    assert m.pieces(0, 40) == [
        (0, 10, frozenset({0})),
        (10, 15, frozenset({1})),
        (15, 20, frozenset({1, 2})),
        (20, 30, frozenset({0, 2})),
        (30, 40, frozenset({0})),
    ]
    assert not m.certain()
    m.assign(0, model.INF, 0)
    assert m.bounds == [0] and m.certain()


# the file model ------------------------------------------------------------------------------
def _written(fm, start, end, ok=True, whole=False):
    wid = fm.new_write(0, start, end)
    (fm.write_whole if whole else fm.write_at)(wid, ok, 0)
    return wid


def test_acknowledged_writes_read_back_exactly():
    fm = model.FileModel(5, {"/f"})
    w1 = _written(fm, 0, 1000, whole=True)
    w2 = _written(fm, 300, 1300)
    assert fm.certain and fm.lengths == {1300}
    good = model.pattern_bytes(5, w1, 0, 300) + model.pattern_bytes(5, w2, 300, 1300)
    assert fm.expected(0, 1300) == good
    assert model.check_read(fm, 0, good) == []
    assert fm.read_lengths(0, None) == {1300} and fm.read_lengths(1200, 5000) == {100}


def test_bytes_of_a_replaced_write_are_a_stale_read():
    fm = model.FileModel(5, {"/f"})
    w1 = _written(fm, 0, 1000, whole=True)
    w2 = _written(fm, 200, 400)
    got = model.pattern_bytes(5, w1, 0, 1000)  # the overwrite is missing
    (run,) = model.check_read(fm, 0, got)
    assert run.stale and run.source == w1 and run.allowed == [w2]
    assert 200 <= run.start < run.end <= 400
    # zeros where an acknowledged write was: stale too (the chunk went back to empty)
    zeros = bytearray(fm.expected(0, 1000))
    zeros[600:700] = bytes(100)
    (run,) = model.check_read(fm, 0, bytes(zeros))
    assert run.source == model.ZERO and run.stale


def test_bytes_no_write_put_there_are_never_written_and_say_whose_they_are():
    fm = model.FileModel(5, {"/f"})
    _written(fm, 0, 1000, whole=True)
    got = bytearray(fm.expected(0, 1000))
    got[512:576] = model.pattern_bytes(8, 3, 64, 128)  # another file's bytes, another offset
    (run,) = model.check_read(fm, 0, bytes(got))
    assert not run.stale and run.source is None
    assert run.decoded[0] == {"offset": 512, "file": 8, "write": 3, "written_at": 64}


def test_a_failed_write_allows_both_contents_until_a_whole_write():
    fm = model.FileModel(5, {"/f"})
    w1 = _written(fm, 0, 1000, whole=True)
    w2 = _written(fm, 500, 1500, ok=False)
    assert not fm.certain and fm.lengths == {1000, 1500}
    old = model.pattern_bytes(5, w1, 0, 1000)
    half = old[:500] + model.pattern_bytes(5, w2, 500, 800) + old[800:]
    assert model.check_read(fm, 0, old) == []
    assert model.check_read(fm, 0, half) == []
    assert fm.expected(0, 1000) is None
    # a later acknowledged write over part of it is exact there again
    w3 = _written(fm, 0, 600)
    first, second = model.check_read(fm, 0, half)
    # a run spans the bytes that differ (bytes both writes share are right either way)
    assert (first.source, first.allowed, second.source) == (w1, [w3], w2)
    assert first.start < 16 and 480 < first.end <= 500 <= second.start < 520 < second.end <= 600
    _written(fm, 0, 10, whole=True)
    assert fm.certain and fm.lengths == {10} and fm.uncertain_since is None


def test_truncation_cuts_to_zeros_and_growing_reads_zeros():
    fm = model.FileModel(5, {"/f"})
    w1 = _written(fm, 0, 1000, whole=True)
    fm.truncate(100, True, 1)
    fm.truncate(700, True, 2)
    assert fm.expected(0, 700) == model.pattern_bytes(5, w1, 0, 100) + bytes(600)
    # a shrink that failed may or may not have cut
    fm.truncate(50, False, 3)
    assert fm.lengths == {50, 700}
    assert model.check_read(fm, 0, fm.expected(0, 50) + bytes(650)) == []
    assert fm.read_lengths(0, None) == {50, 700}
    assert fm.observe_length(700) and fm.lengths == {700}
    assert not fm.observe_length(3)


def test_a_whole_write_over_an_empty_file_keeps_what_a_failed_write_left_past_its_end():
    fm = model.FileModel(5, {"/f"})
    w1 = _written(fm, 0, 1000, ok=False)  # may have left bytes past the length 0
    fm.observe_length(0)
    _written(fm, 0, 10, whole=True)  # an empty file is not cut when opened with truncation
    fm.truncate(1000, True, 2)
    pieces = fm.content.pieces(10, 1000)
    assert pieces == [(10, 1000, frozenset({0, w1}))]


def test_rename_and_remove_that_failed_leave_two_places():
    fm = model.FileModel(5, {"/a"})
    fm.moved("/a", "/b", False, 1)
    assert fm.path is None and fm.paths == {"/a", "/b"}
    fm.resolved("/b")
    fm.unlinked(False, 2)
    assert fm.paths == {"/b", None} and not fm.removed
    fm.unlinked(True, 3)
    assert fm.removed


# the schedule ----------------------------------------------------------------------------------
def test_a_seed_gives_the_same_schedule_and_each_round_its_own():
    a = faults.plan_round(7, 3, faults.LOCAL_KINDS, 3, 2.0)
    assert a == faults.plan_round(7, 3, faults.LOCAL_KINDS, 3, 2.0)
    assert a != faults.plan_round(8, 3, faults.LOCAL_KINDS, 3, 2.0)
    assert a != faults.plan_round(7, 4, faults.LOCAL_KINDS, 3, 2.0)


def test_the_schedule_keeps_to_its_kinds_and_durations():
    hb = 2.0
    for k in range(50):
        rnd = faults.plan_round(1, k, faults.LOCAL_KINDS, 4, hb)
        assert 3 <= len(rnd.storage) <= 5 and len(rnd.meta) <= 2
        for f in rnd.storage:
            assert f.kind in ("storage_kill", "storage_pause_short", "storage_pause_long")
            assert 0 <= f.victim < 4
            if f.kind == "storage_pause_short":
                assert f.duration < hb
            if f.kind == "storage_pause_long":
                assert f.duration > hb
        assert all(f.kind == "meta_kill" and f.victim is None for f in rnd.meta)
    only_kills = faults.plan_round(1, 0, ("storage_kill",), 3, hb)
    assert {f.kind for f in only_kills.storage} == {"storage_kill"} and only_kills.meta == []


class FakeDriver:
    servers = 3

    def __init__(self, fail_start: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail_start = fail_start

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, *args))
            if name == "start_storage" and self.fail_start:
                raise RuntimeError("port in use")
            return True

        return call


def test_the_runner_breaks_then_heals_and_reports_what_it_could_not_heal():
    rnd = faults.Round(
        index=0,
        storage=[
            faults.Fault("storage_kill", 1, 0.01, 0.0, True),
            faults.Fault("storage_pause_long", 2, 0.01, 0.0, False),
        ],
        meta=[faults.Fault("meta_kill", None, 0.01, 0.0, False)],
        meta_delay=0.0,
        quiet=0.0,
    )
    driver, found = FakeDriver(), []
    runner = faults.FaultRunner(driver, lambda kind, detail: found.append(kind))
    runner.run_round(rnd)
    storage = [c for c in driver.calls if c[0] not in ("kill_meta", "start_meta")]
    assert storage == [
        ("kill_storage", 1),
        ("start_storage", 1),
        ("wait_serving", 90),
        ("pause_storage", 2),
        ("resume_storage", 2),
    ]
    assert [c for c in driver.calls if c[0] in ("kill_meta", "start_meta")] == [
        ("kill_meta",),
        ("start_meta",),
    ]
    assert runner.counts() == {"storage_kill": 1, "storage_pause_long": 1, "meta_kill": 1}
    assert all(r.healed >= r.start > 0 for r in runner.log) and found == []

    broken = faults.FaultRunner(FakeDriver(fail_start=True), lambda k, d: found.append(k))
    rec = broken.apply(rnd, rnd.storage[0])
    assert found == ["restart_failed"] and "port in use" in rec.notes[0]


# replica agreement ---------------------------------------------------------------------------
def test_replica_differences_name_the_chunk_and_every_replica():
    from emberfs.proto import common_pb2

    routing = common_pb2.RoutingInfo(
        targets=[common_pb2.TargetInfo(target_id=t, grpc_address=f"s{t}") for t in (1, 2, 3)],
        chains=[common_pb2.ChainInfo(chain_id=9, targets=[1, 2, 3])],
    )
    same = (4, 0, 100, 77)
    listings = {
        1: {(5, 0): same, (5, 1): (2, 0, 10, 1), (6, 0): same},
        2: {(5, 0): same, (5, 1): (3, 0, 10, 2), (6, 0): same},
        3: {(5, 0): same, (6, 0): (4, 5, 100, 77)},
    }
    diffs = cluster.replica_differences(routing, lambda addr, tid: listings[tid])
    assert [(d["inode"], d["index"]) for d in diffs] == [(5, 1), (6, 0)]
    assert diffs[0]["replicas"]["3"] is None
    assert diffs[1]["replicas"]["3"]["pending"] == 5
    whole = {t: {(5, 0): same} for t in (1, 2, 3)}
    assert cluster.replica_differences(routing, lambda addr, tid: whole[tid]) == []


# the checker against a real cluster -----------------------------------------------------------
@pytest.mark.slow
def test_the_workload_reports_a_write_that_never_reached_storage(cluster, tmp_path):
    """A write the model counts as acknowledged but that was never sent reads as stale, and
    as lost once checked after the heal; the file waits for that check."""
    workload = importlib.import_module("benchmarks.chaos_workload")
    history = tmp_path / "client.jsonl"
    w = workload.Workload(
        workload.ClientConfig(
            0, 1, cluster.meta_address, "/chaos-canary", 256 * KiB, str(history), max_files=3
        )
    )
    try:
        w.fs.makedirs(w.dir, exist_ok=True)
        w.create()
        w.create()
        fm = next(iter(w.files.values()))
        w.overwrite(fm, "overwrite_in_chunk", 0, 5000)  # a real write: the file has 5000 bytes
        wid = fm.new_write(0, 1000, 3000)
        fm.write_at(wid, True, 0)  # as if acknowledged; nothing was written
        w.read_back(fm, 0, None)
        assert w.held == {fm.file_id} and fm not in w.live()
        for _ in range(10):
            w.step()
        w.verify(1)
        assert w.held == set() and fm.file_id in w.force_rewrite
    finally:
        w.close()
    found = [json.loads(line) for line in history.read_text().splitlines()]
    kinds = [(v["kind"], v["file"]) for v in found if v["type"] == "violation"]
    assert kinds == [("stale_read", fm.file_id), ("lost_write", fm.file_id)]
    run = next(v for v in found if v["type"] == "violation")["detail"]["runs"][0]
    assert run["allowed_writes"] == [wid] and run["found_write"] != wid
    assert 1000 <= run["start"] < run["end"] <= 3000


# the short run -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_short_run_finds_no_violation(tmp_path):
    out = tmp_path / "summary.json"
    argv = [
        sys.executable,
        "-m",
        "benchmarks.chaos",
        "--faults",
        "12",
        "--clients",
        "3",
        "--seed",
        "20",
        "--data-dir",
        str(tmp_path / "run"),
        "--json-out",
        str(out),
    ]
    env = dict(os.environ)
    env.pop("EMBERFS_META", None)
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, err = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: it stops its cluster and clients, then exits
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"the checker did not finish:\n{err[-4000:]}")
    r = subprocess.CompletedProcess(argv, proc.returncode, "", err)
    assert r.returncode in (0, 1), f"the checker could not run:\n{r.stderr[-4000:]}"
    summary = json.loads(out.read_text())
    assert summary["faults"]["total"] >= 12
    assert summary["bytes_verified"]["exact_after_heal"] > 0
    assert summary["violations"]["by_kind"] == {}, r.stderr[-6000:]
    assert r.returncode == 0
