"""Retried requests apply once; racing transactions retry through the guard keys."""

from __future__ import annotations

import errno

import pytest

from emberfs.common import errors
from emberfs.metaserver.fs import idempotency
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import common_pb2, meta_pb2


class Clock:
    def __init__(self):
        self.now = 1_000_000_000

    def __call__(self):
        self.now += 1000
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def ns(store, clock):
    return Namespace(store(), chain_table=lambda: [1, 2, 3], clock=clock)


def ctx(request_id, client="client-a"):
    return common_pb2.RequestContext(client_id=client, request_id=request_id)


def idem_keys(ns):
    return [k for k, _ in ns.engine.scan_prefix(keys.IDEMPOTENT)]


def test_mkdir_retry_returns_first_result(ns):
    first = ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(1), path="/d"))
    again = ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(1), path="/d"))
    assert again == first
    assert ns.counts()["directories"] == 2
    with pytest.raises(errors.AlreadyExists):
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(2), path="/d"))
    with pytest.raises(errors.AlreadyExists):  # request id 0: no deduplication
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(0), path="/d"))
    with pytest.raises(errors.AlreadyExists):  # another client's id 1 is another request
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(1, "client-b"), path="/d"))


def test_a_retry_is_answered_once_its_first_attempt_is_durable(clock):
    """A replayed response can describe a batch whose WAL sync has not ended: sync first."""

    class Counting(MemoryEngine):
        syncs = 0

        def sync(self):
            self.syncs += 1

    ns = Namespace(Counting(), chain_table=lambda: [1, 2, 3], clock=clock)
    first = ns.create(meta_pb2.CreateRequest(ctx=ctx(1), path="/f", exclusive=True))
    before = ns.engine.syncs
    assert ns.create(meta_pb2.CreateRequest(ctx=ctx(1), path="/f", exclusive=True)) == first
    assert ns.engine.syncs == before + 1


def test_mutations_apply_once(ns):
    created = ns.create(meta_pb2.CreateRequest(ctx=ctx(1), path="/f", exclusive=True))
    assert ns.create(meta_pb2.CreateRequest(ctx=ctx(1), path="/f", exclusive=True)) == created
    link = ns.hardlink(meta_pb2.HardlinkRequest(ctx=ctx(2), src="/f", dst="/g"))
    assert ns.hardlink(meta_pb2.HardlinkRequest(ctx=ctx(2), src="/f", dst="/g")) == link
    assert ns.stat(meta_pb2.StatRequest(path="/f")).attr.nlink == 2
    opened = ns.open(meta_pb2.OpenRequest(ctx=ctx(3), path="/f", flags=meta_pb2.OPEN_WRITE))
    assert ns.open(meta_pb2.OpenRequest(ctx=ctx(3), path="/f", flags=meta_pb2.OPEN_WRITE)) == opened
    assert len(ns.sessions()) == 1
    close = meta_pb2.CloseRequest(
        ctx=ctx(4), inode=opened.attr.inode, session_id=opened.session_id, length=9, wrote=True
    )
    assert ns.close(close) == ns.close(close)
    moved = ns.rename(meta_pb2.RenameRequest(ctx=ctx(5), src="/g", dst="/h"))
    assert ns.rename(meta_pb2.RenameRequest(ctx=ctx(5), src="/g", dst="/h")) == moved
    removed = ns.remove(meta_pb2.RemoveRequest(ctx=ctx(6), path="/h"))
    assert ns.remove(meta_pb2.RemoveRequest(ctx=ctx(6), path="/h")) == removed
    assert ns.stat(meta_pb2.StatRequest(path="/f")).attr.nlink == 1
    assert len(idem_keys(ns)) == 6


def test_failures_are_not_stored(ns):
    with pytest.raises(errors.NotFound):
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(7), path="/x/y"))
    assert idem_keys(ns) == []
    ns.mkdir(meta_pb2.MkdirRequest(path="/x"))
    assert (
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(7), path="/x/y")).attr.type == common_pb2.DIRECTORY
    )


def test_request_id_reused_for_another_method(ns):
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(1), path="/d"))
    with pytest.raises(errors.InvalidArgument):
        ns.create(meta_pb2.CreateRequest(ctx=ctx(1), path="/f"))
    assert ns.list(meta_pb2.ListRequest(path="/")).entries[0].name == "d"
    assert len(ns.list(meta_pb2.ListRequest(path="/")).entries) == 1


