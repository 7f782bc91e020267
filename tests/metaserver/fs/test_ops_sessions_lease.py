"""Write-session leases: renewal, expiry, and the GC of files unlinked while open."""

from __future__ import annotations

import pytest

from emberfs.common.errors import InvalidArgument, NotFound
from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.fs.opcontext import Credentials, OpContext
from emberfs.metaserver.fs.ops import sessions
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import Conflict
from emberfs.proto import cluster_pb2, common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(60)

SECOND = 10**9
TIMEOUT = 30.0
WRITE = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE


class Clock:
    """A settable clock in nanoseconds, and the monotonic seconds that move with it."""

    def __init__(self) -> None:
        self.now = 1_700_000_000 * SECOND

    def __call__(self) -> int:
        return self.now

    def seconds(self) -> float:
        return self.now / SECOND

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * SECOND)


@pytest.fixture
def clock():
    return Clock()


def make_ns(store, clock, engine=None, grace=None) -> Namespace:
    return Namespace(
        engine if engine is not None else store(),
        chain_table=lambda: [1, 2, 3],
        clock=clock,
        session_timeout=TIMEOUT,
        grace=grace if grace is not None else Grace(clock=clock.seconds),
    )


@pytest.fixture
def ns(store, clock):
    return make_ns(store, clock)


def open_write(ns, path: str) -> meta_pb2.OpenResponse:
    return ns.open(meta_pb2.OpenRequest(path=path, flags=WRITE, mode=0o644))


def renew(ns, *pairs) -> set[tuple[int, int]]:
    req = meta_pb2.RenewSessionsRequest(
        sessions=[meta_pb2.SessionRef(inode=i, session_id=s) for i, s in pairs]
    )
    return {(r.inode, r.session_id) for r in ns.renew_sessions(req).expired}


def session_ids(ns) -> set[tuple[int, int]]:
    return {(s["inode"], s["session_id"]) for s in ns.sessions()}


def gc_inodes(ns) -> set[int]:
    out = set()
    for _, raw in ns.engine.scan_prefix(keys.GC):
        item = cluster_pb2.GCItem()
        item.ParseFromString(raw)
        out.add(item.inode)
    return out


def test_open_starts_the_lease_and_the_listing_shows_it(ns, clock):
    resp = open_write(ns, "/f")
    (s,) = ns.sessions()
    assert s["since"] == s["renewed"] == clock.now
    assert s["expires"] == clock.now + int(TIMEOUT * SECOND)
    assert (s["inode"], s["session_id"]) == (resp.attr.inode, resp.session_id)


def test_renewal_keeps_a_session_alive(ns, clock):
    resp = open_write(ns, "/f")
    ref = (resp.attr.inode, resp.session_id)
    for _ in range(5):
        clock.advance(TIMEOUT * 0.6)
        assert renew(ns, ref) == set()
        assert ns.expire_sessions() == []
    assert session_ids(ns) == {ref}
    assert ns.sessions()[0]["renewed"] == clock.now
    # the session still works: Close sets the length
    attr = ns.close(
        meta_pb2.CloseRequest(inode=ref[0], session_id=ref[1], length=10, wrote=True)
    ).attr
    assert attr.size == 10 and session_ids(ns) == set()


def test_unrenewed_session_expires_after_the_timeout_and_keeps_the_synced_length(ns, clock):
    resp = open_write(ns, "/f")
    inode, sid = resp.attr.inode, resp.session_id
    ns.sync(meta_pb2.SyncRequest(inode=inode, session_id=sid, length=123))
    clock.advance(TIMEOUT - 1)
    assert ns.expire_sessions() == []
    assert session_ids(ns) == {(inode, sid)}
    clock.advance(1)
    (ended,) = ns.expire_sessions()
    assert (ended.inode, ended.session_id) == (inode, sid)
    assert session_ids(ns) == set() and ns.counts()["sessions"] == 0
    attr = ns.stat(meta_pb2.StatRequest(path="/f")).attr
    assert attr.size == 123
    assert gc_inodes(ns) == set()
    # the ended session is gone for Sync and Close too
    with pytest.raises(InvalidArgument):
        ns.close(meta_pb2.CloseRequest(inode=inode, session_id=sid, length=1, wrote=True))
    assert ns.expire_sessions() == []


