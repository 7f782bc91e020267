"""Remove, write sessions, unlink-while-open and the GC queue."""

from __future__ import annotations

import pytest

from emberfs.common import errors
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.store import keys
from emberfs.proto import cluster_pb2, common_pb2, meta_pb2

W, C, X, T, A = (
    meta_pb2.OPEN_WRITE,
    meta_pb2.OPEN_CREATE,
    meta_pb2.OPEN_EXCLUSIVE,
    meta_pb2.OPEN_TRUNCATE,
    meta_pb2.OPEN_APPEND,
)


class Cuts:
    def __init__(self):
        self.calls = []

    def __call__(self, attr, length, request_id):
        self.calls.append((attr.inode, length))


@pytest.fixture
def cuts():
    return Cuts()


@pytest.fixture
def ns(store, cuts):
    return Namespace(store(), chain_table=lambda: [1, 2, 3, 4, 5], truncate_chunks=cuts)


def gc_items(ns):
    out = {}
    for key, raw in ns.engine.scan_prefix(keys.GC):
        item = cluster_pb2.GCItem()
        item.ParseFromString(raw)
        assert key == keys.gc_key(item.gc_id) and item.gc_id == item.inode
        out[item.inode] = list(item.chains)
    return out


def stat(ns, path):
    return ns.stat(meta_pb2.StatRequest(path=path)).attr


def rm(ns, path, **kw):
    return ns.remove(meta_pb2.RemoveRequest(path=path, **kw)).removed


def test_remove_file_queues_gc_with_its_chains(ns):
    f = ns.create(meta_pb2.CreateRequest(path="/f")).attr
    assert rm(ns, "/f") == 1
    assert gc_items(ns) == {f.inode: list(f.layout.chains)}
    assert ns.engine.get(keys.inode_key(f.inode)) is None
    with pytest.raises(errors.NotFound):
        stat(ns, "/f")
    with pytest.raises(errors.NotFound):
        rm(ns, "/f")
    assert ns.counts()["files"] == 0


def test_remove_directories(ns):
    ns.mkdir(meta_pb2.MkdirRequest(path="/d/e", parents=True))
    ns.create(meta_pb2.CreateRequest(path="/d/e/f"))
    with pytest.raises(errors.NotEmpty):
        rm(ns, "/d")
    with pytest.raises(errors.NotADirectory):
        rm(ns, "/d/e/f", directory=True)
    rm(ns, "/d/e/f")
    assert rm(ns, "/d/e", directory=True) == 1
    assert rm(ns, "/d") == 1  # an empty directory goes without flags too
    with pytest.raises(errors.Busy):
        rm(ns, "/", recursive=True)
    assert ns.counts() == {
        "inodes": 1,
        "files": 0,
        "directories": 1,
        "symlinks": 0,
        "sessions": 0,
        "pending_cuts": 0,
    }
    # nothing of the removed directories is left in the store (only the root's entry guard)
    left = [k for k, _ in ns.engine.scan_prefix(keys.DENTRY)]
    assert left == [keys.dentry_prefix(1)]


def test_remove_symlink_not_target(ns):
    ns.create(meta_pb2.CreateRequest(path="/f"))
    ns.symlink(meta_pb2.SymlinkRequest(path="/s", target="/f"))
    rm(ns, "/s")
    assert stat(ns, "/f").type == common_pb2.FILE
    assert gc_items(ns) == {}