def test_read_only_calls_store_nothing(ns):
    ns.create(meta_pb2.CreateRequest(path="/f"))
    ns.stat(meta_pb2.StatRequest(ctx=ctx(1), path="/f"))
    ns.open(meta_pb2.OpenRequest(ctx=ctx(2), path="/f"))
    ns.list(meta_pb2.ListRequest(ctx=ctx(3), path="/"))
    assert idem_keys(ns) == []


def test_window_prunes_old_results_per_client(ns, monkeypatch):
    monkeypatch.setattr(idempotency, "PRUNE_EVERY_SHARED", 1)  # every store prunes
    window = 64
    monkeypatch.setattr(idempotency, "WINDOW", window)
    for rid in range(1, window + 40):
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(rid), path=f"/d{rid}"))
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(1, "client-b"), path="/other"))
    kept_a = [k for k in idem_keys(ns) if k.startswith(keys.idempotent_prefix("client-a"))]
    assert len(kept_a) == window
    assert keys.idempotent_key("client-a", 1) not in kept_a
    assert keys.idempotent_key("client-a", window + 39) in kept_a
    assert keys.idempotent_key("client-b", 1) in idem_keys(ns)


def test_results_past_the_retry_horizon_are_pruned_per_client(ns, clock, monkeypatch):
    monkeypatch.setattr(idempotency, "PRUNE_EVERY_SHARED", 1)  # every store prunes
    for rid in range(1, 5):
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(rid), path=f"/a{rid}"))
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(1, "client-b"), path="/b"))
    clock.now += idempotency.RETRY_HORIZON_NS + 1
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(5), path="/a5"))
    assert idem_keys(ns) == [keys.idempotent_key("client-a", 5), keys.idempotent_key("client-b", 1)]


def test_pruning_seeks_to_the_first_kept_record(ns, monkeypatch):
    """Each store's prune scan starts where the last one stopped, not at the client's range start."""
    monkeypatch.setattr(idempotency, "PRUNE_EVERY_SHARED", 1)  # every store prunes
    monkeypatch.setattr(idempotency, "WINDOW", 16)
    mine = keys.idempotent_prefix("client-a")
    starts = []
    scan = ns.engine.scan

    def spying_scan(start, end, limit=None):
        if start.startswith(mine):
            starts.append(start)
        return scan(start, end, limit)

    monkeypatch.setattr(ns.engine, "scan", spying_scan)
    for rid in range(1, 41):
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(rid), path=f"/d{rid}"))
    assert idem_keys(ns) == [keys.idempotent_key("client-a", r) for r in range(25, 41)]
    assert starts[0] == mine  # no hint yet: the whole range
    assert starts[-1] == keys.idempotent_key("client-a", 24)
    # a namespace without hints (a restarted metaserver) scans the range once, then seeks
    fresh = Namespace(ns.engine, chain_table=lambda: [1, 2, 3], clock=ns.clock)
    starts.clear()
    for rid in range(41, 44):
        fresh.mkdir(meta_pb2.MkdirRequest(ctx=ctx(rid), path=f"/d{rid}"))
    assert starts == [
        mine,
        keys.idempotent_key("client-a", 26),
        keys.idempotent_key("client-a", 27),
    ]
    assert idem_keys(ns) == [keys.idempotent_key("client-a", r) for r in range(28, 44)]


def test_prune_hints_only_advance_and_forget_idle_clients():
    hints = idempotency.PruneHints(capacity=2)
    hints.advance("a", 10)
    hints.advance("a", 4)
    assert hints.first("a") == 10
    hints.advance("b", 3)
    hints.advance("a", 11)  # a is now the most recent
    hints.advance("c", 7)  # b is forgotten
    assert (hints.first("a"), hints.first("b"), hints.first("c")) == (11, 0, 7)


def test_pruning_a_record_at_the_largest_request_id(ns, clock, monkeypatch):
    monkeypatch.setattr(idempotency, "PRUNE_EVERY_SHARED", 1)  # every store prunes
    top = idempotency.MAX_REQUEST_ID
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(top), path="/top"))
    clock.now += idempotency.RETRY_HORIZON_NS + 1
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(5), path="/a"))
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(6), path="/b"))
    assert keys.idempotent_key("client-a", top) not in idem_keys(ns)
    assert keys.idempotent_key("client-a", 6) in idem_keys(ns)


