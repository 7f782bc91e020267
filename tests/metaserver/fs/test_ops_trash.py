"""The trash on the metadata engines: keep, list, restore, purge and expire removed entries."""

from __future__ import annotations

import pytest

from emberfs.common import errors
from emberfs.metaserver.consistency.namespacecheck import NamespaceCheck
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2, meta_pb2

ALICE = common_pb2.RequestContext(uid=1000, gid=1000)
BOB = common_pb2.RequestContext(uid=1001, gid=1001)


class Clock:
    def __init__(self):
        self.now = 1_000_000 * 10**9

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def ns(store, clock):
    return Namespace(store(), chain_table=lambda: [1, 2, 3], clock=clock, trash_days=1)


def create(ns, path, ctx=ALICE):
    return ns.create(meta_pb2.CreateRequest(ctx=ctx, path=path)).attr


def remove(ns, path, ctx=ALICE, **kw):
    return ns.remove(meta_pb2.RemoveRequest(ctx=ctx, path=path, **kw)).removed


def listed(ns, ctx=ALICE, **kw):
    return list(ns.trash_list(meta_pb2.TrashListRequest(ctx=ctx, **kw)).entries)


def restore(ns, entries=(), ctx=ALICE, **kw):
    req = meta_pb2.TrashRestoreRequest(ctx=ctx, entries=list(entries), **kw)
    return list(ns.trash_restore(req).restored)


def purge(ns, entries=(), ctx=ALICE, **kw):
    return ns.trash_purge(meta_pb2.TrashPurgeRequest(ctx=ctx, entries=list(entries), **kw))


def exists(ns, path):
    try:
        ns.stat(meta_pb2.StatRequest(path=path))
    except errors.NotFound:
        return False
    return True


def gc_inodes(ns):
    return {keys.gc_id(k) for k, _ in ns.engine.scan_prefix(keys.GC)}


def test_removed_file_waits_in_the_trash_and_comes_back(ns, clock):
    ns.mkdir(meta_pb2.MkdirRequest(path="/home", mode=0o777))
    f = create(ns, "/home/a")
    assert remove(ns, "/home/a") == 1
    assert not exists(ns, "/home/a") and gc_inodes(ns) == set()
    [entry] = listed(ns)
    assert (entry.entry, entry.path, entry.uid, entry.type, entry.entries) == (
        f.inode,
        "/home/a",
        1000,
        common_pb2.FILE,
        1,
    )
    assert entry.removed_ns == clock.now
    [back] = restore(ns, [f.inode])
    assert back.path == "/home/a"
    assert ns.stat(meta_pb2.StatRequest(path="/home/a")).attr.inode == f.inode
    assert listed(ns) == []


def test_recursive_remove_keeps_the_tree_whole(ns):
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/t/sub", parents=True))
    for i in range(20):
        create(ns, f"/t/sub/f{i}")
    create(ns, "/t/top")
    assert remove(ns, "/t", recursive=True) == 23
    assert not exists(ns, "/t")
    [entry] = listed(ns)
    assert entry.type == common_pb2.DIRECTORY and entry.entries == 23
    restore(ns, all=True)
    assert sorted(e.name for e in ns.list(meta_pb2.ListRequest(path="/t/sub")).entries) == sorted(
        f"f{i}" for i in range(20)
    )
    assert exists(ns, "/t/top")


def test_restore_over_an_existing_name_fails_and_loses_nothing(ns):
    old = create(ns, "/a")
    remove(ns, "/a")
    new = create(ns, "/a")
    with pytest.raises(errors.AlreadyExists):
        restore(ns, [old.inode])
    assert ns.stat(meta_pb2.StatRequest(path="/a")).attr.inode == new.inode
    assert [e.entry for e in listed(ns)] == [old.inode]
    [back] = restore(ns, [old.inode], to="/a.old")
    assert back.path == "/a.old"
    assert ns.stat(meta_pb2.StatRequest(path="/a.old")).attr.inode == old.inode


