"""Namespace basics on the in-memory engine: mkdir, create, stat, list, links, attributes."""

from __future__ import annotations

import errno

import pytest

from emberfs.common import errors
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import common_pb2, meta_pb2

FILE, DIRECTORY, SYMLINK = common_pb2.FILE, common_pb2.DIRECTORY, common_pb2.SYMLINK


@pytest.fixture
def ns(store):
    return Namespace(store(), chain_table=lambda: [1, 2, 3, 4, 5, 6])


def stat(ns, path, follow=True):
    return ns.stat(meta_pb2.StatRequest(path=path, follow=follow)).attr


def names(ns, path, **kw):
    return [e.name for e in ns.list(meta_pb2.ListRequest(path=path, **kw)).entries]


def test_root_exists_open_to_all(ns):
    root = stat(ns, "/")
    assert root.inode == 1 and root.type == DIRECTORY and root.mode == 0o777
    assert stat(ns, "").inode == 1
    assert ns.counts()["directories"] == 1


def test_root_survives_restart_and_ids_are_never_reused(store):
    engine = store()
    ns = Namespace(engine, chain_table=lambda: [1])
    a = ns.create(meta_pb2.CreateRequest(path="/a")).attr.inode
    ns.remove(meta_pb2.RemoveRequest(path="/a"))
    again = Namespace(engine, chain_table=lambda: [1])
    assert again.counts()["inodes"] == 1
    b = again.create(meta_pb2.CreateRequest(path="/a")).attr.inode
    assert b > a > 1


def test_mkdir_and_parents(ns):
    d = ns.mkdir(meta_pb2.MkdirRequest(path="/a", mode=0o750)).attr
    assert d.type == DIRECTORY and d.mode == 0o750 and d.nlink == 2
    with pytest.raises(errors.AlreadyExists):
        ns.mkdir(meta_pb2.MkdirRequest(path="/a"))
    with pytest.raises(errors.NotFound):
        ns.mkdir(meta_pb2.MkdirRequest(path="/x/y"))
    deep = ns.mkdir(meta_pb2.MkdirRequest(path="/x/y/z", parents=True)).attr
    assert stat(ns, "/x/y/z").inode == deep.inode
    # an existing directory is fine with parents
    assert (
        ns.mkdir(meta_pb2.MkdirRequest(path="/x/y", parents=True)).attr.inode
        == stat(ns, "/x/y").inode
    )
    assert ns.mkdir(meta_pb2.MkdirRequest(path="/", parents=True)).attr.inode == 1
    ns.create(meta_pb2.CreateRequest(path="/x/f"))
    with pytest.raises(errors.NotADirectory):
        ns.mkdir(meta_pb2.MkdirRequest(path="/x/f/g", parents=True))
    with pytest.raises(errors.NotADirectory):
        ns.mkdir(meta_pb2.MkdirRequest(path="/x/f/g"))
    assert ns.counts() == {
        "inodes": 6,
        "files": 1,
        "directories": 5,
        "symlinks": 0,
        "sessions": 0,
        "pending_cuts": 0,
    }


def test_create_exclusive_and_not(ns):
    f = ns.create(meta_pb2.CreateRequest(path="/f", mode=0o600, exclusive=True)).attr
    assert f.type == FILE and f.mode == 0o600 and f.size == 0 and f.nlink == 1
    assert len(f.layout.chains) == 4 and f.layout.chunk_size == 4 << 20
    with pytest.raises(errors.AlreadyExists):
        ns.create(meta_pb2.CreateRequest(path="/f", exclusive=True))
    assert ns.create(meta_pb2.CreateRequest(path="/f")).attr.inode == f.inode
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
    with pytest.raises(errors.IsADirectory):
        ns.create(meta_pb2.CreateRequest(path="/d"))
    with pytest.raises(errors.NotFound):
        ns.create(meta_pb2.CreateRequest(path="/nope/f"))
    with pytest.raises(errors.NotADirectory):
        ns.create(meta_pb2.CreateRequest(path="/f/g"))


def test_create_without_chains_is_unavailable(store):
    ns = Namespace(store(), chain_table=lambda: [])
    with pytest.raises(errors.Unavailable, match="no storage chains"):
        ns.create(meta_pb2.CreateRequest(path="/f"))
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))  # directories need no chains
    assert names(ns, "/") == ["d"]


