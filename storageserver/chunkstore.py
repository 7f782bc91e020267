"""The chunk engine of one storage target: chunk files plus a RocksDB of chunk metadata.

A target keeps every chunk as one file per stored version under ``root/chunks``
and the chunk's metadata in a RocksDB under ``root/meta``. File names are made
from integers only (``chunks/<inode:016x>/<index:08x>.<version:x>.<file id:x>``),
so no request string ever reaches a path.

Every change is copy-on-write: a new version is written to a new file first,
then the metadata record is switched to it, then the file it replaced is
retired. Metadata therefore never points at a missing or half-written file,
and a reader holding the old file (:meth:`ChunkStore.committed_file`) keeps
reading the old version after a newer one commits.

A retired file is kept as a spare under ``root/spare`` (up to ``spare_bytes``
and ``MAX_SPARES`` per target) when no reader holds it, and a new version that
fills at least half of the newest spare takes it, renames it into place and
writes over it, cut to its new length; otherwise a retired file is unlinked.
Writing over blocks a file already has skips the file system's allocation
(and, on thin-provisioned or trimmed virtual disks, the device's): a direct
write over written blocks ran at twice the rate of one to new blocks on the
test machine's disk. A spare holds another chunk's bytes until it is
written over, but never past its new length, and no record refers to it.

A chunk holds at most one committed and one pending version (CRAQ): a write is
staged as pending (:meth:`ChunkStore.stage`), then committed or aborted once
the chain has answered. Reopening a store drops pending versions and deletes
files that no record refers to (spares are kept), so after ``kill -9`` at any
point a chunk reads back as its last committed version.

Durability: by default files are written without ``fsync`` and the RocksDB WAL
is written but not synced. A killed process then loses nothing (the operating
system already holds every acknowledged write); a power loss may. With
``fsync=True`` each chunk file (and its directory entry) is fsynced before the
metadata refers to it and every metadata write syncs the WAL, which survives
power loss at the cost of a few milliseconds per change.

Chunk files are written with direct I/O (``O_DIRECT``) where the file system
allows it: the largest 4 KiB-aligned part of the content goes straight from the
caller's buffer (or an aligned per-thread copy of it) to the device, the rest
through the page cache. A buffered write of new data has to fill fresh page
cache pages, and on a virtual machine whose host takes back free guest memory
that costs more CPU than all the network copies of a replicated write; a direct
write costs a tenth of it. Reads stay buffered (``sendfile`` from the page
cache); the kernel keeps direct writes and cached pages coherent. Where
``O_DIRECT`` is refused (tmpfs and some network file systems) the store falls
back to buffered writes by itself; ``direct_io=False`` asks for them.

Callers order the updates of one chunk (the data server holds a per-chunk lock);
the store itself is safe to call from many threads: metadata read-modify-write
runs under one lock, file I/O outside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import re
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from emberfs.common import framing
from emberfs.common.layout import MAX_CHUNK_SIZE

log = logging.getLogger(__name__)

MAX_INODE = (1 << 64) - 1
MAX_INDEX = (1 << 32) - 1
MAX_VERSION = (1 << 64) - 1

_KEY = struct.Struct(">QI")
_CONFIG_KEY = b"\x00" * _KEY.size  # inode 0 is never a chunk: the store's own settings
_CONFIG = struct.Struct("<II")  # format, block size
_FORMAT = 1
_RECORD = struct.Struct("<BQQIIQQII")
_FILE_NAME = re.compile(r"([0-9a-f]{8})\.([0-9a-f]{1,16})\.([0-9a-f]{1,16})")
_INODE_DIR = re.compile(r"[0-9a-f]{16}")
_SPARE_NAME = re.compile(r"[0-9a-f]{1,16}")
DEFAULT_SPARE_BYTES = 1 << 30  # retired chunk files kept for reuse, per target
MAX_SPARES = 4096  # and at most this many of them
_DIRECT_ALIGN = 4096  # buffer address, file offset and length of an O_DIRECT write
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_SCRATCH_MAX = 16 * 1024 * 1024  # largest aligned copy kept per thread
_scratch = threading.local()


def _address(view: memoryview) -> int | None:
    """The address of a writable buffer's first byte, or None when it is read-only."""
    if view.readonly or not len(view):
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _aligned(view: memoryview) -> memoryview:
    """``view`` itself when its address is aligned for direct I/O, else an aligned copy.

    The copy lives in a page-aligned anonymous mapping kept per thread (up
    to ``_SCRATCH_MAX`` bytes), so a thread copies into memory it has touched
    before.
    """
    address = _address(view)
    if address is not None and address % _DIRECT_ALIGN == 0:
        return view
    n = len(view)
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < n:
        buf = mmap.mmap(-1, max(n, _DIRECT_ALIGN))
        if n <= _SCRATCH_MAX:
            _scratch.buf = buf
    out = memoryview(buf)[:n]
    out[:] = view
    return out