def test_restore_all_puts_a_directory_back_before_what_was_in_it(ns):
    older = create(ns, "/f")
    d = ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/d")).attr
    assert older.inode < d.inode  # entries in inode order would put the file back first
    ns.rename(meta_pb2.RenameRequest(ctx=ALICE, src="/f", dst="/d/f"))
    remove(ns, "/d/f")
    remove(ns, "/d", directory=True)
    assert [e.path for e in restore(ns, all=True)] == ["/d", "/d/f"]
    assert exists(ns, "/d/f")


def test_restore_without_the_parent_needs_another_place(ns):
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/d"))
    f = create(ns, "/d/f")
    remove(ns, "/d/f")
    remove(ns, "/d", directory=True)
    with pytest.raises(errors.NotFound, match="parent directory is gone"):
        restore(ns, [f.inode])
    restore(ns, [f.inode], to="/f")
    assert exists(ns, "/f")
    with pytest.raises(errors.InvalidArgument):
        restore(ns, all=True, to="/x")


def test_another_user_neither_sees_nor_restores_nor_purges_my_entries(ns):
    f = create(ns, "/mine")
    remove(ns, "/mine")
    assert listed(ns, BOB) == []
    with pytest.raises(errors.PermissionDenied):
        listed(ns, BOB, user=1000)
    with pytest.raises(errors.PermissionDenied):
        listed(ns, BOB, all_users=True)
    with pytest.raises(errors.NotFound):
        restore(ns, [f.inode], BOB)
    with pytest.raises(errors.NotFound):
        purge(ns, [f.inode], BOB)
    assert restore(ns, all=True, ctx=BOB) == []
    root = common_pb2.RequestContext(uid=0, gid=0)
    assert [e.entry for e in listed(ns, root, user=1000)] == [f.inode]
    assert [e.entry for e in listed(ns, root, all_users=True)] == [f.inode]
    assert [e.entry for e in listed(ns)] == [f.inode]


def test_purge_queues_the_chunks_and_a_tree_goes_in_slices(ns):
    f = create(ns, "/f")
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/d"))
    g = create(ns, "/d/g")
    remove(ns, "/f")
    remove(ns, "/d", recursive=True)
    assert purge(ns, [f.inode]).purged == 1
    assert gc_inodes(ns) == {f.inode}
    assert purge(ns, all=True).purged == 1
    ns.purge_detached()  # what the background purge does
    assert gc_inodes(ns) == {f.inode, g.inode}
    assert listed(ns) == [] and ns.counts()["inodes"] == 1
    with pytest.raises(errors.InvalidArgument):
        purge(ns)


def test_purge_older_than(ns, clock):
    a = create(ns, "/a")
    remove(ns, "/a")
    clock.now += 10**9
    create(ns, "/b")
    remove(ns, "/b")
    assert purge(ns, all=True, before_ns=clock.now).purged == 1
    assert gc_inodes(ns) == {a.inode}
    assert [e.path for e in listed(ns)] == ["/b"]


def test_the_sweep_purges_what_is_older_than_the_trash_days(ns, clock):
    a = create(ns, "/a")
    remove(ns, "/a")
    clock.now += 86400 * 10**9 - 1
    b = create(ns, "/b")
    remove(ns, "/b")
    assert ns.expire_trash() == 0
    clock.now += 2
    assert ns.expire_trash() == 1
    assert gc_inodes(ns) == {a.inode}
    assert [e.entry for e in listed(ns)] == [b.inode]


def test_hard_links_and_rename_over(ns):
    f = create(ns, "/f")
    ns.hardlink(meta_pb2.HardlinkRequest(ctx=ALICE, src="/f", dst="/g"))
    remove(ns, "/g")  # another link is left: nothing to keep
    assert listed(ns) == []
    assert ns.stat(meta_pb2.StatRequest(path="/f")).attr.nlink == 1
    h = create(ns, "/h")
    ns.rename(meta_pb2.RenameRequest(ctx=ALICE, src="/f", dst="/h"))
    [entry] = listed(ns)
    assert (entry.entry, entry.path) == (h.inode, "/h")
    assert ns.stat(meta_pb2.StatRequest(path="/h")).attr.inode == f.inode
    restore(ns, [h.inode], to="/h.replaced")
    assert exists(ns, "/h.replaced")


