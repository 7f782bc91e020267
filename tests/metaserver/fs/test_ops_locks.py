"""POSIX locks on the metaserver: the lock table's rules, leases, expiry, waiting, permissions."""

from __future__ import annotations

import threading
import time

import pytest

from emberfs.common.errors import InvalidArgument, NotFound, PermissionDenied
from emberfs.metaserver.clustermgr.grace import Grace
from emberfs.metaserver.fs import locktable
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2, meta_pb2

pytestmark = pytest.mark.timeout(60)

SECOND = 10**9
LEASE = 10.0
EOF = locktable.TO_EOF
R, W, U = meta_pb2.LOCK_READ, meta_pb2.LOCK_WRITE, meta_pb2.LOCK_UNLOCK
POSIX, FLOCK = meta_pb2.LOCK_POSIX, meta_pb2.LOCK_FLOCK


def lk(type_, start=0, end=EOF, owner=1, lease=1, kind=POSIX, pid=0):
    return meta_pb2.FileLock(
        kind=kind, type=type_, start=start, end=end, lease_id=lease, owner=owner, pid=pid
    )


def ranges(locks, owner=None):
    return [
        (lock.type, lock.start, lock.end) for lock in locks if owner is None or lock.owner == owner
    ]


# the table, pure -----------------------------------------------------------------------


def test_split_an_owners_lock_around_an_unlock_and_a_downgrade():
    locks = locktable.apply([], lk(W, 0, 99))
    locks = locktable.apply(locks, lk(U, 10, 19))
    assert ranges(locks) == [(W, 0, 9), (W, 20, 99)]
    locks = locktable.apply(locks, lk(R, 40, 49))
    assert ranges(locks) == [(W, 0, 9), (W, 20, 39), (R, 40, 49), (W, 50, 99)]


def test_merge_touching_and_overlapping_locks_of_one_type():
    locks = locktable.apply([], lk(R, 0, 9))
    locks = locktable.apply(locks, lk(R, 20, 29))
    locks = locktable.apply(locks, lk(R, 10, 19))  # touches both
    assert ranges(locks) == [(R, 0, 29)]
    locks = locktable.apply(locks, lk(R, 25, EOF))
    assert ranges(locks) == [(R, 0, EOF)]
    locks = locktable.apply(locks, lk(W, 5, 5))
    assert ranges(locks) == [(R, 0, 4), (W, 5, 5), (R, 6, EOF)]
    locks = locktable.apply(locks, lk(U, 0, EOF))
    assert locks == []


def test_other_owners_locks_stay_and_conflicts_need_a_writer():
    mine = lk(R, 0, 99, owner=1)
    theirs = lk(R, 50, 149, owner=2)
    locks = locktable.apply(locktable.apply([], mine), theirs)
    assert locktable.first_conflict(locks, lk(R, 0, EOF, owner=3)) is None
    assert locktable.first_conflict(locks, lk(W, 100, 120, owner=1)) == theirs
    assert locktable.first_conflict(locks, lk(W, 0, 49, owner=1)) is None  # only its own
    assert locktable.first_conflict(locks, lk(W, 150, EOF, owner=3)) is None
    # same owner number under another lease is another owner
    assert locktable.first_conflict(locks, lk(W, 0, 0, owner=1, lease=2)) == mine
    # an unlock is never refused; flock and fcntl locks never meet
    assert locktable.first_conflict(locks, lk(U, 0, EOF, owner=3)) is None
    assert locktable.first_conflict(locks, lk(W, owner=3, kind=FLOCK)) is None


def test_flock_is_whole_file_and_converts():
    wanted = locktable.validate(lk(R, 5, 9, kind=FLOCK))
    assert (wanted.start, wanted.end) == (0, EOF)
    locks = locktable.apply([], wanted)
    locks = locktable.apply(locks, locktable.validate(lk(W, kind=FLOCK)))
    assert ranges(locks) == [(W, 0, EOF)]
    with pytest.raises(InvalidArgument):
        locktable.validate(lk(R, 10, 9))
    with pytest.raises(InvalidArgument):
        locktable.validate(lk(7))


# the namespace: leases and calls ---------------------------------------------------------


class Clock:
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