class VersionConflict(Exception):
    """The requested version does not fit the chunk's state.

    Raised when staging a version not newer than the committed one, or when
    committing a version that is not the pending one.
    """


@dataclass
class ChunkMeta:
    """What a target knows about one chunk.

    Attributes
    ----------
    inode, index : int
        The chunk id.
    version : int
        Committed version (0: nothing committed yet).
    pending_version : int
        Staged, not yet committed version (0: nothing pending).
    length : int
        Length of the committed content.
    crcs : list of int
        CRC32C of each ``block_size`` block of the committed content.
    checksum : int
        CRC32C of the whole committed content.
    pending_length : int
        Length of the pending content (0 when nothing is pending).
    pending_checksum : int
        CRC32C of the whole pending content.
    """

    inode: int
    index: int
    version: int
    pending_version: int
    length: int
    crcs: list[int]
    checksum: int
    pending_length: int = 0
    pending_checksum: int = 0


@dataclass
class _Record:
    c_version: int = 0
    c_fid: int = 0
    c_len: int = 0
    c_sum: int = 0
    p_version: int = 0
    p_fid: int = 0
    p_len: int = 0
    p_sum: int = 0
    c_crcs: list[int] = field(default_factory=list)
    p_crcs: list[int] = field(default_factory=list)

    def encode(self) -> bytes:
        head = _RECORD.pack(
            _FORMAT,
            self.c_version,
            self.c_fid,
            self.c_len,
            self.c_sum,
            self.p_version,
            self.p_fid,
            self.p_len,
            self.p_sum,
        )
        crcs = self.c_crcs + self.p_crcs
        return head + struct.pack(f"<{len(crcs)}I", *crcs)

    @classmethod
    def decode(cls, raw: bytes, block_size: int) -> _Record:
        fmt, cv, cf, cl, cs, pv, pf, pl, ps = _RECORD.unpack_from(raw)
        if fmt != _FORMAT:
            raise ValueError(f"unknown chunk record format {fmt}")
        nc = framing.n_blocks(cl, block_size)
        np_ = framing.n_blocks(pl, block_size)
        crcs = list(struct.unpack_from(f"<{nc + np_}I", raw, _RECORD.size))
        return cls(cv, cf, cl, cs, pv, pf, pl, ps, crcs[:nc], crcs[nc:])

    def drop_pending(self) -> None:
        self.p_version = self.p_fid = self.p_len = self.p_sum = 0
        self.p_crcs = []


def _check_chunk(inode: int, index: int) -> None:
    if not isinstance(inode, int) or not 1 <= inode <= MAX_INODE:
        raise ValueError(f"inode {inode!r} is outside 1..2^64-1")
    if not isinstance(index, int) or not 0 <= index <= MAX_INDEX:
        raise ValueError(f"chunk index {index!r} is outside 0..2^32-1")


def _check_version(version: int) -> None:
    if not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise ValueError(f"version {version!r} is outside 1..2^64-1")


