"""The etcd engine's own behaviour: URLs, etcd's limits, revisions, endpoints that fail, quorum loss.

What every engine must do alike is in test_kv.py and the namespace tests (parametrised by
engine); this file holds what only a store of several etcd members shows.
"""

from __future__ import annotations

import time

import pytest

from emberfs.cli.localetcd import LocalEtcd
from emberfs.common import errors
from emberfs.metaserver.store import kv
from emberfs.metaserver.store.etcd import Compactor, EtcdEngine
from emberfs.metaserver.store.etcdclient import EtcdSettings


@pytest.fixture
def engine(etcd_url):
    e = EtcdEngine(etcd_url)
    yield e
    e.close()


def test_urls_name_endpoints_prefix_and_limits():
    s = EtcdSettings.parse("etcd://h1:2379,h2:2380/fs/one?max_txn_ops=1024&timeout=2.5")
    assert s.endpoints == ("h1:2379", "h2:2380")
    assert s.prefix == b"/fs/one/"
    assert (s.max_txn_ops, s.timeout) == (1024, 2.5)
    assert EtcdSettings.parse(s.url) == s
    plain = EtcdSettings.parse("etcd://127.0.0.1:2379")
    assert plain.prefix == b"/emberfs/" and plain.max_txn_ops == 128
    for bad in (
        "http://h:1",
        "etcd://",
        "etcd://h",
        "etcd://h:x",
        "etcd://h:1/?max_txn_ops=0",
        "etcd://h:1/?nope=1",
        "etcd://h:1/?timeout=fast",
    ):
        with pytest.raises(ValueError):
            EtcdSettings.parse(bad)


def test_a_transaction_over_etcds_limits_is_refused_before_it_is_sent(engine):
    txn = engine.transaction()
    for i in range(engine.max_txn_ops):
        txn.put(b"k%04d" % i, b"v")
    with pytest.raises(kv.TransactionTooLarge, match="at most 128"):
        txn.put(b"one-more", b"v")
    # reads are bounded only for a transaction that writes, and at its commit
    engine.write({b"r%04d" % i: b"v" for i in range(100)})
    engine.write({b"r%04d" % i: b"v" for i in range(100, 200)})
    reader = engine.transaction()
    assert all(reader.get(b"r%04d" % i) == b"v" for i in range(200))
    reader.commit()  # read only: nothing to commit
    reader.put(b"w", b"1")
    with pytest.raises(kv.TransactionTooLarge):
        reader.commit()
    big = engine.transaction()
    big.put(b"huge", b"x" * (2 << 20))
    with pytest.raises(kv.TransactionTooLarge, match="bytes"):
        big.commit()
    assert engine.get(b"w") is None and engine.get(b"huge") is None
    assert kv.TransactionTooLarge.errno == 7  # E2BIG reaches the client


def write_all(engine, pairs: dict[bytes, bytes]) -> None:
    items = sorted(pairs.items())
    for i in range(0, len(items), 100):
        engine.write(dict(items[i : i + 100]))


def test_scans_page_through_one_revision(engine):
    write_all(engine, {b"s%05d" % i: b"a" for i in range(1200)})
    txn = engine.transaction()
    it = txn.scan_prefix(b"s")
    first = [next(it) for _ in range(10)]
    engine.write({b"s%05d" % i: b"b" for i in range(100)})  # lands after the first page
    engine.write({b"s%05d" % i: b"b" for i in range(1100, 1200)})
    rest = list(it)
    seen = first + rest
    assert len(seen) == 1200 and {v for _, v in seen} == {b"a"}
    assert engine.count_prefix(b"s") == 1200
    assert [k for k, _ in engine.scan_prefix(b"s", limit=1001)][-1] == b"s01000"


def test_a_compacted_revision_is_a_conflict_the_transaction_runs_again(engine):
    engine.write({b"a": b"1", b"b": b"1"})
    txn = engine.transaction()
    assert txn.get(b"a") == b"1"
    engine.write({b"b": b"2"})
    compactor = Compactor(engine)
    compactor()  # notes the revision
    engine.write({b"c": b"1"})
    assert compactor() > txn.revision  # compacts past the transaction's revision
    with pytest.raises(kv.Conflict):
        txn.get(b"b")
    runs = []

    def read_both(t):
        runs.append(1)
        return t.get(b"a"), t.get(b"b")

    assert kv.run_transaction(engine, read_both) == (b"1", b"2")


@pytest.fixture
def three(tmp_path):
    """A three-member etcd cluster of its own (members are killed)."""
    cluster = LocalEtcd(tmp_path / "etcd", members=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_dead_member_is_left_for_the_others_and_a_lost_quorum_is_unavailable(three):
    patient = EtcdEngine(three.url("fs") + "?timeout=20")  # rides out an etcd election
    engine = EtcdEngine(three.url("fs") + "?timeout=3")
    try:
        patient.write({b"k": b"1"})
        three.kill(0)  # the endpoint the engines use first (and perhaps etcd's leader)
        for i in range(20):
            kv.run_transaction(patient, lambda t, i=i: t.put(b"k", b"%d" % i))
        assert engine.get(b"k") == b"19"
        three.kill(1)  # one of three left: no quorum
        started = time.monotonic()
        with pytest.raises(errors.Unavailable, match="metadata store .*unavailable"):
            engine.write({b"k": b"lost"})
        with pytest.raises(errors.Unavailable):
            engine.get(b"k")
        assert time.monotonic() - started < 10  # two calls, each within its 3 s deadline
        three.start_member(0)
        three.start_member(1)
        deadline = time.monotonic() + 30
        while True:
            try:
                engine.write({b"k": b"back"})
                break
            except errors.Unavailable:
                assert time.monotonic() < deadline, "etcd did not come back"
                time.sleep(0.2)
        assert engine.get(b"k") == b"back"
    finally:
        engine.close()
        patient.close()
