"""Directory quotas on the metadata engines: usage kept exact, limits enforced, moves ruled."""

from __future__ import annotations

import errno
import random

import pytest

from emberfs.common import errors
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.proto import common_pb2, meta_pb2

ROOT = common_pb2.RequestContext(uid=0, gid=0)
ALICE = common_pb2.RequestContext(uid=1000, gid=1000)
WRITE = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE
MiB = 1 << 20
CHUNK = 4 * MiB


@pytest.fixture
def ns(store):
    return Namespace(store(), chain_table=lambda: [1, 2, 3])


def mkdir(ns, path):
    return ns.mkdir(meta_pb2.MkdirRequest(ctx=ROOT, path=path, mode=0o777)).attr


def set_quota(ns, path, ctx=ROOT, **limits):
    return ns.quota_set(meta_pb2.QuotaSetRequest(ctx=ctx, path=path, **limits))


def quota(ns, path):
    q = ns.quota_get(meta_pb2.QuotaGetRequest(ctx=ROOT, path=path))
    return q.used_bytes, q.used_inodes


def write(ns, path, length, ctx=ROOT):
    """A writer's life: open (create), reserve as it grows, close with the length."""
    opened = ns.open(meta_pb2.OpenRequest(ctx=ctx, path=path, flags=WRITE, mode=0o644))
    attr = opened.attr
    if length > attr.quota_charged and attr.quota_realm:
        req = meta_pb2.QuotaReserveRequest(
            ctx=ctx, inode=attr.inode, session_id=opened.session_id, end=length
        )
        try:
            attr = ns.quota_reserve(req).attr
        except errors.QuotaExceeded:  # the writer gives up: its session ends, nothing written
            ns.close(meta_pb2.CloseRequest(ctx=ctx, inode=attr.inode, session_id=opened.session_id))
            raise
        assert attr.quota_charged >= length
    req = meta_pb2.CloseRequest(
        ctx=ctx, inode=attr.inode, session_id=opened.session_id, length=length, wrote=True
    )
    return ns.close(req).attr


def test_create_mkdir_and_writes_count_and_removal_gives_back(ns):
    mkdir(ns, "/q")
    set_quota(ns, "/q", max_bytes=100 * MiB, max_inodes=10)
    mkdir(ns, "/q/d")
    write(ns, "/q/d/a", 5 * MiB)
    ns.symlink(meta_pb2.SymlinkRequest(ctx=ROOT, path="/q/l", target="d/a"))
    assert quota(ns, "/q") == (5 * MiB, 3)
    ns.remove(meta_pb2.RemoveRequest(ctx=ROOT, path="/q/d", recursive=True))
    assert quota(ns, "/q") == (0, 1)


def test_limits_refuse_with_edquot_and_lose_nothing(ns):
    mkdir(ns, "/q")
    set_quota(ns, "/q", max_bytes=10 * MiB, max_inodes=3)
    write(ns, "/q/a", 6 * MiB)
    opened = ns.open(meta_pb2.OpenRequest(ctx=ROOT, path="/q/b", flags=WRITE))
    held = opened.attr.quota_charged  # the open's share of the room left
    assert held == 4 * MiB // 16
    req = meta_pb2.QuotaReserveRequest(
        ctx=ROOT, inode=opened.attr.inode, session_id=opened.session_id, end=6 * MiB
    )
    with pytest.raises(errors.QuotaExceeded) as exc:
        ns.quota_reserve(req)
    assert exc.value.errno == errno.EDQUOT
    assert quota(ns, "/q") == (6 * MiB + held, 2)  # the refusal changed nothing
    ns.close(meta_pb2.CloseRequest(ctx=ROOT, inode=opened.attr.inode, session_id=opened.session_id))
    assert quota(ns, "/q") == (6 * MiB, 2)
    write(ns, "/q/c", 0)
    with pytest.raises(errors.QuotaExceeded):
        ns.create(meta_pb2.CreateRequest(ctx=ROOT, path="/q/d"))
    with pytest.raises(errors.QuotaExceeded):
        ns.mkdir(meta_pb2.MkdirRequest(ctx=ROOT, path="/q/e"))
    assert quota(ns, "/q")[1] == 3
    # growth by truncation is checked too
    with pytest.raises(errors.QuotaExceeded):
        ns.truncate(meta_pb2.TruncateRequest(ctx=ROOT, path="/q/a", length=11 * MiB))
    ns.truncate(meta_pb2.TruncateRequest(ctx=ROOT, path="/q/a", length=MiB))
    assert quota(ns, "/q")[0] == MiB


