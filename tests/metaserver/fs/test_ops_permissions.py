"""Permission checks with different callers."""

from __future__ import annotations

import pytest

from emberfs.common import errors
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.proto import common_pb2, meta_pb2

ROOT = common_pb2.RequestContext(uid=0, gid=0)
ALICE = common_pb2.RequestContext(uid=1000, gid=1000)
BOB = common_pb2.RequestContext(uid=1001, gid=1001)
BOB_IN_ALICES_GROUP = common_pb2.RequestContext(uid=1001, gid=1001, groups=[1000])


@pytest.fixture
def ns(store):
    ns = Namespace(store(), chain_table=lambda: [1, 2, 3])
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/home", mode=0o755))
    ns.create(meta_pb2.CreateRequest(ctx=ALICE, path="/home/notes", mode=0o640))
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/private", mode=0o700))
    ns.create(meta_pb2.CreateRequest(ctx=ALICE, path="/private/secret", mode=0o666))
    return ns


def test_owner_is_the_caller(ns):
    attr = ns.stat(meta_pb2.StatRequest(ctx=BOB, path="/home/notes")).attr
    assert (attr.uid, attr.gid, attr.mode) == (1000, 1000, 0o640)


def test_search_permission_on_every_directory(ns):
    with pytest.raises(errors.PermissionDenied):
        ns.stat(meta_pb2.StatRequest(ctx=BOB, path="/private/secret"))
    ns.stat(meta_pb2.StatRequest(ctx=ROOT, path="/private/secret"))
    ns.stat(meta_pb2.StatRequest(ctx=ALICE, path="/private/secret"))
    out = ns.batch_stat(meta_pb2.BatchStatRequest(ctx=BOB, paths=["/private/secret", "/home"]))
    assert [r.errno for r in out.results] == [13, 0]


def test_batch_open_needs_read_permission_as_open_does(ns):
    paths = ["/home/notes", "/private/secret", "/home"]
    out = ns.batch_open(meta_pb2.BatchOpenRequest(ctx=BOB, paths=paths))
    assert [r.errno for r in out.results] == [13, 13, 0]
    with pytest.raises(errors.PermissionDenied):
        ns.open(meta_pb2.OpenRequest(ctx=BOB, path="/home/notes"))
    out = ns.batch_open(meta_pb2.BatchOpenRequest(ctx=BOB_IN_ALICES_GROUP, paths=paths[:1]))
    assert [r.errno for r in out.results] == [0]


def test_write_and_search_on_parent_to_change_entries(ns):
    for call in (
        lambda: ns.create(meta_pb2.CreateRequest(ctx=BOB, path="/home/mine")),
        lambda: ns.mkdir(meta_pb2.MkdirRequest(ctx=BOB, path="/home/d")),
        lambda: ns.symlink(meta_pb2.SymlinkRequest(ctx=BOB, path="/home/s", target="x")),
        lambda: ns.remove(meta_pb2.RemoveRequest(ctx=BOB, path="/home/notes")),
        lambda: ns.rename(meta_pb2.RenameRequest(ctx=BOB, src="/home/notes", dst="/stolen")),
        lambda: ns.hardlink(meta_pb2.HardlinkRequest(ctx=BOB, src="/home/notes", dst="/home/l")),
    ):
        with pytest.raises(errors.PermissionDenied):
            call()
    assert [e.name for e in ns.list(meta_pb2.ListRequest(ctx=BOB, path="/home")).entries] == [
        "notes"
    ]
    # the root directory is open to everyone
    ns.create(meta_pb2.CreateRequest(ctx=BOB, path="/bobs"))
    ns.remove(meta_pb2.RemoveRequest(ctx=BOB, path="/bobs"))


def test_read_and_write_on_files(ns):
    with pytest.raises(errors.PermissionDenied):
        ns.open(meta_pb2.OpenRequest(ctx=BOB, path="/home/notes"))
    ns.open(meta_pb2.OpenRequest(ctx=BOB_IN_ALICES_GROUP, path="/home/notes"))
    with pytest.raises(errors.PermissionDenied):
        ns.open(
            meta_pb2.OpenRequest(
                ctx=BOB_IN_ALICES_GROUP, path="/home/notes", flags=meta_pb2.OPEN_WRITE
            )
        )
    with pytest.raises(errors.PermissionDenied):
        ns.truncate(meta_pb2.TruncateRequest(ctx=BOB_IN_ALICES_GROUP, path="/home/notes"))
    ns.open(meta_pb2.OpenRequest(ctx=ALICE, path="/home/notes", flags=meta_pb2.OPEN_WRITE))
    ns.open(meta_pb2.OpenRequest(ctx=ROOT, path="/home/notes", flags=meta_pb2.OPEN_WRITE))
    # a file created by this open is writable even with a read-only mode
    got = ns.open(
        meta_pb2.OpenRequest(
            ctx=BOB,
            path="/ro",
            mode=0o444,
            flags=meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE,
        )
    )
    assert got.session_id and got.attr.mode == 0o444