@pytest.fixture
def ns(store, clock):
    return Namespace(
        store(),
        chain_table=lambda: [1, 2, 3],
        clock=clock,
        grace=Grace(clock=clock.seconds),
        lock_lease_timeout=LEASE,
    )


def ctx(client: str, uid: int = 0) -> common_pb2.RequestContext:
    return common_pb2.RequestContext(client_id=client, uid=uid, gid=uid)


def make_file(ns, path="/f", mode=0o644) -> int:
    req = meta_pb2.CreateRequest(ctx=ctx("maker"), path=path, mode=mode)
    return ns.create(req).attr.inode


def lease(ns, client: str, uid: int = 0) -> int:
    resp = ns.locks.open_lease(meta_pb2.OpenLockLeaseRequest(ctx=ctx(client, uid)))
    assert resp.timeout == LEASE
    return resp.lease_id


def setlk(ns, client, inode, lock, wait_ms=0, uid=0):
    req = meta_pb2.SetLockRequest(ctx=ctx(client, uid), inode=inode, lock=lock, wait_ms=wait_ms)
    return ns.locks.set_lock(req)


def getlk(ns, client, inode, lock):
    req = meta_pb2.GetLockRequest(ctx=ctx(client), inode=inode, lock=lock)
    return ns.locks.get_lock(req).conflict


def test_two_clients_contend_and_unlock_frees(ns):
    inode = make_file(ns)
    a, b = lease(ns, "a"), lease(ns, "b")
    assert setlk(ns, "a", inode, lk(W, 0, 99, lease=a, pid=11)).granted
    refused = setlk(ns, "b", inode, lk(R, 50, 50, lease=b))
    assert not refused.granted
    assert (refused.conflict.lease_id, refused.conflict.pid, refused.conflict.client_id) == (
        a,
        11,
        "a",
    )
    assert setlk(ns, "b", inode, lk(W, 100, EOF, lease=b)).granted
    held = getlk(ns, "b", inode, lk(W, 0, 0, lease=b))
    assert (held.type, held.start, held.end, held.pid) == (W, 0, 99, 11)
    assert getlk(ns, "a", inode, lk(R, 0, 99, lease=a)).type == U
    assert setlk(ns, "a", inode, lk(U, 0, EOF, lease=a)).granted
    assert setlk(ns, "b", inode, lk(R, 50, 50, lease=b)).granted
    assert not ns.engine.get(keys.lock_held_key(a, inode))
    assert ns.engine.get(keys.lock_held_key(b, inode)) == b""


def test_flock_shared_then_exclusive(ns):
    inode = make_file(ns)
    a, b = lease(ns, "a"), lease(ns, "b")
    assert setlk(ns, "a", inode, lk(R, lease=a, kind=FLOCK)).granted
    assert setlk(ns, "b", inode, lk(R, lease=b, kind=FLOCK)).granted
    assert not setlk(ns, "b", inode, lk(W, lease=b, kind=FLOCK)).granted
    assert setlk(ns, "b", inode, lk(R, lease=b, kind=FLOCK)).granted  # still shared
    assert setlk(ns, "a", inode, lk(U, lease=a, kind=FLOCK)).granted
    assert setlk(ns, "b", inode, lk(W, lease=b, kind=FLOCK)).granted
    # fcntl locks are another table
    assert setlk(ns, "a", inode, lk(W, lease=a)).granted


def test_an_unrenewed_lease_ends_with_its_locks(ns, clock):
    inode = make_file(ns)
    a, b = lease(ns, "a"), lease(ns, "b")
    assert setlk(ns, "a", inode, lk(W, lease=a)).granted
    clock.advance(LEASE * 0.6)
    assert not ns.locks.renew_lease(meta_pb2.RenewLockLeaseRequest(ctx=ctx("b"), lease_id=b)).gone
    assert ns.locks.expire_leases() == []
    clock.advance(LEASE * 0.6)  # a: 1.2 timeouts unrenewed, b: 0.6
    ended = ns.locks.expire_leases()
    assert [(lease_.lease_id, n) for lease_, n in ended] == [(a, 1)]
    assert ns.engine.get(keys.lock_key(inode)) is None
    assert list(ns.engine.scan_prefix(keys.lock_held_prefix(a))) == []
    assert setlk(ns, "b", inode, lk(W, lease=b)).granted
    # the ended lease: told so, nothing changes
    assert setlk(ns, "a", inode, lk(W, lease=a)).lease_gone
    renewed = ns.locks.renew_lease(meta_pb2.RenewLockLeaseRequest(ctx=ctx("a"), lease_id=a))
    assert renewed.gone