def test_a_reservation_is_counted_until_the_writer_closes(ns):
    mkdir(ns, "/q")
    set_quota(ns, "/q", max_bytes=64 * MiB)
    opened = ns.open(meta_pb2.OpenRequest(ctx=ROOT, path="/q/a", flags=WRITE))
    held = opened.attr.quota_charged
    assert 0 < held <= CHUNK  # a share of the room, at most a chunk, without asking
    req = meta_pb2.QuotaReserveRequest(
        ctx=ROOT, inode=opened.attr.inode, session_id=opened.session_id, end=20 * MiB
    )
    granted = ns.quota_reserve(req).attr.quota_charged
    assert 20 * MiB <= granted <= 20 * MiB + (64 - 20) * MiB // 2
    assert quota(ns, "/q")[0] == granted
    # another writer cannot take what this one reserved
    with pytest.raises(errors.QuotaExceeded):
        write(ns, "/q/b", 64 * MiB - granted + 1)
    req = meta_pb2.CloseRequest(
        ctx=ROOT, inode=opened.attr.inode, session_id=opened.session_id, length=3, wrote=True
    )
    ns.close(req)
    assert quota(ns, "/q")[0] == 3


def test_a_close_past_the_reservation_is_checked(ns):
    mkdir(ns, "/q")
    set_quota(ns, "/q", max_bytes=8 * MiB)
    opened = ns.open(meta_pb2.OpenRequest(ctx=ROOT, path="/q/a", flags=WRITE))
    req = meta_pb2.CloseRequest(
        ctx=ROOT, inode=opened.attr.inode, session_id=opened.session_id, length=9 * MiB, wrote=True
    )
    with pytest.raises(errors.QuotaExceeded):
        ns.close(req)
    assert ns.stat(meta_pb2.StatRequest(path="/q/a")).attr.size == 0


def test_batch_write_open_reserves_each_length(ns):
    mkdir(ns, "/q")
    set_quota(ns, "/q", max_bytes=10 * MiB)
    req = meta_pb2.BatchWriteOpenRequest(
        ctx=ROOT,
        paths=["/q/a", "/q/b", "/q/c"],
        flags=WRITE | meta_pb2.OPEN_TRUNCATE,
        reserve=[4 * MiB, 4 * MiB, 4 * MiB],
    )
    results = ns.batch_write_open(req).results
    assert [r.errno for r in results] == [0, 0, 122]
    assert results[0].opened.attr.quota_charged == 4 * MiB
    assert quota(ns, "/q") == (8 * MiB, 2)


def test_moves_across_quotas(ns):
    for d in ("/a", "/b", "/b/n", "/free"):
        mkdir(ns, d)
    set_quota(ns, "/a", max_bytes=100 * MiB)
    set_quota(ns, "/b", max_bytes=10 * MiB)
    set_quota(ns, "/b/n")
    write(ns, "/a/f", 3 * MiB)
    mkdir(ns, "/a/sub")
    ns.rename(meta_pb2.RenameRequest(ctx=ROOT, src="/a/f", dst="/b/n/f"))
    assert quota(ns, "/a") == (0, 1) and quota(ns, "/b") == (3 * MiB, 2)
    assert quota(ns, "/b/n") == (3 * MiB, 1)
    ns.rename(meta_pb2.RenameRequest(ctx=ROOT, src="/b/n/f", dst="/b/f"))  # out of the nested one
    assert quota(ns, "/b") == (3 * MiB, 2) and quota(ns, "/b/n") == (0, 0)
    ns.rename(meta_pb2.RenameRequest(ctx=ROOT, src="/b/f", dst="/free/f"))
    assert quota(ns, "/b") == (0, 1)
    write(ns, "/a/big", 11 * MiB)
    with pytest.raises(errors.QuotaExceeded):  # would not fit there: nothing moves
        ns.rename(meta_pb2.RenameRequest(ctx=ROOT, src="/a/big", dst="/b/big"))
    assert quota(ns, "/a")[0] == 11 * MiB
    with pytest.raises(errors.CrossDevice):
        ns.rename(meta_pb2.RenameRequest(ctx=ROOT, src="/a/sub", dst="/b/sub"))
    with pytest.raises(errors.CrossDevice):
        ns.hardlink(meta_pb2.HardlinkRequest(ctx=ROOT, src="/a/big", dst="/b/big"))
    ns.hardlink(meta_pb2.HardlinkRequest(ctx=ROOT, src="/a/big", dst="/a/sub/big"))
    with pytest.raises(errors.CrossDevice):  # a file with two links stays in one realm
        ns.rename(meta_pb2.RenameRequest(ctx=ROOT, src="/a/big", dst="/free/big"))
    # within one realm a directory moves, and the quotas below it keep their paths
    ns.rename(meta_pb2.RenameRequest(ctx=ROOT, src="/b", dst="/c"))
    listed = ns.quota_list(meta_pb2.QuotaListRequest(ctx=ROOT)).quotas
    assert sorted(q.path for q in listed) == ["/a", "/c", "/c/n"]
    mkdir(ns, "/c/x")
    ns.rename(meta_pb2.RenameRequest(ctx=ROOT, src="/c/n", dst="/c/x", exchange=True))
    listed = ns.quota_list(meta_pb2.QuotaListRequest(ctx=ROOT)).quotas
    assert sorted(q.path for q in listed) == ["/a", "/c", "/c/x"]


