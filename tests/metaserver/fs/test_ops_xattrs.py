"""Extended attributes in the namespace, on every metadata engine: Linux's rules and limits."""

from __future__ import annotations

import errno
import os

import pytest

from emberfs.common import errors
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.fs.ops import xattrs
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2, meta_pb2

ROOT = common_pb2.RequestContext(uid=0, gid=0)
ALICE = common_pb2.RequestContext(uid=1000, gid=1000)
BOB = common_pb2.RequestContext(uid=1001, gid=1001)
CREATE, REPLACE = meta_pb2.XATTR_CREATE, meta_pb2.XATTR_REPLACE


@pytest.fixture
def ns(store):
    ns = Namespace(store(), chain_table=lambda: [1, 2, 3])
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/home", mode=0o755))
    ns.create(meta_pb2.CreateRequest(ctx=ALICE, path="/home/f", mode=0o644))
    return ns


def put(ns, path, name, value=b"v", ctx=ALICE, flags=0, follow=True):
    req = meta_pb2.SetXattrRequest(
        ctx=ctx, path=path, name=name, value=value, flags=flags, follow=follow
    )
    return ns.set_xattr(req).attr


def get(ns, path, name, ctx=ALICE, follow=True):
    req = meta_pb2.GetXattrRequest(ctx=ctx, path=path, name=name, follow=follow)
    return ns.get_xattr(req).value


def names(ns, path, ctx=ALICE, follow=True):
    req = meta_pb2.ListXattrRequest(ctx=ctx, path=path, follow=follow)
    return list(ns.list_xattr(req).names)


def drop(ns, path, name, ctx=ALICE, follow=True):
    req = meta_pb2.RemoveXattrRequest(ctx=ctx, path=path, name=name, follow=follow)
    return ns.remove_xattr(req).attr


def fails(errno_value, call):
    with pytest.raises(errors.EmberError) as info:
        call()
    assert info.value.errno == errno_value, info.value
    return info.value


def test_set_get_list_remove_and_ctime(ns):
    before = ns.stat(meta_pb2.StatRequest(ctx=ALICE, path="/home/f")).attr
    attr = put(ns, "/home/f", "user.b", b"\x00binary\xff")
    assert attr.ctime_ns > before.ctime_ns and attr.mtime_ns == before.mtime_ns
    put(ns, "/home/f", "user.a", b"")
    assert get(ns, "/home/f", "user.b") == b"\x00binary\xff"
    assert get(ns, "/home/f", "user.a") == b""
    assert names(ns, "/home/f") == ["user.a", "user.b"]
    put(ns, "/home/f", "user.b", b"replaced")
    assert get(ns, "/home/f", "user.b") == b"replaced"
    assert drop(ns, "/home/f", "user.b").ctime_ns >= attr.ctime_ns
    assert names(ns, "/home/f") == ["user.a"]
    fails(errno.ENODATA, lambda: get(ns, "/home/f", "user.b"))
    fails(errno.ENODATA, lambda: drop(ns, "/home/f", "user.b"))
    drop(ns, "/home/f", "user.a")
    assert names(ns, "/home/f") == []
    # no attributes left: no record left
    ino = ns.stat(meta_pb2.StatRequest(path="/home/f")).attr.inode
    assert ns.engine.get(keys.xattr_key(ino)) is None
    fails(errno.ENOENT, lambda: get(ns, "/home/missing", "user.a"))


def test_create_and_replace_flags(ns):
    fails(errno.ENODATA, lambda: put(ns, "/home/f", "user.x", flags=REPLACE))
    put(ns, "/home/f", "user.x", b"1", flags=CREATE)
    fails(errno.EEXIST, lambda: put(ns, "/home/f", "user.x", b"2", flags=CREATE))
    put(ns, "/home/f", "user.x", b"3", flags=REPLACE)
    assert get(ns, "/home/f", "user.x") == b"3"
    fails(errno.EINVAL, lambda: put(ns, "/home/f", "user.x", flags=8))