def test_stat_by_inode_and_batch(ns):
    f = ns.create(meta_pb2.CreateRequest(path="/f")).attr
    assert ns.stat(meta_pb2.StatRequest(inode=f.inode)).attr == f
    with pytest.raises(errors.NotFound):
        ns.stat(meta_pb2.StatRequest(inode=999))
    with pytest.raises(errors.InvalidArgument):
        ns.stat(meta_pb2.StatRequest(inode=f.inode, path="/f"))
    out = ns.batch_stat(meta_pb2.BatchStatRequest(paths=["/f", "/missing", "/f/x", "/", "a\0b"]))
    got = [(r.errno, r.attr.inode) for r in out.results]
    assert got == [(0, f.inode), (errno.ENOENT, 0), (errno.ENOTDIR, 0), (0, 1), (errno.EINVAL, 0)]


def test_batch_open_gives_what_a_read_open_gives(ns):
    f = ns.create(meta_pb2.CreateRequest(path="/f")).attr
    ns.symlink(meta_pb2.SymlinkRequest(path="/s", target="/f"))
    paths = ["/f", "/missing", "/f/x", "/", "/s", "a\0b"]
    out = ns.batch_open(meta_pb2.BatchOpenRequest(paths=paths))
    got = [(r.errno, r.attr.inode) for r in out.results]
    assert got == [
        (0, f.inode),
        (errno.ENOENT, 0),
        (errno.ENOTDIR, 0),
        (0, 1),
        (0, f.inode),
        (errno.EINVAL, 0),
    ]
    for path, r in zip(paths, out.results, strict=True):
        if not r.errno:
            assert r.attr == ns.open(meta_pb2.OpenRequest(path=path)).attr
    assert out.results[0].attr.layout.chains  # what a reader needs to find the chunks
    with pytest.raises(errors.InvalidArgument):
        ns.batch_open(meta_pb2.BatchOpenRequest(paths=["/f"] * 10001))


def test_batch_write_open_gives_what_open_gives_and_batch_close_what_close_gives(ns):
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
    old = ns.create(meta_pb2.CreateRequest(path="/d/old")).attr
    flags = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE | meta_pb2.OPEN_TRUNCATE
    paths = ["/d/a", "/missing/b", "/d/old", "/d", "/d/old/x", "/d/c"]
    out = ns.batch_write_open(meta_pb2.BatchWriteOpenRequest(paths=paths, flags=flags, mode=0o600))
    assert [r.errno for r in out.results] == [0, errno.ENOENT, 0, errno.EISDIR, errno.ENOTDIR, 0]
    a, _, o, _, _, c = out.results
    assert o.opened.attr.inode == old.inode
    assert a.opened.attr.mode == 0o600 and a.opened.attr.layout.chains
    assert (a.opened.created, o.opened.created, c.opened.created) == (True, False, True)
    sessions = {r.opened.session_id for r in (a, o, c)}
    assert len(sessions) == 3 and 0 not in sessions
    assert ns.counts()["files"] == 3
    # the sessions are real: Close ends them with their lengths, once
    items = [
        meta_pb2.CloseItem(
            inode=a.opened.attr.inode, session_id=a.opened.session_id, length=5, wrote=True
        ),
        meta_pb2.CloseItem(inode=o.opened.attr.inode, session_id=o.opened.session_id),
        meta_pb2.CloseItem(inode=c.opened.attr.inode, session_id=999, length=1, wrote=True),
    ]
    closed = ns.batch_close(meta_pb2.BatchCloseRequest(items=items))
    assert [r.errno for r in closed.results] == [0, 0, errno.EINVAL]
    assert closed.results[0].attr.size == 5 and stat(ns, "/d/a").size == 5
    again = ns.batch_close(meta_pb2.BatchCloseRequest(items=items[:1]))
    assert again.results[0].errno == errno.EINVAL  # that session ended
    assert [s["inode"] for s in ns.sessions()] == [c.opened.attr.inode]
    # exclusive creates refuse existing paths, one by one
    excl = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE | meta_pb2.OPEN_EXCLUSIVE
    out = ns.batch_write_open(meta_pb2.BatchWriteOpenRequest(paths=["/d/a", "/d/e"], flags=excl))
    assert [r.errno for r in out.results] == [errno.EEXIST, 0]
    # whole-call errors: no write flag, bad flags, too many paths
    for bad in (0, meta_pb2.OPEN_CREATE, 1 << 10, meta_pb2.OPEN_WRITE | meta_pb2.OPEN_EXCLUSIVE):
        with pytest.raises(errors.InvalidArgument):
            ns.batch_write_open(meta_pb2.BatchWriteOpenRequest(paths=["/d/z"], flags=bad))
    with pytest.raises(errors.InvalidArgument):
        ns.batch_write_open(meta_pb2.BatchWriteOpenRequest(paths=["/d/z"] * 10001, flags=flags))
    with pytest.raises(errors.InvalidArgument):
        ns.batch_close(meta_pb2.BatchCloseRequest(items=items[:1] * 10001))
    assert not ns.batch_open(meta_pb2.BatchOpenRequest(paths=["/d/z"])).results[0].attr.inode