def test_close_lease_releases_everything(ns):
    inodes = [make_file(ns, f"/f{i}") for i in range(3)]
    a, b = lease(ns, "a"), lease(ns, "b")
    for inode in inodes:
        assert setlk(ns, "a", inode, lk(R, 0, 9, lease=a)).granted
        assert setlk(ns, "a", inode, lk(W, 20, 29, lease=a)).granted
    assert setlk(ns, "b", inodes[0], lk(R, 0, 9, lease=b)).granted
    req = meta_pb2.CloseLockLeaseRequest(ctx=ctx("a"), lease_id=a)
    assert ns.locks.close_lease(req).released == 6
    assert ns.locks.close_lease(req).released == 0
    for inode in inodes:
        assert setlk(ns, "b", inode, lk(W, 10, EOF, lease=b)).granted


def test_a_lease_is_its_clients_and_files_must_exist(ns):
    inode = make_file(ns)
    a = lease(ns, "a")
    with pytest.raises(PermissionDenied):
        setlk(ns, "b", inode, lk(W, lease=a))
    with pytest.raises(PermissionDenied):
        ns.locks.renew_lease(meta_pb2.RenewLockLeaseRequest(ctx=ctx("b"), lease_id=a))
    with pytest.raises(NotFound):
        setlk(ns, "a", 999_999, lk(W, lease=a))
    with pytest.raises(InvalidArgument):
        setlk(ns, "a", 1, lk(W, lease=a))  # the root directory
    with pytest.raises(InvalidArgument):
        ns.locks.open_lease(meta_pb2.OpenLockLeaseRequest(ctx=ctx("")))


def test_permissions_follow_the_lock_type(ns):
    inode = make_file(ns, "/ro", mode=0o444)
    secret = make_file(ns, "/secret", mode=0o600)
    u = lease(ns, "u", uid=1000)
    assert setlk(ns, "u", inode, lk(R, lease=u), uid=1000).granted
    with pytest.raises(PermissionDenied):
        setlk(ns, "u", inode, lk(W, lease=u), uid=1000)
    assert setlk(ns, "u", inode, lk(W, lease=u, kind=FLOCK), uid=1000).granted  # any open file
    with pytest.raises(PermissionDenied):
        setlk(ns, "u", secret, lk(R, lease=u, kind=FLOCK), uid=1000)
    assert setlk(ns, "u", secret, lk(U, lease=u), uid=1000).granted  # unlocking needs nothing


def test_a_waiting_request_is_granted_at_the_release(store):
    ns = Namespace(store(), chain_table=lambda: [1], lock_lease_timeout=LEASE)
    inode = make_file(ns)
    a, b = lease(ns, "a"), lease(ns, "b")
    assert setlk(ns, "a", inode, lk(W, lease=a)).granted
    started = time.monotonic()
    assert not setlk(ns, "b", inode, lk(W, lease=b), wait_ms=300).granted
    assert 0.25 <= time.monotonic() - started < 1.5
    threading.Timer(0.3, lambda: setlk(ns, "a", inode, lk(U, lease=a))).start()
    started = time.monotonic()
    assert setlk(ns, "b", inode, lk(W, lease=b), wait_ms=5000).granted
    waited = time.monotonic() - started
    assert 0.25 <= waited < 1.5, waited


def test_waiters_are_bounded(store):
    ns = Namespace(store(), chain_table=lambda: [1], lock_lease_timeout=LEASE)
    inode = make_file(ns)
    a, b = lease(ns, "a"), lease(ns, "b")
    assert setlk(ns, "a", inode, lk(W, lease=a)).granted
    taken = 0
    while ns.locks.releases.slot():
        taken += 1
    try:
        started = time.monotonic()
        assert not setlk(ns, "b", inode, lk(W, lease=b), wait_ms=2000).granted
        assert time.monotonic() - started < 0.5  # answered at once
    finally:
        for _ in range(taken):
            ns.locks.releases.free()
    assert taken == 8
