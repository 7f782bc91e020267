"""Group commit of the KV engines: concurrent commits share one batch, each keeps its own check."""

from __future__ import annotations

import threading
import time

import pytest

from emberfs.metaserver.store.kv import Conflict, MemoryEngine, RocksEngine, run_transaction


class SlowEngine(MemoryEngine):
    """A memory engine whose batches take a while, like a synced WAL write."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.batches = 0

    def _apply(self, puts, deletes):
        self.batches += 1
        time.sleep(self.delay)
        super()._apply(puts, deletes)


def _increment(engine, key: bytes) -> None:
    def fn(txn):
        value = int(txn.get(key) or b"0")
        txn.put(key, str(value + 1).encode())

    run_transaction(engine, fn, attempts=1000)


def _hammer(engine, threads: int, per_thread: int, keys: list[bytes]) -> None:
    def work(t: int) -> None:
        for i in range(per_thread):
            _increment(engine, keys[(t + i) % len(keys)])

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(60)
    assert not any(th.is_alive() for th in pool)


def test_concurrent_commits_share_batches_and_lose_no_update():
    engine = SlowEngine(delay=0.005)
    keys = [b"a", b"b", b"c"]
    _hammer(engine, threads=8, per_thread=25, keys=keys)
    assert sum(int(engine.get(k)) for k in keys) == 8 * 25
    assert engine.batches < 8 * 25  # commits were grouped


def test_a_group_rejects_a_commit_whose_read_an_earlier_one_changed():
    class HeldLeader(MemoryEngine):
        """A group's leader waits at the gate before it validates and writes the group."""

        def __init__(self) -> None:
            super().__init__()
            self.gate = threading.Event()

        def _commit_group(self, group):
            self.gate.wait(5)  # hold the leader until both commits are queued
            super()._commit_group(group)

    engine = HeldLeader()
    engine.write({b"k": b"0"})
    # both read k == 0; committed as one group, the second must fail
    first = engine.transaction()
    second = engine.transaction()
    for txn, value in ((first, b"1"), (second, b"2")):
        assert txn.get(b"k") == b"0"
        txn.put(b"k", value)
    barrier = threading.Barrier(2)
    outcome: dict[str, object] = {}

    def commit(name, txn):
        barrier.wait()
        try:
            txn.commit()
            outcome[name] = "ok"
        except Conflict:
            outcome[name] = "conflict"

    threads = [
        threading.Thread(target=commit, args=(n, t)) for n, t in (("1", first), ("2", second))
    ]
    for th in threads:
        th.start()
    time.sleep(0.2)
    engine.gate.set()
    for th in threads:
        th.join(5)
    assert sorted(outcome.values()) == ["conflict", "ok"]
    winner = "1" if outcome["1"] == "ok" else "2"
    assert engine.get(b"k") == winner.encode()


def test_a_failed_batch_fails_every_commit_of_its_group():
    class Broken(MemoryEngine):
        def _apply(self, puts, deletes):
            raise OSError("disk gone")

    engine = Broken()
    txn = engine.transaction()
    txn.put(b"x", b"1")
    with pytest.raises(OSError, match="disk gone"):
        txn.commit()
    assert engine.get(b"x") is None


def test_rocks_engine_group_commit_keeps_every_increment(tmp_path):
    engine = RocksEngine(tmp_path / "db")
    try:
        _hammer(engine, threads=6, per_thread=20, keys=[b"n"])
        assert int(engine.get(b"n")) == 120
    finally:
        engine.close()
    reopened = RocksEngine(tmp_path / "db")
    try:
        assert int(reopened.get(b"n")) == 120
    finally:
        reopened.close()
