"""The chunk files of one storage target: their names, the direct-I/O writer and the spares.

A target keeps every stored version of a chunk as one file under ``root/chunks``,
named from integers only (``<inode:016x>/<index:08x>.<version:x>.<file id:x>``),
so no request string ever reaches a path. :class:`ChunkFiles` writes, reads and
retires those files; which file holds which version of a chunk is recorded by
:class:`~emberfs.storageserver.chunkstore.ChunkStore`, which calls it. A file is
never changed once written: a new version is a new file.

Spares. A file no record refers to any more is retired (:meth:`ChunkFiles.retire`):
kept as a spare under ``root/spare`` (up to ``spare_bytes`` and ``MAX_SPARES``
per target) when no reader holds it, else unlinked. A new file that fills at
least half of the newest spare takes it: the spare is renamed into place,
written over and cut to its new length. Writing over blocks a file already has
skips the allocation of the file system (and, on thin-provisioned or trimmed
virtual disks, of the device). A spare holds another chunk's bytes until it is
written over, but never past its new length. A reader's file
(:meth:`ChunkFiles.open_reader`) is unlinked when retired, never written over,
so it keeps reading the version it opened. A target short of space drops
its spares (:meth:`ChunkFiles.drop_spares`) before it refuses a write.

Direct I/O. Files are written with ``O_DIRECT`` where the file system allows
it: the largest 4 KiB-aligned part of the content goes straight from the
caller's buffer (or an aligned per-thread copy of it) to the device, the rest
through the page cache, because a direct write spares the CPU the filling of
fresh page-cache pages that a buffered write of new data pays. Reads stay
buffered (``sendfile`` from the page cache); the kernel keeps direct writes and
cached pages coherent. Where ``O_DIRECT`` is refused (tmpfs and some network
file systems) writes fall back to the page cache by themselves;
``direct_io=False`` asks for them. Files under ``direct_min`` bytes (256 KiB) are
written through the page cache too: a small direct write waits for the device
(about 0.26 ms for 112 KiB on this kind of virtual disk, against 0.09 ms through
the page cache, file creation included) and saves little filling, and the
writes of a small-file batch are staged one after another.

A write that fails (ENOSPC among others) leaves nothing of the new file.

Durability: without ``fsync`` a written file is in the page cache or on the
device, which a killed process cannot lose; with ``fsync=True`` the file and
its directory entry are fsynced before :meth:`ChunkFiles.write` returns.

The methods are safe to call from many threads: file ids, the spare list and
the byte counts are kept under one lock, file I/O runs outside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import mmap
import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

DIRECT_MIN = 256 * 1024  # smaller files go through the page cache
DEFAULT_SPARE_BYTES = 1 << 30  # retired chunk files kept for reuse, per target
MAX_SPARES = 4096  # and at most this many of them
_FILE_NAME = re.compile(r"([0-9a-f]{8})\.([0-9a-f]{1,16})\.([0-9a-f]{1,16})")
_INODE_DIR = re.compile(r"[0-9a-f]{16}")
_SPARE_NAME = re.compile(r"[0-9a-f]{1,16}")
_DIRECT_ALIGN = 4096  # buffer address, file offset and length of an O_DIRECT write
#: the open flag of direct I/O (0 where the platform has none)
O_DIRECT = getattr(os, "O_DIRECT", 0)
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


def pread_all(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes of the file ``fd`` from ``offset``; ``OSError`` if it ends sooner."""
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


