"""The chunk engine of one storage target: the operations on its chunks.

:class:`ChunkStore` is what the storage server calls to read a chunk's
committed version, stage, commit or abort a pending one, install a resync copy,
and remove or list chunks. It keeps the record of every chunk (versions,
lengths, CRC32C of every block, the file of each version) in
:class:`~emberfs.storageserver.chunkrecords.ChunkRecords`, a RocksDB under
``root/meta``, and the content in files named from integers only, which
:class:`~emberfs.storageserver.chunkfiles.ChunkFiles` writes under
``root/chunks`` and keeps as spares under ``root/spare``.

Every change is copy-on-write: a new version is written to a new file first,
then the metadata record is switched to it, then the file it replaced is
retired. Metadata therefore never points at a missing or half-written file,
and a reader holding the old file (:meth:`ChunkStore.committed_file`) keeps
reading the old version after a newer one commits.

A chunk holds at most one committed and one pending version (CRAQ): a write is
staged as pending (:meth:`ChunkStore.stage`), then committed or aborted once
the chain has answered. Reopening a store drops pending versions and deletes
files that no record refers to (spares are kept), so after ``kill -9`` at any
point a chunk reads back as its last committed version.

Space: :meth:`ChunkStore.admit_write` says whether the version a write would
stage fits in the file system, leaving its reserve free
(:class:`~emberfs.storageserver.space.SpaceGuard`); a stage or copy that
fails with ENOSPC anyway makes the target full, and leaves neither a file nor
a record behind.

Durability: by default files are written without ``fsync`` and the RocksDB WAL
is written but not synced. A killed process then loses nothing (the operating
system already holds every acknowledged write); a power loss may. With
``fsync=True`` each chunk file (and its directory entry) is fsynced before the
metadata refers to it and every metadata write syncs the WAL, which survives
power loss at the cost of a few milliseconds per change.

Callers order the updates of one chunk (the data server holds a per-chunk lock);
the store itself is safe to call from many threads: metadata read-modify-write
runs under one lock, file I/O outside it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from emberfs.common import framing
from emberfs.common.layout import MAX_CHUNK_SIZE
from emberfs.storageserver.chunkcontent import cut_content, written_content
from emberfs.storageserver.chunkfiles import DEFAULT_SPARE_BYTES, ChunkFiles, pread_all
from emberfs.storageserver.chunkrecords import (
    ChunkMeta,
    ChunkRecord,
    ChunkRecords,
    VersionConflict,
    check_chunk,
    check_version,
)
from emberfs.storageserver.space import DEFAULT_RESERVE_BYTES, SpaceGuard


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
        (see :mod:`~emberfs.storageserver.chunkfiles`); the store turns it off
        by itself on the first refusal.
    direct_min : int, optional
        Chunk files smaller than this are written through the page cache
        (default :data:`~emberfs.storageserver.chunkfiles.DIRECT_MIN`).
    spare_bytes : int, default DEFAULT_SPARE_BYTES
        Bytes of retired chunk files kept to be written over by new versions
        (see :mod:`~emberfs.storageserver.chunkfiles`); 0 unlinks every
        retired file.
    reserve_bytes : int, default DEFAULT_RESERVE_BYTES
        Bytes of the file system that new versions leave free (see
        :mod:`~emberfs.storageserver.space`).

    Attributes
    ----------
    space : SpaceGuard
        The file system's free space: :meth:`admit_write` asks it, and a
        stage or copy that fails with ENOSPC makes the target full.
    """

    def __init__(
        self,
        root: Path,
        *,
        block_size: int = framing.DEFAULT_BLOCK,
        fsync: bool = False,
        direct_io: bool = True,
        direct_min: int | None = None,
        spare_bytes: int = DEFAULT_SPARE_BYTES,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ):
        if not framing.MIN_BLOCK <= block_size <= framing.MAX_DATA:
            raise ValueError(f"block size {block_size} is out of range")
        self.root = Path(root)
        self.block_size = block_size
        self.files = ChunkFiles(
            self.root,
            fsync=fsync,
            direct_io=direct_io,
            direct_min=direct_min,
            spare_bytes=spare_bytes,
        )
        self.records = ChunkRecords(self.root, block_size, sync=fsync)
        self._lock = threading.Lock()
        self._closed = False
        self.repaired = 0  # damaged committed chunks a whole copy replaced since the store opened
        try:
            self._count = self.records.recover(self.files)
            self.space = SpaceGuard(
                self.root, reserve=reserve_bytes, release=self.files.drop_spares
            )
        except BaseException:
            self.records.close()
            raise

    @property
    def fsync(self) -> bool:
        """Whether chunk files are fsynced and the metadata WAL synced before a change returns."""
        return self.files.fsync

    @property
    def direct_io(self) -> bool:
        """Whether chunk files are written with ``O_DIRECT`` (turned off on the first refusal)."""
        return self.files.direct_io

    @property
    def spare_bytes(self) -> int:
        """Bytes of retired chunk files kept as spares at most."""
        return self.files.spare_bytes

    # ------------------------------------------------------------------ reads

    def meta(self, inode: int, index: int) -> ChunkMeta | None:
        """The chunk's metadata, or None when the target has no such chunk."""
        check_chunk(inode, index)
        rec = self.records.get(inode, index)
        return None if rec is None else rec.meta(inode, index)

    @contextlib.contextmanager
    def committed_file(self, inode: int, index: int) -> Iterator[tuple[int, ChunkMeta]]:
        """A read-only descriptor of the committed version's file, and its metadata.

        The descriptor is closed when the block ends. Until then it keeps
        reading the same version even if a newer one commits meanwhile: the
        file it holds is unlinked, never kept as a spare to be written over.

        Raises
        ------
        KeyError
            The chunk has no committed version on this target, or it is
            damaged (its file was lost: :meth:`ChunkRecords.recover`).
        """
        check_chunk(inode, index)
        with self._lock:
            rec = self.records.get(inode, index)
            if rec is None or not rec.c_version or rec.damaged:
                raise KeyError((inode, index))
            path = self.files.path(inode, index, rec.c_version, rec.c_fid)
            fd = self.files.open_reader(path)
        try:
            yield fd, rec.meta(inode, index)
        finally:
            self.files.close_reader(path, fd)

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
            return pread_all(fd, offset, end - offset), meta

    # ------------------------------------------------------------------ updates

    def admit_write(
        self, inode: int, index: int, offset: int, length: int, *, full_chunk: bool = False
    ) -> bool:
        """Whether the file system has room for the version that :meth:`stage` would write.

        That version holds the whole new content: ``length`` bytes when
        ``full_chunk``, else the committed content with ``length`` bytes at
        ``offset``. False when the target is full (:attr:`space`).
        """
        check_chunk(inode, index)
        size = length
        if not full_chunk:
            rec = self.records.get(inode, index)
            old = rec.c_len if rec is not None and rec.c_version else 0
            size = max(old, offset + length)
        return self.space.admit(size)

    def _new_version(self, inode: int, index: int, version: int, content, switch):
        """Write ``content`` as a new file of ``version``, then let ``switch`` point a record at it.

        ``switch(record or None, file id)`` runs under the store's lock and
        returns ``(record to store or None, files it replaces, result)``; with
        None the new file is dropped. Returns the result.
        """
        with self.space.taking(len(content)):
            path, fid = self.files.write(inode, index, version, content)
        written = (path, len(content))
        garbage: list[tuple[Path, int]] = []
        try:
            with self._lock:
                old = self.records.get(inode, index)
                rec, replaced, result = switch(old, fid)
                if rec is None:
                    garbage.append(written)
                else:
                    with self.space.taking(len(content)):
                        self.records.put(inode, index, rec)
                    self._count += old is None
                    garbage.extend(replaced)
        except BaseException:
            self.files.retire([written])  # no record refers to it
            raise
        self.files.retire(garbage)
        return result

    def _stage_switch(self, inode, index, base_ref, pending, rec: ChunkRecord | None, fid: int):
        """Point ``rec`` at a new pending version, unless its committed one moved off ``base_ref``."""
        if ((rec.c_version, rec.c_fid) if rec else (0, 0)) != base_ref:
            return None, [], None  # committed meanwhile: build again
        rec = rec or ChunkRecord()
        replaced = [rec.pending_file(self.files, inode, index)] if rec.p_version else []
        rec.p_version, rec.p_fid = pending[0], fid
        rec.p_len, rec.p_sum, rec.p_crcs = pending[1:]
        return rec, replaced, rec.meta(inode, index)

    def _stage_new(self, inode: int, index: int, version: int, build) -> ChunkMeta:
        """Write a pending version whose content ``build(committed record)`` returns.

        ``build`` returns (content, block crcs, checksum). If the committed
        version changes while the new file is written, the build is redone.
        """
        for _ in range(16):
            base = self.records.get(inode, index)
            base_ref = (base.c_version, base.c_fid) if base else (0, 0)
            if base is not None and version <= base.c_version:
                raise VersionConflict(
                    f"chunk {inode}:{index}: version {version} is not newer than "
                    f"the committed version {base.c_version}"
                )
            content, crcs, checksum = build(base)
            pending = (version, len(content), checksum, crcs)
            switch = functools.partial(self._stage_switch, inode, index, base_ref, pending)
            meta = self._new_version(inode, index, version, content, switch)
            if meta is not None:
                return meta
        raise VersionConflict(f"chunk {inode}:{index}: committed version kept changing")

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
        check_chunk(inode, index)
        check_version(version)
        view = memoryview(data).cast("B")
        n = len(view)
        if not 0 < chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk size {chunk_size} is out of range")
        if offset < 0 or offset + n > chunk_size:
            raise ValueError(f"write [{offset}, {offset + n}) crosses the chunk size {chunk_size}")
        if full_chunk and offset:
            raise ValueError("a full-chunk write starts at offset 0")
        build = functools.partial(
            written_content,
            self.files,
            inode,
            index,
            offset=offset,
            view=view,
            block_size=self.block_size,
            full_chunk=full_chunk,
            crcs=crcs,
        )
        return self._stage_new(inode, index, version, build)

    def stage_truncate(self, inode: int, index: int, version: int, length: int) -> ChunkMeta:
        """Store ``version`` as pending: the committed content cut to ``length``.

        A ``length`` at or past the committed end keeps the content unchanged
        (bytes past a chunk's end read as zeros, so a cut never extends).
        Raises like :meth:`stage`.
        """
        check_chunk(inode, index)
        check_version(version)
        if not isinstance(length, int) or not 0 <= length <= MAX_CHUNK_SIZE:
            raise ValueError(f"length {length!r} is out of range")
        build = functools.partial(
            cut_content, self.files, inode, index, length=length, block_size=self.block_size
        )
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
        check_chunk(inode, index)
        check_version(version)
        with self._lock:
            rec = self.records.get(inode, index)
            if rec is None or rec.p_version != version:
                if rec is not None and rec.c_version == version and not rec.p_version:
                    return rec.meta(inode, index)
                pending = rec.p_version if rec else 0
                raise VersionConflict(
                    f"chunk {inode}:{index}: version {version} is not pending (pending {pending})"
                )
            garbage = []
            if rec.c_version:
                garbage.append(rec.committed_file(self.files, inode, index))
            rec.c_version, rec.c_fid, rec.c_len = rec.p_version, rec.p_fid, rec.p_len
            rec.c_sum, rec.c_crcs = rec.p_sum, rec.p_crcs
            self.repaired += rec.damaged
            rec.damaged = False  # whole content again (a damaged chunk stages only whole ones)
            rec.drop_pending()
            self.records.put(inode, index, rec)
            meta = rec.meta(inode, index)
        self.files.retire(garbage)
        return meta

    def abort(self, inode: int, index: int, version: int) -> None:
        """Drop pending ``version`` (nothing happens when it is not pending)."""
        check_chunk(inode, index)
        check_version(version)
        with self._lock:
            rec = self.records.get(inode, index)
            if rec is None or rec.p_version != version:
                return
            garbage = [rec.pending_file(self.files, inode, index)]
            rec.drop_pending()
            if rec.c_version:
                self.records.put(inode, index, rec)
            else:
                self.records.delete(inode, index)
                self._count -= 1
        self.files.retire(garbage)

    def install(self, inode: int, index: int, version: int, data, *, replace: bool = False) -> bool:
        """Make ``data`` the committed content at ``version`` (a resync copy).

        Applies when ``version`` is newer than the local committed version, or
        equal to it with other content (a resync source is a serving replica and
        so the authority on what a committed version holds; a replica can only
        disagree after a write it once committed was given up). With
        ``replace`` it applies whatever this replica holds: the source found it
        ahead (a version its predecessor gave up) while holding the chunk. A
        pending version not newer than ``version`` is dropped, a newer one kept.

        Returns
        -------
        bool
            Whether the copy was applied.
        """
        check_chunk(inode, index)
        check_version(version)
        view = memoryview(data).cast("B")
        if len(view) > MAX_CHUNK_SIZE:
            raise ValueError(f"{len(view)} bytes exceed the largest chunk size")
        crcs = framing.block_crcs(view, self.block_size)
        checksum = framing.combine_crcs(crcs, self.block_size, len(view))

        def stale(rec: ChunkRecord | None) -> bool:
            if rec is not None and rec.damaged:
                return False  # a whole copy is what it waits for
            if replace:
                return rec is not None and (rec.c_version, rec.c_len, rec.c_sum) == (
                    version,
                    len(view),
                    checksum,
                )
            if rec is None or rec.c_version < version:
                return False
            return rec.c_version > version or (rec.c_len, rec.c_sum) == (len(view), checksum)

        if stale(self.records.get(inode, index)):
            return False

        def switch(rec: ChunkRecord | None, fid: int):
            if stale(rec):
                return None, [], False
            rec = rec or ChunkRecord()
            replaced = [rec.committed_file(self.files, inode, index)] if rec.c_version else []
            if rec.p_version and (replace or rec.p_version <= version):
                replaced.append(rec.pending_file(self.files, inode, index))
                rec.drop_pending()
            rec.c_version, rec.c_fid, rec.c_len = version, fid, len(view)
            self.repaired += rec.damaged
            rec.c_sum, rec.c_crcs, rec.damaged = checksum, crcs, False
            return rec, replaced, True

        return self._new_version(inode, index, version, view, switch)

    def mark_damaged(self, inode: int, index: int, version: int) -> bool:
        """Mark the committed ``version`` damaged (its file failed a check); whether it was marked.

        As after a crash that lost the file: reads answer NOT_FOUND, and only a
        whole copy (a resync) makes it whole again. A chunk at another version
        by now is left alone.
        """
        check_chunk(inode, index)
        with self._lock:
            rec = self.records.get(inode, index)
            if rec is None or rec.c_version != version or rec.damaged:
                return False
            rec.damaged = True
            self.records.put(inode, index, rec)
            return True

    def remove(self, inode: int, index: int, version: int | None = None) -> bool:
        """Remove a chunk (every version); returns whether it was removed.

        With ``version`` only while that is still its committed version and no
        other is pending (a chunk written since it was looked at stays).
        """
        check_chunk(inode, index)
        with self._lock:
            rec = self.records.get(inode, index)
            if rec is None:
                return False
            if version is not None and (rec.c_version != version or rec.p_version):
                return False
            self.records.delete(inode, index)
            self._count -= 1
        garbage = []
        if rec.c_version:
            garbage.append(rec.committed_file(self.files, inode, index))
        if rec.p_version:
            garbage.append(rec.pending_file(self.files, inode, index))
        self.files.retire(garbage)
        return True

    def remove_inode(
        self,
        inode: int,
        indices: Iterable[int] | None = None,
        versions: Iterable[int] | None = None,
    ) -> int:
        """Remove the given chunks of ``inode`` (all of them when ``indices`` is None).

        ``versions``, one per index, removes each chunk only while it is still
        at that committed version (see :meth:`remove`). Returns the number of
        chunks removed.
        """
        check_chunk(inode, 0)
        if indices is None:
            wanted = [m.index for m in self.records.scan(inode, None, None)]
        else:
            wanted = list(indices)
            for index in wanted:
                check_chunk(inode, index)
        expected = list(versions) if versions is not None else [None] * len(wanted)
        if len(expected) != len(wanted):
            raise ValueError("versions must name one version per index")
        removed = sum(
            1
            for index, version in zip(wanted, expected, strict=True)
            if self.remove(inode, index, version)
        )
        if indices is None:
            self.files.remove_inode_dir(inode)
        return removed

    # ------------------------------------------------------------------ listing

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
        if inode != 0:
            check_chunk(inode, 0)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if after is not None:
            check_chunk(*after)
        return list(self.records.scan(inode, after, limit))

    def stats(self) -> dict:
        """``capacity`` (of the file system), ``used`` (by chunk files), ``chunks``, ``spare``
        (bytes of spares, not counted as used: new chunks write over them first) and ``full``
        (the target refuses writes for lack of space; :meth:`SpaceGuard.check` looks again)."""
        st = os.statvfs(self.root)
        full = self.space.check()
        with self._lock:
            used, spare = self.files.usage()
            return {
                "capacity": st.f_blocks * st.f_frsize,
                "used": used,
                "chunks": self._count,
                "spare": spare,
                "full": full,
            }

    def close(self) -> None:
        """Close the metadata database (the store is unusable afterwards)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.records.close()

    def __enter__(self) -> ChunkStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["ChunkMeta", "ChunkStore", "VersionConflict"]
