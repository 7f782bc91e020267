"""Namespace calls of many threads ride together: the Combiner, and through a real cluster."""

from __future__ import annotations

import errno
import os
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from emberfs.client.meta import Combiner, MetaClient


def test_a_call_alone_goes_alone_and_overlapping_calls_go_together():
    sent: list[list] = []
    release = threading.Event()

    def send(items):
        sent.append(list(items))
        if len(sent) == 1:
            release.wait(5)  # the first call is slow: the others queue behind it
        return [f"done {i}" if i != "bad" else OSError(errno.EEXIST, "exists", i) for i in items]

    combiner = Combiner(send)
    results: dict = {}

    def call(item):
        try:
            results[item] = combiner.call(item)
        except OSError as exc:
            results[item] = exc

    first = threading.Thread(target=call, args=("a",))
    first.start()
    while not sent:
        threading.Event().wait(0.001)
    others = [threading.Thread(target=call, args=(x,)) for x in ("b", "bad", "c", "d")]
    for t in others:
        t.start()
    while combiner.queued() < 4:
        threading.Event().wait(0.001)
    release.set()
    for t in [first, *others]:
        t.join(5)
    assert sent[0] == ["a"]
    assert sorted(sent[1]) == ["b", "bad", "c", "d"] and len(sent) == 2
    assert results["a"] == "done a" and results["d"] == "done d"
    assert isinstance(results["bad"], FileExistsError) and results["bad"].filename == "bad"
    assert combiner.call("e") == "done e" and sent[-1] == ["e"]


def test_a_failed_batch_fails_each_of_its_calls():
    def send(items):
        raise ConnectionError("metaserver gone")

    combiner = Combiner(send)
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda i: _outcome(combiner.call, i), range(20)))
    assert all(isinstance(o, ConnectionError) for o in outcomes)
    assert combiner.queued() == 0
    assert isinstance(_outcome(combiner.call, "later"), ConnectionError)  # nothing stuck


def test_callers_of_a_finished_call_that_call_again_ride_the_next_one_together():
    """Threads calling in a loop stay in one group: each call carries all of them.

    Without waiting for them, a call that ends hands over to the callers
    queued meanwhile, and its own callers queue behind that: the threads
    split into groups taking turns (one and seven of eight).
    """
    sent: list[int] = []

    def send(items):
        sent.append(len(items))
        threading.Event().wait(0.02)
        return list(items)

    combiner = Combiner(send)
    combiner.MAX_LINGER = 0.5  # the call's quarter, 5 ms, bounds the wait

    def loop(t):
        for i in range(12):
            assert combiner.call((t, i)) == (t, i)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(loop, range(8)))
    assert sum(sent) == 96
    steady = sent[2:-2]
    assert sum(1 for n in steady if n == 8) >= 0.8 * len(steady), sent


def test_a_caller_that_comes_back_alone_is_not_held_past_the_wait():
    sent: list[list] = []
    gate = threading.Barrier(3)

    def send(items):
        if not sent:
            threading.Event().wait(0.2)  # the others queue behind the first call
        sent.append(sorted(items))
        return list(items)

    combiner = Combiner(send)
    combiner.MAX_LINGER = 0.05
    threads = [threading.Thread(target=lambda x=x: (gate.wait(), combiner.call(x))) for x in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sorted(x for batch in sent for x in batch) == ["a", "b", "c"]
    # only one of the last call's callers calls again: it goes once the wait is over
    assert combiner.call("d") == "d" and sent[-1] == ["d"]


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        return exc


def calls_of(cluster, method: str) -> float:
    with urllib.request.urlopen(cluster.admin_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("emberfs_meta_request_duration_seconds_count{") and (
            f'method="{method}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.slow
def test_files_written_from_many_threads_share_namespace_calls(cluster, fs):
    root = "/combined"
    fs.makedirs(root, exist_ok=True)
    datas = {f"{root}/f{i:03d}": os.urandom(1000 + 37 * i) for i in range(120)}
    before = {m: calls_of(cluster, m) for m in ("BatchWriteOpen", "BatchClose", "Open", "Close")}

    def write(item):
        path, data = item
        with fs.open(path, "wb") as f:
            f.write(data)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, datas.items()))
    after = {m: calls_of(cluster, m) for m in before}
    assert fs.cat(list(datas)) == datas
    opens = after["Open"] - before["Open"] + after["BatchWriteOpen"] - before["BatchWriteOpen"]
    closes = after["Close"] - before["Close"] + after["BatchClose"] - before["BatchClose"]
    # every file was opened and closed once, and threads that overlapped shared calls
    assert after["BatchWriteOpen"] > before["BatchWriteOpen"]
    assert opens < len(datas) and closes < len(datas)
    assert all(info["size"] == len(datas[info["name"]]) for info in fs.ls(root, detail=True))


@pytest.mark.slow
def test_creates_of_many_threads_answer_each_path(cluster):
    client = MetaClient(cluster.meta_address)
    client.mkdir("/creates", parents=True)
    client.create("/creates/exists")
    paths = [f"/creates/c{i}" for i in range(200)] + ["/creates/exists"] * 8
    before = calls_of(cluster, "BatchCreate")
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda p: _outcome(client.create, p, 0o600, True), paths))
    made = [o for o in outcomes[:200]]
    assert all(o.mode & 0o777 == 0o600 for o in made), made
    assert len({o.inode for o in made}) == 200
    assert all(isinstance(o, FileExistsError) for o in outcomes[200:])
    assert calls_of(cluster, "BatchCreate") > before
    listed = {e.name for e in client.list("/creates")}
    assert listed == {p.rsplit("/", 1)[1] for p in paths}