class ChunkStore:
    """One storage target: chunk files + a RocksDB of chunk metadata under ``root``.

    Parameters
    ----------
    root : Path
        The target's directory (created if missing).
    block_size : int, default framing.DEFAULT_BLOCK
        Bytes per stored CRC32C. Fixed when the store is created; reopening
        with another value raises ``ValueError``.
    fsync : bool, default False
        Fsync chunk files and sync the metadata WAL before a change returns
        (power-loss durability). Without it a change survives the death of the
        process but not of the machine.
    direct_io : bool, default True
        Write chunk files with ``O_DIRECT`` where the file system allows it
        (see the module notes); the store turns it off by itself on the
        first refusal.
    spare_bytes : int, default DEFAULT_SPARE_BYTES
        Bytes of retired chunk files kept to be written over by new versions
        (see the module notes); 0 unlinks every retired file.
    """

    def __init__(
        self,
        root: Path,
        *,
        block_size: int = framing.DEFAULT_BLOCK,
        fsync: bool = False,
        direct_io: bool = True,
        spare_bytes: int = DEFAULT_SPARE_BYTES,
    ):
        from rocksdict import Options, Rdict, WriteOptions

        if not framing.MIN_BLOCK <= block_size <= framing.MAX_DATA:
            raise ValueError(f"block size {block_size} is out of range")
        self.root = Path(root)
        self.block_size = block_size
        self.fsync = fsync
        self.direct_io = bool(direct_io and _O_DIRECT)
        if spare_bytes < 0:
            raise ValueError("spare_bytes must not be negative")
        self.spare_bytes = spare_bytes
        self._chunks_dir = self.root / "chunks"
        self._chunks_dir.mkdir(parents=True, exist_ok=True)
        self._spare_dir = self.root / "spare"
        self._spare_dir.mkdir(exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db = Rdict(str(self.root / "meta"), opts)
        self._wopts = WriteOptions()
        self._wopts.sync = fsync
        self._lock = threading.Lock()
        self._used = 0
        self._count = 0
        self._next_fid = 1
        self._spares: list[tuple[Path, int]] = []  # (path, size), newest last
        self._spare_total = 0  # bytes in _spares and in renames under way
        self._next_spare = 1
        self._readers: dict[Path, int] = {}  # committed files held by committed_file()
        self._closed = False
        try:
            self._check_config()
            self._recover()
        except BaseException:
            self._db.close()
            raise

    # ------------------------------------------------------------------ setup

    def _check_config(self) -> None:
        raw = self._db.get(_CONFIG_KEY)
        if raw is None:
            self._db.put(_CONFIG_KEY, _CONFIG.pack(_FORMAT, self.block_size), self._wopts)
            return
        fmt, block_size = _CONFIG.unpack(raw)
        if fmt != _FORMAT:
            raise ValueError(f"{self.root}: unknown chunk store format {fmt}")
        if block_size != self.block_size:
            raise ValueError(
                f"{self.root}: created with block size {block_size}, opened with {self.block_size}"
            )

    def _recover(self) -> None:
        """Drop pending versions and files no record refers to; count what is kept."""
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        changes = 0
        referenced: dict[Path, int] = {}
        max_fid = 0
        it = self._db.iter()
        it.seek(_KEY.pack(1, 0))
        while it.valid():
            key, raw = it.key(), it.value()
            it.next()
            inode, index = _KEY.unpack(key)
            rec = _Record.decode(raw, self.block_size)
            max_fid = max(max_fid, rec.c_fid, rec.p_fid)
            dirty = False
            if rec.p_version:
                rec.drop_pending()
                dirty = True
            if rec.c_version:
                path = self._path(inode, index, rec.c_version, rec.c_fid)
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    size = -1
                if size != rec.c_len:
                    log.error(
                        "%s: chunk %d:%d version %d: file %s (size %d, expected %d); dropped",
                        self.root,
                        inode,
                        index,
                        rec.c_version,
                        "missing" if size < 0 else "wrong size",
                        size,
                        rec.c_len,
                    )
                    rec = _Record()
                    dirty = True
                else:
                    referenced[path] = size
            if not rec.c_version:
                batch.delete(key)
                changes += 1
                continue
            if dirty:
                batch.put(key, rec.encode())
                changes += 1
            self._count += 1
        if changes:
            self._db.write(batch, self._wopts)
        for inode_dir in os.scandir(self._chunks_dir):
            if not (
                inode_dir.is_dir(follow_symlinks=False) and _INODE_DIR.fullmatch(inode_dir.name)
            ):
                log.warning("%s: unexpected entry %s left alone", self.root, inode_dir.path)
                continue
            for entry in os.scandir(inode_dir.path):
                m = _FILE_NAME.fullmatch(entry.name)
                if not m or not entry.is_file(follow_symlinks=False):
                    log.warning("%s: unexpected entry %s left alone", self.root, entry.path)
                    continue
                max_fid = max(max_fid, int(m.group(3), 16))
                path = Path(entry.path)
                if path in referenced:
                    self._used += referenced[path]
                else:
                    os.unlink(path)
            try:
                os.rmdir(inode_dir.path)
            except OSError:
                pass  # not empty
        self._next_fid = max_fid + 1
        self._adopt_spares()

    def _adopt_spares(self) -> None:
        """Keep the spares a previous run left, within ``spare_bytes``."""
        for entry in sorted(os.scandir(self._spare_dir), key=lambda e: e.name):
            if not (_SPARE_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)):
                log.warning("%s: unexpected entry %s left alone", self.root, entry.path)
                continue
            self._next_spare = max(self._next_spare, int(entry.name, 16) + 1)
            size = entry.stat(follow_symlinks=False).st_size
            if self._spare_fits(size):
                self._spares.append((Path(entry.path), size))
                self._spare_total += size
            else:
                os.unlink(entry.path)

    # ------------------------------------------------------------------ helpers

    def _path(self, inode: int, index: int, version: int, fid: int) -> Path:
        return self._chunks_dir / f"{inode:016x}" / f"{index:08x}.{version:x}.{fid:x}"

    def _get(self, key: bytes) -> _Record | None:
        raw = self._db.get(key)
        return None if raw is None else _Record.decode(raw, self.block_size)

    def _put(self, key: bytes, rec: _Record) -> None:
        self._db.put(key, rec.encode(), self._wopts)

    def _meta(self, inode: int, index: int, rec: _Record) -> ChunkMeta:
        return ChunkMeta(
            inode=inode,
            index=index,
            version=rec.c_version,
            pending_version=rec.p_version,
            length=rec.c_len,
            crcs=list(rec.c_crcs),
            checksum=rec.c_sum,
            pending_length=rec.p_len,
            pending_checksum=rec.p_sum,
        )

    def _write_file(self, inode: int, index: int, version: int, data) -> tuple[Path, int]:
        """Write ``data`` to a new file of the chunk; returns (path, file id).

        The newest spare is written over when ``data`` fills at least half of
        it: cutting a spare much shorter would give most of its blocks back.
        """
        view = memoryview(data).cast("B")
        with self._lock:
            fid = self._next_fid
            self._next_fid += 1
            spare = None
            if self._spares and 2 * len(view) >= self._spares[-1][1]:
                spare = self._spares.pop()
                self._spare_total -= spare[1]
        path = self._path(inode, index, version, fid)
        new_dir = False
        for attempt in range(3):
            try:
                if spare is not None:
                    os.rename(spare[0], path)
                    fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
                else:
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                    fd = os.open(path, flags, 0o644)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
                if spare is not None and not spare[0].exists():
                    spare = None  # gone (removed by hand): create the file instead
                    continue
                # first chunk of the inode here, or remove_inode just dropped the directory
                path.parent.mkdir(exist_ok=True)
                new_dir = True
        try:
            written = self._write_direct(path, view) if self.direct_io else 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], written)
            if spare is not None and spare[1] > len(view):
                os.ftruncate(fd, len(view))  # nothing of the spare's old content past the end
            if self.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        if self.fsync:
            self._fsync_dir(path.parent)
            if new_dir:
                self._fsync_dir(self._chunks_dir)
        with self._lock:
            self._used += len(view)
        return path, fid

    def _write_direct(self, path: Path, view: memoryview) -> int:
        """Write the aligned head of ``view`` to the new file ``path`` with O_DIRECT.

        Returns how many bytes it wrote from offset 0 (a multiple of the
        alignment); the caller writes the rest through the page cache. A file
        system that refuses direct I/O turns it off for the store.
        """
        n = len(view) - len(view) % _DIRECT_ALIGN
        if n == 0:
            return 0
        try:
            fd = os.open(path, os.O_WRONLY | _O_DIRECT | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._direct_refused(exc)
            return 0
        written = 0
        try:
            src = _aligned(view[:n])
            while written < n:
                k = os.pwrite(fd, src[written:], written)
                if k <= 0:
                    break
                written += k
                if k % _DIRECT_ALIGN:
                    break  # the rest would be misaligned: the page cache takes it
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._direct_refused(exc)
        finally:
            os.close(fd)
        return written

    def _direct_refused(self, exc: OSError) -> None:
        if self.direct_io:
            self.direct_io = False
            log.info("%s: direct I/O refused (%s); writing through the page cache", self.root, exc)

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _spare_fits(self, size: int) -> bool:
        """Whether a file of ``size`` bytes may be kept as a spare (empty ones have no blocks)."""
        return (
            size > 0
            and len(self._spares) < MAX_SPARES
            and self._spare_total + size <= self.spare_bytes
        )

    def _retire(self, paths: Iterable[tuple[Path, int]]) -> None:
        """Keep replaced files as spares or unlink them (no record refers to them any more).

        A file some reader still holds (:meth:`committed_file`) is unlinked,
        never written over. No new reader can take it: readers open only the
        file a record refers to, and the record was switched before.
        """
        freed = 0
        for path, size in paths:
            with self._lock:
                keep = path not in self._readers and self._spare_fits(size)
                if keep:
                    self._spare_total += size
                    spare = self._spare_dir / f"{self._next_spare:x}"
                    self._next_spare += 1
            if keep:
                try:
                    os.rename(path, spare)
                except OSError as exc:
                    with self._lock:
                        self._spare_total -= size
                    if isinstance(exc, FileNotFoundError):
                        continue
                else:
                    with self._lock:
                        self._spares.append((spare, size))
                    freed += size
                    continue
            try:
                os.unlink(path)
                freed += size
            except FileNotFoundError:
                pass
        if freed:
            with self._lock:
                self._used -= freed

    def _read(self, path: Path, offset: int, length: int) -> bytes:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            return self._pread_all(fd, offset, length)
        finally:
            os.close(fd)

    @staticmethod
    def _pread_all(fd: int, offset: int, length: int) -> bytes:
        data = os.pread(fd, length, offset)
        if len(data) == length:
            return data
        buf = bytearray(length)
        view = memoryview(buf)
        got = len(data)
        view[:got] = data
        while got < length:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                raise OSError(f"chunk file ended after {got} of {length} bytes")
            got += n
        return bytes(buf)

    @staticmethod
    def _pread_into(fd: int, view: memoryview, offset: int) -> None:
        got = 0
        while got < len(view):
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                raise OSError(f"chunk file ended {len(view) - got} bytes early")
            got += n

    def _patched_content(
        self, inode: int, index: int, base: _Record | None, offset: int, data: memoryview
    ) -> bytearray:
        """The committed content with ``data`` written at ``offset`` (gap zero-filled).

        Only the committed bytes that survive the write are read.
        """
        old_len = base.c_len if base and base.c_version else 0
        end = offset + len(data)
        content = bytearray(max(old_len, end))
        mv = memoryview(content)
        if old_len and (offset > 0 or end < old_len):
            path = self._path(inode, index, base.c_version, base.c_fid)
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                if offset:
                    self._pread_into(fd, mv[: min(offset, old_len)], 0)
                if end < old_len:
                    self._pread_into(fd, mv[end:old_len], end)
            finally:
                os.close(fd)
        mv[offset:end] = data
        return content

    def _stage_new(self, inode: int, index: int, version: int, build) -> ChunkMeta:
        """Write a pending version whose content ``build(committed record)`` returns.

        ``build`` returns (content, block crcs, checksum). If the committed
        version changes while the new file is written, the build is redone.
        """
        key = _KEY.pack(inode, index)
        for _ in range(16):
            base = self._get(key)
            base_ref = (base.c_version, base.c_fid) if base else (0, 0)
            if base is not None and version <= base.c_version:
                raise VersionConflict(
                    f"chunk {inode}:{index}: version {version} is not newer than "
                    f"the committed version {base.c_version}"
                )
            content, crcs, checksum = build(base)
            path, fid = self._write_file(inode, index, version, content)
            garbage: list[tuple[Path, int]] = []
            with self._lock:
                rec = self._get(key)
                ref = (rec.c_version, rec.c_fid) if rec else (0, 0)
                if ref != base_ref:
                    garbage.append((path, len(content)))
                    rec = None
                else:
                    if rec is None:
                        rec = _Record()
                        self._count += 1
                    elif rec.p_version:
                        garbage.append(
                            (self._path(inode, index, rec.p_version, rec.p_fid), rec.p_len)
                        )
                    rec.p_version, rec.p_fid = version, fid
                    rec.p_len, rec.p_sum, rec.p_crcs = len(content), checksum, crcs
                    self._put(key, rec)
                    meta = self._meta(inode, index, rec)
            self._retire(garbage)
            if rec is not None:
                return meta
        raise VersionConflict(f"chunk {inode}:{index}: committed version kept changing")

    # ------------------------------------------------------------------ reads

    def meta(self, inode: int, index: int) -> ChunkMeta | None:
        """The chunk's metadata, or None when the target has no such chunk."""
        _check_chunk(inode, index)
        rec = self._get(_KEY.pack(inode, index))
        return None if rec is None else self._meta(inode, index, rec)

    @contextlib.contextmanager
    def committed_file(self, inode: int, index: int) -> Iterator[tuple[int, ChunkMeta]]:
        """A read-only descriptor of the committed version's file, and its metadata.

        The descriptor is closed when the block ends. Until then it keeps
        reading the same version even if a newer one commits meanwhile: the
        file it holds is unlinked, never kept as a spare to be written over.

        Raises
        ------
        KeyError
            The chunk has no committed version on this target.
        """
        _check_chunk(inode, index)
        with self._lock:
            rec = self._get(_KEY.pack(inode, index))
            if rec is None or not rec.c_version:
                raise KeyError((inode, index))
            path = self._path(inode, index, rec.c_version, rec.c_fid)
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self._readers[path] = self._readers.get(path, 0) + 1
        try:
            yield fd, self._meta(inode, index, rec)
        finally:
            os.close(fd)
            with self._lock:
                left = self._readers[path] - 1
                if left:
                    self._readers[path] = left
                else:
                    del self._readers[path]

    def read_committed(
        self, inode: int, index: int, offset: int = 0, length: int | None = None
    ) -> tuple[bytes, ChunkMeta]:
        """Bytes ``[offset, offset+length)`` of the committed content (clipped to its end).

        ``length`` None reads to the end. Raises ``KeyError`` when nothing is committed.
        """
        if offset < 0 or (length is not None and length < 0):
            raise ValueError("offset and length must not be negative")
        with self.committed_file(inode, index) as (fd, meta):
            end = meta.length if length is None else min(meta.length, offset + length)
            if offset >= end:
                return b"", meta
            return self._pread_all(fd, offset, end - offset), meta

    # ------------------------------------------------------------------ updates

    def stage(
        self,
        inode: int,
        index: int,
        version: int,
        offset: int,
        data,
        *,
        chunk_size: int,
        full_chunk: bool = False,
        crcs: list[int] | None = None,
    ) -> ChunkMeta:
        """Store ``version`` as the chunk's pending version.

        The new content is the committed content with ``data`` written at
        ``offset`` (a gap past the old end reads as zeros), or exactly ``data``
        when ``full_chunk``. The committed version stays readable until
        :meth:`commit`. A pending version already present is replaced.

        Parameters
        ----------
        inode, index : int
            The chunk id.
        version : int
            The new version; must be newer than the committed one.
        offset : int
            Chunk offset of ``data`` (0 when ``full_chunk``).
        data : bytes-like
            The bytes written.
        chunk_size : int
            The file's chunk size; ``offset + len(data)`` may not exceed it.
        full_chunk : bool, default False
            ``data`` replaces the whole content.
        crcs : list of int or None
            CRC32C of each ``block_size`` block of ``data``, already verified
            by the caller; used (instead of computing them again) when
            ``data`` becomes the whole content.

        Returns
        -------
        ChunkMeta
            The metadata with the new pending version.

        Raises
        ------
        ValueError
            Out-of-range ids, version, offset or size.
        VersionConflict
            ``version`` is not newer than the committed version.
        """
        _check_chunk(inode, index)
        _check_version(version)
        view = memoryview(data).cast("B")
        n = len(view)
        if not 0 < chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk size {chunk_size} is out of range")
        if offset < 0 or offset + n > chunk_size:
            raise ValueError(f"write [{offset}, {offset + n}) crosses the chunk size {chunk_size}")
        if full_chunk and offset:
            raise ValueError("a full-chunk write starts at offset 0")
        bs = self.block_size
        given_crcs = crcs

        def build(base: _Record | None):
            old_len = base.c_len if base and base.c_version else 0
            if full_chunk or (offset == 0 and n >= old_len):
                block_crcs = given_crcs
                if block_crcs is None or len(block_crcs) != framing.n_blocks(n, bs):
                    block_crcs = framing.block_crcs(view, bs)
                return view, list(block_crcs), framing.combine_crcs(block_crcs, bs, n)
            content = self._patched_content(inode, index, base, offset, view)
            new_len = len(content)
            mv = memoryview(content)
            first = min(offset, old_len) // bs
            last = framing.n_blocks(offset + n, bs)
            old = base.c_crcs if base else []
            crcs = list(old[:first])
            crcs.extend(crc32c.crc32c(mv[i * bs : (i + 1) * bs]) for i in range(first, last))
            crcs.extend(old[last : framing.n_blocks(new_len, bs)])
            return content, crcs, framing.combine_crcs(crcs, bs, new_len)

        return self._stage_new(inode, index, version, build)

    def stage_truncate(self, inode: int, index: int, version: int, length: int) -> ChunkMeta:
        """Store ``version`` as pending: the committed content cut to ``length``.

        A ``length`` at or past the committed end keeps the content unchanged
        (bytes past a chunk's end read as zeros, so a cut never extends).
        Raises like :meth:`stage`.
        """
        _check_chunk(inode, index)
        _check_version(version)
        if not isinstance(length, int) or not 0 <= length <= MAX_CHUNK_SIZE:
            raise ValueError(f"length {length!r} is out of range")
        bs = self.block_size

        def build(base: _Record | None):
            old_len = base.c_len if base and base.c_version else 0
            new_len = min(length, old_len)
            if new_len == 0:
                return b"", [], crc32c.crc32c(b"")
            path = self._path(inode, index, base.c_version, base.c_fid)
            content = self._read(path, 0, new_len)
            full = new_len // bs
            crcs = list(base.c_crcs[:full])
            if new_len % bs:
                crcs.append(crc32c.crc32c(memoryview(content)[full * bs :]))
            return content, crcs, framing.combine_crcs(crcs, bs, new_len)

        return self._stage_new(inode, index, version, build)

    def commit(self, inode: int, index: int, version: int) -> ChunkMeta:
        """Make pending ``version`` the committed one; the replaced file is retired.

        Committing the version that is already committed (and not pending)
        returns its metadata unchanged, so a repeated commit is harmless.

        Raises
        ------
        VersionConflict
            ``version`` is neither pending nor committed.
        """
        _check_chunk(inode, index)
        _check_version(version)
        key = _KEY.pack(inode, index)
        with self._lock:
            rec = self._get(key)
            if rec is None or rec.p_version != version:
                if rec is not None and rec.c_version == version and not rec.p_version:
                    return self._meta(inode, index, rec)
                pending = rec.p_version if rec else 0
                raise VersionConflict(
                    f"chunk {inode}:{index}: version {version} is not pending (pending {pending})"
                )
            garbage = []
            if rec.c_version:
                garbage.append((self._path(inode, index, rec.c_version, rec.c_fid), rec.c_len))
            rec.c_version, rec.c_fid, rec.c_len = rec.p_version, rec.p_fid, rec.p_len
            rec.c_sum, rec.c_crcs = rec.p_sum, rec.p_crcs
            rec.drop_pending()
            self._put(key, rec)
            meta = self._meta(inode, index, rec)
        self._retire(garbage)
        return meta

    def abort(self, inode: int, index: int, version: int) -> None:
        """Drop pending ``version`` (nothing happens when it is not pending)."""
        _check_chunk(inode, index)
        _check_version(version)
        key = _KEY.pack(inode, index)
        with self._lock:
            rec = self._get(key)
            if rec is None or rec.p_version != version:
                return
            garbage = [(self._path(inode, index, rec.p_version, rec.p_fid), rec.p_len)]
            rec.drop_pending()
            if rec.c_version:
                self._put(key, rec)
            else:
                self._db.delete(key, self._wopts)
                self._count -= 1
        self._retire(garbage)

    def install(self, inode: int, index: int, version: int, data) -> bool:
        """Make ``data`` the committed content at ``version`` (a resync copy).

        Applies when ``version`` is newer than the local committed version, or
        equal to it with other content (a resync source is a serving replica and
        so the authority on what a committed version holds; a replica can only
        disagree after a write it once committed was given up). A pending
        version not newer than ``version`` is dropped, a newer one kept.

        Returns
        -------
        bool
            Whether the copy was applied.
        """
        _check_chunk(inode, index)
        _check_version(version)
        view = memoryview(data).cast("B")
        if len(view) > MAX_CHUNK_SIZE:
            raise ValueError(f"{len(view)} bytes exceed the largest chunk size")
        key = _KEY.pack(inode, index)
        crcs = framing.block_crcs(view, self.block_size)
        checksum = framing.combine_crcs(crcs, self.block_size, len(view))

        def stale(rec: _Record | None) -> bool:
            if rec is None or rec.c_version < version:
                return False
            return rec.c_version > version or (rec.c_len, rec.c_sum) == (len(view), checksum)

        if stale(self._get(key)):
            return False
        path, fid = self._write_file(inode, index, version, view)
        garbage: list[tuple[Path, int]] = []
        with self._lock:
            rec = self._get(key)
            if stale(rec):
                garbage.append((path, len(view)))
                applied = False
            else:
                if rec is None:
                    rec = _Record()
                    self._count += 1
                if rec.c_version:
                    garbage.append((self._path(inode, index, rec.c_version, rec.c_fid), rec.c_len))
                if rec.p_version and rec.p_version <= version:
                    garbage.append((self._path(inode, index, rec.p_version, rec.p_fid), rec.p_len))
                    rec.drop_pending()
                rec.c_version, rec.c_fid, rec.c_len = version, fid, len(view)
                rec.c_sum, rec.c_crcs = checksum, crcs
                self._put(key, rec)
                applied = True
        self._retire(garbage)
        return applied

    def remove(self, inode: int, index: int) -> bool:
        """Remove a chunk (every version); returns whether it existed."""
        _check_chunk(inode, index)
        key = _KEY.pack(inode, index)
        with self._lock:
            rec = self._get(key)
            if rec is None:
                return False
            self._db.delete(key, self._wopts)
            self._count -= 1
        garbage = []
        if rec.c_version:
            garbage.append((self._path(inode, index, rec.c_version, rec.c_fid), rec.c_len))
        if rec.p_version:
            garbage.append((self._path(inode, index, rec.p_version, rec.p_fid), rec.p_len))
        self._retire(garbage)
        return True

    def remove_inode(self, inode: int, indices: Iterable[int] | None = None) -> int:
        """Remove the given chunks of ``inode`` (all of them when ``indices`` is None).

        Returns the number of chunks removed.
        """
        _check_chunk(inode, 0)
        if indices is None:
            wanted = [m.index for m in self._iter(inode, None, None)]
        else:
            wanted = list(indices)
            for index in wanted:
                _check_chunk(inode, index)
        removed = sum(1 for index in wanted if self.remove(inode, index))
        if indices is None:
            try:
                os.rmdir(self._chunks_dir / f"{inode:016x}")
            except OSError:
                pass  # missing, or a new chunk arrived meanwhile
        return removed

    # ------------------------------------------------------------------ listing

    def _iter(self, inode: int, after: tuple[int, int] | None, limit: int | None):
        start = _KEY.pack(max(inode, 1), 0)
        if after is not None:
            _check_chunk(*after)
            start = max(start, _KEY.pack(*after) + b"\x00")
        it = self._db.iter()
        it.seek(start)
        n = 0
        while it.valid() and (limit is None or n < limit):
            ino, index = _KEY.unpack(it.key())
            if inode and ino != inode:
                break
            yield self._meta(ino, index, _Record.decode(it.value(), self.block_size))
            n += 1
            it.next()

    def list(
        self, inode: int = 0, after: tuple[int, int] | None = None, limit: int = 1000
    ) -> list[ChunkMeta]:
        """Chunks ordered by (inode, index), starting after ``after``.

        Parameters
        ----------
        inode : int, default 0
            Only this inode's chunks; 0 lists every inode.
        after : (inode, index), optional
            List chunks strictly after this id.
        limit : int, default 1000
            Most chunks returned.
        """
        if not isinstance(inode, int) or not 0 <= inode <= MAX_INODE:
            raise ValueError(f"inode {inode!r} is outside 0..2^64-1")
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return list(self._iter(inode, after, limit))

    def stats(self) -> dict:
        """``{"capacity": bytes of the filesystem, "used": bytes of chunk files, "chunks": n,
        "spare": bytes of spare files}``.

        Spares are not counted as used: new chunks write over them first.
        """
        st = os.statvfs(self.root)
        with self._lock:
            return {
                "capacity": st.f_blocks * st.f_frsize,
                "used": self._used,
                "chunks": self._count,
                "spare": self._spare_total,
            }

    def close(self) -> None:
        """Close the metadata database (the store is unusable afterwards)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def __enter__(self) -> ChunkStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["ChunkMeta", "ChunkStore", "VersionConflict"]