def test_batch_remove_removes_each_path_as_remove_would(ns):
    ns.mkdir(meta_pb2.MkdirRequest(path="/d/sub", parents=True))
    for p in ("/d/a", "/d/b", "/d/sub/c"):
        ns.create(meta_pb2.CreateRequest(path=p))
    paths = ["/d/a", "/d/missing", "/d/sub", "/", "/d/b"]
    out = ns.batch_remove(meta_pb2.BatchRemoveRequest(paths=paths))
    got = [(r.errno, r.removed) for r in out.results]
    assert got == [(0, 1), (errno.ENOENT, 0), (errno.ENOTEMPTY, 0), (errno.EBUSY, 0), (0, 1)]
    out = ns.batch_remove(meta_pb2.BatchRemoveRequest(paths=["/d/sub"], recursive=True))
    assert [(r.errno, r.removed) for r in out.results] == [(0, 2)]
    assert names(ns, "/d") == []
    with pytest.raises(errors.InvalidArgument):
        ns.batch_remove(meta_pb2.BatchRemoveRequest(paths=["/d"] * 10001))
    assert names(ns, "/") == ["d"]


def test_validation_errors(ns):
    with pytest.raises(errors.NameTooLong):
        ns.create(meta_pb2.CreateRequest(path="/" + "x" * 256))
    with pytest.raises(errors.NameTooLong):
        stat(ns, "/a" * 2100)
    for bad in ("/a/../b", "/a/./b", "/a\0b"):
        with pytest.raises(errors.InvalidArgument):
            ns.mkdir(meta_pb2.MkdirRequest(path=bad))
    assert names(ns, "/") == []
    with pytest.raises(errors.InvalidArgument):
        ns.open(meta_pb2.OpenRequest(path="/f", flags=1 << 10))
    with pytest.raises(errors.InvalidArgument):
        ns.list(meta_pb2.ListRequest(path="/", start_after="a/b"))
    with pytest.raises(errors.InvalidArgument):
        ns.stat(meta_pb2.StatRequest(ctx=common_pb2.RequestContext(client_id="a\0b"), path="/"))


def test_list_pages_through_ten_thousand_entries(ns):
    ns.mkdir(meta_pb2.MkdirRequest(path="/big"))
    engine = ns.engine
    # populate through the namespace, in a few big transactions' worth of requests
    for i in range(10000):
        ns.create(meta_pb2.CreateRequest(path=f"/big/f{i:05d}"))
    seen = []
    calls = 0
    token = ""
    while True:
        page = ns.list(meta_pb2.ListRequest(path="/big", start_after=token))
        calls += 1
        seen.extend(e.name for e in page.entries)
        assert all(e.attr.type == FILE and e.attr.inode for e in page.entries)
        if not page.more:
            break
        token = page.entries[-1].name
    assert calls <= 10
    assert seen == [f"f{i:05d}" for i in range(10000)]
    one = ns.list(meta_pb2.ListRequest(path="/big", limit=50000))
    assert len(one.entries) == 10000 and not one.more
    small = ns.list(meta_pb2.ListRequest(path="/big", limit=3, start_after="f09997"))
    assert [e.name for e in small.entries] == ["f09998", "f09999"] and not small.more
    assert engine.get(keys.dentry_key(stat(ns, "/big").inode, "f00000")) is not None


