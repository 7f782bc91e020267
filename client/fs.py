"""``EmberFileSystem``: EmberFS as an fsspec filesystem (``emberfs://`` and ``ember://``).

URLs are ``emberfs://HOST:PORT/path`` (the metaserver's address) or
``emberfs:///path`` with the metaserver taken from ``EMBERFS_META`` (default
``127.0.0.1:9400``). Namespace operations are single metaserver calls; file
data moves over the framed data protocol (:mod:`emberfs.client.datapath`).

One instance can be shared by threads. After ``os.fork`` (PyTorch DataLoader
workers) the child notices the new process id and lazily builds its own gRPC
channel, data connections and thread pool; the parent's are never touched.
"""

from __future__ import annotations

import datetime
import errno
import os
import re
import threading
from collections.abc import Iterator

from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.spec import AbstractFileSystem
from fsspec.utils import stringify_path, tokenize

from emberfs.client.buffers import as_bytes
from emberfs.client.chunkio import ChunkIO, wait_all
from emberfs.client.file import EmberFile
from emberfs.client.handles import (
    OpenHandle,
    WriteSessions,
    attr_info,
    is_a_directory,
    stale_session,
)
from emberfs.client.memory import keep_freed_memory
from emberfs.client.meta import BATCH_OPEN, MetaClient
from emberfs.client.runtime import ProcessRuntime, Runtime
from emberfs.common.layout import chunk_spans
from emberfs.proto import common_pb2, meta_pb2

DEFAULT_META = "127.0.0.1:9400"
_PROTOCOLS = ("emberfs", "ember")
_URL = re.compile(r"^(?:emberfs|ember)://")
_MAGIC = re.compile(r"[*?\[]")


def default_meta() -> str:
    """The metaserver address from ``EMBERFS_META`` (or 127.0.0.1:9400)."""
    return os.environ.get("EMBERFS_META") or DEFAULT_META