def test_fsck_counts_kept_entries_as_reachable(ns):
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/d"))
    create(ns, "/d/f")
    create(ns, "/g")
    remove(ns, "/d", recursive=True)
    remove(ns, "/g")
    check = NamespaceCheck(ns.engine)
    assert list(check.check(check.load_inodes(), {})) == []


def test_without_a_trash_removal_deletes(store):
    ns = Namespace(store(), chain_table=lambda: [1])
    f = create(ns, "/f")
    remove(ns, "/f")
    assert gc_inodes(ns) == {f.inode}
    assert listed(ns) == []


def test_a_tree_larger_than_a_transaction_goes_and_comes_back_whole(ns):
    """On etcd (128 operations a transaction) too: the tree moves in one small transaction."""
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/big"))
    req = meta_pb2.BatchCreateRequest(
        ctx=ALICE, items=[meta_pb2.CreateRequest(path=f"/big/f{i}") for i in range(300)]
    )
    assert all(r.errno == 0 for r in ns.batch_create(req).results)
    assert remove(ns, "/big", recursive=True) == 301
    restore(ns, all=True)
    assert len(ns.list(meta_pb2.ListRequest(path="/big")).entries) == 300
    remove(ns, "/big", recursive=True)
    assert purge(ns, all=True).purged == 1
    ns.purge_detached()
    assert len(gc_inodes(ns)) == 300 and ns.counts()["inodes"] == 1


def test_many_entries_are_purged_in_slices(ns, clock):
    req = meta_pb2.BatchCreateRequest(
        ctx=ALICE, items=[meta_pb2.CreateRequest(path=f"/f{i}") for i in range(40)]
    )
    ns.batch_create(req)
    for i in range(20):
        remove(ns, f"/f{i}")
    calls, purged, more = 0, 0, True
    while more:  # as the client does: again while ``more``
        resp = purge(ns, all=True)
        calls, purged, more = calls + 1, purged + resp.purged, resp.more
    assert purged == 20 and (calls > 1) == (ns.engine.max_txn_ops is not None)
    for i in range(20, 40):
        remove(ns, f"/f{i}")
    clock.now += 2 * 86400 * 10**9
    assert ns.expire_trash() == 20
    assert listed(ns) == [] and len(gc_inodes(ns)) == 40


def test_skip_trash_deletes_as_without_a_trash(ns):
    f, g, h, k = (create(ns, p) for p in ("/f", "/g", "/h", "/k"))
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/d"))
    req = meta_pb2.BatchCreateRequest(
        ctx=ALICE, items=[meta_pb2.CreateRequest(path=f"/d/f{i}") for i in range(200)]
    )
    assert all(r.errno == 0 for r in ns.batch_create(req).results)
    assert remove(ns, "/f", skip_trash=True) == 1
    assert remove(ns, "/d", recursive=True, skip_trash=True) == 201
    ns.purge_detached()  # a tree larger than a transaction (etcd) goes in slices
    batch = meta_pb2.BatchRemoveRequest(ctx=ALICE, paths=["/g"], skip_trash=True)
    assert [r.removed for r in ns.batch_remove(batch).results] == [1]
    ns.rename(meta_pb2.RenameRequest(ctx=ALICE, src="/h", dst="/k", skip_trash=True))
    assert listed(ns) == [] and not exists(ns, "/d")
    assert {f.inode, g.inode, k.inode} <= gc_inodes(ns) and len(gc_inodes(ns)) == 203
    assert ns.stat(meta_pb2.StatRequest(path="/k")).attr.inode == h.inode
    assert ns.counts()["inodes"] == 2  # the root and /k


def test_skip_trash_keeps_permissions_and_retries_are_answered_once(ns):
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/mine"))
    create(ns, "/mine/f")
    with pytest.raises(errors.PermissionDenied):
        remove(ns, "/mine/f", ctx=BOB, skip_trash=True)
    again = common_pb2.RequestContext(uid=1000, gid=1000, client_id="c", request_id=7)
    assert remove(ns, "/mine/f", ctx=again, skip_trash=True) == 1
    assert remove(ns, "/mine/f", ctx=again, skip_trash=True) == 1  # the retry: same answer
    assert listed(ns) == [] and len(gc_inodes(ns)) == 1
