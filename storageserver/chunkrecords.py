"""The chunk records of one storage target: a RocksDB under ``root/meta``, and its recovery.

One record per chunk, keyed by (inode, index) as big-endian integers, so a
scan lists the chunks in id order. A record (:class:`ChunkRecord`) holds the
committed and the pending version of the chunk, each with its file id, length,
CRC32C of every ``block_size`` block and CRC32C of the whole content; the file
id and the version name the chunk file
(:meth:`~emberfs.storageserver.chunkfiles.ChunkFiles.path`). Inode 0 is never
a chunk: its key holds the store's settings (record format and block size),
checked when the store is opened.

Reopening (:meth:`ChunkRecords.recover`) drops pending versions, which no
chain acknowledged, and records whose committed file is missing or has
another size; then the chunk files no record refers to are deleted. After
``kill -9`` at any point a chunk so reads back as its last committed version.

Records are written with the WAL synced only when ``sync`` is set; callers
serialise the read-modify-write of one record
(:class:`~emberfs.storageserver.chunkstore.ChunkStore` holds a lock).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from emberfs.common import framing
from emberfs.storageserver.chunkfiles import ChunkFiles

log = logging.getLogger(__name__)

MAX_INODE = (1 << 64) - 1
MAX_INDEX = (1 << 32) - 1
MAX_VERSION = (1 << 64) - 1

_KEY = struct.Struct(">QI")
_CONFIG_KEY = b"\x00" * _KEY.size  # inode 0 is never a chunk: the store's own settings
_CONFIG = struct.Struct("<II")  # format, block size
_FORMAT = 1
_FORMAT_DAMAGED = 2  # the same layout; the committed version's file was lost (see recover)
_RECORD = struct.Struct("<BQQIIQQII")
_NO_SPACE = os.strerror(errno.ENOSPC)  # in the message of RocksDB's IOError


class VersionConflict(Exception):
    """The requested version does not fit the chunk's state.

    Raised when staging a version not newer than the committed one, or when
    committing a version that is not the pending one.
    """


def check_chunk(inode: int, index: int) -> None:
    """ValueError unless ``(inode, index)`` can name a chunk."""
    if not isinstance(inode, int) or not 1 <= inode <= MAX_INODE:
        raise ValueError(f"inode {inode!r} is outside 1..2^64-1")
    if not isinstance(index, int) or not 0 <= index <= MAX_INDEX:
        raise ValueError(f"chunk index {index!r} is outside 0..2^32-1")


def check_version(version: int) -> None:
    """ValueError unless ``version`` can number a chunk version."""
    if not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise ValueError(f"version {version!r} is outside 1..2^64-1")


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
    damaged: bool = False


@dataclass
class ChunkRecord:
    """The stored record of one chunk: committed (``c_``) and pending (``p_``) version.

    Each has a version (0: none), the file id, the length, the CRC32C of the
    whole content and of each block.
    """

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
    damaged: bool = False  # the committed version's file was lost: no content to serve

    def encode(self) -> bytes:
        head = _RECORD.pack(
            _FORMAT_DAMAGED if self.damaged else _FORMAT,
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
    def decode(cls, raw: bytes, block_size: int) -> ChunkRecord:
        fmt, cv, cf, cl, cs, pv, pf, pl, ps = _RECORD.unpack_from(raw)
        if fmt not in (_FORMAT, _FORMAT_DAMAGED):
            raise ValueError(f"unknown chunk record format {fmt}")
        nc = framing.n_blocks(cl, block_size)
        np_ = framing.n_blocks(pl, block_size)
        crcs = list(struct.unpack_from(f"<{nc + np_}I", raw, _RECORD.size))
        return cls(cv, cf, cl, cs, pv, pf, pl, ps, crcs[:nc], crcs[nc:], fmt == _FORMAT_DAMAGED)

    def drop_pending(self) -> None:
        self.p_version = self.p_fid = self.p_len = self.p_sum = 0
        self.p_crcs = []

    def committed_file(self, files: ChunkFiles, inode: int, index: int) -> tuple[Path, int]:
        """The file of the committed version of chunk ``(inode, index)``, and its length."""
        return files.path(inode, index, self.c_version, self.c_fid), self.c_len

    def pending_file(self, files: ChunkFiles, inode: int, index: int) -> tuple[Path, int]:
        """The file of the pending version of chunk ``(inode, index)``, and its length."""
        return files.path(inode, index, self.p_version, self.p_fid), self.p_len

    def meta(self, inode: int, index: int) -> ChunkMeta:
        """What the record says of chunk ``(inode, index)``."""
        return ChunkMeta(
            inode=inode,
            index=index,
            version=self.c_version,
            pending_version=self.p_version,
            length=self.c_len,
            crcs=list(self.c_crcs),
            checksum=self.c_sum,
            pending_length=self.p_len,
            pending_checksum=self.p_sum,
            damaged=self.damaged,
        )


class ChunkRecords:
    """The RocksDB of chunk records under ``root/meta``, opened (and created if missing).

    Parameters
    ----------
    root : Path
        The target's directory.
    block_size : int
        Bytes per stored CRC32C; a store created with another one is refused
        with ``ValueError``.
    sync : bool, default False
        Sync the WAL on every write.
    """

    def __init__(self, root: Path, block_size: int, *, sync: bool = False):
        from rocksdict import Options, Rdict, WriteOptions

        self.root = Path(root)
        self.block_size = block_size
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.db = Rdict(str(self.root / "meta"), opts)
        self._wopts = WriteOptions()
        self._wopts.sync = sync
        try:
            self._check_config()
        except BaseException:
            self.db.close()
            raise

    def _check_config(self) -> None:
        raw = self.db.get(_CONFIG_KEY)
        if raw is None:
            self.db.put(_CONFIG_KEY, _CONFIG.pack(_FORMAT, self.block_size), self._wopts)
            return
        fmt, block_size = _CONFIG.unpack(raw)
        if fmt != _FORMAT:
            raise ValueError(f"{self.root}: unknown chunk store format {fmt}")
        if block_size != self.block_size:
            raise ValueError(
                f"{self.root}: created with block size {block_size}, opened with {self.block_size}"
            )

    def recover(self, files: ChunkFiles) -> int:
        """Drop pending versions, and mark damaged the records whose file is missing or wrong.

        A committed version whose file did not reach the disk whole (a power
        loss without ``fsync``) keeps its record, marked damaged: the chunk
        existed, so it is neither read as a hole here nor removed from the
        other replicas by a resync; reads and updates of it are refused until
        a whole copy replaces it. Then ``files`` takes up what a previous run
        left: the chunk files no record refers to go. Returns the number of
        records kept.
        """
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        changes = 0
        count = 0
        referenced: dict[Path, int] = {}
        max_fid = 0
        it = self.db.iter()
        it.seek(_KEY.pack(1, 0))
        while it.valid():
            key, raw = it.key(), it.value()
            it.next()
            inode, index = _KEY.unpack(key)
            rec = ChunkRecord.decode(raw, self.block_size)
            max_fid = max(max_fid, rec.c_fid, rec.p_fid)
            dirty = False
            if rec.p_version:
                rec.drop_pending()
                dirty = True
            if rec.c_version and not rec.damaged:
                path = files.path(inode, index, rec.c_version, rec.c_fid)
                size = files.size(path)
                if size != rec.c_len:
                    log.error(
                        "%s: chunk %d:%d version %d: file %s (size %d, expected %d); "
                        "marked damaged",
                        self.root,
                        inode,
                        index,
                        rec.c_version,
                        "missing" if size < 0 else "wrong size",
                        size,
                        rec.c_len,
                    )
                    rec.damaged = True
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
            count += 1
        if changes:
            self.db.write(batch, self._wopts)
        files.recover(referenced, max_fid)
        return count

    def get(self, inode: int, index: int) -> ChunkRecord | None:
        """The record of chunk ``(inode, index)``, or None."""
        raw = self.db.get(_KEY.pack(inode, index))
        return None if raw is None else ChunkRecord.decode(raw, self.block_size)

    def put(self, inode: int, index: int, rec: ChunkRecord) -> None:
        """Store the record of chunk ``(inode, index)``."""
        with self._no_space():
            self.db.put(_KEY.pack(inode, index), rec.encode(), self._wopts)

    def delete(self, inode: int, index: int) -> None:
        """Delete the record of chunk ``(inode, index)``."""
        with self._no_space():
            self.db.delete(_KEY.pack(inode, index), self._wopts)

    @contextlib.contextmanager
    def _no_space(self) -> Iterator[None]:
        """RocksDB's "no space left" error raised as ``OSError(ENOSPC)``.

        RocksDB then refuses every later change ("Writer has previous
        error") until the database is reopened (the storage server restarts).
        """
        try:
            yield
        except OSError:
            raise
        except Exception as exc:
            if _NO_SPACE not in str(exc):
                raise
            raise OSError(errno.ENOSPC, f"{self.root}: chunk records: {exc}") from exc

    def scan(
        self, inode: int, after: tuple[int, int] | None, limit: int | None
    ) -> Iterator[ChunkMeta]:
        """Up to ``limit`` chunks of ``inode`` (0: of every inode) in id order, after ``after``."""
        start = _KEY.pack(max(inode, 1), 0)
        if after is not None:
            start = max(start, _KEY.pack(*after) + b"\x00")
        it = self.db.iter()
        it.seek(start)
        n = 0
        while it.valid() and (limit is None or n < limit):
            ino, index = _KEY.unpack(it.key())
            if inode and ino != inode:
                break
            yield ChunkRecord.decode(it.value(), self.block_size).meta(ino, index)
            n += 1
            it.next()

    def close(self) -> None:
        """Close the database."""
        self.db.close()


__all__ = ["ChunkMeta", "ChunkRecord", "ChunkRecords"]