class EmberFileSystem(AbstractFileSystem):
    """EmberFS through fsspec.

    Parameters
    ----------
    meta : str or None
        ``host:port`` of the metaserver; None reads ``EMBERFS_META``
        (default ``127.0.0.1:9400``). A URL's host:port sets it.
    readahead_depth : int, default 8
        Chunks fetched ahead of a sequential reader.
    write_depth : int, default 8
        Chunk writes in flight per open file.
    max_workers : int, default 16
        Threads of the data-path pool (parallel chunk reads and writes).
    max_connections : int, default 8
        Connections to one storage server at most.
    default_block_size : int, default 4 MiB
        Buffer size of copies; files use their own chunk size for readahead.
    connect_timeout, io_timeout : float, default 5.0, 30.0
        Data connections: connect and per-operation socket timeouts (seconds).
    rpc_timeout : float, default 30.0
        Deadline of each metaserver call.
    retry_timeout : float, default 30.0
        How long metaserver calls are retried while it is unavailable.
    read_timeout, write_timeout : float, default 60.0
        How long a chunk read or write keeps retrying replicas while chains
        are reconfigured.
    stall_check : float, default 1.0
        Seconds a data transfer waits on a storage server before the client
        asks the metaserver whether that server is still up. One that the
        cluster has declared offline (a hung or unreachable host) is left for
        another replica at once instead of after ``io_timeout``.
    auto_mkdir : bool, default True
        Create missing parent directories when a file is written.
    list_page : int, default 2000
        Entries per ``List`` call.
    session_renew_interval : float, default 60.0
        Seconds between lease renewals of the write sessions of open files
        (one ``RenewSessions`` call per process for all of them). Keep it
        well below the metaserver's ``--session-timeout`` (default 300 s).
    keep_memory : bool, default False
        Keep freed memory in this process (glibc's malloc only; process-wide,
        see :func:`emberfs.client.memory.keep_freed_memory`), so that every
        whole-file ``read()`` or ``cat_file`` after the first reuses pages
        the process already has instead of faulting in new ones. For
        long-lived loader processes that read whole large files; the
        process's resident memory then stays at its peak.
    """

    protocol = _PROTOCOLS
    root_marker = "/"
    cachable = True

    readahead_depth = 8
    write_depth = 8
    max_workers = 16
    max_connections = 8
    default_block_size = 4 * 1024 * 1024
    connect_timeout = 5.0
    io_timeout = 30.0
    rpc_timeout = 30.0
    retry_timeout = 30.0
    read_timeout = 60.0
    write_timeout = 60.0
    stall_check = 1.0
    auto_mkdir = True
    list_page = 2000
    session_renew_interval = 60.0
    keep_memory = False

    _OPTIONS = (
        "readahead_depth",
        "write_depth",
        "max_workers",
        "max_connections",
        "default_block_size",
        "connect_timeout",
        "io_timeout",
        "rpc_timeout",
        "retry_timeout",
        "read_timeout",
        "write_timeout",
        "stall_check",
        "auto_mkdir",
        "list_page",
        "session_renew_interval",
        "keep_memory",
    )

    def __init__(self, meta: str | None = None, **kwargs) -> None:
        options = {k: kwargs.pop(k) for k in self._OPTIONS if k in kwargs}
        super().__init__(**kwargs)
        self.meta = meta or default_meta()
        for name, value in options.items():
            setattr(self, name, value)
        self.blocksize = self.default_block_size
        if self.keep_memory:
            keep_freed_memory()
        self._rt = ProcessRuntime(self)
        # what EmberFile and the transfers of many files read, write and end sessions through
        self.chunk_io = ChunkIO(self._rt)
        self.sessions = WriteSessions(self._rt)
        self._plan = threading.local()  # see _planned

    # per-process runtime ---------------------------------------------------------
    def _runtime(self) -> Runtime:
        return self._rt.get()

    @property
    def _meta(self) -> MetaClient:
        return self._runtime().meta

    def close(self) -> None:
        """Release connections and threads (the instance stays usable)."""
        self._rt.close()

    @property
    def fsid(self) -> str:
        return f"emberfs-{self.meta}"

    # paths ---------------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        m = _URL.match(path)
        if m:
            rest = path[m.end() :]
            path = rest if rest.startswith("/") else "/" + rest.partition("/")[2]
        path = re.sub("/+", "/", "/" + path)
        if len(path) > 1:
            path = path.rstrip("/")
        return path or "/"

    @staticmethod
    def _get_kwargs_from_urls(path):
        m = _URL.match(stringify_path(path))
        if m:
            authority = path[m.end() :].partition("/")[0]
            if authority:
                return {"meta": authority}
        return {}

    def unstrip_protocol(self, name: str) -> str:
        return f"emberfs://{self.meta}{self._strip_protocol(name)}"

    # attributes ------------------------------------------------------------------
    def info(self, path, **kwargs) -> dict:
        path = self._strip_protocol(path)
        return attr_info(path, self._meta.stat(path, follow=True))

    def ls(self, path, detail: bool = True, **kwargs):
        path = self._strip_protocol(path)
        try:
            entries = list(self._meta.list(path, page=self.list_page))
        except NotADirectoryError:
            info = self.info(path)
            if info["type"] == "directory":
                raise
            return [info] if detail else [path]
        base = "" if path == "/" else path
        out = [attr_info(f"{base}/{e.name}", e.attr) for e in entries]
        return out if detail else [o["name"] for o in out]

    def exists(self, path, **kwargs) -> bool:
        try:
            self.info(path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def modified(self, path) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.UTC)

    def created(self, path) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.UTC)

    def ukey(self, path) -> str:
        """Changes whenever the file's content may have changed."""
        attr = self._meta.stat(self._strip_protocol(path), follow=True)
        return tokenize(self.meta, attr.inode, attr.size, attr.mtime_ns, attr.ctime_ns)

    def checksum(self, path) -> int:
        return int(self.ukey(path), 16)

    def statfs(self) -> dict:
        """Capacity and usage of the cluster."""
        r = self._meta.statfs()
        return {f.name: getattr(r, f.name) for f in r.DESCRIPTOR.fields}

    # directories -----------------------------------------------------------------
    def mkdir(self, path, create_parents: bool = True, **kwargs) -> None:
        path = self._strip_protocol(path)
        try:
            self._meta.mkdir(path, parents=False)
        except FileNotFoundError:
            if not create_parents:
                raise
            self._meta.mkdir(self._parent(path), parents=True)
            self._meta.mkdir(path, parents=False)

    def makedirs(self, path, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        if exist_ok:
            self._meta.mkdir(path, parents=True)
        else:
            self.mkdir(path, create_parents=True)

    def rmdir(self, path) -> None:
        self._meta.remove(self._strip_protocol(path), directory=True)

    def rm_file(self, path) -> None:
        """Remove a file or symlink (IsADirectoryError for a directory)."""
        path = self._strip_protocol(path)
        if self._meta.stat(path, follow=False).type == common_pb2.DIRECTORY:
            raise is_a_directory(path)
        self._meta.remove(path)

    _rm = rm_file

    def rm(self, path, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Remove files, or whole trees with ``recursive`` (one metaserver call per tree).

        Many paths (a list, or what a glob or ``maxdepth`` expands to) go in
        one ``BatchRemove`` call per 1000, each removed on its own: every
        path is attempted, then the first failure in their order is raised.
        """
        paths = path if isinstance(path, list | tuple) else [path]
        if maxdepth is None and not any(_MAGIC.search(str(p)) for p in paths):
            stripped = [self._strip_protocol(p) for p in paths]
            if len(stripped) == 1:
                self._meta.remove(stripped[0], recursive=recursive)
                return
            for got in self._meta.batch_remove(stripped, recursive=recursive):
                if isinstance(got, OSError):
                    raise got
            return
        expanded = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        deepest_first = sorted(expanded, key=lambda s: (-s.count("/"), s))
        for got in self._meta.batch_remove(deepest_first, recursive=recursive):
            if isinstance(got, OSError) and not isinstance(got, FileNotFoundError):
                raise got  # a missing path went with its parent

    def mv(self, path1, path2, recursive: bool = False, maxdepth=None, **kwargs) -> None:
        """Rename a file or directory (atomic, one call); into ``path2`` if it is a directory."""
        if not (isinstance(path1, str) and isinstance(path2, str)) or _MAGIC.search(path1):
            return super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        try:
            if self.info(dst)["type"] == "directory" and src != dst:
                dst = f"{dst.rstrip('/')}/{src.rsplit('/', 1)[-1]}"
        except FileNotFoundError:
            pass
        try:
            self._meta.rename(src, dst)
        except FileNotFoundError:
            if not self.auto_mkdir or not self.exists(src):
                raise
            self.makedirs(self._parent(dst), exist_ok=True)
            self._meta.rename(src, dst)

    rename = mv

    # opening ---------------------------------------------------------------------
    def _open_handle(self, path: str, flags: int) -> OpenHandle:
        try:
            resp = self._meta.open(path, flags)
        except FileNotFoundError:
            if not (flags & meta_pb2.OPEN_CREATE and self.auto_mkdir):
                raise
            self._meta.mkdir(self._parent(path), parents=True)
            resp = self._meta.open(path, flags)
        if resp.attr.type == common_pb2.DIRECTORY:
            raise is_a_directory(path)
        return OpenHandle.from_open(path, resp)

    def _read_handles(self, paths: list[str]) -> dict[str, OpenHandle | OSError]:
        """Read-only handles of (stripped) ``paths``: each a handle, or the error of its open.

        All of them come from one ``BatchOpen`` round trip per
        :data:`~emberfs.client.meta.BATCH_OPEN` distinct paths.
        """
        unique = list(dict.fromkeys(paths))
        out: dict[str, OpenHandle | OSError] = {}
        for path, got in zip(unique, self._meta.batch_open(unique), strict=True):
            if isinstance(got, OSError):
                out[path] = got
            elif got.type == common_pb2.DIRECTORY:
                out[path] = is_a_directory(path)
            else:
                out[path] = OpenHandle.for_read(path, got)
        return out

    def _open(
        self,
        path,
        mode: str = "rb",
        block_size=None,
        autocommit: bool = True,
        cache_options=None,
        **kwargs,
    ) -> EmberFile:
        path = self._strip_protocol(path)
        flags = {
            "rb": meta_pb2.OPEN_READ,
            "wb": meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE | meta_pb2.OPEN_TRUNCATE,
            "xb": meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE | meta_pb2.OPEN_EXCLUSIVE,
            "ab": meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE | meta_pb2.OPEN_APPEND,
        }.get(mode)
        if flags is None:
            raise ValueError(f"unsupported mode {mode!r} (use rb, wb, ab or xb)")
        handle = self._open_handle(path, flags)
        return EmberFile(
            self,
            path,
            mode,
            handle=handle,
            block_size=block_size,
            autocommit=autocommit,
            cache_options=cache_options,
            **kwargs,
        )

    def touch(self, path, truncate: bool = True, **kwargs) -> None:
        """Create an empty file, or update the mtime (``truncate=False``) of one."""
        path = self._strip_protocol(path)
        flags = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE
        if truncate:
            flags |= meta_pb2.OPEN_TRUNCATE
        h = self._open_handle(path, flags)
        self._meta.close_file(h.inode, h.session_id, 0 if truncate else h.size, True, path)

    def truncate(self, path, length: int) -> None:
        """Set a file's length: cut chunks past it on every replica, or extend with zeros."""
        if length < 0:
            raise OSError(errno.EINVAL, "negative length", path)
        self._meta.truncate(self._strip_protocol(path), int(length))
        self.invalidate_cache(self._parent(self._strip_protocol(path)))

    # reading and writing -------------------------------------------------------------
    def cat_file(self, path, start=None, end=None, **kwargs) -> bytes:
        """The bytes of ``path`` (all its chunks fetched in parallel into one buffer)."""
        path = self._strip_protocol(path)
        h = self._open_handle(path, meta_pb2.OPEN_READ)
        return self.chunk_io.read_range(h, start, end)

    def cat(self, path, recursive=False, on_error="raise", **kwargs):
        """The bytes of one path, or ``{path: bytes}`` of many, all fetched concurrently.

        As fsspec's ``cat``, but the files of a list, glob or directory are
        opened with one round trip to the metaserver (per 1000 paths) and all
        their chunks fetched in parallel, as :meth:`cat_ranges` does.
        ``on_error``: ``"raise"`` (the error of the first failed path in the
        sorted order of ``expand_path``, once every file was tried),
        ``"omit"`` (leave failed paths out) or ``"return"`` (the error as the
        value).
        """
        paths = self.expand_path(path, recursive=recursive, **kwargs)
        if (
            len(paths) == 1
            and not isinstance(path, list)
            and paths[0] == self._strip_protocol(path)
        ):
            return self.cat_file(paths[0], **kwargs)
        n = len(paths)  # expand_path gave them stripped
        got_all = self._fetch_ranges(paths, [kwargs.get("start")] * n, [kwargs.get("end")] * n)
        out = {}
        for p, got in zip(paths, got_all, strict=True):
            if not isinstance(got, Exception):
                out[p] = got
            elif on_error == "raise":
                raise got
            elif on_error == "return":
                out[p] = got
        return out

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs) -> list:
        """Byte ranges of files, all fetched concurrently (one ``BatchOpen`` for the files)."""
        if not isinstance(starts, list):
            starts = [starts] * len(paths)
        if not isinstance(ends, list):
            ends = [ends] * len(paths)
        if len(starts) != len(paths) or len(ends) != len(paths):
            raise ValueError("paths, starts and ends must have the same length")
        stripped = [self._strip_protocol(p) for p in paths]
        return self._fetch_ranges(stripped, starts, ends, on_error)

    def _fetch_ranges(self, stripped: list[str], starts, ends, on_error="return") -> list:
        """:meth:`cat_ranges` of paths already stripped, with one start and end per path."""
        handles = self._read_handles(stripped)
        if on_error != "return":
            for p in stripped:
                if isinstance(handles[p], OSError):
                    raise handles[p]  # before any read starts
        jobs = self.chunk_io.start_reads([handles[p] for p in stripped], starts, ends)
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

    def pipe_file(self, path, value, mode: str = "overwrite", **kwargs) -> None:
        """Write ``value`` as the whole file; ``mode="create"`` refuses an existing path."""
        with self.open(path, "xb" if mode == "create" else "wb") as f:
            f.write(bytes(value) if not isinstance(value, bytes) else value)

    def pipe(self, path, value=None, mode: str = "overwrite", **kwargs) -> None:
        """Write one file, or many (``{path: bytes}``) at once.

        The files of a dict are opened with one metaserver call (per 1000
        files, ``BatchWriteOpen``), all their chunks are written at once, and
        their write sessions end with one more call (``BatchClose``). Every
        file is attempted; then the first failed path's error, in the dict's
        order, is raised. ``mode="create"`` refuses existing paths, as
        :meth:`pipe_file` does.
        """
        if isinstance(path, str):
            self.pipe_file(self._strip_protocol(path), value, mode=mode, **kwargs)
            return
        if not isinstance(path, dict):
            raise ValueError("path must be str or dict")
        # one write per file: of keys naming the same file the last wins, as in a loop
        items = {self._strip_protocol(k): v for k, v in path.items()}
        if len(items) <= 1:
            for k, v in items.items():
                self.pipe_file(k, v, mode=mode, **kwargs)
            return
        failed = self._write_files(items, exclusive=mode == "create")
        for k in items:
            if k in failed:
                raise failed[k]

    def _write_handles(self, paths: list[str], flags: int) -> dict[str, OpenHandle | OSError]:
        """Write opens of (stripped) ``paths`` with ``flags``: each a handle or its open's error.

        One ``BatchWriteOpen`` round trip per 1000 paths; with ``auto_mkdir``
        the missing parents of paths that failed with ENOENT are made, and
        those paths opened again in one more call.
        """
        got: dict[str, meta_pb2.OpenResponse | OSError] = dict(
            zip(paths, self._meta.batch_write_open(paths, flags), strict=True)
        )
        missing = [p for p, g in got.items() if isinstance(g, FileNotFoundError)]
        if missing and self.auto_mkdir:
            retry = []
            made: dict[str, OSError | None] = {}
            for p in missing:
                parent = self._parent(p)
                if parent not in made:
                    try:
                        self._meta.mkdir(parent, parents=True)
                        made[parent] = None
                    except OSError as exc:
                        made[parent] = exc
                if made[parent] is None:
                    retry.append(p)
                else:
                    got[p] = made[parent]  # what a single open would raise
            if retry:
                got.update(zip(retry, self._meta.batch_write_open(retry, flags), strict=True))
        return {
            p: g if isinstance(g, OSError) else OpenHandle.from_open(p, g) for p, g in got.items()
        }

    def _write_files(self, items: dict, exclusive: bool = False) -> dict[str, OSError]:
        """Write whole files ``{stripped path: bytes-like}``, all at once; the failures by path.

        One ``BatchWriteOpen`` (per 1000), every chunk of every file on the
        runtime's executor together, then one ``BatchClose`` with the exact
        lengths (a file whose writes failed keeps the length it was opened
        with, as :meth:`EmberFile.close` leaves it). Every file is attempted.
        """
        flags = meta_pb2.OPEN_WRITE | meta_pb2.OPEN_CREATE
        flags |= meta_pb2.OPEN_EXCLUSIVE if exclusive else meta_pb2.OPEN_TRUNCATE
        datas = {p: v if isinstance(v, bytes) else bytes(v) for p, v in items.items()}
        handles = self._write_handles(list(datas), flags)
        failed: dict[str, BaseException] = {
            p: h for p, h in handles.items() if isinstance(h, OSError)
        }
        opened = {p: h for p, h in handles.items() if not isinstance(h, OSError)}
        sessions = self.sessions
        try:
            writes = {}
            for p, h in opened.items():
                sessions.register(h)
                view = memoryview(datas[p])
                writes[p] = [
                    self.chunk_io.submit_write(
                        h, s.file_offset, view[s.file_offset : s.file_offset + s.length]
                    )
                    for s in chunk_spans(0, len(view), h.chunk_size)
                ]
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
            ended = sessions.close_many(
                [(h.inode, h.session_id, len(datas[p]), p not in failed) for p, h in closing],
                [p for p, _ in closing],
            )
            for (p, h), got in zip(closing, ended, strict=True):
                if isinstance(got, OSError):
                    stale = got.errno == errno.EINVAL  # Close finds no such session
                    failed.setdefault(p, stale_session(p) if stale else got)
                else:
                    h.attr = got
        finally:
            for h in opened.values():
                sessions.unregister(h)
        return {p: _as_oserror(error, f"writing {p}") for p, error in failed.items()}

    def _copy_stream(self, f1, f2, callback=None, size: int | None = None) -> None:
        size = getattr(f1, "size", None) if size is None else size
        if callback is not None and size is not None:
            callback.set_size(size)
        unit = max(self.default_block_size, getattr(f1, "blocksize", 0) or 0)
        while True:
            data = f1.read(unit)
            if not data:
                break
            f2.write(data)
            if callback is not None:
                callback.relative_update(len(data))

    def cp_file(self, path1, path2, **kwargs) -> None:
        """Copy a file by streaming its chunks (reads ahead while writing)."""
        if self._planning(path1, path2):
            return
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        with self.open(path1, "rb") as f1, self.open(path2, "wb") as f2:
            self._copy_stream(f1, f2)

    def put_file(self, lpath, rpath, callback=None, mode: str = "overwrite", **kwargs) -> None:
        """Upload one local file (or make the directory for a local directory)."""
        if self._planning(lpath, rpath):
            return
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        with open(lpath, "rb") as f1:
            size = os.fstat(f1.fileno()).st_size
            with self.open(rpath, "xb" if mode == "create" else "wb") as f2:
                self._copy_stream(f1, f2, callback, size)

    def get_file(self, rpath, lpath, callback=None, outfile=None, **kwargs) -> None:
        """Download one file (or make the local directory for a directory)."""
        if outfile is None and self._planning(rpath, lpath):
            return
        rpath = self._strip_protocol(rpath)
        if outfile is None and self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        with self.open(rpath, "rb") as f1:
            self._download(f1, lpath, callback, outfile)

    def _download(self, f1: EmberFile, lpath, callback=None, outfile=None) -> None:
        """Copy the open remote file ``f1`` to the local ``lpath`` (or into ``outfile``)."""
        if callback is not None:
            callback.set_size(f1.size)
        close = outfile is None
        if close:
            outfile = _open_local(lpath)
        try:
            buf = bytearray(min(max(f1.size, 1), max(self.default_block_size, f1.blocksize)))
            view = memoryview(buf)
            while True:
                n = f1.readinto(view)
                if not n:
                    break
                outfile.write(view[:n])
                if callback is not None:
                    callback.relative_update(n)
        finally:
            if close:
                outfile.close()

    # many files at once ----------------------------------------------------------
    def _planned(self, method: str, *args, **kwargs) -> list[tuple[str, str]]:
        """The (source, destination) pairs fsspec's ``get``, ``put`` or ``copy`` moves one by one.

        fsspec's own method expands the paths (lists, globs, recursion,
        trailing slashes, an existing destination directory); while it runs,
        in this thread, its per-file calls (:meth:`get_file`,
        :meth:`put_file`, :meth:`cp_file`) only record their pair.
        """
        pairs: list[tuple[str, str]] = []
        self._plan.pairs = pairs
        try:
            getattr(super(), method)(*args, **kwargs)
        finally:
            self._plan.pairs = None
        return pairs

    def _planning(self, src, dst) -> bool:
        """Inside :meth:`_planned` (this thread): record the pair instead of moving it."""
        pairs = getattr(self._plan, "pairs", None)
        if pairs is None:
            return False
        pairs.append((src, dst))
        return True

    def get(
        self, rpath, lpath, recursive=False, callback=DEFAULT_CALLBACK, maxdepth=None, **kwargs
    ):
        """Download files with fsspec's path rules, many of them together.

        The remote paths are opened with one ``BatchOpen`` call per 1000 and
        their directories made locally. Files of at most
        ``default_block_size`` bytes are fetched in groups (up to 1000 files
        and 64 MiB), every chunk of a group at once; larger files one after
        the other, each reading its chunks ahead in parallel. Every path is
        attempted, then the first failure in fsspec's order is raised.
        ``callback`` counts the paths done.
        """
        pairs = self._planned("get", rpath, lpath, recursive=recursive, maxdepth=maxdepth, **kwargs)
        if not pairs:
            return
        callback.set_size(len(pairs))
        stripped = [self._strip_protocol(r) for r, _ in pairs]
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
                with callback.branched(r, local) as child, EmberFile(self, h.path, handle=h) as f1:
                    self._download(f1, local, callback=child)
            except Exception as exc:
                failed[i] = _as_oserror(exc, f"reading {stripped[i]}")
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
                (small if h.size <= self.default_block_size else big).append((i, h))
        return failed, small, big

    def _fetch_groups(self, small: list) -> Iterator[list]:
        """The whole contents of small files, in groups fetched all at once.

        ``small`` holds ``(i, handle)`` pairs; per group (:func:`_groups`)
        this yields ``(i, ResultBuffer or OSError)`` for each of them.
        """
        for group in _groups(small, lambda item: item[1].size):
            n = len(group)
            jobs = self.chunk_io.start_reads([h for _, h in group], [None] * n, [None] * n)
            out = []
            for (i, h), (_, buf, futures) in zip(group, jobs, strict=True):
                try:
                    wait_all(futures)
                    out.append((i, buf))
                except Exception as exc:
                    out.append((i, _as_oserror(exc, f"reading {h.path}")))
            yield out

    def copy(self, path1, path2, recursive=False, maxdepth=None, on_error=None, **kwargs):
        """Copy files within EmberFS with fsspec's path rules, many of them together.

        The sources are opened with one ``BatchOpen`` call per 1000 and
        their directories made at the destination. Files of at most
        ``default_block_size`` bytes are read in groups (up to 1000 files and
        64 MiB, every chunk of a group at once) and written as :meth:`pipe`
        writes a dict; larger files are streamed one after the other. Every
        path is attempted. ``on_error`` as fsspec's: ``"raise"`` (the default
        unless ``recursive``) raises the first failure in fsspec's order,
        ``"ignore"`` skips missing sources (FileNotFoundError) and raises any
        other failure.
        """
        if on_error is None:
            on_error = "ignore" if recursive else "raise"
        pairs = self._planned(
            "copy",
            path1,
            path2,
            recursive=recursive,
            maxdepth=maxdepth,
            on_error=on_error,
            **kwargs,
        )
        sources = [self._strip_protocol(a) for a, _ in pairs]
        targets = [self._strip_protocol(b) for _, b in pairs]
        handles = self._read_handles(sources) if pairs else {}
        failed, small, big = self._split_sources(
            [handles[p] for p in sources], lambda i: self.makedirs(targets[i], exist_ok=True)
        )
        for group in self._fetch_groups(small):
            values, index = {}, {}
            for i, got in group:
                if isinstance(got, OSError):
                    failed[i] = got
                else:
                    values[targets[i]] = as_bytes(got)
                    index[targets[i]] = i
            for dst, error in self._write_files(values).items():
                failed[index[dst]] = error
        for i, h in big:
            try:
                with EmberFile(self, h.path, handle=h) as f1, self.open(targets[i], "wb") as f2:
                    self._copy_stream(f1, f2)
            except Exception as exc:
                failed[i] = _as_oserror(exc, f"copying {sources[i]} to {targets[i]}")
        for i in sorted(failed):
            if on_error == "raise" or not isinstance(failed[i], FileNotFoundError):
                raise failed[i]

    def put(
        self, lpath, rpath, recursive=False, callback=DEFAULT_CALLBACK, maxdepth=None, **kwargs
    ):
        """Upload files with fsspec's path rules, many of them together.

        Directories are made first. Files of at most ``default_block_size``
        bytes are read in groups (up to 1000 files and 64 MiB) and written as
        :meth:`pipe` writes a dict (one ``BatchWriteOpen``, every chunk at
        once, one ``BatchClose``); larger files one after the other, each
        with several chunks in flight. ``mode="create"`` refuses existing
        remote files. Every path is attempted, then the first failure in
        fsspec's order is raised. ``callback`` counts the paths done.
        """
        pairs = self._planned("put", lpath, rpath, recursive=recursive, maxdepth=maxdepth, **kwargs)
        if not pairs:
            return
        callback.set_size(len(pairs))
        mode = kwargs.get("mode", "overwrite")
        failed: dict[int, OSError] = {}
        small, big = [], []
        for i, (local, r) in enumerate(pairs):
            r = self._strip_protocol(r)
            try:
                if os.path.isdir(local):
                    self.makedirs(r, exist_ok=True)
                else:
                    size = os.path.getsize(local)
                    (small if size <= self.default_block_size else big).append((i, local, r, size))
                    continue
            except OSError as exc:
                failed[i] = exc
            callback.relative_update(1)
        for group in _groups(small, lambda item: item[3]):
            values, index = {}, {}
            for i, local, r, _ in group:
                try:
                    with open(local, "rb") as f:
                        values[r] = f.read()
                    index[r] = i
                except OSError as exc:
                    failed[i] = exc
            for r, error in self._write_files(values, exclusive=mode == "create").items():
                failed[index[r]] = error
            for i, local, r, size in group:
                if i not in failed:
                    _moved(callback, local, r, size)
                callback.relative_update(1)
        for i, local, r, _ in big:
            try:
                with callback.branched(local, r) as child:
                    self.put_file(local, r, callback=child, mode=mode)
            except Exception as exc:
                failed[i] = _as_oserror(exc, f"writing {r}")
            callback.relative_update(1)
        if failed:
            raise failed[min(failed)]


#: ``get``, ``put`` and ``copy`` move small files in groups of at most this many bytes
GROUP_BYTES = 64 * 1024 * 1024


def _groups(items: list, size_of) -> Iterator[list]:
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


def _as_oserror(error: BaseException, doing: str) -> OSError:
    """``error`` itself when it is an OSError, else an EIO naming what failed."""
    if isinstance(error, OSError):
        return error
    wrapped = OSError(errno.EIO, f"{doing} failed: {error}")
    wrapped.__cause__ = error
    return wrapped