def test_read_permission_to_list(ns):
    with pytest.raises(errors.PermissionDenied):
        ns.list(meta_pb2.ListRequest(ctx=BOB, path="/private"))
    assert len(ns.list(meta_pb2.ListRequest(ctx=ALICE, path="/private")).entries) == 1


def test_chmod_and_chown_rules(ns):
    with pytest.raises(errors.NotPermitted):
        ns.setattr(meta_pb2.SetAttrRequest(ctx=BOB, path="/home/notes", mode=0o777))
    with pytest.raises(errors.NotPermitted):
        ns.setattr(meta_pb2.SetAttrRequest(ctx=BOB, path="/home/notes", mtime_ns=1))
    with pytest.raises(errors.NotPermitted):
        ns.setattr(meta_pb2.SetAttrRequest(ctx=ALICE, path="/home/notes", uid=1001))
    with pytest.raises(errors.NotPermitted):  # not a member of group 1001
        ns.setattr(meta_pb2.SetAttrRequest(ctx=ALICE, path="/home/notes", gid=1001))
    # a refused request changes nothing, even the parts that were allowed
    with pytest.raises(errors.NotPermitted):
        ns.setattr(meta_pb2.SetAttrRequest(ctx=ALICE, path="/home/notes", mode=0o600, uid=5))
    assert ns.stat(meta_pb2.StatRequest(path="/home/notes")).attr.mode == 0o640
    assert (
        ns.setattr(meta_pb2.SetAttrRequest(ctx=ALICE, path="/home/notes", mode=0o604)).attr.mode
        == 0o604
    )
    assert (
        ns.setattr(meta_pb2.SetAttrRequest(ctx=ALICE, path="/home/notes", uid=1000)).attr.uid
        == 1000
    )
    alice_in_group = common_pb2.RequestContext(uid=1000, gid=1000, groups=[50])
    assert (
        ns.setattr(meta_pb2.SetAttrRequest(ctx=alice_in_group, path="/home/notes", gid=50)).attr.gid
        == 50
    )
    given = ns.setattr(
        meta_pb2.SetAttrRequest(ctx=ROOT, path="/home/notes", uid=1001, gid=1001)
    ).attr
    assert (given.uid, given.gid) == (1001, 1001)
    # now Bob owns it: Bob can chmod, Alice cannot
    ns.setattr(meta_pb2.SetAttrRequest(ctx=BOB, path="/home/notes", mode=0o600))
    with pytest.raises(errors.NotPermitted):
        ns.setattr(meta_pb2.SetAttrRequest(ctx=ALICE, path="/home/notes", mode=0o666))


def test_set_layout_needs_owner(ns):
    layout = common_pb2.Layout(chunk_size=1 << 20, stripe=1)
    with pytest.raises(errors.NotPermitted):
        ns.set_layout(meta_pb2.SetLayoutRequest(ctx=BOB, path="/home", layout=layout))
    ns.set_layout(meta_pb2.SetLayoutRequest(ctx=ALICE, path="/home", layout=layout))


def test_sticky_directory(ns):
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ROOT, path="/tmp", mode=0o1777))
    ns.create(meta_pb2.CreateRequest(ctx=ALICE, path="/tmp/a"))
    with pytest.raises(errors.NotPermitted):
        ns.remove(meta_pb2.RemoveRequest(ctx=BOB, path="/tmp/a"))
    with pytest.raises(errors.NotPermitted):
        ns.rename(meta_pb2.RenameRequest(ctx=BOB, src="/tmp/a", dst="/tmp/b"))
    ns.create(meta_pb2.CreateRequest(ctx=BOB, path="/tmp/b"))
    ns.rename(meta_pb2.RenameRequest(ctx=BOB, src="/tmp/b", dst="/tmp/c"))
    ns.remove(meta_pb2.RemoveRequest(ctx=ALICE, path="/tmp/a"))


def test_recursive_remove_needs_rights_on_the_whole_tree(ns):
    ns.mkdir(meta_pb2.MkdirRequest(ctx=BOB, path="/bob/locked", parents=True))
    ns.create(meta_pb2.CreateRequest(ctx=BOB, path="/bob/locked/f"))
    ns.setattr(meta_pb2.SetAttrRequest(ctx=ROOT, path="/bob/locked", uid=0))
    with pytest.raises(errors.PermissionDenied):
        ns.remove(meta_pb2.RemoveRequest(ctx=BOB, path="/bob", recursive=True))
    assert ns.stat(meta_pb2.StatRequest(path="/bob/locked/f")).attr.uid == 1001
    assert ns.remove(meta_pb2.RemoveRequest(ctx=ROOT, path="/bob", recursive=True)).removed == 3


def test_setgid_directory_passes_its_group(ns):
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ROOT, path="/shared", mode=0o2777))
    ns.setattr(meta_pb2.SetAttrRequest(ctx=ROOT, path="/shared", gid=77))
    f = ns.create(meta_pb2.CreateRequest(ctx=BOB, path="/shared/f")).attr
    d = ns.mkdir(meta_pb2.MkdirRequest(ctx=BOB, path="/shared/d", mode=0o755)).attr
    assert f.gid == 77 and d.gid == 77 and d.mode == 0o2755
