"""Rename edge cases, like rename(2)."""

from __future__ import annotations

import pytest

from emberfs.common import errors
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.store import keys
from emberfs.proto import cluster_pb2, meta_pb2


@pytest.fixture
def ns(store):
    ns = Namespace(store(), chain_table=lambda: [1, 2, 3])
    ns.mkdir(meta_pb2.MkdirRequest(path="/a/b/c", parents=True))
    ns.mkdir(meta_pb2.MkdirRequest(path="/empty"))
    ns.mkdir(meta_pb2.MkdirRequest(path="/full"))
    ns.create(meta_pb2.CreateRequest(path="/full/x"))
    ns.create(meta_pb2.CreateRequest(path="/f"))
    ns.create(meta_pb2.CreateRequest(path="/g"))
    return ns


def mv(ns, src, dst, **kw):
    return ns.rename(meta_pb2.RenameRequest(src=src, dst=dst, **kw)).attr


def ino(ns, path):
    return ns.stat(meta_pb2.StatRequest(path=path)).attr.inode


def exists(ns, path):
    try:
        ino(ns, path)
    except errors.NotFound:
        return False
    return True


def gc_items(ns):
    out = []
    for _, raw in ns.engine.scan_prefix(keys.GC):
        item = cluster_pb2.GCItem()
        item.ParseFromString(raw)
        out.append(item)
    return out


def test_file_across_directories(ns):
    f = ino(ns, "/f")
    attr = mv(ns, "/f", "/a/b/c/moved")
    assert attr.inode == f
    assert not exists(ns, "/f") and ino(ns, "/a/b/c/moved") == f


def test_file_over_file_replaces_and_queues_gc(ns):
    f, g = ino(ns, "/f"), ino(ns, "/g")
    mv(ns, "/f", "/g")
    assert ino(ns, "/g") == f and not exists(ns, "/f")
    assert [i.inode for i in gc_items(ns)] == [g]
    assert ns.counts()["files"] == 2  # /g (was /f) and /full/x


def test_no_replace(ns):
    with pytest.raises(errors.AlreadyExists):
        mv(ns, "/f", "/g", no_replace=True)
    assert exists(ns, "/f") and exists(ns, "/g")
    mv(ns, "/f", "/h", no_replace=True)
    assert exists(ns, "/h")


def test_dir_over_empty_dir(ns):
    a = ino(ns, "/a")
    mv(ns, "/a", "/empty")
    assert ino(ns, "/empty") == a and ino(ns, "/empty/b/c")
    assert not exists(ns, "/a")
    assert ns.counts()["directories"] == 5  # root, empty(a), b, c, full


def test_dir_over_non_empty_dir(ns):
    with pytest.raises(errors.NotEmpty):
        mv(ns, "/a", "/full")
    assert exists(ns, "/a/b") and exists(ns, "/full/x")


def test_type_mismatches(ns):
    with pytest.raises(errors.NotADirectory):
        mv(ns, "/a", "/f")
    with pytest.raises(errors.IsADirectory):
        mv(ns, "/f", "/empty")
    assert exists(ns, "/f") and exists(ns, "/a")


def test_into_own_subtree(ns):
    with pytest.raises(errors.InvalidArgument):
        mv(ns, "/a", "/a/b/c/d")
    with pytest.raises(errors.InvalidArgument):
        mv(ns, "/a", "/a/x")
    # through a symlink that leads into the subtree
    ns.symlink(meta_pb2.SymlinkRequest(path="/into", target="/a/b"))
    with pytest.raises(errors.InvalidArgument):
        mv(ns, "/a", "/into/x")
    assert exists(ns, "/a/b/c")


def test_same_path_and_same_inode_are_no_ops(ns):
    f = ino(ns, "/f")
    assert mv(ns, "/f", "/f").inode == f
    ns.hardlink(meta_pb2.HardlinkRequest(src="/f", dst="/f2"))
    mv(ns, "/f", "/f2")
    assert ino(ns, "/f") == ino(ns, "/f2") == f
    assert ns.stat(meta_pb2.StatRequest(path="/f")).attr.nlink == 2


def test_missing_and_root(ns):
    with pytest.raises(errors.NotFound):
        mv(ns, "/nope", "/x")
    with pytest.raises(errors.NotFound):
        mv(ns, "/f", "/nope/x")
    with pytest.raises(errors.Busy):
        mv(ns, "/", "/x")
    with pytest.raises(errors.Busy):
        mv(ns, "/f", "/")


def test_symlink_moves_itself(ns):
    ns.symlink(meta_pb2.SymlinkRequest(path="/link", target="/a"))
    mv(ns, "/link", "/empty/link")
    assert ns.readlink(meta_pb2.ReadlinkRequest(path="/empty/link")).target == "/a"
    assert exists(ns, "/a")


def test_rename_over_hardlinked_file_keeps_inode(ns):
    g = ino(ns, "/g")
    ns.hardlink(meta_pb2.HardlinkRequest(src="/g", dst="/g2"))
    mv(ns, "/f", "/g")
    assert ns.stat(meta_pb2.StatRequest(path="/g2")).attr.nlink == 1
    assert ino(ns, "/g2") == g
    assert gc_items(ns) == []


# exchange (RENAME_EXCHANGE) ------------------------------------------------------------


def test_exchange_swaps_non_empty_directories_and_frees_nothing(ns):
    a, full = ino(ns, "/a"), ino(ns, "/full")
    assert mv(ns, "/a", "/full", exchange=True).inode == a
    assert ino(ns, "/full") == a and ino(ns, "/a") == full
    assert exists(ns, "/full/b/c") and exists(ns, "/a/x")
    assert gc_items(ns) == [] and ns.counts()["directories"] == 6


def test_exchange_swaps_a_file_and_a_directory_across_parents(ns):
    f, c = ino(ns, "/f"), ino(ns, "/a/b/c")
    mv(ns, "/f", "/a/b/c", exchange=True)
    assert ino(ns, "/a/b/c") == f and ino(ns, "/f") == c
    assert (
        ns.stat(meta_pb2.StatRequest(path="/f")).attr.type
        == ns.stat(meta_pb2.StatRequest(path="/a")).attr.type
    )  # a directory now


def test_exchange_needs_both_names_and_no_ancestor(ns):
    with pytest.raises(errors.NotFound):
        mv(ns, "/f", "/nope", exchange=True)
    with pytest.raises(errors.NotFound):
        mv(ns, "/nope", "/f", exchange=True)
    with pytest.raises(errors.InvalidArgument):  # /a would move under itself
        mv(ns, "/a", "/a/b/c", exchange=True)
    with pytest.raises(errors.InvalidArgument):  # so would /a, from the other side
        mv(ns, "/a/b/c", "/a", exchange=True)
    with pytest.raises(errors.InvalidArgument):
        mv(ns, "/f", "/g", exchange=True, no_replace=True)
    assert exists(ns, "/a/b/c") and exists(ns, "/f") and exists(ns, "/g")
    assert mv(ns, "/f", "/f", exchange=True).inode == ino(ns, "/f")