def test_remove_recursive_is_one_transaction_with_gc_per_file(ns):
    ns.mkdir(meta_pb2.MkdirRequest(path="/t/a/b", parents=True))
    files = [
        ns.create(meta_pb2.CreateRequest(path=p)).attr.inode for p in ("/t/1", "/t/a/2", "/t/a/b/3")
    ]
    ns.symlink(meta_pb2.SymlinkRequest(path="/t/a/s", target="/keep"))
    keep = ns.create(meta_pb2.CreateRequest(path="/keep")).attr.inode
    ns.hardlink(meta_pb2.HardlinkRequest(src="/keep", dst="/t/a/b/k"))
    commits = []
    real_commit = ns.engine.commit

    def counting_commit(reads, puts, deletes, **kw):
        commits.append(len(deletes))
        return real_commit(reads, puts, deletes, **kw)

    ns.engine.commit = counting_commit
    removed = rm(ns, "/t", recursive=True)
    ns.engine.commit = real_commit
    assert removed == 8  # t, a, b, 1, 2, 3, s, k
    assert len(commits) == 1
    assert set(gc_items(ns)) == set(files)
    assert stat(ns, "/keep").nlink == 1 and keep not in gc_items(ns)
    assert ns.counts() == {
        "inodes": 2,
        "files": 1,
        "directories": 1,
        "symlinks": 0,
        "sessions": 0,
        "pending_cuts": 0,
    }


def test_hardlink_gc_only_at_last_link(ns):
    f = ns.create(meta_pb2.CreateRequest(path="/f")).attr
    ns.hardlink(meta_pb2.HardlinkRequest(src="/f", dst="/g"))
    ns.hardlink(meta_pb2.HardlinkRequest(src="/g", dst="/h"))
    assert stat(ns, "/h").nlink == 3
    rm(ns, "/f")
    assert stat(ns, "/g").nlink == 2 and gc_items(ns) == {}
    rm(ns, "/h")
    assert stat(ns, "/g").nlink == 1 and gc_items(ns) == {}
    rm(ns, "/g")
    assert set(gc_items(ns)) == {f.inode}


def test_write_session_sync_close(ns):
    opened = ns.open(meta_pb2.OpenRequest(path="/f", flags=W | C, mode=0o640))
    assert opened.session_id and opened.attr.mode == 0o640 and opened.attr.size == 0
    inode = opened.attr.inode
    [sess] = ns.sessions()
    assert sess["inode"] == inode and sess["session_id"] == opened.session_id
    assert ns.counts()["sessions"] == 1
    synced = ns.sync(
        meta_pb2.SyncRequest(inode=inode, session_id=opened.session_id, length=500, mtime_ns=77)
    ).attr
    assert synced.size == 500 and synced.mtime_ns == 77
    assert ns.sessions() != []
    closed = ns.close(
        meta_pb2.CloseRequest(inode=inode, session_id=opened.session_id, length=800, wrote=True)
    ).attr
    assert closed.size == 800 and stat(ns, "/f").size == 800
    assert ns.sessions() == []
    with pytest.raises(errors.InvalidArgument):
        ns.close(meta_pb2.CloseRequest(inode=inode, session_id=opened.session_id))
    with pytest.raises(errors.InvalidArgument):
        ns.sync(meta_pb2.SyncRequest(inode=inode, session_id=12345, length=1))
    # a read open starts no session and a close without wrote keeps the length
    assert ns.open(meta_pb2.OpenRequest(path="/f")).session_id == 0
    again = ns.open(meta_pb2.OpenRequest(path="/f", flags=A))
    assert again.session_id and again.attr.size == 800
    ns.close(meta_pb2.CloseRequest(inode=inode, session_id=again.session_id, length=1))
    assert stat(ns, "/f").size == 800


def test_open_flags(ns, cuts):
    with pytest.raises(errors.NotFound):
        ns.open(meta_pb2.OpenRequest(path="/f"))
    created = ns.open(meta_pb2.OpenRequest(path="/f", flags=C)).attr  # create, read-only
    assert created.type == common_pb2.FILE and ns.sessions() == []
    with pytest.raises(errors.AlreadyExists):
        ns.open(meta_pb2.OpenRequest(path="/f", flags=W | C | X))
    with pytest.raises(errors.InvalidArgument):
        ns.open(meta_pb2.OpenRequest(path="/f", flags=W | X))
    ns.truncate(meta_pb2.TruncateRequest(path="/f", length=4096))
    t = ns.open(meta_pb2.OpenRequest(path="/f", flags=W | T))
    assert t.attr.size == 0 and stat(ns, "/f").size == 0
    assert cuts.calls == [(created.inode, 0)]
    # an empty file is not cut again
    ns.open(meta_pb2.OpenRequest(path="/f", flags=W | T))
    assert len(cuts.calls) == 1
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
    for flags in (W, A, W | C, T):
        with pytest.raises(errors.IsADirectory):
            ns.open(meta_pb2.OpenRequest(path="/d", flags=flags))
    assert ns.open(meta_pb2.OpenRequest(path="/d")).attr.type == common_pb2.DIRECTORY