def test_list_errors(ns):
    ns.create(meta_pb2.CreateRequest(path="/f"))
    with pytest.raises(errors.NotADirectory):
        ns.list(meta_pb2.ListRequest(path="/f"))
    with pytest.raises(errors.NotFound):
        ns.list(meta_pb2.ListRequest(path="/missing"))


def test_symlinks(ns):
    ns.mkdir(meta_pb2.MkdirRequest(path="/d/e", parents=True))
    f = ns.create(meta_pb2.CreateRequest(path="/d/e/f")).attr
    link = ns.symlink(meta_pb2.SymlinkRequest(path="/abs", target="/d/e")).attr
    assert link.type == SYMLINK and link.size == 4
    ns.symlink(meta_pb2.SymlinkRequest(path="/d/rel", target="e/f"))
    ns.symlink(meta_pb2.SymlinkRequest(path="/d/e/up", target="../../d/./e"))
    assert stat(ns, "/abs/f").inode == f.inode
    assert stat(ns, "/d/rel").inode == f.inode
    assert stat(ns, "/d/rel", follow=False).type == SYMLINK
    assert stat(ns, "/d/e/up/up/up/f").inode == f.inode
    assert ns.readlink(meta_pb2.ReadlinkRequest(path="/d/rel")).target == "e/f"
    with pytest.raises(errors.InvalidArgument):
        ns.readlink(meta_pb2.ReadlinkRequest(path="/d/e/f"))
    with pytest.raises(errors.AlreadyExists):
        ns.symlink(meta_pb2.SymlinkRequest(path="/abs", target="x"))
    with pytest.raises(errors.InvalidArgument):
        ns.symlink(meta_pb2.SymlinkRequest(path="/empty", target=""))
    # loops
    ns.symlink(meta_pb2.SymlinkRequest(path="/l1", target="/l2"))
    ns.symlink(meta_pb2.SymlinkRequest(path="/l2", target="l1"))
    with pytest.raises(errors.TooManyLinks):
        stat(ns, "/l1")
    with pytest.raises(errors.TooManyLinks):
        stat(ns, "/l1/x", follow=False)
    assert stat(ns, "/l1", follow=False).type == SYMLINK
    # a dangling symlink: create makes its target
    ns.symlink(meta_pb2.SymlinkRequest(path="/dangling", target="/d/new"))
    with pytest.raises(errors.NotFound):
        stat(ns, "/dangling")
    made = ns.create(meta_pb2.CreateRequest(path="/dangling")).attr
    assert stat(ns, "/d/new").inode == made.inode
    with pytest.raises(errors.AlreadyExists):
        ns.create(meta_pb2.CreateRequest(path="/dangling", exclusive=True))
    # listing through a symlink to a directory
    assert names(ns, "/abs") == ["f", "up"]
    assert ns.counts()["symlinks"] == 6


def test_hardlinks(ns):
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
    f = ns.create(meta_pb2.CreateRequest(path="/f")).attr
    linked = ns.hardlink(meta_pb2.HardlinkRequest(src="/f", dst="/d/g")).attr
    assert linked.inode == f.inode and linked.nlink == 2
    assert stat(ns, "/d/g").nlink == 2 and stat(ns, "/f").nlink == 2
    with pytest.raises(errors.NotPermitted):
        ns.hardlink(meta_pb2.HardlinkRequest(src="/d", dst="/d2"))
    with pytest.raises(errors.AlreadyExists):
        ns.hardlink(meta_pb2.HardlinkRequest(src="/f", dst="/d/g"))
    with pytest.raises(errors.NotFound):
        ns.hardlink(meta_pb2.HardlinkRequest(src="/nope", dst="/x"))
    assert ns.counts()["files"] == 1


def test_truncate_shrink_has_storage_cut_once_the_length_is_committed(store):
    calls = []

    def cut(attr, length, request_id):
        calls.append((attr.inode, attr.size, length))

    ns = Namespace(store(), chain_table=lambda: [1], truncate_chunks=cut)
    f = ns.create(meta_pb2.CreateRequest(path="/f")).attr
    assert ns.truncate(meta_pb2.TruncateRequest(path="/f", length=1000)).attr.size == 1000
    assert calls == []  # growing cuts nothing
    assert ns.truncate(meta_pb2.TruncateRequest(path="/f", length=10)).attr.size == 10
    assert calls == [(f.inode, 10, 10)]
    ns.truncate(meta_pb2.TruncateRequest(path="/f", length=10))
    assert len(calls) == 1
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
    with pytest.raises(errors.IsADirectory):
        ns.truncate(meta_pb2.TruncateRequest(path="/d", length=0))
    with pytest.raises(errors.InvalidArgument):
        ns.truncate(meta_pb2.TruncateRequest(path="/f", length=1 << 63))


