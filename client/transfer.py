"""Moving many files at once: reading, writing, downloading, uploading and copying them together.

fsspec moves files one after the other; EmberFS opens many with one
metaserver call and keeps every chunk of many files in flight at once.
:class:`BatchTransfer` does that for one filesystem:

* ``cat`` of many files and ``cat_ranges`` open every file with one
  ``BatchOpen`` per 1000 paths and fetch all their chunks in parallel;
* ``pipe`` of many files opens them with one ``BatchWriteOpen``, writes every
  chunk at once and ends every write session with one ``BatchClose``;
* ``get``, ``put`` and ``copy`` take the (source, destination) pairs that
  fsspec's path rules gave (:mod:`emberfs.client.plan`), make the
  directories first, move files of at most ``default_block_size`` bytes in
  groups (:func:`groups`: up to 1000 files and :data:`GROUP_BYTES`) as the
  calls above do, and stream larger files one after the other.

Every file is attempted; then the first failure in the caller's order is
raised. Callbacks report each file's bytes to its own branch, as fsspec's
loop over files does. The moves of one file (``get_file``, ``put_file``,
``cp_file``) stream it, remote reads received straight into one buffer
(:func:`stream_out`).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from emberfs.client.buffers import as_bytes
from emberfs.client.chunkio import wait_all
from emberfs.client.file import EmberFile
from emberfs.client.handles import OpenHandle, is_a_directory, stale_session
from emberfs.client.meta import BATCH_OPEN
from emberfs.client.paths import parent, strip_protocol
from emberfs.proto import common_pb2, meta_pb2

if TYPE_CHECKING:
    from emberfs.client.core import Client
    from emberfs.client.fs import EmberFileSystem

log = logging.getLogger(__name__)


class BatchTransfer:
    """The transfers of many files of one filesystem, each file's chunks in parallel.

    Parameters
    ----------
    client : Client
        Whose metaserver client, file I/O and write sessions it uses.
    fs : EmberFileSystem
        The filesystem it serves: files too large to move in groups are
        streamed through its ``open``; its ``auto_mkdir`` and
        ``default_block_size`` apply.
    """

    def __init__(self, client: Client, fs: EmberFileSystem) -> None:
        self.client = client
        self.fs = fs

    # reading many files ------------------------------------------------------------
    def _read_handles(self, paths: list[str]) -> dict[str, OpenHandle | OSError]:
        """Read-only handles of (stripped) ``paths``: each a handle, or the error of its open.

        All of them come from one ``BatchOpen`` round trip per
        :data:`~emberfs.client.meta.BATCH_OPEN` distinct paths.
        """
        unique = list(dict.fromkeys(paths))
        out: dict[str, OpenHandle | OSError] = {}
        for path, got in zip(unique, self.client.meta.batch_open(unique), strict=True):
            if isinstance(got, OSError):
                out[path] = got
            elif got.type == common_pb2.DIRECTORY:
                out[path] = is_a_directory(path)
            else:
                out[path] = OpenHandle.for_read(path, got)
        return out

    def cat(self, paths: list[str], start, end, on_error: str) -> dict:
        """``{path: bytes}`` of the (stripped) ``paths``, as ``EmberFileSystem.cat`` returns them."""
        n = len(paths)
        got_all = self._fetch_ranges(paths, [start] * n, [end] * n)
        out = {}
        for p, got in zip(paths, got_all, strict=True):
            if not isinstance(got, Exception):
                out[p] = got
            elif on_error == "raise":
                raise got
            elif on_error == "return":
                out[p] = got
        return out

    def cat_ranges(self, paths, starts, ends, on_error: str) -> list:
        """The byte ranges of ``EmberFileSystem.cat_ranges``, one start and end or one per path."""
        if not isinstance(starts, list):
            starts = [starts] * len(paths)
        if not isinstance(ends, list):
            ends = [ends] * len(paths)
        if len(starts) != len(paths) or len(ends) != len(paths):
            raise ValueError("paths, starts and ends must have the same length")
        stripped = [strip_protocol(p) for p in paths]
        return self._fetch_ranges(stripped, starts, ends, on_error)

    def _fetch_ranges(self, stripped: list[str], starts, ends, on_error="return") -> list:
        """``cat_ranges`` of paths already stripped, with one start and end per path."""
        handles = self._read_handles(stripped)
        if on_error != "return":
            for p in stripped:
                if isinstance(handles[p], OSError):
                    raise handles[p]  # before any read starts
        jobs = self.client.files.start_reads([handles[p] for p in stripped], starts, ends)
        out = []
        for err, buf, futures in jobs:
            if err is not None:
                out.append(err)
                continue
            try:
                wait_all(futures)
                out.append(as_bytes(buf))
            except Exception as exc:
                if on_error != "return":
                    raise
                out.append(exc)
        return out

    def _fetch_groups(self, small: list) -> Iterator[list]:
        """The whole contents of small files, in groups fetched all at once.

        ``small`` holds ``(i, handle)`` pairs; per group (:func:`groups`)
        this yields ``(i, ResultBuffer or OSError)`` for each of them.
        """
        for group in groups(small, lambda item: item[1].size):
            n = len(group)
            jobs = self.client.files.start_reads([h for _, h in group], [None] * n, [None] * n)
            out = []
            for (i, h), (_, buf, futures) in zip(group, jobs, strict=True):
                try:
                    wait_all(futures)
                    out.append((i, buf))
                except Exception as exc:
                    out.append((i, _as_oserror(exc, f"reading {h.path}")))
            yield out

    # writing many files ------------------------------------------------------------
    def pipe(self, values: dict, mode: str, **kwargs) -> None:
        """Write the files of ``{path: bytes}`` as ``EmberFileSystem.pipe`` does with a dict."""
        if not isinstance(values, dict):
            raise ValueError("path must be str or dict")
        # one write per file: of keys naming the same file the last wins, as in a loop
        items = {strip_protocol(k): v for k, v in values.items()}
        if len(items) <= 1:
            for k, v in items.items():
                self.fs.pipe_file(k, v, mode=mode, **kwargs)
            return
        failed = self.write_files(items, exclusive=mode == "create")
        for k in items:
            if k in failed:
                raise failed[k]

    def _write_handles(
        self, paths: list[str], flags: int, lengths: dict[str, int] | None = None
    ) -> dict[str, OpenHandle | OSError]:
        """Write opens of (stripped) ``paths`` with ``flags``: each a handle or its open's error.

        One ``BatchWriteOpen`` round trip per 1000 paths; with ``auto_mkdir``
        the missing parents of paths that failed with ENOENT are made, and
        those paths opened again in one more call. ``lengths`` (path -> bytes
        to be written) are reserved in the files' quotas at the open.
        """
        meta = self.client.meta
        got: dict[str, meta_pb2.OpenResponse | OSError] = dict(
            zip(paths, meta.batch_write_open(paths, flags, reserve=lengths), strict=True)
        )
        missing = [p for p, g in got.items() if isinstance(g, FileNotFoundError)]
        if missing and self.fs.auto_mkdir:
            retry = []
            made: dict[str, OSError | None] = {}
            for p in missing:
                up = parent(p)
                if up not in made:
                    try:
                        self.client.meta.mkdir(up, parents=True)
                        made[up] = None
                    except OSError as exc:
                        made[up] = exc
                if made[up] is None:
                    retry.append(p)
                else:
                    got[p] = made[up]  # what a single open would raise
            if retry:
                opened = meta.batch_write_open(retry, flags, reserve=lengths)
                got.update(zip(retry, opened, strict=True))
        return {
            p: g if isinstance(g, OSError) else OpenHandle.from_open(p, g) for p, g in got.items()
        }

    def write_files(self, items: dict, exclusive: bool = False) -> dict[str, OSError]:
        """Write whole files ``{stripped path: bytes-like}``, all at once; the failures by path.

        One ``BatchWriteOpen`` (per 1000), every chunk of every file at once
        (the chunks bound for one chain in write batches,
        :meth:`~emberfs.client.fileio.FileIO.submit_files`), then one
        ``BatchClose`` with the exact lengths. A file this call created whose
        writes or close failed is removed again (one ``BatchRemove``); an
        existing file whose writes failed keeps the length it was opened with,
        as :meth:`EmberFile.close <emberfs.client.file.EmberFile.close>` leaves
        it. Every file is attempted.
        """
        flags = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE
        flags |= meta_pb2.OPEN_EXCLUSIVE if exclusive else meta_pb2.OPEN_TRUNCATE
        datas = {p: v if isinstance(v, bytes) else bytes(v) for p, v in items.items()}
        handles = self._write_handles(list(datas), flags, {p: len(d) for p, d in datas.items()})
        failed: dict[str, BaseException] = {
            p: h for p, h in handles.items() if isinstance(h, OSError)
        }
        opened = {p: h for p, h in handles.items() if not isinstance(h, OSError)}
        sessions = self.client.sessions
        try:
            for h in opened.values():
                sessions.register(h)
            started = self.client.files.submit_files(
                [(h, memoryview(datas[p])) for p, h in opened.items()]
            )
            writes = dict(zip(opened, started, strict=True))
            closing = []
            for p, h in opened.items():
                try:
                    wait_all(writes[p])
                except BaseException as exc:
                    failed[p] = exc
                if h.expired:
                    failed.setdefault(p, stale_session(p))
                    continue
                closing.append((p, h))
            for _, h in closing:  # a renewal that races the close must not call it expired
                sessions.unregister(h)
            try:
                ended = sessions.close_many(
                    [(h.inode, h.session_id, len(datas[p]), p not in failed) for p, h in closing],
                    [p for p, _ in closing],
                )
            except Exception as exc:  # the whole call failed: every file of it did
                ended = [_for_path(exc, p) for p, _ in closing]
            for (p, h), got in zip(closing, ended, strict=True):
                if isinstance(got, OSError):
                    stale = got.errno == errno.EINVAL  # Close finds no such session
                    failed.setdefault(p, stale_session(p) if stale else got)
                else:
                    h.attr = got
        finally:
            for h in opened.values():
                sessions.unregister(h)
            self._take_back([h for p, h in opened.items() if h.created and p in failed])
        return {p: _as_oserror(error, f"writing {p}", p) for p, error in failed.items()}

    def _take_back(self, handles: list[OpenHandle]) -> None:
        """Remove the files this call created whose data or close failed: none stays half made.

        Each path goes only while it still names the file created (another
        writer's file that replaced it stays); a failure here leaves the file
        as a failed single write would (its error is the write's).
        """
        if not handles:
            return
        try:
            self.client.meta.batch_remove(
                [h.path for h in handles], inodes=[h.inode for h in handles], skip_trash=True
            )
        except OSError as exc:
            log.warning("could not remove %d files whose writes failed: %s", len(handles), exc)

    # moving files --------------------------------------------------------------------
    def get(self, pairs: list[tuple[str, str]], callback) -> None:
        """Download the ``(remote, local)`` pairs; ``callback`` counts them."""
        if not pairs:
            return
        callback.set_size(len(pairs))
        stripped = [strip_protocol(r) for r, _ in pairs]
        handles = self._read_handles(stripped)
        failed, small, big = self._split_sources(
            [handles[p] for p in stripped], lambda i: os.makedirs(pairs[i][1], exist_ok=True)
        )
        callback.relative_update(len(pairs) - len(small) - len(big))  # directories, failures
        for group in self._fetch_groups(small):
            for i, got in group:
                (r, local), size = pairs[i], handles[stripped[i]].size
                try:
                    if isinstance(got, OSError):
                        raise got
                    _write_local(local, got.view)
                    _moved(callback, r, local, size)
                except OSError as exc:
                    failed[i] = exc
                callback.relative_update(1)
        for i, h in big:
            r, local = pairs[i]
            try:  # through the handle opened above: no second open
                with (
                    callback.branched(r, local) as child,
                    EmberFile(self.fs, h.path, handle=h) as f1,
                ):
                    self.download(f1, local, callback=child)
            except Exception as exc:
                failed[i] = _as_oserror(exc, f"reading {stripped[i]}")
            callback.relative_update(1)
        if failed:
            raise failed[min(failed)]

    def copy(self, pairs: list[tuple[str, str]], on_error: str) -> None:
        """Copy the ``(source, destination)`` pairs within EmberFS.

        ``on_error="ignore"`` skips sources that are missing
        (FileNotFoundError); any other failure is raised.
        """
        sources = [strip_protocol(a) for a, _ in pairs]
        targets = [strip_protocol(b) for _, b in pairs]
        handles = self._read_handles(sources) if pairs else {}
        failed, small, big = self._split_sources(
            [handles[p] for p in sources], lambda i: self.fs.makedirs(targets[i], exist_ok=True)
        )
        for group in self._fetch_groups(small):
            values, index = {}, {}
            for i, got in group:
                if isinstance(got, OSError):
                    failed[i] = got
                else:
                    values[targets[i]] = as_bytes(got)
                    index[targets[i]] = i
            for dst, error in self.write_files(values).items():
                failed[index[dst]] = error
        for i, h in big:
            try:
                with (
                    EmberFile(self.fs, h.path, handle=h) as f1,
                    self.fs.open(targets[i], "wb") as f2,
                ):
                    self.copy_stream(f1, f2)
            except Exception as exc:
                failed[i] = _as_oserror(exc, f"copying {sources[i]} to {targets[i]}")
        for i in sorted(failed):
            if on_error == "raise" or not isinstance(failed[i], FileNotFoundError):
                raise failed[i]

    def put(self, pairs: list[tuple[str, str]], callback, mode: str) -> None:
        """Upload the ``(local, remote)`` pairs; ``mode="create"`` refuses existing files."""
        if not pairs:
            return
        callback.set_size(len(pairs))
        failed: dict[int, OSError] = {}
        small, big = [], []
        for i, (local, r) in enumerate(pairs):
            r = strip_protocol(r)
            try:
                if os.path.isdir(local):
                    self.fs.makedirs(r, exist_ok=True)
                else:
                    size = os.path.getsize(local)
                    (small if size <= self.fs.default_block_size else big).append(
                        (i, local, r, size)
                    )
                    continue
            except OSError as exc:
                failed[i] = exc
            callback.relative_update(1)
        for group in groups(small, lambda item: item[3]):
            values, index = {}, {}
            for i, local, r, _ in group:
                try:
                    with open(local, "rb") as f:
                        values[r] = f.read()
                    index[r] = i
                except OSError as exc:
                    failed[i] = exc
            for r, error in self.write_files(values, exclusive=mode == "create").items():
                failed[index[r]] = error
            for i, local, r, size in group:
                if i not in failed:
                    _moved(callback, local, r, size)
                callback.relative_update(1)
        for i, local, r, _ in big:
            try:
                with callback.branched(local, r) as child:
                    self.fs.put_file(local, r, callback=child, mode=mode)
            except Exception as exc:
                failed[i] = _as_oserror(exc, f"writing {r}", r)
            callback.relative_update(1)
        if failed:
            raise failed[min(failed)]

    def _split_sources(self, handles: list, make_dir) -> tuple[dict[int, OSError], list, list]:
        """Sort the opened sources of a ``get`` or ``copy`` by what moving each one takes.

        A directory's destination is made (``make_dir(i)``). Returns
        ``(failed, small, big)``: the failures by index, and ``(i, handle)``
        of the files of at most ``default_block_size`` bytes and of the larger ones.
        """
        failed: dict[int, OSError] = {}
        small, big = [], []
        for i, h in enumerate(handles):
            if isinstance(h, IsADirectoryError):
                try:
                    make_dir(i)
                except OSError as exc:
                    failed[i] = exc
            elif isinstance(h, OSError):
                failed[i] = h
            else:
                (small if h.size <= self.fs.default_block_size else big).append((i, h))
        return failed, small, big

    # one file ------------------------------------------------------------------------
    def copy_file(self, path1: str, path2: str) -> None:
        """Copy the file ``path1`` to ``path2`` by streaming (or make ``path2`` a directory)."""
        if self.fs.isdir(path1):
            self.fs.makedirs(path2, exist_ok=True)
            return
        with self.fs.open(path1, "rb") as f1, self.fs.open(path2, "wb") as f2:
            self.copy_stream(f1, f2)

    def put_file(self, lpath, rpath: str, callback=None, mode: str = "overwrite") -> None:
        """Upload the local ``lpath`` to ``rpath`` (or make the directory of a local one)."""
        if os.path.isdir(lpath):
            self.fs.makedirs(rpath, exist_ok=True)
            return
        with open(lpath, "rb") as f1:
            size = os.fstat(f1.fileno()).st_size
            with self.fs.open(rpath, "xb" if mode == "create" else "wb") as f2:
                self.copy_stream(f1, f2, callback, size)

    def get_file(self, rpath: str, lpath, callback=None, outfile=None) -> None:
        """Download ``rpath`` to the local ``lpath`` or into ``outfile`` (a directory: made)."""
        if outfile is None and self.fs.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        with self.fs.open(rpath, "rb") as f1:
            self.download(f1, lpath, callback, outfile)

    def download(self, f1: EmberFile, lpath, callback=None, outfile=None) -> None:
        """Copy the open remote file ``f1`` to the local ``lpath`` (or into ``outfile``)."""
        if callback is not None:
            callback.set_size(f1.size)
        close = outfile is None
        if close:
            outfile = _open_local(lpath)
        try:
            unit = min(max(f1.size, 1), max(self.fs.default_block_size, f1.blocksize))
            stream_out(f1, outfile, unit, callback)
        finally:
            if close:
                outfile.close()

    def copy_stream(self, f1, f2, callback=None, size: int | None = None) -> None:
        """Copy the open file ``f1`` into ``f2`` in units of at least ``default_block_size``."""
        size = getattr(f1, "size", None) if size is None else size
        if callback is not None and size is not None:
            callback.set_size(size)
        unit = max(self.fs.default_block_size, getattr(f1, "blocksize", 0) or 0)
        while True:
            data = f1.read(unit)
            if not data:
                break
            f2.write(data)
            if callback is not None:
                callback.relative_update(len(data))


#: ``get``, ``put`` and ``copy`` move small files in groups of at most this many bytes
GROUP_BYTES = 64 * 1024 * 1024


def groups(items: list, size_of) -> Iterator[list]:
    """``items`` in groups of at most :data:`BATCH_OPEN` items and :data:`GROUP_BYTES` bytes."""
    group: list = []
    total = 0
    for item in items:
        n = size_of(item)
        if group and (len(group) >= BATCH_OPEN or total + n > GROUP_BYTES):
            yield group
            group, total = [], 0
        group.append(item)
        total += n
    if group:
        yield group


def stream_out(f, out, unit: int, callback=None) -> None:
    """Write the rest of the open file ``f`` to ``out``, ``unit`` bytes at a time at most.

    Every piece is received with ``f.readinto`` into one buffer of ``unit``
    bytes (straight from the sockets where nothing is cached) and written
    from there; ``callback`` counts the bytes.
    """
    view = memoryview(bytearray(unit))
    while True:
        n = f.readinto(view)
        if not n:
            break
        out.write(view[:n])
        if callback is not None:
            callback.relative_update(n)


def _moved(callback, src, dst, nbytes: int) -> None:
    """Report a file moved in a group as fsspec's per-file loop would: its bytes to its branch."""
    with callback.branched(src, dst) as child:
        child.set_size(nbytes)
        child.relative_update(nbytes)


def _open_local(path):
    """The local file ``path`` opened for writing, its parent directories made first."""
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    return open(path, "wb")  # noqa: SIM115 - the caller closes it


def _write_local(path, data) -> None:
    """Write ``data`` as the local file ``path``, making its parent directories."""
    with _open_local(path) as f:
        f.write(data)


def _for_path(error: Exception, path: str) -> OSError:
    """A call's failure as the failure of one of its files (an OSError naming ``path``)."""
    if isinstance(error, OSError) and error.errno is not None:
        return type(error)(error.errno, error.strerror, path)
    wrapped = OSError(errno.EIO, f"closing failed: {error}", path)
    wrapped.__cause__ = error
    return wrapped


def _as_oserror(error: BaseException, doing: str, path: str | None = None) -> OSError:
    """``error`` itself when it is an OSError, else an EIO naming what failed.

    An OSError that names no file is given ``path`` as its file name.
    """
    if isinstance(error, OSError):
        if path is not None and error.filename is None:
            error.filename = path
        return error
    wrapped = OSError(errno.EIO, f"{doing} failed: {error}", path)
    wrapped.__cause__ = error
    return wrapped