def test_expiry_of_the_last_session_of_an_unlinked_file_queues_gc_and_drops_the_inode(ns, clock):
    a = open_write(ns, "/f")
    b = open_write(ns, "/f")
    inode = a.attr.inode
    ns.remove(meta_pb2.RemoveRequest(path="/f"))
    files_before = ns.counts()["files"]
    assert ns.stat(meta_pb2.StatRequest(inode=inode)).attr.nlink == 0
    clock.advance(TIMEOUT / 2)
    assert renew(ns, (inode, b.session_id)) == set()
    clock.advance(TIMEOUT / 2)
    # a's lease ran out, b's did not: the inode stays while b is open
    assert [s.session_id for s in ns.expire_sessions()] == [a.session_id]
    assert gc_inodes(ns) == set()
    assert ns.stat(meta_pb2.StatRequest(inode=inode)).attr.inode == inode
    clock.advance(TIMEOUT)
    assert [s.session_id for s in ns.expire_sessions()] == [b.session_id]
    assert gc_inodes(ns) == {inode}
    with pytest.raises(NotFound):
        ns.stat(meta_pb2.StatRequest(inode=inode))
    assert ns.counts()["files"] == files_before - 1
    assert list(ns.engine.scan_prefix(keys.session_prefix(inode))) == []


def test_renewal_of_unknown_or_expired_sessions_reports_them(ns, clock):
    resp = open_write(ns, "/f")
    live = open_write(ns, "/g")
    ref = (resp.attr.inode, resp.session_id)
    live_ref = (live.attr.inode, live.session_id)
    assert renew(ns, (999, 1), (resp.attr.inode, 12345), live_ref) == {
        (999, 1),
        (resp.attr.inode, 12345),
    }
    clock.advance(TIMEOUT / 2)
    renew(ns, live_ref)
    clock.advance(TIMEOUT / 2)
    ns.expire_sessions()
    assert renew(ns, ref, live_ref, ref) == {ref}
    # a closed session is reported the same way
    ns.close(meta_pb2.CloseRequest(inode=live_ref[0], session_id=live_ref[1]))
    assert renew(ns, live_ref) == {live_ref}


def test_renewal_rejects_oversized_requests(ns):
    too_many = [(1, i) for i in range(sessions.MAX_RENEW + 1)]
    with pytest.raises(InvalidArgument):
        renew(ns, *too_many)


def test_renewal_is_not_deduplicated(ns, clock):
    resp = open_write(ns, "/f")
    ref = (resp.attr.inode, resp.session_id)
    ctx = common_pb2.RequestContext(client_id="c", request_id=7)
    req = meta_pb2.RenewSessionsRequest(
        ctx=ctx, sessions=[meta_pb2.SessionRef(inode=ref[0], session_id=ref[1])]
    )
    ns.renew_sessions(req)
    clock.advance(5)
    ns.renew_sessions(req)
    assert ns.sessions()[0]["renewed"] == clock.now
    assert list(ns.engine.scan_prefix(keys.IDEMPOTENT)) == []


def _renew_attempt(ns, clock, refs):
    txn = ns.engine.transaction()
    op = OpContext(txn, Credentials(0, 0, frozenset()), ns.env, clock())
    req = meta_pb2.RenewSessionsRequest(
        sessions=[meta_pb2.SessionRef(inode=i, session_id=s) for i, s in refs]
    )
    return txn, sessions.renew(op, req)


def test_renewal_does_not_conflict_with_concurrent_creates_and_opens(ns, clock):
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
    resp = open_write(ns, "/d/f")
    ref = (resp.attr.inode, resp.session_id)
    clock.advance(1)
    txn, out = _renew_attempt(ns, clock, [ref])
    assert list(out.expired) == []
    # while the renewal is in flight: creates in the same directory, another
    # write open of the same file, a Sync of the renewed session
    ns.create(meta_pb2.CreateRequest(path="/d/g"))
    other = open_write(ns, "/d/f")
    open_write(ns, "/d/h")
    ns.sync(meta_pb2.SyncRequest(inode=ref[0], session_id=ref[1], length=5))
    txn.commit()  # no Conflict
    renewed = {(s["inode"], s["session_id"]): s["renewed"] for s in ns.sessions()}
    assert renewed[ref] == clock.now
    assert renewed[(other.attr.inode, other.session_id)] == clock.now
    assert ns.stat(meta_pb2.StatRequest(path="/d/f")).attr.size == 5