class Storage:
    """Chunk cuts that fail until ``up``; each call is kept as ``(length, request id)``."""

    def __init__(self) -> None:
        self.up = False
        self.calls: list[tuple[int, int]] = []

    def cut(self, attr, length: int, request_id: int) -> None:
        self.calls.append((length, request_id))
        if not self.up:
            raise errors.Unavailable("chain down")


def test_a_cut_storage_could_not_make_keeps_the_new_length_and_blocks_growth_until_done(store):
    """A shrink commits its length with the cut; the cut is finished before the file may grow.

    Without the pending cut, a cut that landed on storage after the metaserver
    stopped waiting left the file its old length over chunks already cut.
    """
    storage = Storage()
    ns = Namespace(store(), chain_table=lambda: [1], truncate_chunks=storage.cut)
    calls = storage.calls
    ns.create(meta_pb2.CreateRequest(path="/f"))
    ns.truncate(meta_pb2.TruncateRequest(path="/f", length=100))
    shrink = meta_pb2.TruncateRequest(
        ctx=common_pb2.RequestContext(client_id="c", request_id=7), path="/f", length=5
    )
    with pytest.raises(errors.Unavailable):
        ns.truncate(shrink)
    assert stat(ns, "/f").size == 5  # the length is the cut's, whatever storage holds
    inode = stat(ns, "/f").inode
    assert ns.cuts.pending() == [inode] and ns.counts()["pending_cuts"] == 1
    with pytest.raises(errors.Unavailable):  # growing would show bytes past the cut
        ns.truncate(meta_pb2.TruncateRequest(path="/f", length=50))
    with pytest.raises(errors.Unavailable):  # and so would writes
        ns.open(meta_pb2.OpenRequest(path="/f", flags=meta_pb2.OPEN_WRITE))
    assert stat(ns, "/f").size == 5 and ns.sessions() == []
    assert ns.cuts.finish_all() == 0 and ns.cuts.pending() == [inode]

    storage.up = True
    assert ns.truncate(shrink).attr.size == 5  # the client's retry, answered once cut
    assert ns.cuts.pending() == []
    assert {length for length, _ in calls} == {5} and len({r for _, r in calls}) == 1
    assert ns.truncate(meta_pb2.TruncateRequest(path="/f", length=50)).attr.size == 50


def test_pending_cuts_are_finished_by_the_sweep_and_replaced_by_a_later_shrink(store):
    storage = Storage()
    ns = Namespace(store(), chain_table=lambda: [1], truncate_chunks=storage.cut)
    calls = storage.calls
    ns.create(meta_pb2.CreateRequest(path="/f"))
    ns.truncate(meta_pb2.TruncateRequest(path="/f", length=100))
    for length in (60, 30):
        with pytest.raises(errors.Unavailable):
            ns.truncate(meta_pb2.TruncateRequest(path="/f", length=length))
    with pytest.raises(errors.Unavailable):  # OPEN_TRUNCATE of a file cut to 30, not yet on storage
        ns.open(meta_pb2.OpenRequest(path="/f", flags=meta_pb2.OPEN_WRITE | meta_pb2.OPEN_TRUNCATE))
    assert stat(ns, "/f").size == 0
    assert [length for length, _ in calls] == [60, 30, 0]
    assert len({r for _, r in calls}) == 3  # each cut its own request
    storage.up = True
    assert ns.cuts.finish_all() == 1
    assert calls[-1] == (0, calls[-2][1]) and ns.cuts.pending() == []
    ns.remove(meta_pb2.RemoveRequest(path="/f"))
    assert ns.cuts.pending() == []


def test_a_removed_file_takes_its_pending_cut_with_it(store):
    ns = Namespace(store(), chain_table=lambda: [1], truncate_chunks=Storage().cut)
    ns.create(meta_pb2.CreateRequest(path="/f"))
    ns.truncate(meta_pb2.TruncateRequest(path="/f", length=100))
    with pytest.raises(errors.Unavailable):
        ns.truncate(meta_pb2.TruncateRequest(path="/f", length=10))
    assert len(ns.cuts.pending()) == 1
    ns.remove(meta_pb2.RemoveRequest(path="/f"))
    assert ns.cuts.pending() == []