def test_names_and_namespaces(ns):
    for name in ("system.posix_acl_access", "os2.x", "plain", "USER.x"):
        fails(errno.EOPNOTSUPP, lambda n=name: put(ns, "/home/f", n))
        fails(errno.EOPNOTSUPP, lambda n=name: get(ns, "/home/f", n))
    fails(errno.EINVAL, lambda: put(ns, "/home/f", "user."))
    fails(errno.ERANGE, lambda: put(ns, "/home/f", ""))
    fails(errno.ERANGE, lambda: put(ns, "/home/f", "user." + "n" * 251))
    put(ns, "/home/f", "user." + "n" * 250)  # 255 bytes
    put(ns, "/home/f", "user.é")  # UTF-8 names
    assert "user.é" in names(ns, "/home/f")
    fails(errno.EINVAL, lambda: put(ns, "/home/f", "user.a\0b"))


def test_value_and_inode_limits(ns):
    fails(errno.E2BIG, lambda: put(ns, "/home/f", "user.big", b"x" * (xattrs.MAX_VALUE + 1)))
    put(ns, "/home/f", "user.big", b"x" * xattrs.MAX_VALUE)
    # names and values of one inode: at most MAX_TOTAL bytes
    room = xattrs.MAX_TOTAL - xattrs.MAX_VALUE - len("user.big") - len("user.big2")
    fails(errno.ENOSPC, lambda: put(ns, "/home/f", "user.big2", b"y" * (room + 1)))
    put(ns, "/home/f", "user.big2", b"y" * room)
    fails(errno.ENOSPC, lambda: put(ns, "/home/f", "user.c", b""))
    assert names(ns, "/home/f") == ["user.big", "user.big2"]
    drop(ns, "/home/f", "user.big2")
    for i in range(xattrs.MAX_COUNT - 1):
        put(ns, "/home/f", f"user.{i:03d}", b"")
    fails(errno.ENOSPC, lambda: put(ns, "/home/f", "user.one-too-many"))
    assert len(names(ns, "/home/f")) == xattrs.MAX_COUNT
    put(ns, "/home/f", "user.000", b"replacing one is fine")


def test_permissions_of_user_attributes(ns):
    put(ns, "/home/f", "user.a", b"1")
    # write permission to change, read permission to read; listing needs neither
    fails(errno.EACCES, lambda: put(ns, "/home/f", "user.b", ctx=BOB))
    fails(errno.EACCES, lambda: drop(ns, "/home/f", "user.a", ctx=BOB))
    assert get(ns, "/home/f", "user.a", ctx=BOB) == b"1"
    ns.setattr(meta_pb2.SetAttrRequest(ctx=ALICE, path="/home/f", mode=0o600))
    fails(errno.EACCES, lambda: get(ns, "/home/f", "user.a", ctx=BOB))
    assert names(ns, "/home/f", ctx=BOB) == ["user.a"]
    assert get(ns, "/home/f", "user.a", ctx=ROOT) == b"1"
    ns.setattr(meta_pb2.SetAttrRequest(ctx=ALICE, path="/home/f", mode=0o666))
    put(ns, "/home/f", "user.b", b"bob's", ctx=BOB)  # a non-owner with write permission
    # a sticky directory: only its owner (or uid 0) changes its user.* attributes
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/tmp", mode=0o1777))
    fails(errno.EPERM, lambda: put(ns, "/tmp", "user.a", ctx=BOB))
    put(ns, "/tmp", "user.a", ctx=ALICE)
    put(ns, "/tmp", "user.b", ctx=ROOT)
    assert get(ns, "/tmp", "user.a", ctx=BOB) == b"v"


