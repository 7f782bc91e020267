"""Tests of the chunk engine of one storage target."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import crc32c
import pytest

from emberfs.common import framing
from emberfs.storageserver.chunkstore import ChunkStore, VersionConflict

BS = framing.MIN_BLOCK  # small blocks: many CRCs per chunk
CS = 256 * 1024


@pytest.fixture
def store(tmp_path):
    s = ChunkStore(tmp_path / "t1", block_size=BS)
    try:
        yield s
    finally:
        s.close()


def content(store: ChunkStore, inode: int, index: int) -> bytes:
    data, meta = store.read_committed(inode, index)
    assert len(data) == meta.length
    framing.verify(data, meta.crcs, store.block_size)
    assert crc32c.crc32c(data) == meta.checksum
    return data


def write(store, inode, index, version, offset, data, **kw):
    store.stage(inode, index, version, offset, data, chunk_size=kw.pop("chunk_size", CS), **kw)
    return store.commit(inode, index, version)


def chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "chunks").rglob("*") if p.is_file())


def test_stage_commit_and_partial_writes(store):
    assert store.meta(1, 0) is None
    m = store.stage(1, 0, 1, 0, b"hello", chunk_size=CS)
    assert (m.version, m.pending_version, m.length, m.pending_length) == (0, 1, 0, 5)
    with pytest.raises(KeyError):
        store.read_committed(1, 0)
    m = store.commit(1, 0, 1)
    assert (m.version, m.pending_version, m.length) == (1, 0, 5)
    assert content(store, 1, 0) == b"hello"
    # a write past the end leaves a zero-filled gap
    write(store, 1, 0, 2, 3 * BS + 7, b"xyz")
    assert content(store, 1, 0) == b"hello" + bytes(3 * BS + 2) + b"xyz"
    # an overwrite in the middle keeps the rest
    write(store, 1, 0, 3, 2, b"LL")
    assert content(store, 1, 0)[:6] == b"heLLo\x00"
    # offset 0 covering the old length replaces the content
    write(store, 1, 0, 4, 0, b"q" * (4 * BS))
    assert content(store, 1, 0) == b"q" * (4 * BS)
    # full_chunk replaces even when shorter
    m = write(store, 1, 0, 5, 0, b"short", full_chunk=True)
    assert content(store, 1, 0) == b"short" and m.version == 5
    assert len(chunk_files(store.root)) == 1


def test_random_writes_match_a_model(store):
    rng = random.Random(7)
    model = {i: bytearray() for i in range(3)}
    versions = dict.fromkeys(model, 0)
    for _ in range(300):
        i = rng.randrange(3)
        v = versions[i] + 1
        kind = rng.random()
        if kind < 0.15:
            length = rng.randrange(0, CS + 1)
            store.stage_truncate(5, i, v, length)
            del model[i][length:]
        else:
            offset = rng.randrange(0, CS)
            n = rng.randrange(0, min(CS - offset, 3 * BS) + 1)
            data = rng.randbytes(n)
            full = kind > 0.9
            if full:
                offset = 0
                model[i] = bytearray(data)
            else:
                if offset > len(model[i]):
                    model[i].extend(bytes(offset - len(model[i])))
                model[i][offset : offset + n] = data
            store.stage(5, i, v, offset, data, chunk_size=CS, full_chunk=full)
        store.commit(5, i, v)
        versions[i] = v
        assert content(store, 5, i) == bytes(model[i])
        assert store.meta(5, i).crcs == framing.block_crcs(model[i], BS)


def test_version_rules(store):
    write(store, 2, 1, 3, 0, b"abc")
    with pytest.raises(VersionConflict):
        store.stage(2, 1, 3, 0, b"x", chunk_size=CS)
    with pytest.raises(VersionConflict):
        store.stage(2, 1, 2, 0, b"x", chunk_size=CS)
    with pytest.raises(VersionConflict):
        store.commit(2, 1, 4)
    assert store.commit(2, 1, 3).version == 3  # repeated commit is harmless
    # a second stage replaces the pending version
    store.stage(2, 1, 4, 0, b"first", chunk_size=CS)
    store.stage(2, 1, 5, 0, b"second", chunk_size=CS)
    with pytest.raises(VersionConflict):
        store.commit(2, 1, 4)
    store.commit(2, 1, 5)
    assert content(store, 2, 1) == b"second"
    assert len(chunk_files(store.root)) == 1


def test_abort(store):
    write(store, 3, 0, 1, 0, b"keep")
    store.stage(3, 0, 2, 0, b"drop", chunk_size=CS)
    assert content(store, 3, 0) == b"keep"
    store.abort(3, 0, 7)  # not pending: nothing happens
    assert store.meta(3, 0).pending_version == 2
    store.abort(3, 0, 2)
    m = store.meta(3, 0)
    assert (m.version, m.pending_version) == (1, 0)
    assert content(store, 3, 0) == b"keep"
    # aborting the only (pending) version of a new chunk forgets the chunk
    store.stage(3, 1, 1, 0, b"new", chunk_size=CS)
    store.abort(3, 1, 1)
    assert store.meta(3, 1) is None
    assert store.stats()["chunks"] == 1
    assert len(chunk_files(store.root)) == 1


def test_truncate(store):
    data = os.urandom(5 * BS + 100)
    write(store, 4, 0, 1, 0, data)
    store.stage_truncate(4, 0, 2, 2 * BS + 1)
    assert content(store, 4, 0) == data  # pending until commit
    m = store.commit(4, 0, 2)
    assert m.length == 2 * BS + 1
    assert content(store, 4, 0) == data[: 2 * BS + 1]
    store.stage_truncate(4, 0, 3, CS)  # past the end: unchanged content
    store.commit(4, 0, 3)
    assert content(store, 4, 0) == data[: 2 * BS + 1]
    store.stage_truncate(4, 0, 4, 0)
    assert store.commit(4, 0, 4).length == 0
    assert content(store, 4, 0) == b""
    # truncating a chunk this target never had gives an empty version
    store.stage_truncate(4, 9, 1, 10)
    assert store.commit(4, 9, 1).length == 0


def test_install(store):
    write(store, 6, 0, 5, 0, b"old")
    assert not store.install(6, 0, 5, b"old")  # already there
    assert store.install(6, 0, 5, b"same version, other content")
    assert content(store, 6, 0) == b"same version, other content"
    assert not store.install(6, 0, 5, b"same version, other content")
    assert len(chunk_files(store.root)) == 1
    assert not store.install(6, 0, 4, b"older")
    assert store.install(6, 0, 7, b"newer")
    assert content(store, 6, 0) == b"newer" and store.meta(6, 0).version == 7
    # an older pending version is dropped, a newer one kept
    store.stage(6, 0, 8, 0, b"pending8", chunk_size=CS)
    assert store.install(6, 0, 9, b"nine")
    assert store.meta(6, 0).pending_version == 0
    store.stage(6, 0, 12, 0, b"pending12", chunk_size=CS)
    assert store.install(6, 0, 10, b"ten")
    m = store.meta(6, 0)
    assert (m.version, m.pending_version) == (10, 12)
    store.commit(6, 0, 12)
    assert content(store, 6, 0) == b"pending12"
    assert store.install(6, 1, 3, b"fresh chunk")
    assert content(store, 6, 1) == b"fresh chunk"
    assert len(chunk_files(store.root)) == 2


def test_remove_list_stats(store):
    for inode in (9, 7, 8):
        for index in (3, 0, 1):
            write(store, inode, index, 1, 0, bytes([inode]) * (index + 1) * 10)
    store.stage(8, 5, 1, 0, b"pending only", chunk_size=CS)
    ids = [(m.inode, m.index) for m in store.list()]
    assert ids == sorted(ids) and len(ids) == 10
    assert [(m.index, m.version) for m in store.list(8)] == [(0, 1), (1, 1), (3, 1), (5, 0)]
    page1 = store.list(limit=4)
    page2 = store.list(after=(page1[-1].inode, page1[-1].index), limit=4)
    page3 = store.list(after=(page2[-1].inode, page2[-1].index), limit=4)
    assert [(m.inode, m.index) for m in page1 + page2 + page3] == ids
    assert [m.index for m in store.list(8, after=(8, 1))] == [3, 5]
    st = store.stats()
    assert st["chunks"] == 10
    assert st["used"] == sum(p.stat().st_size for p in chunk_files(store.root))
    assert st["capacity"] > st["used"]

    assert store.remove(9, 3) and not store.remove(9, 3)
    assert store.remove_inode(8, [1, 5, 77]) == 2
    assert [m.index for m in store.list(8)] == [0, 3]
    assert store.remove_inode(7) == 3
    assert store.list(7) == []
    assert not (store.root / "chunks" / f"{7:016x}").exists()
    st = store.stats()
    assert st["chunks"] == 4
    assert st["used"] == sum(p.stat().st_size for p in chunk_files(store.root))


def test_old_descriptor_reads_old_version_after_commit(store):
    old = os.urandom(3 * BS)
    write(store, 10, 0, 1, 0, old)
    with store.committed_file(10, 0) as (fd, meta):
        write(store, 10, 0, 2, 0, os.urandom(3 * BS), full_chunk=True)
        store.stage(10, 0, 3, 0, b"z" * BS, chunk_size=CS)
        assert meta.version == 1
        assert os.pread(fd, meta.length, 0) == old
    assert len(chunk_files(store.root)) == 2  # committed v2 + pending v3


def spare_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "spare").iterdir() if p.is_file())


@pytest.mark.parametrize(
    "fsync, direct_io",
    [(False, True), (True, True), (False, False)],
    ids=["direct", "fsync", "buffered"],
)
def test_retired_files_are_written_over_by_new_versions(tmp_path, fsync, direct_io):
    with ChunkStore(tmp_path / "t", block_size=BS, fsync=fsync, direct_io=direct_io) as store:
        first = os.urandom(CS)
        write(store, 1, 0, 1, 0, first)
        (v1,) = chunk_files(store.root)
        v1_ino = v1.stat().st_ino
        second = os.urandom(CS - 5)
        write(store, 1, 0, 2, 0, second, full_chunk=True)
        # the replaced file is kept, whole, as a spare: not counted as used
        (spare,) = spare_files(store.root)
        assert spare.stat().st_ino == v1_ino and spare.read_bytes() == first
        assert store.stats()["spare"] == CS
        assert store.stats()["used"] == len(second)
        # the next new version is written over it and cut to its own length
        shorter = os.urandom(CS * 2 // 3 + 11)
        write(store, 2, 7, 1, 0, shorter)
        assert spare_files(store.root) == []
        assert store.stats()["spare"] == 0
        (path,) = [p for p in chunk_files(store.root) if p.parent.name == f"{2:016x}"]
        assert path.stat().st_ino == v1_ino
        assert path.stat().st_size == len(shorter)
        assert content(store, 2, 7) == shorter
        assert content(store, 1, 0) == second
        # a longer version grows the spare it takes
        write(store, 1, 0, 3, 0, b"x", full_chunk=True)  # retires `second`
        longer = os.urandom(CS)
        write(store, 3, 0, 1, 0, longer)
        assert content(store, 3, 0) == longer
        assert store.stats()["used"] == sum(p.stat().st_size for p in chunk_files(store.root))


def test_a_held_file_is_unlinked_never_written_over(store):
    old = os.urandom(CS)
    write(store, 10, 0, 1, 0, old)
    with store.committed_file(10, 0) as (fd, meta):
        write(store, 10, 0, 2, 0, os.urandom(CS), full_chunk=True)
        assert os.fstat(fd).st_nlink == 0  # retired while held: unlinked, not a spare
        assert spare_files(store.root) == []
        for inode in range(11, 15):  # new chunks and more retired files around it
            write(store, inode, 0, 1, 0, os.urandom(CS))
            write(store, inode, 0, 2, 0, os.urandom(CS), full_chunk=True)
        assert os.pread(fd, meta.length, 0) == old
    assert len(spare_files(store.root)) >= 1


def test_readers_never_see_a_spare_written_over(store):
    """Readers hold committed files while writers replace them and reuse spares."""
    stop = threading.Event()
    errors: list[BaseException] = []
    checked = [0]

    def writer(inode: int) -> None:
        try:
            version = 1
            while not stop.is_set():
                for index in range(3):
                    write(store, inode, index, version, 0, os.urandom(CS), full_chunk=True)
                version += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader(inode: int) -> None:
        try:
            while not stop.is_set():
                for index in range(3):
                    try:
                        with store.committed_file(inode, index) as (fd, meta):
                            time.sleep(0.001)  # a slow sendfile, while writers go on
                            data = os.pread(fd, meta.length, 0)
                    except KeyError:
                        continue
                    framing.verify(data, meta.crcs, store.block_size)
                    checked[0] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in (1, 2)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in (1, 2, 1, 2)]
    for t in threads:
        t.start()
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert checked[0] > 50
    # the writers kept many retired files as spares, and took them again:
    # spare names are never reused, and the pool stayed small
    assert store.files.spares_named >= 20
    assert len(spare_files(store.root)) <= 8


def test_spares_are_bounded(tmp_path, monkeypatch):
    from emberfs.storageserver import chunkfiles

    with ChunkStore(tmp_path / "a", block_size=BS, spare_bytes=2 * CS) as store:
        for index in range(3):
            write(store, 1, index, 1, 0, os.urandom(CS))
        store.remove_inode(1)
        assert len(spare_files(store.root)) == 2 and store.stats()["spare"] == 2 * CS
        write(store, 2, 0, 1, 0, b"y")  # too short to take a spare
        # a new version takes one spare, and the 1-byte file it replaced fits
        write(store, 2, 0, 2, 0, os.urandom(CS // 2), full_chunk=True)
        assert len(spare_files(store.root)) == 2 and store.stats()["spare"] == CS + 1
        write(store, 2, 1, 1, 0, b"")
        store.remove(2, 1)  # empty files have no blocks to reuse
        assert len(spare_files(store.root)) == 2
    with ChunkStore(tmp_path / "b", block_size=BS, spare_bytes=0) as store:
        write(store, 1, 0, 1, 0, os.urandom(CS))
        store.remove(1, 0)
        assert spare_files(store.root) == [] and chunk_files(store.root) == []
    monkeypatch.setattr(chunkfiles, "MAX_SPARES", 2)
    with ChunkStore(tmp_path / "c", block_size=BS) as store:
        for index in range(5):
            write(store, 1, index, 1, 0, b"tiny")
        store.remove_inode(1)
        assert len(spare_files(store.root)) == 2
    with pytest.raises(ValueError):
        ChunkStore(tmp_path / "d", spare_bytes=-1)


def test_reopen_keeps_spares_within_the_bound(tmp_path):
    root = tmp_path / "t"
    with ChunkStore(root, block_size=BS) as store:
        for index in range(3):
            write(store, 4, index, 1, 0, os.urandom(CS))
        store.remove_inode(4)
    inodes = {p.stat().st_ino for p in spare_files(root)}
    assert len(inodes) == 3
    (root / "spare" / "notes.txt").write_text("left alone")
    with ChunkStore(root, block_size=BS) as store:
        assert store.stats()["spare"] == 3 * CS
        data = os.urandom(CS)
        write(store, 5, 0, 1, 0, data)
        (path,) = chunk_files(root)
        assert path.stat().st_ino in inodes and content(store, 5, 0) == data
    with ChunkStore(root, block_size=BS, spare_bytes=CS) as store:
        assert store.stats()["spare"] == CS
        assert len([p for p in spare_files(root) if p.name != "notes.txt"]) == 1
        # a spare removed by hand is not missed: the file is created instead
        for p in spare_files(root):
            if p.name != "notes.txt":
                p.unlink()
        write(store, 6, 0, 1, 0, b"fresh")
        assert content(store, 6, 0) == b"fresh"
    assert (root / "spare" / "notes.txt").read_text() == "left alone"


def test_corrupted_file_is_caught_by_crcs(store):
    data = os.urandom(4 * BS)
    write(store, 11, 2, 1, 0, data)
    (path,) = chunk_files(store.root)
    raw = bytearray(path.read_bytes())
    raw[2 * BS + 17] ^= 0x40
    path.write_bytes(raw)
    got, meta = store.read_committed(11, 2)
    with pytest.raises(framing.ChecksumError) as err:
        framing.verify(got, meta.crcs, store.block_size)
    assert err.value.block == 2


def test_bad_arguments(store):
    with pytest.raises(ValueError):
        store.stage(0, 0, 1, 0, b"x", chunk_size=CS)
    with pytest.raises(ValueError):
        store.stage(1 << 64, 0, 1, 0, b"x", chunk_size=CS)
    with pytest.raises(ValueError):
        store.stage(1, 1 << 32, 1, 0, b"x", chunk_size=CS)
    with pytest.raises(ValueError):
        store.stage(1, -1, 1, 0, b"x", chunk_size=CS)
    with pytest.raises(ValueError):
        store.stage(1, 0, 0, 0, b"x", chunk_size=CS)
    with pytest.raises(ValueError):
        store.stage(1, 0, 1, CS - 1, b"xy", chunk_size=CS)
    with pytest.raises(ValueError):
        store.stage(1, 0, 1, -1, b"x", chunk_size=CS)
    with pytest.raises(ValueError):
        store.stage(1, 0, 1, 4, b"x", chunk_size=CS, full_chunk=True)
    with pytest.raises(ValueError):
        store.stage_truncate(1, 0, 1, -1)
    with pytest.raises(ValueError):
        store.meta("1", 0)
    with pytest.raises(ValueError):
        store.list(limit=0)
    assert store.list() == [] and chunk_files(store.root) == []


def test_reopen_recovers(tmp_path):
    root = tmp_path / "t"
    s = ChunkStore(root, block_size=BS)
    write(s, 1, 0, 1, 0, b"committed")
    s.stage(1, 0, 2, 0, b"pending", chunk_size=CS)
    s.stage(1, 1, 1, 0, b"pending only", chunk_size=CS)
    s.close()
    stray = root / "chunks" / f"{1:016x}" / "00000000.9.ff"
    stray.write_bytes(b"torn")
    s = ChunkStore(root, block_size=BS)
    try:
        m = s.meta(1, 0)
        assert (m.version, m.pending_version) == (1, 0)
        assert content(s, 1, 0) == b"committed"
        assert s.meta(1, 1) is None
        assert len(chunk_files(root)) == 1
        assert s.stats() == {**s.stats(), "chunks": 1, "used": len(b"committed")}
        # new files never reuse a name seen before
        write(s, 1, 0, 2, 0, b"again", full_chunk=True)
        assert content(s, 1, 0) == b"again"
    finally:
        s.close()
    with pytest.raises(ValueError):
        ChunkStore(root, block_size=2 * BS)


def test_concurrent_writers(store):
    errors = []

    def worker(inode):
        try:
            for v in range(1, 41):
                store.stage(inode, v % 4, v // 4 + 1, (v * 997) % BS, os.urandom(BS), chunk_size=CS)
                store.commit(inode, v % 4, v // 4 + 1)
                with store.committed_file(inode, v % 4):
                    pass
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert store.stats()["chunks"] == 24
    for m in store.list():
        content(store, m.inode, m.index)
    assert store.stats()["used"] == sum(p.stat().st_size for p in chunk_files(store.root))


# The writer of the crash test and its checker share this model: the content of
# version v of a chunk is version v-1 with one deterministic operation applied.
MODEL = textwrap.dedent(
    """
    import random

    CHUNK = 256 * 1024

    def op(inode, index, version):
        rng = random.Random(f"{inode}-{index}-{version}")
        kind = rng.random()
        if kind < 0.1:
            return ("truncate", rng.randrange(0, CHUNK), b"")
        if kind < 0.3:
            return ("full", 0, rng.randbytes(rng.randrange(0, CHUNK + 1)))
        offset = rng.randrange(0, CHUNK)
        return ("write", offset, rng.randbytes(rng.randrange(1, CHUNK - offset + 1)))

    def expected(inode, index, version):
        data = bytearray()
        for v in range(1, version + 1):
            kind, offset, payload = op(inode, index, v)
            if kind == "truncate":
                del data[offset:]
            elif kind == "full":
                data = bytearray(payload)
            else:
                if offset > len(data):
                    data.extend(bytes(offset - len(data)))
                data[offset:offset + len(payload)] = payload
        return bytes(data)
    """
)

WRITER = MODEL + textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from emberfs.storageserver.chunkstore import ChunkStore

    store = ChunkStore(Path(sys.argv[1]), block_size=4096)
    chunks = [(3, i) for i in range(6)]
    version = {c: (store.meta(*c).version if store.meta(*c) else 0) for c in chunks}
    step = 0
    while True:
        step += 1
        c = chunks[step % len(chunks)]
        v = version[c] + 1
        if step % 7 == 0:  # a write that the chain gives up on
            store.stage(*c, v, 0, b"aborted", chunk_size=CHUNK)
            store.abort(*c, v)
        kind, offset, payload = op(*c, v)
        if kind == "truncate":
            store.stage_truncate(*c, v, offset)
        else:
            store.stage(*c, v, offset, payload, chunk_size=CHUNK, full_chunk=kind == "full")
        store.commit(*c, v)
        version[c] = v
        print(c[0], c[1], v, flush=True)
    """
)