def test_expired_results_are_pruned(ns, clock):
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(1), path="/old"))
    clock.now += idempotency.MAX_AGE_NS + 1
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(1, "c3"), path="/new"))
    assert keys.idempotent_key("client-a", 1) in idem_keys(ns)  # not on the request path
    assert ns.prune_retry_records() == 2
    assert idem_keys(ns) == [keys.idempotent_key("c3", 1)]
    # a sweep in slices resumes where it stopped
    for rid in range(3, 10):
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(rid, "c2"), path=f"/s{rid}"))
    clock.now += idempotency.MAX_AGE_NS + 1
    cursor, seen = idempotency.prune_expired(ns.engine, clock.now, limit=3)
    assert cursor is not None and seen == 3
    while cursor is not None:
        cursor, seen = idempotency.prune_expired(ns.engine, clock.now, start=cursor, limit=3)
    assert idem_keys(ns) == []
    # the namespace's sweep goes through the whole table in slices
    for rid in range(10, 17):
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(rid, "c4"), path=f"/t{rid}"))
    clock.now += idempotency.MAX_AGE_NS + 1
    assert ns.prune_retry_records(slice_records=2) == 7
    assert idem_keys(ns) == []


def racing(ns, action):
    """Run ``action`` just before the next commit of ``ns``'s engine (a racing request)."""
    real = ns.engine.commit
    state = {"armed": True}

    def commit(reads, puts, deletes, **kw):
        if state["armed"]:
            state["armed"] = False
            action()
        return real(reads, puts, deletes, **kw)

    ns.engine.commit = commit


def test_rmdir_racing_a_create_retries(ns):
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
    racing(ns, lambda: ns.create(meta_pb2.CreateRequest(path="/d/late")))
    with pytest.raises(errors.NotEmpty):
        ns.remove(meta_pb2.RemoveRequest(path="/d"))
    assert ns.stat(meta_pb2.StatRequest(path="/d/late")).attr.type == common_pb2.FILE


def test_recursive_remove_racing_a_create_takes_it_too(ns):
    ns.mkdir(meta_pb2.MkdirRequest(path="/t/u", parents=True))
    racing(ns, lambda: ns.create(meta_pb2.CreateRequest(path="/t/u/late")))
    assert ns.remove(meta_pb2.RemoveRequest(path="/t", recursive=True)).removed == 3
    assert [k for k, _ in ns.engine.scan_prefix(keys.INODE)] == [keys.inode_key(1)]


def test_unlink_racing_a_write_open_keeps_the_inode(ns):
    f = ns.create(meta_pb2.CreateRequest(path="/f")).attr
    opened = {}
    racing(
        ns,
        lambda: opened.update(
            r=ns.open(meta_pb2.OpenRequest(path="/f", flags=meta_pb2.OPEN_WRITE))
        ),
    )
    ns.remove(meta_pb2.RemoveRequest(path="/f"))
    assert list(ns.engine.scan_prefix(keys.GC)) == []
    assert ns.stat(meta_pb2.StatRequest(inode=f.inode)).attr.nlink == 0
    ns.close(meta_pb2.CloseRequest(inode=f.inode, session_id=opened["r"].session_id))
    assert [k for k, _ in ns.engine.scan_prefix(keys.GC)] == [keys.gc_key(f.inode)]


def test_two_racing_last_closes_queue_gc_once(ns):
    s1 = ns.open(meta_pb2.OpenRequest(path="/f", flags=meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE))
    s2 = ns.open(meta_pb2.OpenRequest(path="/f", flags=meta_pb2.OPEN_WRITE))
    inode = s1.attr.inode
    ns.remove(meta_pb2.RemoveRequest(path="/f"))
    racing(ns, lambda: ns.close(meta_pb2.CloseRequest(inode=inode, session_id=s2.session_id)))
    ns.close(meta_pb2.CloseRequest(inode=inode, session_id=s1.session_id))
    assert [k for k, _ in ns.engine.scan_prefix(keys.GC)] == [keys.gc_key(inode)]
    assert ns.engine.get(keys.inode_key(inode)) is None