def test_trusted_and_security_namespaces(ns):
    fails(errno.EPERM, lambda: put(ns, "/home/f", "trusted.t", ctx=ALICE))
    fails(errno.EPERM, lambda: put(ns, "/home/f", "security.s", ctx=ALICE))
    put(ns, "/home/f", "trusted.t", b"t", ctx=ROOT)
    put(ns, "/home/f", "security.s", b"s", ctx=ROOT)
    put(ns, "/home/f", "user.u", b"u", ctx=ALICE)
    # trusted.* is uid 0's alone: hidden from others, and reads as missing
    assert names(ns, "/home/f", ctx=ROOT) == ["security.s", "trusted.t", "user.u"]
    assert names(ns, "/home/f", ctx=ALICE) == ["security.s", "user.u"]
    fails(errno.ENODATA, lambda: get(ns, "/home/f", "trusted.t", ctx=ALICE))
    assert get(ns, "/home/f", "trusted.t", ctx=ROOT) == b"t"
    assert get(ns, "/home/f", "security.s", ctx=BOB) == b"s"
    fails(errno.EPERM, lambda: drop(ns, "/home/f", "trusted.t", ctx=ALICE))
    fails(errno.EPERM, lambda: drop(ns, "/home/f", "security.s", ctx=ALICE))
    drop(ns, "/home/f", "security.s", ctx=ROOT)


def test_symlinks_follow_or_not(ns):
    ns.symlink(meta_pb2.SymlinkRequest(ctx=ALICE, path="/home/l", target="/home/f"))
    put(ns, "/home/l", "user.through", b"1")  # followed: set on the file
    assert names(ns, "/home/f") == ["user.through"]
    assert names(ns, "/home/l", follow=False) == []
    # user.* on the symlink itself: EPERM, as Linux; reading one: ENODATA
    fails(errno.EPERM, lambda: put(ns, "/home/l", "user.x", follow=False))
    fails(errno.ENODATA, lambda: get(ns, "/home/l", "user.through", follow=False))
    put(ns, "/home/l", "trusted.link", b"own", ctx=ROOT, follow=False)
    assert names(ns, "/home/l", ctx=ROOT, follow=False) == ["trusted.link"]
    assert names(ns, "/home/f", ctx=ROOT) == ["user.through"]


def test_they_belong_to_the_inode(ns):
    put(ns, "/home/f", "user.a", b"1")
    ns.hardlink(meta_pb2.HardlinkRequest(ctx=ALICE, src="/home/f", dst="/home/g"))
    assert get(ns, "/home/g", "user.a") == b"1"
    put(ns, "/home/g", "user.b", b"2")
    ns.rename(meta_pb2.RenameRequest(ctx=ALICE, src="/home/f", dst="/home/moved"))
    assert names(ns, "/home/moved") == ["user.a", "user.b"]
    ino = ns.stat(meta_pb2.StatRequest(path="/home/g")).attr.inode
    ns.remove(meta_pb2.RemoveRequest(ctx=ALICE, path="/home/moved"))
    assert get(ns, "/home/g", "user.b") == b"2"  # one link left
    ns.remove(meta_pb2.RemoveRequest(ctx=ALICE, path="/home/g"))
    assert ns.engine.get(keys.xattr_key(ino)) is None
    # a directory's go with it, a replaced file's with it, a removed tree's with it
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ALICE, path="/home/d"))
    ns.create(meta_pb2.CreateRequest(ctx=ALICE, path="/home/d/x"))
    ns.create(meta_pb2.CreateRequest(ctx=ALICE, path="/home/y"))
    inos = [ns.stat(meta_pb2.StatRequest(path=p)).attr.inode for p in ("/home/d/x", "/home/y")]
    put(ns, "/home/d/x", "user.a")
    put(ns, "/home/y", "user.a")
    ns.create(meta_pb2.CreateRequest(ctx=ALICE, path="/home/z"))
    ns.rename(meta_pb2.RenameRequest(ctx=ALICE, src="/home/z", dst="/home/y"))
    ns.remove(meta_pb2.RemoveRequest(ctx=ALICE, path="/home/d", recursive=True))
    ns.purge_detached()
    assert [ns.engine.get(keys.xattr_key(i)) for i in inos] == [None, None]
    assert list(ns.engine.scan_prefix(keys.XATTR)) == []