@pytest.mark.timeout(120)
def test_kill_9_mid_stream_keeps_every_acknowledged_version(tmp_path):
    model: dict = {}
    exec(MODEL, model)
    root = tmp_path / "target"
    acknowledged: dict[tuple[int, int], int] = {}
    for round_no in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            want = 150 + random.randrange(150)
            deadline = time.monotonic() + 60
            lines = 0
            while lines < want:
                line = child.stdout.readline()
                assert line, f"writer died: {child.stderr.read()}"
                inode, index, version = map(int, line.split())
                acknowledged[(inode, index)] = version
                lines += 1
                assert time.monotonic() < deadline, "writer too slow"
            time.sleep(random.random() * 0.02)  # land anywhere inside the next operations
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            # every commit the writer reported before it died must have survived
            # (a report cut short by the kill is not counted: only whole lines are)
            for line in child.stdout.read().splitlines(keepends=True):
                if not line.endswith("\n"):
                    continue
                inode, index, version = map(int, line.split())
                acknowledged[(inode, index)] = version
            child.stdout.close()
            child.stderr.close()
        store = ChunkStore(root, block_size=4096)
        try:
            for (inode, index), version in acknowledged.items():
                meta = store.meta(inode, index)
                assert meta is not None, (round_no, inode, index)
                assert meta.pending_version == 0
                assert meta.version >= version
                data = content(store, inode, index)
                assert data == model["expected"](inode, index, meta.version)
            referenced = {m.inode for m in store.list()}
            assert referenced == {3}
            assert len(chunk_files(root)) == len(store.list())
            assert store.stats()["used"] == sum(p.stat().st_size for p in chunk_files(root))
        finally:
            store.close()


