"""The KV interface behaves the same on the RocksDB, in-memory and etcd engines."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from emberfs.metaserver.store import kv


def _engine(kind, tmp_path, request):
    if kind == "memory":
        return kv.MemoryEngine()
    if kind == "rocksdb":
        return kv.RocksEngine(tmp_path / "db")
    from emberfs.metaserver.store.etcd import EtcdEngine

    return EtcdEngine(request.getfixturevalue("etcd_url"))


@pytest.fixture(params=["memory", "rocksdb", "etcd"])
def engine(request, tmp_path):
    e = _engine(request.param, tmp_path, request)
    yield e
    e.close()


@pytest.fixture(params=["memory", "rocksdb"])
def local_engine(request, tmp_path):
    """The engines one process owns (group commits, the version shortcut)."""
    e = _engine(request.param, tmp_path, request)
    yield e
    e.close()


def test_get_put_delete(engine):
    assert engine.get(b"a") is None
    engine.write({b"a": b"1", b"b": b"2"})
    assert engine.get(b"a") == b"1"
    engine.write({}, {b"a"})
    assert engine.get(b"a") is None
    assert engine.get(b"b") == b"2"


def test_scan_ranges_and_prefixes(engine):
    engine.write({b"p/a": b"1", b"p/b": b"2", b"p/c": b"3", b"q/a": b"4", b"o": b"0"})
    assert [k for k, _ in engine.scan(b"p/", b"p/c")] == [b"p/a", b"p/b"]
    assert [k for k, _ in engine.scan_prefix(b"p/")] == [b"p/a", b"p/b", b"p/c"]
    assert [k for k, _ in engine.scan_prefix(b"p/", start_after=b"p/a")] == [b"p/b", b"p/c"]
    assert [k for k, _ in engine.scan_prefix(b"p/", limit=2)] == [b"p/a", b"p/b"]
    assert [k for k, _ in engine.scan(b"q", None)] == [b"q/a"]


def test_prefix_end():
    assert kv.prefix_end(b"ab") == b"ac"
    assert kv.prefix_end(b"a\xff") == b"b"
    assert kv.prefix_end(b"\xff\xff") is None


def test_transaction_sees_own_writes_and_commits_atomically(engine):
    engine.write({b"k1": b"old", b"k3": b"x"})
    txn = engine.transaction()
    txn.put(b"k2", b"new")
    txn.delete(b"k3")
    assert txn.get(b"k2") == b"new"
    assert txn.get(b"k3") is None
    assert [k for k, _ in txn.scan_prefix(b"k")] == [b"k1", b"k2"]
    assert engine.get(b"k2") is None  # nothing visible before commit
    txn.commit()
    assert engine.get(b"k2") == b"new" and engine.get(b"k3") is None


def test_conflicting_transaction_is_refused(engine):
    engine.write({b"counter": b"1"})
    t1 = engine.transaction()
    t2 = engine.transaction()
    t1.get(b"counter")
    t2.get(b"counter")
    t1.put(b"counter", b"2")
    t2.put(b"counter", b"3")
    t1.commit()
    with pytest.raises(kv.Conflict):
        t2.commit()
    assert engine.get(b"counter") == b"2"


def test_a_read_only_commit_does_not_wait_for_writers(local_engine):
    """Nothing applied since it began: a transaction that only read is done at once."""
    local_engine.write({b"a": b"1"})
    syncing, release = threading.Event(), threading.Event()
    sync = local_engine.sync

    def slow_sync():
        syncing.set()
        assert release.wait(10)
        sync()

    local_engine.sync = slow_sync
    writer = threading.Thread(target=local_engine.write, args=({b"c": b"1"},), daemon=True)
    writer.start()
    try:
        assert syncing.wait(5)  # a writer's batch applied, its WAL sync under way
        txn = local_engine.transaction()
        assert txn.get(b"a") == b"1" and txn.get(b"b") is None
        done = threading.Event()

        def commit():
            txn.commit()
            done.set()

        threading.Thread(target=commit, daemon=True).start()
        assert done.wait(5)
    finally:
        release.set()
        writer.join(5)


def test_a_read_only_transaction_that_a_batch_overtook_is_validated(local_engine):
    engine = local_engine
    engine.write({b"a": b"1", b"b": b"1"})
    unchanged = engine.transaction()
    changed = engine.transaction()
    assert unchanged.get(b"a") == b"1" and changed.get(b"b") == b"1"
    engine.write({b"b": b"2"})
    unchanged.commit()  # what it read still holds
    with pytest.raises(kv.Conflict):
        changed.commit()


def test_a_transaction_reads_one_state_of_the_store(engine):
    """A write landing between two reads of a transaction is not half seen."""
    engine.write({b"a": b"1", b"b": b"1"})
    txn = engine.transaction()
    assert txn.get(b"a") == b"1"
    engine.write({b"a": b"2", b"b": b"2"})
    second = txn.get(b"b")
    if second == b"1":
        txn.commit()  # a snapshot (etcd): both reads of one state, nothing to validate
    else:
        with pytest.raises(kv.Conflict):  # read through (local engines): validated
            txn.commit()
    assert txn.get(b"a") == b"1"  # a key is read once per transaction


def test_a_writer_is_validated_against_the_store_only_after_another_batch(local_engine):
    """Reads still current (no batch since they began) are not read again at commit."""
    local_engine.write({b"a": b"1", b"b": b"1"})
    gets = []
    read = local_engine.get
    local_engine.get = lambda key: gets.append(key) or read(key)
    quiet = local_engine.transaction()
    assert quiet.get(b"a") == b"1"
    quiet.put(b"c", b"1")
    quiet.commit()
    assert gets == [b"a"]
    gets.clear()
    overtaken = local_engine.transaction()
    assert overtaken.get(b"a") == b"1"
    overtaken.put(b"d", b"1")
    local_engine.write({b"b": b"2"})
    overtaken.commit()  # validated against the store, and what it read holds
    assert gets == [b"a", b"a"]
    assert local_engine.get(b"c") == local_engine.get(b"d") == b"1"


def test_a_transaction_begun_while_a_batch_is_applied_is_validated():
    class Slow(kv.MemoryEngine):
        def __init__(self):
            super().__init__()
            self.slow = False  # batches are applied at once until set
            self.applying = threading.Event()
            self.release = threading.Event()

        def _apply(self, puts, deletes):
            if self.slow:
                self.applying.set()
                assert self.release.wait(5)
            super()._apply(puts, deletes)

    engine = Slow()
    engine.write({b"k": b"old"})
    engine.slow = True
    writer = threading.Thread(target=engine.write, args=({b"k": b"new"},))
    writer.start()
    assert engine.applying.wait(5)
    txn = engine.transaction()  # the batch is half done
    assert txn.get(b"k") == b"old"
    engine.release.set()
    writer.join(5)
    assert engine.version % 2 == 0
    with pytest.raises(kv.Conflict):
        txn.commit()


def test_run_transaction_retries_until_no_conflict(engine):
    engine.write({b"n": b"0"})

    def incr(txn):
        n = int(txn.get(b"n"))
        txn.put(b"n", str(n + 1).encode())

    threads = [
        threading.Thread(target=lambda: [kv.run_transaction(engine, incr) for _ in range(50)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert engine.get(b"n") == b"200"


def test_readers_commit_only_states_that_existed(engine):
    """Transfers keep a + b at 100; every read that commits sees a sum of 100."""
    engine.write({b"a": b"100", b"b": b"0"})
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def transfer(txn):
        a, b = int(txn.get(b"a")), int(txn.get(b"b"))
        n = 1 if a > 0 else -1
        txn.put(b"a", str(a - n).encode())
        txn.put(b"b", str(b + n).encode())

    def read_both(txn):
        a = int(txn.get(b"a"))
        time.sleep(0.0002)  # let a writer in between the two reads
        return a + int(txn.get(b"b"))

    def guarded(fn):
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    def write_until_stopped():
        while not stop.is_set():
            kv.run_transaction(engine, transfer, attempts=1000)
            time.sleep(0.0003)  # and let the readers commit now and then

    def read_200():
        for _ in range(200):
            seen.append(kv.run_transaction(engine, read_both, attempts=1000))

    writers = [threading.Thread(target=guarded, args=(write_until_stopped,)) for _ in range(3)]
    readers = [threading.Thread(target=guarded, args=(read_200,)) for _ in range(2)]
    for t in writers + readers:
        t.start()
    for t in readers:
        t.join()
    stop.set()
    for t in writers:
        t.join()
    assert not errors
    assert len(seen) == 400 and set(seen) == {100}
    assert int(engine.get(b"a")) + int(engine.get(b"b")) == 100


def test_a_rocksdb_scan_stops_at_its_end_without_walking_deleted_keys(tmp_path, monkeypatch):
    """A scan's last step does not walk the deleted keys after its range.

    The acknowledgements of a finished GC burst are thousands of deleted keys
    right after the range each later item's scan reads; RocksDB counts the
    deleted or overwritten entries its iterators stepped over
    (``rocksdb.number.iter.skip``, recorded when an iterator is dropped).
    """
    import rocksdict

    made = []
    real = rocksdict.Options

    def with_statistics(*args, **kwargs):
        opts = real(*args, **kwargs)
        opts.enable_statistics()
        made.append(opts)
        return opts

    monkeypatch.setattr(rocksdict, "Options", with_statistics)
    try:
        engine = kv.RocksEngine(tmp_path / "db")
    finally:
        monkeypatch.setattr(rocksdict, "Options", real)

    def skipped() -> int:
        for line in made[0].get_statistics().splitlines():
            if line.startswith("rocksdb.number.iter.skip "):
                return int(line.split()[-1])
        raise AssertionError("no iterator statistics")

    try:
        engine.write({b"a/1": b"x", b"c": b"y"})
        gone = {b"b/%05d" % i for i in range(2000)}
        engine.write(dict.fromkeys(gone, b""))
        engine.write({}, gone)
        before = skipped()
        for _ in range(5):
            assert list(engine.scan_prefix(b"a/")) == [(b"a/1", b"x")]
            assert list(engine.transaction().scan_prefix(b"a/")) == [(b"a/1", b"x")]
        assert skipped() - before < 100
        assert [k for k, _ in engine.scan(b"a", None)] == [b"a/1", b"c"]
        assert skipped() - before >= 2000  # an unbounded scan does walk them
    finally:
        engine.close()


def test_rocksdb_commit_survives_kill_9(tmp_path):
    """Every commit that returned is on disk after SIGKILL of the writer."""
    script = textwrap.dedent(
        f"""
        import sys
        from emberfs.metaserver.store.kv import RocksEngine
        e = RocksEngine({str(tmp_path / "db")!r})
        i = 0
        while True:
            e.write({{b"key%08d" % i: b"v" * 100}})
            print(i, flush=True)
            i += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    acknowledged = -1
    for line in proc.stdout:
        acknowledged = int(line)
        if acknowledged >= 300:
            break
    proc.kill()
    proc.wait()
    e = kv.RocksEngine(tmp_path / "db")
    try:
        for i in range(acknowledged + 1):
            assert e.get(b"key%08d" % i) == b"v" * 100, i
    finally:
        e.close()


def test_deferred_commits_share_one_sync(tmp_path):
    """``commit``/``write`` with ``sync=False`` skip the WAL sync; ``sync()`` makes all durable."""
    e = kv.RocksEngine(tmp_path / "db")

    class CountingSyncs:
        def __init__(self, db):
            self.db, self.syncs = db, 0

        def flush_wal(self, sync):
            self.syncs += sync
            return self.db.flush_wal(sync)

        def __getattr__(self, name):
            return getattr(self.db, name)

    db = e.db = CountingSyncs(e.db)
    try:
        for i in range(5):
            kv.run_transaction(e, lambda t, i=i: t.put(b"k%d" % i, b"v"), sync=False)
        assert db.syncs == 0
        assert [k for k, _ in e.scan_prefix(b"k")] == [b"k%d" % i for i in range(5)]
        e.sync()
        assert db.syncs == 1
        kv.run_transaction(e, lambda t: t.put(b"k9", b"v"))  # the default syncs
        assert db.syncs == 2
        e.write({b"w": b"v"}, sync=False)  # a blind batch may defer its sync too
        assert db.syncs == 2 and e.get(b"w") == b"v"
        e.write({b"w": b"v2"})
        assert db.syncs == 3
    finally:
        e.db = db.db
        e.close()
