"""One entry of a disk cache: its file's format, its checks, and its I/O past the page cache.

An entry file holds one whole chunk: its bytes, then a CRC32C of every
:data:`BLOCK` bytes (little-endian u32 each), zeros up to a multiple of
:data:`ALIGN` bytes less the footer, and :data:`FOOTER` (a magic, the block
size, the data's length and the CRC32C of the CRC table) last. A read checks
the footer, the file's size and the CRC of every block it returns.

Entries are written and read with direct I/O (``O_DIRECT``) where the file
system has it: the bytes move between the disk and an aligned buffer of the
process without a copy through the page cache, which costs a CPU as much as
the transfer itself, so the fills of a first epoch take little CPU from the
reads, and the reads of a dataset larger than memory move at the disk's
speed; the entries take no room in the page cache, which stays the job's. A
file system without direct I/O (tmpfs) gets buffered I/O. Reads of a small
part of an entry read just the blocks they need (buffered).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import threading
import time

import crc32c

from emberfs.client.cachestate import PerProcess

BLOCK = 64 * 1024  # bytes per CRC32C
FOOTER = struct.Struct("<4sIQI")  # magic, block size, data length, CRC32C of the CRC table
MAGIC = b"EMBC"
ALIGN = 4096  # direct I/O's alignment of offsets, lengths and buffers
_U32 = struct.Struct("<I")
_NOT_DIRECT = (errno.EINVAL, errno.EOPNOTSUPP)


def table_size(length: int) -> int:
    """Bytes of the CRC table of an entry of ``length`` data bytes."""
    return 4 * -(-length // BLOCK)


def entry_size(length: int) -> int:
    """Bytes of the file of an entry of ``length`` data bytes (a multiple of :data:`ALIGN`)."""
    return -(-(length + table_size(length) + FOOTER.size) // ALIGN) * ALIGN


padded = entry_size  # the size of an entry's buffers: its file, written and read whole


def new_buffer(length: int) -> mmap.mmap:
    """An aligned buffer, private to this process, for an entry of ``length`` data bytes."""
    return mmap.mmap(-1, padded(length), flags=mmap.MAP_PRIVATE)


class _Spares:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: dict[int, list[mmap.mmap]] = {}
        self.kept = 0


class AlignedPool:
    """Buffers of :func:`new_buffer` that this process reuses by size, ``keep`` bytes at most."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._spares = PerProcess(_Spares)

    def get(self, length: int) -> mmap.mmap:
        """A buffer for an entry of ``length`` bytes (old content)."""
        size = padded(length)
        spares = self._spares.get()
        with spares.lock:
            free = spares.free.get(size)
            if free:
                spares.kept -= size
                return free.pop()
        return new_buffer(length)

    def put(self, buf: mmap.mmap) -> None:
        """Take back a buffer nobody reads or writes any more."""
        spares = self._spares.get()
        with spares.lock:
            if spares.kept + len(buf) <= self.keep:
                spares.free.setdefault(len(buf), []).append(buf)
                spares.kept += len(buf)


class _Scratch(threading.local):
    buf: mmap.mmap | None = None

    def get(self, length: int) -> mmap.mmap:
        """This thread's aligned buffer, large enough for an entry of ``length`` bytes."""
        if self.buf is None or len(self.buf) < padded(length):
            self.buf = new_buffer(length)
        return self.buf


_scratch = _Scratch()


def _crc_table(view: memoryview) -> bytes:
    return b"".join(
        _U32.pack(crc32c.crc32c(view[i : i + BLOCK])) for i in range(0, len(view), BLOCK)
    )


def write_entry(path: str, data, length: int, crcs: tuple | None = None) -> None:
    """Write the entry of ``data``'s first ``length`` bytes as the new file ``path``.

    ``data`` from :func:`new_buffer` is written in place; anything else is
    copied into an aligned buffer first. ``crcs``, ``(CRC32Cs, block size)``
    of the data known already, saves computing them when the blocks are
    :data:`BLOCK` bytes. Raises the OSError of a failure (a full disk);
    ``path`` may then be left behind, part written.
    """
    if not (isinstance(data, mmap.mmap) and len(data) >= padded(length)):
        buf = _scratch.get(length)
        buf[:length] = memoryview(data).cast("B")[:length]
        data = buf
    view = memoryview(data)
    if crcs is not None and crcs[1] == BLOCK and len(crcs[0]) * 4 == table_size(length):
        table = struct.pack(f"<{len(crcs[0])}I", *crcs[0])
    else:
        table = _crc_table(view[:length])
    total = entry_size(length)
    end = length + len(table)
    view[length:end] = table
    view[end : total - FOOTER.size] = bytes(total - FOOTER.size - end)
    view[total - FOOTER.size : total] = FOOTER.pack(MAGIC, BLOCK, length, crc32c.crc32c(table))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_DIRECT, 0o644)
    except OSError as exc:
        if exc.errno not in _NOT_DIRECT:
            raise
        fd = os.open(path, flags, 0o644)
    try:
        try:
            _write_all(fd, view[:total])
        except OSError as exc:  # direct I/O refused after all: write through the page cache
            if exc.errno not in _NOT_DIRECT:
                raise
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            os.ftruncate(fd, 0)
            _write_all(fd, view[:total], 0)
    finally:
        os.close(fd)