def test_setattr_and_statfs(store):
    ns = Namespace(store(), chain_table=lambda: [1], usage=lambda: (1000, 300))
    ns.create(meta_pb2.CreateRequest(path="/f", mode=0o644))
    attr = ns.setattr(
        meta_pb2.SetAttrRequest(path="/f", mode=0o100600, uid=7, gid=8, mtime_ns=12345)
    ).attr
    assert (attr.mode, attr.uid, attr.gid, attr.mtime_ns) == (0o600, 7, 8, 12345)
    assert attr.ctime_ns > 12345
    assert stat(ns, "/f").uid == 7
    # unset fields stay
    assert ns.setattr(meta_pb2.SetAttrRequest(path="/f", mode=0)).attr.uid == 7
    ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
    fs = ns.statfs(meta_pb2.StatFsRequest())
    assert (fs.capacity, fs.used, fs.free) == (1000, 300, 700)
    assert (fs.inodes, fs.files, fs.directories) == (3, 1, 2)


def test_layouts_inherit_and_validate(store):
    table = [10, 11, 12, 13, 14, 15, 16, 17]
    ns = Namespace(
        store(),
        chain_table=lambda: table,
        default_layout=common_pb2.Layout(chunk_size=1 << 20, stripe=2),
    )
    top = ns.create(meta_pb2.CreateRequest(path="/f")).attr.layout
    assert top.chunk_size == 1 << 20 and top.stripe == 2 and len(top.chains) == 2
    custom = common_pb2.Layout(chunk_size=256 << 10, stripe=3, chain_table=[12, 13, 14])
    ns.mkdir(meta_pb2.MkdirRequest(path="/d", layout=custom))
    ns.mkdir(meta_pb2.MkdirRequest(path="/d/sub/deeper", parents=True))
    seeds = []
    for i in range(6):
        lay = ns.create(meta_pb2.CreateRequest(path=f"/d/sub/deeper/f{i}")).attr.layout
        assert lay.chunk_size == 256 << 10 and lay.stripe == 3
        assert sorted(lay.chains) == [12, 13, 14]
        seeds.append(lay.seed)
    assert seeds == sorted(seeds) and len(set(seeds)) == 6
    # round-robin: consecutive files start at consecutive windows of the table
    firsts = set()
    for i in range(8):
        lay = ns.create(meta_pb2.CreateRequest(path=f"/g{i}")).attr.layout
        firsts.add(frozenset(lay.chains))
    assert len(firsts) == 8
    # set_layout on an existing directory, then clear it again
    got = ns.set_layout(
        meta_pb2.SetLayoutRequest(
            path="/d", layout=common_pb2.Layout(chunk_size=64 << 20, stripe=1)
        )
    ).attr
    assert got.layout.chunk_size == 64 << 20
    lay = ns.create(meta_pb2.CreateRequest(path="/d/x")).attr.layout
    assert lay.chunk_size == 64 << 20 and lay.stripe == 1
    ns.set_layout(meta_pb2.SetLayoutRequest(path="/d", layout=common_pb2.Layout()))
    assert ns.create(meta_pb2.CreateRequest(path="/d/y")).attr.layout.chunk_size == 1 << 20
    bad = [
        common_pb2.Layout(chunk_size=100_000, stripe=1),
        common_pb2.Layout(chunk_size=32 << 10, stripe=1),
        common_pb2.Layout(chunk_size=128 << 20, stripe=1),
        common_pb2.Layout(chunk_size=1 << 20, stripe=0),
        common_pb2.Layout(chunk_size=1 << 20, stripe=257),
        common_pb2.Layout(chunk_size=1 << 20, stripe=1, chain_table=[99]),
        common_pb2.Layout(chunk_size=1 << 20, stripe=1, chain_table=[10, 10]),
        common_pb2.Layout(chunk_size=1 << 20, stripe=1, chains=[10]),
        common_pb2.Layout(stripe=2),
    ]
    for layout in bad:
        with pytest.raises(errors.InvalidArgument):
            ns.set_layout(meta_pb2.SetLayoutRequest(path="/d", layout=layout))
        with pytest.raises(errors.InvalidArgument):
            ns.mkdir(meta_pb2.MkdirRequest(path="/bad", layout=layout))
    assert "bad" not in names(ns, "/")
    with pytest.raises(errors.NotADirectory):
        ns.set_layout(
            meta_pb2.SetLayoutRequest(
                path="/f", layout=common_pb2.Layout(chunk_size=1 << 20, stripe=1)
            )
        )
    # directories and symlinks have no chains
    assert not stat(ns, "/d").layout.chains
    assert not ns.symlink(meta_pb2.SymlinkRequest(path="/s", target="/f")).attr.layout.chains