def test_a_renewal_in_flight_keeps_its_session_from_expiring(ns, clock):
    resp = open_write(ns, "/f")
    ref = (resp.attr.inode, resp.session_id)
    clock.advance(TIMEOUT)
    txn, out = _renew_attempt(ns, clock, [ref])  # it read the session: the lease is renewed
    assert list(out.expired) == []
    assert ns.expire_sessions() == []
    txn.commit()  # no Conflict
    assert session_ids(ns) == {ref}
    clock.advance(TIMEOUT)
    assert [(s.inode, s.session_id) for s in ns.expire_sessions()] == [ref]


def test_renewal_racing_with_expiry_of_the_same_session_makes_the_expiry_retry(ns, clock):
    resp = open_write(ns, "/f")
    ref = (resp.attr.inode, resp.session_id)
    clock.advance(TIMEOUT)
    # an expiry that read the session and found its lease run out, not yet committed
    txn = ns.engine.transaction()
    op = OpContext(txn, Credentials(0, 0, frozenset()), ns.env, clock())
    assert sessions.expire(op, *ref, lambda s: ns.leases.lapsed(*ref)) is not None
    assert renew(ns, ref) == set()
    with pytest.raises(Conflict):
        txn.commit()
    # the retried expiry finds the lease renewed
    assert ns.expire_sessions() == []
    assert session_ids(ns) == {ref}


def test_leases_are_judged_on_the_monotonic_clock_not_the_stored_wall_clock(store, clock):
    wall = Clock()  # the wall clock jumps, the monotonic one does not
    ns = make_ns(store, wall, grace=Grace(clock=clock.seconds))
    resp = open_write(ns, "/f")
    ref = (resp.attr.inode, resp.session_id)
    wall.advance(10 * TIMEOUT)
    assert ns.expire_sessions() == []
    (listed,) = ns.sessions()
    assert listed["expires"] == wall.now + int(TIMEOUT * SECOND)
    clock.advance(TIMEOUT)
    assert [(s.inode, s.session_id) for s in ns.expire_sessions()] == [ref]


def test_stored_sessions_get_a_full_timeout_after_a_restart(store, clock):
    engine = store()
    first = make_ns(store, clock, engine)
    renewed = open_write(first, "/renewed")
    old = open_write(first, "/old")
    clock.advance(TIMEOUT - 1)
    assert renew(first, (renewed.attr.inode, renewed.session_id)) == set()
    # the metaserver stops; it starts again after longer than the timeout
    clock.advance(2 * TIMEOUT)
    grace = Grace(clock=clock.seconds)
    ns = make_ns(store, clock, engine, grace)
    clock.advance(1)
    grace.begin()  # it listens from now
    assert ns.expire_sessions() == []
    clock.advance(TIMEOUT - 1)
    assert ns.expire_sessions() == []
    assert renew(ns, (renewed.attr.inode, renewed.session_id)) == set()
    clock.advance(1)
    # the one its client renewed lives on; the other's grace is over
    assert [(s.inode, s.session_id) for s in ns.expire_sessions()] == [
        (old.attr.inode, old.session_id)
    ]
    assert session_ids(ns) == {(renewed.attr.inode, renewed.session_id)}


def test_sessions_get_a_full_timeout_after_a_stall_of_the_metaserver(store, clock):
    grace = Grace(clock=clock.seconds, max_gap=TIMEOUT / 2)
    ns = make_ns(store, clock, grace=grace)
    resp = open_write(ns, "/f")
    ref = (resp.attr.inode, resp.session_id)
    clock.advance(TIMEOUT / 4)
    assert ns.expire_sessions() == []
    clock.advance(2 * TIMEOUT)  # stopped: nothing could be heard
    assert ns.expire_sessions() == []
    assert grace.stalls == 1
    for _ in range(3):
        clock.advance(TIMEOUT / 4)
        assert ns.expire_sessions() == []
    clock.advance(TIMEOUT / 4)
    assert [(s.inode, s.session_id) for s in ns.expire_sessions()] == [ref]
    assert grace.stalls == 1


def test_session_timeout_must_be_positive(store):
    with pytest.raises(ValueError):
        Namespace(store(), chain_table=lambda: [1], session_timeout=0)