def test_endless_conflicts_become_unavailable(ns):
    d = ns.mkdir(meta_pb2.MkdirRequest(path="/d")).attr.inode
    real = ns.engine.commit
    attempts = []

    def always_racing(reads, puts, deletes, **kw):
        # another request moves the directory's entry guard before every commit
        attempts.append(1)
        ns.engine.write({keys.dentry_prefix(d): str(len(attempts)).encode()})
        return real(reads, puts, deletes, **kw)

    ns.engine.commit = always_racing
    with pytest.raises(errors.Unavailable):
        ns.remove(meta_pb2.RemoveRequest(path="/d"))
    ns.engine.commit = real
    assert len(attempts) == 16
    assert ns.stat(meta_pb2.StatRequest(path="/d")).attr.type == common_pb2.DIRECTORY


def test_batch_write_open_and_close_retries_apply_once(ns):
    flags = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE | meta_pb2.OPEN_EXCLUSIVE
    req = meta_pb2.BatchWriteOpenRequest(ctx=ctx(10), paths=["/a", "/b", "/a"], flags=flags)
    first = ns.batch_write_open(req)
    # path i is the Open with request id 10 + i: the repeated exclusive create fails on its own
    assert [r.errno for r in first.results] == [0, 0, errno.EEXIST]
    assert ns.batch_write_open(req) == first  # a retry opens nothing twice
    assert ns.counts()["files"] == 2 and len(ns.sessions()) == 2
    # the ids are those of single Opens: request 11 is the open of /b
    single = ns.open(meta_pb2.OpenRequest(ctx=ctx(11), path="/b", flags=flags))
    assert single == first.results[1].opened
    with pytest.raises(errors.AlreadyExists):  # a fresh request id is a new open
        ns.open(meta_pb2.OpenRequest(ctx=ctx(13), path="/b", flags=flags))

    items = [
        meta_pb2.CloseItem(
            inode=r.opened.attr.inode, session_id=r.opened.session_id, length=3, wrote=True
        )
        for r in first.results[:2]
    ]
    close = meta_pb2.BatchCloseRequest(ctx=ctx(20), items=items)
    closed = ns.batch_close(close)
    assert [r.errno for r in closed.results] == [0, 0]
    assert ns.batch_close(close) == closed  # the retry finds both closes done
    assert ns.sessions() == []
    with pytest.raises(errors.InvalidArgument):  # ids past 2**64 - 1
        ns.batch_write_open(
            meta_pb2.BatchWriteOpenRequest(
                ctx=ctx(2**64 - 2), paths=["/c", "/d", "/e"], flags=flags
            )
        )
    assert not ns.batch_stat(meta_pb2.BatchStatRequest(paths=["/c"])).results[0].attr.inode


def test_batch_create_retry_applies_once(ns):
    ns.create(meta_pb2.CreateRequest(path="/old"))
    items = [
        meta_pb2.CreateRequest(path="/a", mode=0o600, exclusive=True),
        meta_pb2.CreateRequest(path="/old", exclusive=True),
        meta_pb2.CreateRequest(path="/b"),
        meta_pb2.CreateRequest(path="/missing/c"),
    ]
    req = meta_pb2.BatchCreateRequest(ctx=ctx(40), items=items)
    first = ns.batch_create(req)
    assert [r.errno for r in first.results] == [0, errno.EEXIST, 0, errno.ENOENT]
    assert first.results[0].attr.mode & 0o777 == 0o600
    assert ns.counts()["files"] == 3
    # a retry (the answer was lost) creates nothing twice, and its exclusive create of /a
    # does not fail on the file its first attempt made
    assert ns.batch_create(req) == first
    assert ns.counts()["files"] == 3
    # item i is the Create with request id 40 + i
    single = ns.create(meta_pb2.CreateRequest(ctx=ctx(42), path="/b"))
    assert single.attr == first.results[2].attr
    with pytest.raises(errors.InvalidArgument):
        ns.batch_create(meta_pb2.BatchCreateRequest(items=[items[2]] * 10001))


def test_batch_remove_retry_applies_once(ns):
    for p in ("/a", "/b"):
        ns.create(meta_pb2.CreateRequest(path=p))
    req = meta_pb2.BatchRemoveRequest(ctx=ctx(30), paths=["/a", "/b"])
    first = ns.batch_remove(req)
    assert [(r.errno, r.removed) for r in first.results] == [(0, 1), (0, 1)]
    ns.create(meta_pb2.CreateRequest(path="/a"))  # a new file of the same name
    assert ns.batch_remove(req) == first  # the retry removes nothing again
    assert ns.stat(meta_pb2.StatRequest(path="/a")).attr.inode