def test_setting_a_quota_counts_what_is_there_and_limits_below_use_are_reported(ns):
    mkdir(ns, "/d")
    mkdir(ns, "/d/n")
    write(ns, "/d/n/a", 2 * MiB)
    set_quota(ns, "/d/n", max_inodes=5)
    write(ns, "/d/b", 3 * MiB)
    got = set_quota(ns, "/d", max_bytes=4 * MiB)
    assert got.over and (got.quota.used_bytes, got.quota.used_inodes) == (5 * MiB, 3)
    with pytest.raises(errors.QuotaExceeded):
        write(ns, "/d/c", MiB)
    got = set_quota(ns, "/d", max_bytes=0)
    assert not got.over
    removed = ns.quota_remove(meta_pb2.QuotaRemoveRequest(ctx=ROOT, path="/d/n")).quota
    assert removed.used_bytes == 2 * MiB
    assert quota(ns, "/d")[1] == 4  # the files now count in /d directly, nothing twice
    write(ns, "/d/n/z", MiB)
    assert quota(ns, "/d") == (6 * MiB, 5)
    with pytest.raises(errors.NotFound):
        quota(ns, "/d/n")


def test_only_root_sets_quotas_and_others_list_what_they_may_search(ns):
    mkdir(ns, "/d")
    ns.mkdir(meta_pb2.MkdirRequest(ctx=ROOT, path="/private", mode=0o700))
    with pytest.raises(errors.PermissionDenied):
        set_quota(ns, "/d", ctx=ALICE, max_bytes=1)
    set_quota(ns, "/d", max_bytes=1)
    set_quota(ns, "/private", max_bytes=1)
    listed = ns.quota_list(meta_pb2.QuotaListRequest(ctx=ALICE)).quotas
    assert [q.path for q in listed] == ["/d"]
    listed = ns.quota_list(meta_pb2.QuotaListRequest(ctx=ROOT)).quotas
    assert [q.path for q in listed] == ["/d", "/private"]
    write(ns, "/f", 0)
    with pytest.raises(errors.NotADirectory):
        set_quota(ns, "/f", max_bytes=1)


def test_statfs_of_a_path_under_a_quota_shows_the_quota(ns):
    mkdir(ns, "/q")
    mkdir(ns, "/q/d")
    set_quota(ns, "/q", max_bytes=50 * MiB, max_inodes=100)
    write(ns, "/q/d/a", 7 * MiB)
    out = ns.statfs(meta_pb2.StatFsRequest(ctx=ROOT, path="/q/d"))
    assert (out.capacity, out.used, out.quota_path) == (50 * MiB, 7 * MiB, "/q")
    assert (out.inode_limit, out.inodes) == (100, 2)
    whole = ns.statfs(meta_pb2.StatFsRequest(ctx=ROOT, path="/"))
    assert whole.quota_path == "" and whole.inode_limit == 0


def test_trash_keeps_usage_until_purged(store):
    ns = Namespace(store(), chain_table=lambda: [1, 2, 3], trash_days=1)
    mkdir(ns, "/q")
    set_quota(ns, "/q", max_bytes=10 * MiB)
    write(ns, "/q/a", 6 * MiB)
    ns.remove(meta_pb2.RemoveRequest(ctx=ROOT, path="/q/a"))
    assert quota(ns, "/q") == (6 * MiB, 1)
    with pytest.raises(errors.QuotaExceeded):
        write(ns, "/q/b", 6 * MiB)
    ns.trash_purge(meta_pb2.TrashPurgeRequest(ctx=ROOT, all=True))
    assert quota(ns, "/q") == (0, 1)  # the refused file /q/b is there, empty
    write(ns, "/q/b", 6 * MiB)