def read_entry(path: str, length: int, offset: int, view: memoryview, touch_ns: int) -> bool:
    """Fill ``view`` with the entry's data bytes at ``offset``; False when the entry is bad.

    Raises FileNotFoundError when there is no entry. An entry found good whose
    mtime is older than ``touch_ns`` nanoseconds gets a new one (LRU).
    """

    def read(fd: int) -> bool:
        if 2 * len(view) < length:
            return _read_blocks(fd, length, offset, view)
        buf = memoryview(_scratch.get(length))
        if not _read_whole(fd, length, buf):
            return False
        view[:] = buf[offset : offset + len(view)]
        return True

    return _with_entry(path, length, touch_ns, read)


def read_whole(path: str, length: int, buf, touch_ns: int) -> bool:
    """Read the whole entry into ``buf`` (from :func:`new_buffer`: no copy); as :func:`read_entry`."""
    return _with_entry(path, length, touch_ns, lambda fd: _read_whole(fd, length, memoryview(buf)))


def _with_entry(path: str, length: int, touch_ns: int, read) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_size != entry_size(length):
            return False
        ok = read(fd)
        if ok and time.time_ns() - st.st_mtime_ns > touch_ns:
            try:
                os.utime(fd)
            except OSError:
                pass
        return ok
    finally:
        os.close(fd)


def _check(table, footer, length: int) -> bytes | None:
    """The CRC table of an entry of ``length`` bytes whose table and footer are good, else None."""
    magic, block, stored, table_crc = FOOTER.unpack(footer)
    table = bytes(table)
    if (magic, block, stored) != (MAGIC, BLOCK, length) or crc32c.crc32c(table) != table_crc:
        return None
    return table


def _blocks_good(table: bytes, data: memoryview, first: int) -> bool:
    """Whether ``data``, the entry's bytes from block ``first`` on, matches its CRCs."""
    for i in range(0, len(data), BLOCK):
        if (
            crc32c.crc32c(data[i : i + BLOCK])
            != _U32.unpack_from(table, 4 * (first + i // BLOCK))[0]
        ):
            return False
    return True


def _read_whole(fd: int, length: int, buf: memoryview) -> bool:
    """Read the whole entry into the aligned ``buf`` (direct I/O where it can) and check it."""
    total = entry_size(length)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
        got = _read_all(fd, buf[:total], 0)
    except OSError as exc:
        if exc.errno not in _NOT_DIRECT:
            raise
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        got = _read_all(fd, buf[:total], 0)
    if got < total:
        return False
    table = _check(
        buf[length : length + table_size(length)], buf[total - FOOTER.size : total], length
    )
    return table is not None and _blocks_good(table, buf[:length], 0)


def _read_blocks(fd: int, length: int, offset: int, view: memoryview) -> bool:
    """Read the blocks holding ``view``'s bytes, the table and footer (buffered), check, copy."""
    total = entry_size(length)
    table = _check(
        os.pread(fd, table_size(length), length),
        os.pread(fd, FOOTER.size, total - FOOTER.size),
        length,
    )
    if table is None:
        return False
    lo = offset - offset % BLOCK
    hi = min(length, -(-(offset + len(view)) // BLOCK) * BLOCK)
    buf = memoryview(bytearray(hi - lo))
    if _read_all(fd, buf, lo) < len(buf) or not _blocks_good(table, buf, lo // BLOCK):
        return False
    view[:] = buf[offset - lo : offset - lo + len(view)]
    return True


def _read_all(fd: int, buf: memoryview, offset: int) -> int:
    """Read into ``buf`` from ``offset`` until it is full or the file ends; the bytes read."""
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        if n <= 0:
            break
        got += n
    return got


def _write_all(fd: int, view: memoryview, offset: int = 0) -> None:
    while len(view):
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