def test_unlink_while_open_defers_gc_to_last_close(ns):
    one = ns.open(meta_pb2.OpenRequest(path="/f", flags=W | C))
    two = ns.open(meta_pb2.OpenRequest(path="/f", flags=W))
    inode = one.attr.inode
    rm(ns, "/f")
    assert gc_items(ns) == {}
    with pytest.raises(errors.NotFound):
        stat(ns, "/f")
    orphan = ns.stat(meta_pb2.StatRequest(inode=inode)).attr
    assert orphan.nlink == 0
    ns.sync(meta_pb2.SyncRequest(inode=inode, session_id=two.session_id, length=10))
    ns.close(meta_pb2.CloseRequest(inode=inode, session_id=one.session_id, length=5, wrote=True))
    assert gc_items(ns) == {} and ns.stat(meta_pb2.StatRequest(inode=inode)).attr.size == 5
    ns.close(meta_pb2.CloseRequest(inode=inode, session_id=two.session_id))
    assert gc_items(ns) == {inode: list(one.attr.layout.chains)}
    with pytest.raises(errors.NotFound):
        ns.stat(meta_pb2.StatRequest(inode=inode))
    assert ns.counts()["inodes"] == 1
    # no guard keys left behind
    assert list(ns.engine.scan_prefix(keys.SESSION)) == []


def test_rename_over_open_file_defers_gc(ns):
    opened = ns.open(meta_pb2.OpenRequest(path="/victim", flags=W | C))
    ns.create(meta_pb2.CreateRequest(path="/new"))
    ns.rename(meta_pb2.RenameRequest(src="/new", dst="/victim"))
    assert gc_items(ns) == {}
    ns.close(meta_pb2.CloseRequest(inode=opened.attr.inode, session_id=opened.session_id))
    assert set(gc_items(ns)) == {opened.attr.inode}


def _big_tree(ns, dirs: int, per_dir: int) -> set[int]:
    """/big with ``dirs`` subdirectories of ``per_dir`` files each; the files' inodes."""
    files = set()
    for d in range(dirs):
        ns.mkdir(meta_pb2.MkdirRequest(path=f"/big/d{d}/e", parents=True))
        paths = [f"/big/d{d}/f{i}" for i in range(per_dir)] + [f"/big/d{d}/e/g"]
        resp = ns.batch_write_open(
            meta_pb2.BatchWriteOpenRequest(paths=paths, flags=W | C, mode=0o644)
        )
        for r in resp.results:
            files.add(r.opened.attr.inode)
            ns.close(
                meta_pb2.CloseRequest(
                    inode=r.opened.attr.inode, session_id=r.opened.session_id, length=0
                )
            )
    return files