def pread_into(fd: int, view: memoryview, offset: int) -> None:
    """Fill ``view`` with the bytes of the file ``fd`` from ``offset``; ``OSError`` if it ends sooner."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise OSError(f"chunk file ended {len(view) - got} bytes early")
        got += n


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ChunkFiles:
    """The chunk files (``root/chunks``) and spare files (``root/spare``) of one target.

    Parameters
    ----------
    root : Path
        The target's directory (created if missing).
    fsync : bool, default False
        Fsync each new file and its directory entry before :meth:`write` returns.
    direct_io : bool, default True
        Write with ``O_DIRECT`` where the file system allows it (see the
        module notes); turned off by itself on the first refusal.
    direct_min : int, default DIRECT_MIN
        Files smaller than this are written through the page cache.
    spare_bytes : int, default DEFAULT_SPARE_BYTES
        Bytes of retired files kept to be written over by new files (see the
        module notes); 0 unlinks every retired file.
    """

    def __init__(
        self,
        root: Path,
        *,
        fsync: bool = False,
        direct_io: bool = True,
        direct_min: int | None = None,
        spare_bytes: int = DEFAULT_SPARE_BYTES,
    ):
        self.root = Path(root)
        self.fsync = fsync
        self.direct_io = bool(direct_io and O_DIRECT)
        self.direct_min = DIRECT_MIN if direct_min is None else direct_min
        if spare_bytes < 0:
            raise ValueError("spare_bytes must not be negative")
        self.spare_bytes = spare_bytes
        self._chunks_dir = self.root / "chunks"
        self._chunks_dir.mkdir(parents=True, exist_ok=True)
        self._spare_dir = self.root / "spare"
        self._spare_dir.mkdir(exist_ok=True)
        self._lock = threading.Lock()
        self._used = 0
        self._next_fid = 1
        self._spares: list[tuple[Path, int]] = []  # (path, size), newest last
        self._spare_total = 0  # bytes in _spares and in renames under way
        self._next_spare = 1
        self._readers: dict[Path, int] = {}  # files held by open_reader()

    @property
    def spares_named(self) -> int:
        """Spare file names handed out so far (names are never reused)."""
        return self._next_spare - 1

    # ------------------------------------------------------------------ names
    def path(self, inode: int, index: int, version: int, fid: int) -> Path:
        """The file of ``version`` of chunk ``(inode, index)`` with file id ``fid``."""
        return self._chunks_dir / f"{inode:016x}" / f"{index:08x}.{version:x}.{fid:x}"

    @staticmethod
    def size(path: Path) -> int:
        """The size of a chunk file, or -1 when it is missing."""
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return -1

    def remove_inode_dir(self, inode: int) -> None:
        """Remove the directory of ``inode``'s files if it is there and empty."""
        try:
            os.rmdir(self._chunks_dir / f"{inode:016x}")
        except OSError:
            pass  # missing, or a new chunk arrived meanwhile

    def usage(self) -> tuple[int, int]:
        """(bytes of chunk files, bytes of spare files)."""
        with self._lock:
            return self._used, self._spare_total

    # ------------------------------------------------------------------ reopening

    def recover(self, referenced: Mapping[Path, int], max_fid: int) -> None:
        """Take up the files a previous run left: delete every chunk file not in
        ``referenced`` (path to size), count the others as used, give new files ids
        past ``max_fid`` and past every file seen, and keep the spares within the limits.
        """
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

    # ------------------------------------------------------------------ writing

    def write(self, inode: int, index: int, version: int, data) -> tuple[Path, int]:
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
        path = self.path(inode, index, version, fid)
        direct = self.direct_io and len(view) >= max(self.direct_min, _DIRECT_ALIGN)
        new_dir = False
        try:
            for attempt in range(3):
                try:
                    if spare is not None:
                        os.rename(spare[0], path)
                        fd, direct = self._open(path, os.O_WRONLY, direct)
                    else:
                        fd, direct = self._open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, direct)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
                    if spare is not None and not spare[0].exists():
                        spare = None  # gone (removed by hand): create the file instead
                        continue
                    # first chunk of the inode here, or remove_inode_dir just dropped it
                    path.parent.mkdir(exist_ok=True)
                    new_dir = True
        except BaseException:
            if new_dir:
                self.remove_inode_dir(inode)  # no file could be made in it (no inode left)
            raise
        try:
            written = self._write_direct(fd, view) if direct else 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], written)
            if spare is not None and spare[1] > len(view):
                os.ftruncate(fd, len(view))  # nothing of the spare's old content past the end
            if self.fsync:
                os.fsync(fd)
        except BaseException:  # ENOSPC among others: nothing of the new file stays
            os.close(fd)
            os.unlink(path)
            if new_dir:
                self.remove_inode_dir(inode)
            raise
        os.close(fd)
        if self.fsync:
            _fsync_dir(path.parent)
            if new_dir:
                _fsync_dir(self._chunks_dir)
        with self._lock:
            self._used += len(view)
        return path, fid

    def _open(self, path: Path, flags: int, direct: bool) -> tuple[int, bool]:
        """Open ``path`` for writing, with ``O_DIRECT`` when ``direct``; (fd, whether direct).

        One descriptor serves the whole write: :meth:`_write_direct` clears its
        ``O_DIRECT`` for an unaligned tail. A file system that refuses direct
        I/O turns it off for the target.
        """
        flags |= getattr(os, "O_CLOEXEC", 0)
        if direct:
            try:
                return os.open(path, flags | O_DIRECT, 0o644), True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._direct_refused(exc)
                flags &= ~os.O_EXCL  # the refused open may have made the file (its name is new)
        return os.open(path, flags, 0o644), False

    def _write_direct(self, fd: int, view: memoryview) -> int:
        """Write the aligned head of ``view`` through the ``O_DIRECT`` descriptor ``fd``.

        Returns how many bytes it wrote from offset 0 (a multiple of the
        alignment). When bytes are left, ``fd`` no longer has ``O_DIRECT``
        and the caller writes them through the page cache. A file system
        that refuses the direct write turns direct I/O off for the target.
        """
        n = len(view) - len(view) % _DIRECT_ALIGN
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
        if written < len(view):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~O_DIRECT)
        return written

    def _direct_refused(self, exc: OSError) -> None:
        if self.direct_io:
            self.direct_io = False
            log.info("%s: direct I/O refused (%s); writing through the page cache", self.root, exc)

    # ------------------------------------------------------------------ retiring

    def _spare_fits(self, size: int) -> bool:
        """Whether a file of ``size`` bytes may be kept as a spare (empty ones have no blocks)."""
        return (
            size > 0
            and len(self._spares) < MAX_SPARES
            and self._spare_total + size <= self.spare_bytes
        )

    def retire(self, files: Iterable[tuple[Path, int]]) -> None:
        """Keep files no record refers to any more as spares, or unlink them.

        ``files`` holds (path, size) pairs. A file some reader still holds
        (:meth:`open_reader`) is unlinked, never written over. The caller
        makes sure no new reader can take it: readers open only the file a
        record refers to, and the record was switched before.
        """
        freed = 0
        for path, size in files:
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

    def drop_spares(self) -> int:
        """Unlink every spare file (the file system wants their space); the bytes freed."""
        with self._lock:
            spares, self._spares = self._spares, []
            freed = sum(size for _, size in spares)
            self._spare_total -= freed
        for path, _ in spares:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if spares:
            log.info(
                "%s: dropped %d spare files (%d bytes) for space", self.root, len(spares), freed
            )
        return freed

    # ------------------------------------------------------------------ reading

    def open_reader(self, path: Path) -> int:
        """A read-only descriptor of ``path``, held until :meth:`close_reader`.

        While it is held, retiring the file unlinks it instead of keeping it
        as a spare, so the descriptor keeps reading the same bytes.
        """
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        with self._lock:
            self._readers[path] = self._readers.get(path, 0) + 1
        return fd

    def close_reader(self, path: Path, fd: int) -> None:
        """Close a descriptor :meth:`open_reader` gave for ``path``."""
        os.close(fd)
        with self._lock:
            left = self._readers[path] - 1
            if left:
                self._readers[path] = left
            else:
                del self._readers[path]

    @staticmethod
    def read(path: Path, offset: int, length: int) -> bytes:
        """``length`` bytes of the file ``path`` from ``offset``."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            return pread_all(fd, offset, length)
        finally:
            os.close(fd)

    @staticmethod
    def patched(path: Path | None, length: int, offset: int, data: memoryview) -> bytearray:
        """The ``length`` bytes of ``path`` with ``data`` written at ``offset`` (gap zero-filled).

        Only the bytes that survive the write are read; ``path`` may be None
        when ``length`` is 0.
        """
        end = offset + len(data)
        content = bytearray(max(length, end))
        mv = memoryview(content)
        if length and (offset > 0 or end < length):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                if offset:
                    pread_into(fd, mv[: min(offset, length)], 0)
                if end < length:
                    pread_into(fd, mv[end:length], end)
            finally:
                os.close(fd)
        mv[offset:end] = data
        return content


__all__ = ["DEFAULT_SPARE_BYTES", "MAX_SPARES", "ChunkFiles", "pread_all", "pread_into"]