def test_a_retry_waits_for_its_first_attempt_still_running(store, clock):
    """A truncating Open retried while its first attempt still cuts the chunks cuts them once.

    Run side by side, the first attempt's cut could land on storage after the client, answered
    by the retry, had written the file again.
    """
    import threading

    cuts = []
    first_cutting = threading.Event()
    let_it_finish = threading.Event()

    def truncate_chunks(attr, length, request_id):
        cuts.append(length)
        first_cutting.set()
        let_it_finish.wait(10)

    ns = Namespace(
        store(), chain_table=lambda: [1, 2, 3], clock=clock, truncate_chunks=truncate_chunks
    )
    h = ns.open(
        meta_pb2.OpenRequest(
            ctx=ctx(1), path="/f", flags=meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE, mode=0o644
        )
    )
    ns.close(
        meta_pb2.CloseRequest(
            ctx=ctx(2), inode=h.attr.inode, session_id=h.session_id, length=100, wrote=True
        )
    )
    req = meta_pb2.OpenRequest(
        ctx=ctx(3), path="/f", flags=meta_pb2.OPEN_WRITE | meta_pb2.OPEN_TRUNCATE
    )
    answers = []
    first = threading.Thread(target=lambda: answers.append(ns.open(req)))
    first.start()
    assert first_cutting.wait(10)
    retry = threading.Thread(target=lambda: answers.append(ns.open(req)))  # the client gave up
    retry.start()
    retry.join(0.5)
    assert retry.is_alive()  # it waits for the first attempt instead of cutting again
    let_it_finish.set()
    first.join(10)
    retry.join(10)
    assert cuts == [0]
    assert len(answers) == 2 and answers[0] == answers[1]


def test_on_a_shared_store_one_store_in_eight_prunes_and_records_stay_bounded(ns, monkeypatch):
    window = 32
    monkeypatch.setattr(idempotency, "WINDOW", window)
    for rid in range(1, 200):
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ctx(rid), path=f"/d{rid}"))
        kept = len(idem_keys(ns))
        every = idempotency.PRUNE_EVERY_SHARED if ns.engine.shared else 1
        assert kept <= window + every, (rid, kept)
    assert keys.idempotent_key("client-a", 199) in idem_keys(ns)
    assert keys.idempotent_key("client-a", 100) not in idem_keys(ns)


def test_a_retry_on_another_metaserver_of_the_store_is_applied_once(store, clock):
    """Two metaservers on one store (etcd): a client whose metaserver died retries on the
    other with the same request ids, and gets the first answers back; nothing is done twice."""
    engine = store()
    first = Namespace(engine, chain_table=lambda: [1, 2, 3], clock=clock)
    other = Namespace(engine, chain_table=lambda: [1, 2, 3], clock=clock)
    made = first.create(meta_pb2.CreateRequest(ctx=ctx(1), path="/f"))
    moved = first.rename(meta_pb2.RenameRequest(ctx=ctx(2), src="/f", dst="/g"))
    gone = first.remove(meta_pb2.RemoveRequest(ctx=ctx(3), path="/g"))
    assert other.create(meta_pb2.CreateRequest(ctx=ctx(1), path="/f")) == made
    assert other.rename(meta_pb2.RenameRequest(ctx=ctx(2), src="/f", dst="/g")) == moved
    assert other.remove(meta_pb2.RemoveRequest(ctx=ctx(3), path="/g")) == gone
    assert other.list(meta_pb2.ListRequest(path="/")).entries == []
    assert [k for k, _ in engine.scan_prefix(keys.GC)] == [keys.gc_key(made.attr.inode)]
    # a request the first one never answered runs on the other, once
    batch = meta_pb2.BatchRemoveRequest(ctx=ctx(10), paths=["/x", "/y"])
    for path in ("/x", "/y"):
        other.create(meta_pb2.CreateRequest(path=path))
    assert [r.removed for r in other.batch_remove(batch).results] == [1, 1]
    assert [r.removed for r in first.batch_remove(batch).results] == [1, 1]
    if engine.shared:  # counts kept in the store: every metaserver sees the same (none left)
        assert other.counts()["files"] == first.counts()["files"] == 0