@pytest.mark.parametrize("source", ["bytes", "bytearray-offset", "mmap"])
@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 3 * 4096 + 17, CS])
def test_direct_io_writes_every_size_and_buffer_exactly(tmp_path, source, size):
    import mmap

    payload = random.randbytes(size)
    if source == "bytes":
        data = payload
    elif source == "bytearray-offset":  # an address that is not aligned
        data = memoryview(bytearray(b"x" + payload))[1:]
    else:
        buf = mmap.mmap(-1, size)
        buf[:] = payload
        data = memoryview(buf)
    with ChunkStore(tmp_path / "t", direct_io=True, direct_min=0) as store:
        store.stage(5, 0, 1, 0, data, chunk_size=CS, full_chunk=True)
        store.commit(5, 0, 1)
        # a partial overwrite rewrites the chunk from a patched copy
        store.stage(5, 0, 2, size // 2, b"zz", chunk_size=CS)
        store.commit(5, 0, 2)
        assert store.direct_io, "this file system refused O_DIRECT"
        expected = bytearray(payload)
        expected[size // 2 : size // 2 + 2] = b"zz"
        assert content(store, 5, 0) == bytes(expected)
        (path,) = chunk_files(tmp_path / "t")
        assert path.stat().st_size == len(expected)


def test_direct_io_refused_falls_back_to_the_page_cache(tmp_path, monkeypatch):
    import errno as errno_mod

    from emberfs.storageserver import chunkfiles

    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & chunkfiles.O_DIRECT:
            raise OSError(errno_mod.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(chunkfiles.os, "open", refusing_open)
    payload = random.randbytes(3 * 4096 + 5)
    with ChunkStore(tmp_path / "t", direct_io=True, direct_min=0) as store:
        store.stage(5, 0, 1, 0, payload, chunk_size=CS, full_chunk=True)
        store.commit(5, 0, 1)
        assert not store.direct_io
        assert content(store, 5, 0) == payload


def test_a_committed_file_lost_in_a_crash_is_marked_damaged_not_dropped(tmp_path):
    root = tmp_path / "t"
    with ChunkStore(root, block_size=BS) as s:
        write(s, 3, 0, 4, 0, b"kept")
        write(s, 3, 1, 2, 0, b"lost on this disk")
    for path in chunk_files(root):
        if path.stat().st_size == len(b"lost on this disk"):
            path.unlink()  # the file never reached the disk; its record did
    with ChunkStore(root, block_size=BS) as s:
        m = s.meta(3, 1)
        assert m.damaged and m.version == 2  # it existed: not a hole, not gone
        assert not s.meta(3, 0).damaged and content(s, 3, 0) == b"kept"
        with pytest.raises(KeyError):
            s.read_committed(3, 1)
        assert [c.index for c in s.list(inode=3)] == [0, 1]
        # a whole copy (a resync, at the same version) makes it whole again
        assert s.install(3, 1, 2, b"lost on this disk")
        assert not s.meta(3, 1).damaged and content(s, 3, 1) == b"lost on this disk"
    with ChunkStore(root, block_size=BS) as s:
        assert not s.meta(3, 1).damaged and content(s, 3, 1) == b"lost on this disk"


def test_small_chunk_files_go_through_the_page_cache(tmp_path, monkeypatch):
    from emberfs.storageserver import chunkfiles

    direct_opens = []
    real_open = os.open

    def counting_open(path, flags, *args):
        if flags & chunkfiles.O_DIRECT:
            direct_opens.append(path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(chunkfiles.os, "open", counting_open)
    small = random.randbytes(chunkfiles.DIRECT_MIN - 4096)
    large = random.randbytes(chunkfiles.DIRECT_MIN)
    with ChunkStore(tmp_path / "t", direct_io=True) as store:
        for inode, payload in ((5, small), (6, large)):
            store.stage(inode, 0, 1, 0, payload, chunk_size=CS, full_chunk=True)
            store.commit(inode, 0, 1)
            assert content(store, inode, 0) == payload
        assert store.direct_io, "this file system refused O_DIRECT"
    # one file opened for direct I/O (the first open of an inode's first chunk may find
    # no directory yet and be tried again)
    (opened,) = set(direct_opens)
    assert "0000000000000006" in str(opened)