def test_stripe_capped_at_chain_count(store):
    ns = Namespace(store(), chain_table=lambda: [7, 8])
    lay = ns.create(meta_pb2.CreateRequest(path="/f")).attr.layout
    assert lay.stripe == 2 and sorted(lay.chains) == [7, 8]


def test_a_batched_truncating_open_makes_its_cut_durable_before_storage_cuts():
    """A batch commits without a sync of its own: the cut's record must be synced first, or a
    restart could forget a length that storage already holds."""
    events: list[str] = []

    class Engine(MemoryEngine):
        def sync(self) -> None:
            events.append("sync")

    def cut(attr, length, request_id):
        events.append("cut")

    ns = Namespace(Engine(), chain_table=lambda: [1], truncate_chunks=cut)
    ns.create(meta_pb2.CreateRequest(path="/f"))
    ns.truncate(meta_pb2.TruncateRequest(path="/f", length=100))
    ns.open(meta_pb2.OpenRequest(path="/g", flags=meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE))
    events.clear()  # (the open above reserved the session ids, which syncs)
    flags = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_TRUNCATE
    (result,) = ns.batch_write_open(
        meta_pb2.BatchWriteOpenRequest(paths=["/f"], flags=flags)
    ).results
    assert result.opened.attr.size == 0
    assert "cut" in events and "sync" in events[: events.index("cut")], events


def test_setattr_no_follow_changes_the_symlink_itself(store):
    ns = Namespace(store(), chain_table=lambda: [1])
    ns.create(meta_pb2.CreateRequest(path="/f", mode=0o644))
    ns.symlink(meta_pb2.SymlinkRequest(path="/l", target="/f"))
    ns.symlink(meta_pb2.SymlinkRequest(path="/dangling", target="/nowhere"))
    before = stat(ns, "/f")
    link = ns.setattr(meta_pb2.SetAttrRequest(path="/l", mtime_ns=777, no_follow=True)).attr
    assert link.type == common_pb2.SYMLINK and link.mtime_ns == 777
    assert stat(ns, "/f").mtime_ns == before.mtime_ns
    assert ns.setattr(meta_pb2.SetAttrRequest(path="/l", mtime_ns=5)).attr.inode == before.inode
    assert (
        ns.setattr(meta_pb2.SetAttrRequest(path="/dangling", uid=3, no_follow=True)).attr.uid == 3
    )
    with pytest.raises(errors.NotFound):
        ns.setattr(meta_pb2.SetAttrRequest(path="/dangling", uid=3))


def test_truncate_by_inode_reaches_a_renamed_or_unlinked_open_file(store):
    storage = Storage()
    storage.up = True
    ns = Namespace(store(), chain_table=lambda: [1], truncate_chunks=storage.cut)
    opened = ns.open(
        meta_pb2.OpenRequest(path="/f", flags=meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE)
    )
    inode = opened.attr.inode
    ns.rename(meta_pb2.RenameRequest(src="/f", dst="/g"))
    attr = ns.truncate(meta_pb2.TruncateRequest(path="/f", inode=inode, length=4096)).attr
    assert attr.inode == inode and attr.size == 4096 and stat(ns, "/g").size == 4096
    ns.remove(meta_pb2.RemoveRequest(path="/g"))  # its write session keeps the inode
    assert ns.truncate(meta_pb2.TruncateRequest(inode=inode, length=10)).attr.size == 10
    ns.close(meta_pb2.CloseRequest(inode=inode, session_id=opened.session_id))
    with pytest.raises(errors.NotFound):
        ns.truncate(meta_pb2.TruncateRequest(inode=inode, length=0))
