"""A target's free space: the guard's decisions, and a chunk store on a disk that fills up."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace

import crc32c
import pytest

from emberfs.common import framing
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.space import SpaceGuard, is_no_space

MiB = 1024 * 1024
BS = framing.MIN_BLOCK
CS = MiB


class Disk:
    """A file system's figures as ``statvfs`` gives them, and how often they were read."""

    def __init__(self, free: int, inodes: int = 1000):
        self.free = free
        self.inodes = inodes
        self.reads = 0

    def statvfs(self, path):
        self.reads += 1
        return SimpleNamespace(f_bavail=self.free // 4096, f_frsize=4096, f_favail=self.inodes)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def guard(disk: Disk, clock: Clock, **kw) -> SpaceGuard:
    return SpaceGuard(Path("/t"), reserve=10 * MiB, statvfs=disk.statvfs, clock=clock, **kw)


def test_writes_are_counted_until_one_does_not_fit_then_the_target_is_full_until_it_does():
    disk, clock = Disk(100 * MiB), Clock()
    g = guard(disk, clock)

    def write(n: int) -> bool:
        ok = g.admit(n)
        if ok:
            disk.free -= n
        return ok

    assert write(40 * MiB) and write(40 * MiB)
    assert disk.reads == 1  # counted, not read again
    assert not write(20 * MiB)  # by the count it would not fit: read again, and it does not
    assert g.full and disk.reads == 2
    assert not write(4096)  # full: refused without a look until a second has passed
    disk.free += 50 * MiB  # files removed
    clock.now += 0.5
    assert not write(4096) and disk.reads == 2
    clock.now += 0.6
    assert write(4096) and not g.full and disk.reads == 3
    assert g.free == 70 * MiB - 4096


def test_a_full_target_waits_for_room_for_the_write_it_refused():
    disk, clock = Disk(25 * MiB), Clock()
    g = guard(disk, clock)
    assert not g.admit(20 * MiB) and g.full
    disk.free = 28 * MiB
    clock.now += 1.0
    assert not g.admit(4096)  # a small one would fit, the refused one not yet
    disk.free = 30 * MiB
    clock.now += 1.0
    assert g.admit(4096) and not g.full


def test_spare_space_is_given_back_before_a_write_is_refused():
    disk, clock = Disk(15 * MiB), Clock()
    released = []

    def release() -> int:
        released.append(True)
        disk.free += 30 * MiB
        return 30 * MiB

    g = guard(disk, clock, release=release)
    assert g.admit(20 * MiB) and not g.full and released == [True]
    nothing = guard(Disk(15 * MiB), clock, release=lambda: 0)
    assert not nothing.admit(20 * MiB) and nothing.full


def test_enospc_and_heartbeat_checks_make_a_target_full():
    disk, clock = Disk(100 * MiB), Clock()
    g = guard(disk, clock)
    g.exhausted(4 * MiB)  # the file system said ENOSPC although the figures showed room
    assert g.full and not g.admit(4096)
    assert g.check() and disk.reads == 2  # within the second: no look
    clock.now += 1.0
    assert not g.check() and disk.reads == 3 and g.admit(4 * MiB)
    disk.free = 5 * MiB  # filled by someone else: the heartbeat's look finds it
    assert g.check() and not g.admit(4096)
    disk.free, disk.inodes = 100 * MiB, 0  # bytes but no inode left
    clock.now += 1.0
    assert g.check() and not g.admit(4096)
    disk.inodes = 5
    clock.now += 1.0
    assert not g.check() and g.admit(4096)
    assert is_no_space(OSError(errno.ENOSPC, "x")) and is_no_space(OSError(errno.EDQUOT, "x"))
    assert not is_no_space(OSError(errno.EIO, "x")) and not is_no_space(ValueError())


# ---------------------------------------------------------------- a chunk store on a small disk


def chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "chunks").rglob("*") if p.is_file())


def spare_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "spare").iterdir() if p.is_file())


def committed(store: ChunkStore, inode: int, index: int) -> bytes:
    data, meta = store.read_committed(inode, index)
    framing.verify(data, meta.crcs, store.block_size)
    assert crc32c.crc32c(data) == meta.checksum
    return data