# the model: random operations, usage checked against a count of the tree ----------------


def truth(ns, top):
    """(bytes, inodes) of everything below ``top``, each inode once, by walking the tree."""
    seen: dict[int, int] = {}
    stack = [top]
    while stack:
        d = stack.pop()
        for e in ns.list(meta_pb2.ListRequest(ctx=ROOT, path=d)).entries:
            p = f"{d.rstrip('/')}/{e.name}"
            seen[e.attr.inode] = e.attr.size if e.attr.type == common_pb2.FILE else 0
            if e.attr.type == common_pb2.DIRECTORY:
                stack.append(p)
    return sum(seen.values()), len(seen)


def test_usage_follows_random_operations_exactly(ns):
    rng = random.Random(46)
    quotas = ["/q1", "/q1/n", "/q2"]
    for d in ("/q1", "/q1/n", "/q2", "/free"):
        mkdir(ns, d)
    for q in quotas:
        set_quota(ns, q, max_bytes=60 * MiB, max_inodes=25)
    dirs = ["/q1", "/q1/n", "/q2", "/free"]
    files: list[str] = []
    outcomes: dict[str, int] = {}
    for step in range(400):
        kind = rng.choice(["write", "write", "mkdir", "truncate", "link", "rename", "rm", "rmdir"])
        try:
            if kind == "write":
                p = f"{rng.choice(dirs)}/f{step}"
                write(ns, p, rng.randrange(0, 12 * MiB))
                files.append(p)
            elif kind == "mkdir":
                p = f"{rng.choice(dirs)}/d{step}"
                mkdir(ns, p)
                dirs.append(p)
            elif kind == "truncate" and files:
                p = rng.choice(files)
                ns.truncate(
                    meta_pb2.TruncateRequest(ctx=ROOT, path=p, length=rng.randrange(0, 16 * MiB))
                )
            elif kind == "link" and files:
                p = f"{rng.choice(dirs)}/h{step}"
                ns.hardlink(meta_pb2.HardlinkRequest(ctx=ROOT, src=rng.choice(files), dst=p))
                files.append(p)
            elif kind == "rename" and files:
                src = rng.choice(files)
                dst = f"{rng.choice(dirs)}/r{step}"
                ns.rename(meta_pb2.RenameRequest(ctx=ROOT, src=src, dst=dst))
                files[files.index(src)] = dst
            elif kind == "rm" and files:
                p = rng.choice(files)
                ns.remove(meta_pb2.RemoveRequest(ctx=ROOT, path=p))
                files.remove(p)
            elif kind == "rmdir" and len(dirs) > 4:
                p = rng.choice(dirs[4:])
                ns.remove(meta_pb2.RemoveRequest(ctx=ROOT, path=p, recursive=True))
                dirs = [d for d in dirs if d != p and not d.startswith(p + "/")]
                files = [f for f in files if not f.startswith(p + "/")]
            outcome = "ok"
        except (errors.QuotaExceeded, errors.CrossDevice, errors.NotFound) as exc:
            outcome = type(exc).__name__
            if kind == "write" and isinstance(exc, errors.QuotaExceeded):
                files.append(p)  # the open made it (empty) before the reservation failed
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        for q in quotas:
            assert quota(ns, q) == truth(ns, q), (step, kind, q)
    # the run went through every kind of outcome
    assert {"ok", "QuotaExceeded", "CrossDevice"} <= set(outcomes), outcomes


def test_a_quota_set_again_counts_afresh(ns):
    # the usage a metaserver keeps in memory must not outlive the quota it was of
    mkdir(ns, "/x")
    set_quota(ns, "/x", max_inodes=3)
    write(ns, "/x/a", 0)
    write(ns, "/x/b", 0)
    ns.quota_remove(meta_pb2.QuotaRemoveRequest(ctx=ROOT, path="/x"))
    for i in range(5):
        write(ns, f"/x/c{i}", 0)
    set_quota(ns, "/x", max_inodes=10)
    for i in range(3):
        write(ns, f"/x/d{i}", 0)
    with pytest.raises(errors.QuotaExceeded):
        write(ns, "/x/e", 0)
    assert quota(ns, "/x") == (0, 10)