def test_stat_with_xattrs_shows_what_the_caller_may_read(ns):
    assert not ns.stat(meta_pb2.StatRequest(ctx=ALICE, path="/home/f", xattrs=True)).xattrs
    put(ns, "/home/f", "user.b", b"2")
    put(ns, "/home/f", "user.a", b"1")
    put(ns, "/home/f", "trusted.t", b"t", ctx=ROOT)
    resp = ns.stat(meta_pb2.StatRequest(ctx=ALICE, path="/home/f", xattrs=True))
    assert [(x.name, x.value) for x in resp.xattrs] == [("user.a", b"1"), ("user.b", b"2")]
    resp = ns.stat(meta_pb2.StatRequest(ctx=ROOT, inode=resp.attr.inode, xattrs=True))
    assert [x.name for x in resp.xattrs] == ["trusted.t", "user.a", "user.b"]
    ns.setattr(meta_pb2.SetAttrRequest(ctx=ALICE, path="/home/f", mode=0o600))
    assert not ns.stat(meta_pb2.StatRequest(ctx=BOB, path="/home/f", xattrs=True)).xattrs
    # without asking, none
    assert not ns.stat(meta_pb2.StatRequest(ctx=ROOT, path="/home/f")).xattrs


def test_a_retried_change_applies_once(ns):
    ctx = common_pb2.RequestContext(client_id="c1", request_id=7, uid=1000, gid=1000)
    first = put(ns, "/home/f", "user.once", b"1", ctx=ctx, flags=CREATE)
    # the same request again (a retry): its first answer, not EEXIST
    again = put(ns, "/home/f", "user.once", b"1", ctx=ctx, flags=CREATE)
    assert again == first
    ctx.request_id = 8
    drop(ns, "/home/f", "user.once", ctx=ctx)
    assert drop(ns, "/home/f", "user.once", ctx=ctx) is not None  # retried: no ENODATA
    fails(errno.ENODATA, lambda: get(ns, "/home/f", "user.once"))


def test_refusals_change_nothing(ns):
    put(ns, "/home/f", "user.a", b"1")
    attr = ns.stat(meta_pb2.StatRequest(path="/home/f")).attr
    for call in (
        lambda: put(ns, "/home/f", "user.a", b"2", flags=CREATE),
        lambda: put(ns, "/home/f", "user.a", b"x" * (xattrs.MAX_VALUE + 1)),
        lambda: put(ns, "/home/f", "user.b", ctx=BOB),
        lambda: put(ns, "/home/f", "system.posix_acl_access"),
    ):
        with pytest.raises(errors.EmberError):
            call()
    assert ns.stat(meta_pb2.StatRequest(path="/home/f")).attr == attr
    assert names(ns, "/home/f") == ["user.a"] and get(ns, "/home/f", "user.a") == b"1"


def test_on_etcd_the_attributes_come_with_the_walk(etcd):
    """Where every read is a round trip, a warm walk fetches the inode's attributes with it."""
    from emberfs.metaserver.store.etcd import EtcdEngine

    engine = EtcdEngine(etcd.url(f"xattr-walk-{os.getpid()}"))
    try:
        ns = Namespace(engine, chain_table=lambda: [1])
        ns.mkdir(meta_pb2.MkdirRequest(path="/a"))
        ns.create(meta_pb2.CreateRequest(path="/a/f"))
        put(ns, "/a/f", "user.x", b"1", ctx=ROOT)
        trips = []
        for method in ("read", "read_many"):
            original = getattr(engine, method)

            def counted(*args, _original=original, _method=method):
                trips.append(_method)
                return _original(*args)

            setattr(engine, method, counted)
        resp = ns.stat(meta_pb2.StatRequest(path="/a/f", xattrs=True))
        assert [(x.name, x.value) for x in resp.xattrs] == [("user.x", b"1")]
        assert get(ns, "/a/f", "user.x", ctx=ROOT) == b"1"
        assert names(ns, "/a/f", ctx=ROOT) == ["user.x"]
        assert trips == ["read_many"] * 3
    finally:
        engine.close()