def put(store: ChunkStore, inode: int, index: int, version: int, data: bytes) -> None:
    store.stage(inode, index, version, 0, data, chunk_size=CS)
    store.commit(inode, index, version)


def fill(path: Path) -> None:
    """Write ``path`` until its file system is full."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(64 * 1024))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_a_full_target_refuses_keeps_its_chunks_and_takes_writes_once_chunks_go(tmpfs, tmp_path):
    root = tmpfs(tmp_path / "t1", 8 * MiB)
    store = ChunkStore(root, block_size=BS, reserve_bytes=MiB)
    try:
        store.space.check_interval = 0.0  # look at every write the guard lets wait
        chunks = {}
        for index in range(16):
            if not store.admit_write(1, index, 0, CS):
                break
            chunks[index] = bytes([index + 1]) * CS
            put(store, 1, index, 1, chunks[index])
        assert 3 <= len(chunks) < 8
        assert store.space.full and store.stats()["full"]
        # a small write into a chunk stages the whole chunk again: it does not fit either
        assert not store.admit_write(1, 0, 100, 10)
        assert all(committed(store, 1, i) == data for i, data in chunks.items())
        store.remove(1, 0)  # its file becomes a spare: the disk is as full as before
        assert spare_files(root)
        assert store.admit_write(1, len(chunks), 0, CS)  # the spare was given back
        assert not spare_files(root) and not store.space.full and not store.stats()["full"]
        put(store, 1, len(chunks), 1, b"z" * CS)
        assert committed(store, 1, len(chunks)) == b"z" * CS
    finally:
        store.close()


def test_enospc_while_staging_leaves_no_file_and_no_record(tmpfs, tmp_path):
    root = tmpfs(tmp_path / "t1", 4 * MiB)
    store = ChunkStore(root, block_size=BS, reserve_bytes=0)
    try:
        put(store, 1, 0, 1, b"a" * (256 * 1024))
        before = chunk_files(root)
        fill(root / "filler")
        with pytest.raises(OSError) as err:
            store.stage(1, 0, 2, 0, b"b" * CS, chunk_size=CS)
        assert err.value.errno == errno.ENOSPC
        with pytest.raises(OSError):
            store.stage(2, 0, 1, 0, b"c" * CS, chunk_size=CS)  # a new inode's first chunk
        assert store.space.full
        assert chunk_files(root) == before
        assert not (root / "chunks" / f"{2:016x}").exists()
        meta = store.meta(1, 0)
        assert (meta.version, meta.pending_version) == (1, 0) and store.meta(2, 0) is None
        assert committed(store, 1, 0) == b"a" * (256 * 1024)
        assert not store.admit_write(1, 0, 0, 10)
        (root / "filler").unlink()
        store.space.check_interval = 0.0
        assert not store.stats()["full"]
        assert store.admit_write(1, 0, 0, CS)
        put(store, 1, 0, 2, b"b" * CS)
        assert committed(store, 1, 0) == b"b" * CS
    finally:
        store.close()


class _FullRecords:
    """A RocksDB whose log writes fail for lack of space (everything else passes through)."""

    def __init__(self, db):
        self._db = db

    def put(self, *args):
        raise Exception(  # what rocksdict raises
            "IO error: No space left on device: While appending to file: 000004.log: "
            "No space left on device"
        )

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_record_that_cannot_be_written_leaves_no_file(tmp_path, monkeypatch):
    store = ChunkStore(tmp_path / "t1", block_size=BS)
    try:
        put(store, 1, 0, 1, b"a" * 5000)
        before = chunk_files(store.root)
        monkeypatch.setattr(store.records, "db", _FullRecords(store.records.db))
        with pytest.raises(OSError) as err:
            store.stage(1, 0, 2, 0, b"b" * 5000, chunk_size=CS)
        assert err.value.errno == errno.ENOSPC and store.space.full
        with pytest.raises(OSError):
            store.install(1, 1, 3, b"c" * 5000)
        assert chunk_files(store.root) == before
        assert store.meta(1, 0).pending_version == 0 and store.meta(1, 1) is None
        monkeypatch.undo()
        assert committed(store, 1, 0) == b"a" * 5000
    finally:
        store.close()