def test_a_tree_too_large_for_one_transaction_goes_at_once_and_is_deleted_in_slices(ns):
    """On etcd (128 operations a transaction) a 6 x 41-file tree cannot go in one commit:
    it is detached at once and deleted slice by slice; in memory it goes in one."""
    files = _big_tree(ns, dirs=6, per_dir=40)
    keep = ns.create(meta_pb2.CreateRequest(path="/keep")).attr.inode
    ns.hardlink(meta_pb2.HardlinkRequest(src="/keep", dst="/big/d0/k"))
    entries = 1 + 6 * (1 + 1 + 40 + 1) + 1  # big, each d with e, its files and e/g, the link
    assert rm(ns, "/big", recursive=True) == entries
    with pytest.raises(errors.NotFound):
        stat(ns, "/big")
    assert [e.name for e in ns.list(meta_pb2.ListRequest(path="/")).entries] == ["keep"]
    ns.purge_detached()  # what the background purge and the leader's sweep do
    assert ns.detached() == 0
    assert set(gc_items(ns)) == files
    assert stat(ns, "/keep").nlink == 1 and keep not in gc_items(ns)
    assert [k for k, _ in ns.engine.scan_prefix(keys.INODE)] == sorted(
        [keys.inode_key(1), keys.inode_key(keep)]
    )
    counts = ns.counts()
    assert (counts["inodes"], counts["files"], counts["directories"]) == (2, 1, 1)


def test_a_detached_tree_is_finished_by_the_sweep_after_a_crash(etcd_url, cuts):
    from emberfs.metaserver.store.etcd import EtcdEngine

    engine = EtcdEngine(etcd_url)  # a store with transaction limits: it detaches trees
    first = Namespace(engine, chain_table=lambda: [1, 2], truncate_chunks=cuts)
    files = _big_tree(first, dirs=3, per_dir=60)
    first.runner.purge_soon = lambda inodes: None  # the metaserver dies before it purges
    assert rm(first, "/big", recursive=True) == 1 + 3 * 63
    assert first.detached() == 1
    again = Namespace(engine, chain_table=lambda: [1, 2], truncate_chunks=cuts)
    assert again.purge_detached() == 1
    assert again.detached() == 0
    assert set(gc_items(again)) == files
    assert [k for k, _ in engine.scan_prefix(keys.INODE)] == [keys.inode_key(1)]
    assert again.counts()["inodes"] == 1
    engine.close()


def test_a_detaching_remove_checks_permissions_over_the_whole_tree(store, cuts):
    ns = Namespace(store(), chain_table=lambda: [1], truncate_chunks=cuts)
    _big_tree(ns, dirs=3, per_dir=50)
    ns.setattr(meta_pb2.SetAttrRequest(path="/big", mode=0o777))
    for d in range(3):
        ns.setattr(meta_pb2.SetAttrRequest(path=f"/big/d{d}", mode=0o777))
        ns.setattr(meta_pb2.SetAttrRequest(path=f"/big/d{d}/e", mode=0o777))
    ns.setattr(meta_pb2.SetAttrRequest(path="/big/d2/e", mode=0o555))
    user = common_pb2.RequestContext(uid=1000, gid=1000)
    with pytest.raises(errors.PermissionDenied):
        ns.remove(meta_pb2.RemoveRequest(ctx=user, path="/big", recursive=True))
    assert stat(ns, "/big/d2/e/g").type == common_pb2.FILE  # nothing went
    assert ns.detached() == 0


def test_a_remove_bound_to_an_inode_spares_a_file_that_replaced_it(ns):
    first = ns.create(meta_pb2.CreateRequest(path="/bound")).attr
    ns.rename(meta_pb2.RenameRequest(src="/bound", dst="/moved"))
    second = ns.create(meta_pb2.CreateRequest(path="/bound")).attr
    with pytest.raises(errors.NotFound):
        rm(ns, "/bound", inode=first.inode)
    assert stat(ns, "/bound").inode == second.inode
    got = ns.batch_remove(
        meta_pb2.BatchRemoveRequest(paths=["/bound", "/moved"], inodes=[first.inode, first.inode])
    )
    assert [r.errno for r in got.results] == [errors.NotFound.errno, 0]
    assert stat(ns, "/bound").inode == second.inode
    with pytest.raises(errors.NotFound):
        stat(ns, "/moved")
    with pytest.raises(errors.InvalidArgument):
        ns.batch_remove(meta_pb2.BatchRemoveRequest(paths=["/bound"], inodes=[1, 2]))
