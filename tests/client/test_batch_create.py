"""Creating many files with one ``BatchWriteOpen``, through real processes.

A batch whose paths partly fail creates exactly the others and reports each
failure for its own path; a batch sent again with the same request ids (its
answer lost) opens nothing twice; a ``pipe`` whose writes or closes fail, or
during which the metaserver is killed, leaves no file without its data.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
import uuid
from concurrent.futures import Future

import grpc
import httpx
import pytest

from emberfs.cli.admin import AdminClient
from emberfs.client.fs import EmberFileSystem
from emberfs.proto import common_pb2, meta_pb2

CREATE_EXCLUSIVE = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE | meta_pb2.OPEN_EXCLUSIVE


# shared by the tests -----------------------------------------------------------------


def user_fs(cluster, uid: int, name: str) -> EmberFileSystem:
    """A filesystem acting as ``uid`` (a token of its own; the suite's token is root)."""
    made = AdminClient(cluster.admin_url, cluster.admin_token).post(
        "/api/v1/tokens", {"uid": uid, "gid": uid, "groups": [], "name": name}
    )
    return EmberFileSystem(cluster.meta_address, token=made["token"], skip_instance_cache=True)


def open_sessions(cluster) -> set[tuple[int, int]]:
    """``(inode, session_id)`` of every open write session of the cluster."""
    resp = httpx.get(f"{cluster.admin_url}/api/v1/sessions", timeout=30)
    resp.raise_for_status()
    return {(s["inode"], s["session_id"]) for s in resp.json()}


def listing(fs: EmberFileSystem, path: str) -> list[tuple[str, int]]:
    """``(name, inode)`` of every entry of directory ``path``, as the metaserver lists them."""
    return [(e.name, e.attr.inode) for e in fs.client.meta.list(path)]


def without_capabilities(resp: meta_pb2.BatchWriteOpenResponse) -> meta_pb2.BatchWriteOpenResponse:
    """``resp`` with the capabilities cleared: each answer signs them anew (fresh expiry)."""
    out = meta_pb2.BatchWriteOpenResponse()
    out.CopyFrom(resp)
    for r in out.results:
        r.opened.ClearField("capability")
    return out


def blobs_under(d: str, names, rng: random.Random, lo: int = 1, hi: int = 64 * 1024) -> dict:
    return {f"{d}/{n}": rng.randbytes(rng.randint(lo, hi)) for n in names}


@pytest.fixture
def shared(fs, base, cluster):
    """A directory the test user owns, one it may not write, and two files that exist.

    Returns ``(user fs, uid, ok dir, protected dir, {existing path: bytes})``; the
    administrator (``fs``) made all of it.
    """
    uid = random.randint(20_000, 60_000)
    ok, protected = f"{base}/ok", f"{base}/protected"
    fs.makedirs(ok)
    fs.makedirs(protected)  # root's, 0755: others may search it, not add to it
    fs.client.meta.setattr(ok, uid=uid, gid=uid)
    old = {f"{ok}/old0": b"old bytes 0", f"{ok}/old1": os.urandom(5000)}
    fs.pipe(old)
    user = user_fs(cluster, uid, f"batch-{uuid.uuid4().hex[:12]}")
    try:
        yield user, uid, ok, protected, old
    finally:
        user.close()


# 1. a batch with names that exist, names the caller may not make, and valid ones --------


def test_batch_write_open_reports_each_failure_for_its_path(fs, cluster, shared):
    user, uid, ok, protected, old = shared
    paths = [
        f"{ok}/new0",
        f"{ok}/old0",
        f"{protected}/p0",
        f"{ok}/new1",
        f"{protected}/p1",
        f"{ok}/old1",
        f"{ok}/new2",
    ]
    valid = [f"{ok}/new0", f"{ok}/new1", f"{ok}/new2"]
    got = dict(zip(paths, user.client.meta.batch_write_open(paths, CREATE_EXCLUSIVE), strict=True))

    for p in old:
        assert isinstance(got[p], FileExistsError), got[p]
        assert (got[p].errno, got[p].filename) == (errno.EEXIST, p)
    for p in (f"{protected}/p0", f"{protected}/p1"):
        assert isinstance(got[p], PermissionError), got[p]
        assert (got[p].errno, got[p].filename) == (errno.EACCES, p)
    for p in valid:
        resp = got[p]
        assert isinstance(resp, meta_pb2.OpenResponse), resp
        assert resp.attr.type == common_pb2.FILE and resp.attr.size == 0
        assert (resp.attr.uid, resp.attr.gid) == (uid, uid)  # the token's identity
        assert resp.session_id and resp.created and resp.capability
    inodes = {got[p].attr.inode for p in valid}
    assert len(inodes) == len(valid)

    # exactly the valid names were added; the others are untouched
    names = sorted(n for n, _ in listing(fs, ok))
    assert names == ["new0", "new1", "new2", "old0", "old1"]
    assert {n: i for n, i in listing(fs, ok) if n.startswith("new")} == {
        p.rsplit("/", 1)[1]: got[p].attr.inode for p in valid
    }
    assert listing(fs, protected) == []
    assert fs.cat(sorted(old)) == old
    sessions = {(got[p].attr.inode, got[p].session_id) for p in valid}
    assert sessions <= open_sessions(cluster)

    # the sessions end with one BatchClose; an item naming no session fails alone
    items = [(got[p].attr.inode, got[p].session_id, 3, True) for p in valid]
    items.insert(1, (fs.info(f"{ok}/old0")["ino"], 12345, 1, True))
    names_of = [valid[0], f"{ok}/old0", *valid[1:]]
    closed = user.client.meta.batch_close(items, names_of)
    assert isinstance(closed[1], OSError)
    assert (closed[1].errno, closed[1].filename) == (errno.EINVAL, f"{ok}/old0")
    assert [a.size for i, a in enumerate(closed) if i != 1] == [3, 3, 3]
    assert not sessions & open_sessions(cluster)
    assert fs.cat(sorted(old)) == old


def test_pipe_creates_exactly_the_valid_files_and_raises_the_first_failure(fs, shared):
    user, _, ok, protected, old = shared
    rng = random.Random(1)
    blobs: dict[str, bytes] = {}
    blobs.update(blobs_under(ok, ["a0"], rng))
    blobs[f"{ok}/old0"] = b"must not replace the old bytes"
    blobs.update(blobs_under(protected, ["p0"], rng))
    blobs.update(blobs_under(ok, ["a1"], rng))
    blobs[f"{protected}/sub/p1"] = b"a missing parent the caller may not make"
    blobs[f"{ok}/old1"] = b"nor these"
    blobs.update(blobs_under(ok, ["a2", "a3"], rng, hi=300 * 1024))
    valid = {p: b for p, b in blobs.items() if p.rsplit("/", 1)[1].startswith("a")}

    with pytest.raises(FileExistsError) as info:  # the first failure in the caller's order
        user.pipe(blobs, mode="create")
    assert (info.value.errno, info.value.filename) == (errno.EEXIST, f"{ok}/old0")

    # the same kinds of failure, the protected directory first
    more = {f"{protected}/q0": b"q", f"{ok}/b0": rng.randbytes(777), f"{ok}/old1": b"x"}
    with pytest.raises(PermissionError) as info:
        user.pipe(more, mode="create")
    assert (info.value.errno, info.value.filename) == (errno.EACCES, f"{protected}/q0")
    valid[f"{ok}/b0"] = more[f"{ok}/b0"]

    assert sorted(fs.ls(ok, detail=False)) == sorted([*valid, *old])
    assert fs.cat(sorted(valid)) == valid  # whole, with the right bytes
    assert {p: fs.info(p)["size"] for p in valid} == {p: len(b) for p, b in valid.items()}
    assert fs.cat(sorted(old)) == old  # the existing files kept their old bytes
    assert fs.ls(protected, detail=False) == []  # nothing made there, no directory either
    # the user reads back what it wrote
    assert user.cat(sorted(valid)) == valid


# 2. a batch retried after a lost answer creates nothing twice -----------------------------


def test_a_batch_write_open_sent_twice_opens_each_path_once(fs, base, cluster):
    d = f"{base}/twice"
    fs.makedirs(d)
    fs.pipe_file(f"{d}/there", b"before")
    names = [f"f{i:02d}" for i in range(20)]
    paths = [f"{d}/{n}" for n in names]
    # an existing name, and a name given twice (its second open fails on the first's file)
    paths += [f"{d}/there", f"{d}/f03"]
    mc = fs.client.meta
    req = meta_pb2.BatchWriteOpenRequest(
        ctx=mc.context(len(paths)), paths=paths, flags=CREATE_EXCLUSIVE, mode=0o640
    )
    first = mc.meta("BatchWriteOpen", req)
    again = mc.meta("BatchWriteOpen", req)  # the same request: its first answer was lost

    errnos = [r.errno for r in first.results]
    assert errnos == [0] * len(names) + [errno.EEXIST, errno.EEXIST]
    assert [r.errno for r in again.results] == errnos  # no EEXIST on its own creations
    assert without_capabilities(again) == without_capabilities(first)
    assert all(r.opened.capability for r in again.results[: len(names)])
    opened = first.results[: len(names)]
    assert all(r.opened.created and r.opened.session_id for r in opened)

    # one entry and one inode per name; one session per file
    inodes = {n: r.opened.attr.inode for n, r in zip(names, opened, strict=True)}
    assert len(set(inodes.values())) == len(names)
    assert sorted(listing(fs, d)) == sorted(
        [*inodes.items(), ("there", fs.info(f"{d}/there")["ino"])]
    )
    sessions = {(r.opened.attr.inode, r.opened.session_id) for r in opened}
    mine = {s for s in open_sessions(cluster) if s[0] in set(inodes.values())}
    assert mine == sessions
    assert fs.cat_file(f"{d}/there") == b"before"

    # a new request (fresh ids) is a new open: every exclusive create now fails
    fresh = mc.batch_write_open(paths, CREATE_EXCLUSIVE)
    assert all(isinstance(g, FileExistsError) for g in fresh)

    # the closes, sent twice, end each session once
    items = [
        meta_pb2.CloseItem(
            inode=r.opened.attr.inode, session_id=r.opened.session_id, length=7, wrote=True
        )
        for r in opened
    ]
    close = meta_pb2.BatchCloseRequest(ctx=mc.context(len(items)), items=items)
    closed = mc.meta("BatchClose", close)
    assert [r.errno for r in closed.results] == [0] * len(items)
    assert mc.meta("BatchClose", close) == closed
    assert {r.attr.size for r in closed.results} == {7}
    assert not sessions & open_sessions(cluster)
    # a new close finds no session
    again_closed = mc.batch_close([(i.inode, i.session_id, 7, True) for i in items], paths[:20])
    assert all(isinstance(g, OSError) and g.errno == errno.EINVAL for g in again_closed)
    assert sorted(listing(fs, d)) == sorted(
        [*inodes.items(), ("there", fs.info(f"{d}/there")["ino"])]
    )


class LostAnswer(grpc.RpcError):
    """What the client sees when a call's answer never comes back."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "the answer was lost"

    def trailing_metadata(self):
        return ()


class Around(grpc.UnaryUnaryClientInterceptor):
    """A gRPC client interceptor that runs each call through :meth:`around`.

    ``around(method, request, send)`` returns the answer; ``send()`` sends
    the call and returns its answer (or raises its error).
    """

    def intercept_unary_unary(self, continuation, details, request):
        method = details.method.rsplit("/", 1)[-1]
        answer = self.around(method, request, lambda: continuation(details, request).result())
        return _Answered(answer)

    def around(self, method: str, request, send):
        return send()


class _Answered:
    """A finished call's outcome as an interceptor returns it."""

    def __init__(self, answer) -> None:
        self.answer = answer

    def result(self, timeout=None):
        return self.answer


def client_with(cluster, interceptor, **options) -> EmberFileSystem:
    """A filesystem whose metaserver calls pass through ``interceptor``."""
    return EmberFileSystem(
        cluster.meta_address, interceptors=(interceptor,), skip_instance_cache=True, **options
    )


class LosingStub(Around):
    """Loses the first answer of each method in ``lossy``.

    The call itself reaches the metaserver and is applied; the client retries it.
    """

    def __init__(self, lossy: tuple[str, ...]) -> None:
        self.sent: dict[str, list] = {m: [] for m in lossy}

    def around(self, method, request, send):
        if method not in self.sent:
            return send()
        self.sent[method].append(request.SerializeToString())
        answer = send()
        if len(self.sent[method]) == 1:
            raise LostAnswer()
        return answer


def test_pipe_whose_answers_are_lost_writes_each_file_once(fs, base, cluster, monkeypatch):
    d = f"{base}/lost"
    fs.makedirs(d)
    rng = random.Random(2)
    blobs = blobs_under(d, [f"f{i:02d}" for i in range(30)], rng)
    losing = LosingStub(("BatchWriteOpen", "BatchClose"))
    lossy = client_with(cluster, losing)
    try:
        lossy.pipe(blobs, mode="create")  # exclusive: a retry must not fail on its own creations
    finally:
        lossy.close()

    # each call was sent twice, the same request both times
    for method, sent in losing.sent.items():
        assert len(sent) == 2 and sent[0] == sent[1], method
    assert fs.cat(sorted(blobs)) == blobs
    entries = listing(fs, d)
    assert sorted(n for n, _ in entries) == sorted(p.rsplit("/", 1)[1] for p in blobs)
    assert not {i for _, i in entries} & {s[0] for s in open_sessions(cluster)}


# 3. a pipe whose writes or closes fail -------------------------------------------------


def assert_no_file_without_its_data(fs: EmberFileSystem, d: str, blobs: dict) -> list[str]:
    """Every file in ``d`` has exactly the bytes given for it; returns their paths."""
    present = sorted(fs.ls(d, detail=False))
    got = fs.cat(present) if present else {}
    wrong = {p: (len(got[p]), len(blobs[p])) for p in present if got[p] != blobs.get(p)}
    assert not wrong, (
        f"{len(wrong)} of {len(present)} files without their exact bytes, "
        f"(got, wanted) bytes of some: {dict(list(wrong.items())[:5])}"
    )
    return present


def test_files_whose_writes_fail_are_not_left_behind(fs, base, monkeypatch):
    d = f"{base}/half"
    fs.makedirs(d)
    rng = random.Random(4)
    blobs = blobs_under(d, [f"f{i:02d}" for i in range(12)], rng, 1000, 200_000)
    doomed = {f"{d}/f03", f"{d}/f07", f"{d}/f08"}
    submit_files = fs.client.files.submit_files

    def failing_some(files):
        """The chunks of the doomed files fail (their storage refused them); the rest go."""
        kept = [(h, v) for h, v in files if h.path not in doomed]
        started = iter(submit_files(kept))
        out = []
        for h, _ in files:
            if h.path in doomed:
                fut: Future = Future()
                fut.set_exception(OSError(errno.EIO, "the chain refused the write"))
                out.append([fut])
            else:
                out.append(next(started))
        return out

    monkeypatch.setattr(fs.client.files, "submit_files", failing_some)
    with pytest.raises(OSError) as info:
        fs.pipe(blobs, mode="create")
    assert (info.value.errno, info.value.filename) == (errno.EIO, f"{d}/f03")
    monkeypatch.undo()
    present = assert_no_file_without_its_data(fs, d, blobs)
    assert present == sorted(set(blobs) - doomed)


class InternalError(LostAnswer):
    """A call the metaserver failed with an unexpected error (not retried)."""

    def code(self):
        return grpc.StatusCode.INTERNAL

    def details(self):
        return "internal error in the metaserver"


class FailingOnce(Around):
    """Fails the first call of ``method`` as a whole (the metaserver's internal error);
    the call never reached the namespace."""

    def __init__(self, method: str) -> None:
        self.method, self.failed = method, 0

    def around(self, method, request, send):
        if method == self.method and not self.failed:
            self.failed += 1
            raise InternalError()
        return send()


def test_a_batch_close_that_fails_as_a_whole_leaves_no_file_without_its_data(fs, base, cluster):
    d = f"{base}/unclosed"
    fs.makedirs(d)
    rng = random.Random(5)
    blobs = blobs_under(d, [f"f{i:02d}" for i in range(6)], rng, 1000, 50_000)
    failing = FailingOnce("BatchClose")
    unlucky = client_with(cluster, failing)
    mc = unlucky.client.meta
    try:
        with pytest.raises(OSError):
            unlucky.pipe(blobs, mode="create")
        assert failing.failed == 1
        # the metaserver answers again: nothing of the failed batch stays half made
        assert_no_file_without_its_data(fs, d, blobs)
    finally:
        # end the sessions the batch may have left open (they would wait for their expiry)
        resp = httpx.get(f"{cluster.admin_url}/api/v1/sessions", timeout=30).json()
        left = [(s["inode"], s["session_id"]) for s in resp if s["client_id"] == mc.ids.client_id]
        mc.batch_close([(i, sid, 0, False) for i, sid in left], [d] * len(left))
        unlucky.close()


# 4. a metaserver killed while a pipe of many small files runs -----------------------------


class KillingStub(Around):
    """Kills the metaserver ``delay`` s after ``method`` is first sent.

    With ``delay`` None it kills once the first call of ``method`` has been answered.
    ``attempts`` records how each call of ``method`` ended (True: answered), ``took``
    the seconds each answered call of any method took.
    """

    def __init__(self, cluster, method: str, delay: float | None) -> None:
        self.cluster, self.method, self.delay = cluster, method, delay
        self.killed = threading.Event()
        self.took: dict[str, list[float]] = {}
        self.attempts: list[bool] = []

    def kill(self) -> None:
        self.cluster.kill_meta()
        self.killed.set()

    def around(self, method, request, send):
        mine = method == self.method
        first = mine and not self.attempts and not self.killed.is_set()
        if first and self.delay is not None:
            threading.Timer(self.delay, self.kill).start()
        t0 = time.monotonic()
        try:
            answer = send()
        except grpc.RpcError:
            if mine:
                self.attempts.append(False)
            raise
        self.took.setdefault(method, []).append(time.monotonic() - t0)
        if mine:
            self.attempts.append(True)
        if first and self.delay is None:
            self.kill()
        return answer


def _pipe_through_a_crash(c, blobs: dict, method: str, delay: float | None):
    """``fs.pipe(blobs, mode="create")`` while the metaserver is killed in ``method``; restarted.

    Returns the pipe's error (None when it returned), the failures ``write_files``
    reported by path, and the :class:`KillingStub` (how the calls went).
    """
    killing = KillingStub(c, method, delay)
    fs = client_with(c, killing, retry_timeout=60.0)
    reported: dict = {}
    write_files = fs.transfers.write_files

    def spying(items, exclusive=False):
        out = write_files(items, exclusive)
        reported.update(out)
        return out

    fs.transfers.write_files = spying
    outcome: list = []

    def run() -> None:
        try:
            fs.pipe(blobs, mode="create")  # exclusive: a retry must not fail on its own files
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - judged by the test
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    try:
        t.start()
        assert killing.killed.wait(30), "the metaserver was never killed"
        time.sleep(0.5)  # calls fail and are retried while it is down
        c.start_meta()
        t.join(90)
        assert not t.is_alive(), "the pipe did not end after the metaserver came back"
    finally:
        fs.close()
    return outcome[0], reported, killing


def _check_no_file_without_its_data(c, d: str, blobs: dict, error, reported) -> None:
    check = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        present = assert_no_file_without_its_data(check, d, blobs)
        if error is None:
            assert present == sorted(blobs)  # every acknowledged file is whole
        else:  # a file not reported failed was acknowledged: it must be there
            assert set(blobs) - set(reported) <= set(present), error
        inodes = {check.info(p)["ino"] for p in present}
        assert not inodes & {s[0] for s in open_sessions(c)}  # every session ended
    finally:
        check.close()


@pytest.mark.slow
def test_a_metaserver_killed_during_a_pipe_of_many_files_leaves_no_file_without_data(
    private_cluster,
):
    c = private_cluster()
    fs = EmberFileSystem(c.meta_address, retry_timeout=60.0, skip_instance_cache=True)
    rng = random.Random(3)

    def files(d: str) -> dict:
        fs.makedirs(d)
        return blobs_under(d, [f"f{i:03d}" for i in range(300)], rng, 20_000, 60_000)

    try:
        # (a) killed once the files are open: their data goes to storage while it is
        # down, and their closes are retried until it is back
        blobs = files("/crash-opened")
        error, reported, a = _pipe_through_a_crash(c, blobs, "BatchWriteOpen", None)
        _check_no_file_without_its_data(c, "/crash-opened", blobs, error, reported)
        assert error is None, error
        assert a.attempts == [True]

        # (b) killed while it works through the BatchWriteOpen (a third into the
        # time the call of (a) took): some files made, no answer; the retry finds them
        blobs = files("/crash-opening")
        delay = a.took["BatchWriteOpen"][0] / 3
        error, reported, b = _pipe_through_a_crash(c, blobs, "BatchWriteOpen", delay)
        _check_no_file_without_its_data(c, "/crash-opening", blobs, error, reported)
        assert error is None, error

        # (c) killed while it works through the BatchClose (a third into the time
        # the one of (b), after the restart, took): some sessions ended, no answer
        blobs = files("/crash-closing")
        delay = b.took["BatchClose"][-1] / 3
        error, reported, _ = _pipe_through_a_crash(c, blobs, "BatchClose", delay)
        _check_no_file_without_its_data(c, "/crash-closing", blobs, error, reported)
        assert error is None, error
    finally:
        fs.close()
