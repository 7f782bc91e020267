"""``EmberFileSystem``: EmberFS as an fsspec filesystem (``emberfs://`` and ``ember://``).

URLs are ``emberfs://HOST:PORT/path`` (the metaserver's address) or
``emberfs:///path`` with the metaserver taken from ``EMBERFS_META`` (default
``127.0.0.1:9400``). The filesystem is built on a
:class:`~emberfs.client.core.Client` (``fs.client``): namespace operations are
single metaserver calls through ``fs.client.meta``; file data moves over the
framed data protocol (:mod:`emberfs.client.datapath`) as chunk I/O planned by
:mod:`emberfs.client.fileio` for open files and by
:mod:`emberfs.client.transfer` (``fs.transfers``) for many files at once.

One instance can be shared by threads. After ``os.fork`` (PyTorch DataLoader
workers) the child notices the new process id and lazily builds its own gRPC
channel, data connections and thread pool; the parent's are never touched.
"""

from __future__ import annotations

import datetime
import errno
import re

from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.spec import AbstractFileSystem
from fsspec.utils import tokenize

from emberfs.client import plan, quotas, trash, xattrs
from emberfs.client.core import Client
from emberfs.client.file import EmberFile
from emberfs.client.handles import OpenHandle, attr_info, is_a_directory
from emberfs.client.options import TUNABLES, ClientOptions
from emberfs.client.paths import PROTOCOLS, meta_of_url, parent, strip_protocol
from emberfs.client.transfer import BatchTransfer
from emberfs.proto import common_pb2, meta_pb2

_MAGIC = re.compile(r"[*?\[]")


class EmberFileSystem(AbstractFileSystem):
    """EmberFS through fsspec.

    Parameters
    ----------
    meta : str or None
        ``host:port`` of the metaserver; None reads ``EMBERFS_META``, then the
        client config file (:mod:`emberfs.client.config`; default
        ``127.0.0.1:9400``). A URL's host:port sets it.
    token : str or None
        The client's token (``emberfs admin token create``): the identity its
        calls act as. None reads ``EMBERFS_TOKEN``, then the config file. A
        cluster with authentication refuses calls without a valid one
        (PermissionError).
    tls_ca : str or None
        CA certificate (PEM) of a metaserver that speaks TLS; None reads the
        config file's ``tls_ca`` (no TLS without one).
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
    interceptors : tuple, default ()
        gRPC client interceptors wrapped around the metaserver channels
        (tracing, or faults injected by tests).
    cache_dir : str or None, default None
        A local disk cache of the chunks read (``docs/client.md``): repeated
        reads of an unchanged file come from it, never from the storage
        servers; shared by the processes of a machine that name it. None
        takes ``EMBERFS_CACHE_DIR``, then the config file; ``""``: no cache.
        A directory that cannot be written raises an OSError naming it.
    cache_size : int, str or None, default None
        What the disk cache holds at most (``"20G"`` too; the least recently
        used chunks are evicted); None takes ``EMBERFS_CACHE_SIZE``, then the
        config file, then 10 GiB.
    """

    protocol = PROTOCOLS
    root_marker = "/"
    cachable = True

    # the tunables (ClientOptions), as class attributes that __init__'s keywords override
    readahead_depth = ClientOptions.readahead_depth
    write_depth = ClientOptions.write_depth
    max_workers = ClientOptions.max_workers
    max_connections = ClientOptions.max_connections
    default_block_size = ClientOptions.default_block_size
    connect_timeout = ClientOptions.connect_timeout
    io_timeout = ClientOptions.io_timeout
    rpc_timeout = ClientOptions.rpc_timeout
    retry_timeout = ClientOptions.retry_timeout
    read_timeout = ClientOptions.read_timeout
    write_timeout = ClientOptions.write_timeout
    stall_check = ClientOptions.stall_check
    auto_mkdir = ClientOptions.auto_mkdir
    list_page = ClientOptions.list_page
    session_renew_interval = ClientOptions.session_renew_interval
    keep_memory = ClientOptions.keep_memory
    interceptors = ClientOptions.interceptors
    cache_dir = ClientOptions.cache_dir
    cache_size = ClientOptions.cache_size

    def __init__(
        self, meta: str | None = None, token: str | None = None, tls_ca: str | None = None, **kwargs
    ) -> None:
        options = {k: kwargs.pop(k) for k in TUNABLES if k in kwargs}
        super().__init__(**kwargs)
        for name, value in options.items():
            setattr(self, name, value)
        self.blocksize = self.default_block_size
        self.client = Client(meta, token, tls_ca, ClientOptions.of(self))
        self.meta = self.client.address
        self.token = self.client.token
        self.tls_ca = self.client.tls_ca
        self.transfers = BatchTransfer(self.client, self)

    def close(self) -> None:
        """Release connections and threads (the instance stays usable)."""
        self.client.close()

    def metrics(self) -> dict:
        """This process's client counters (the disk cache's), as ``Client.metrics``."""
        return self.client.metrics()

    @property
    def fsid(self) -> str:
        return f"emberfs-{self.meta}"

    # paths ---------------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path):
        return strip_protocol(path)

    @staticmethod
    def _get_kwargs_from_urls(path):
        authority = meta_of_url(path)
        return {"meta": authority} if authority else {}

    def unstrip_protocol(self, name: str) -> str:
        return f"emberfs://{self.meta}{self._strip_protocol(name)}"

    # attributes ------------------------------------------------------------------
    def info(self, path, **kwargs) -> dict:
        """fsspec's ``info``, one ``Stat``; ``"xattrs"`` ({name: value}) when the inode has
        extended attributes the caller may read."""
        path = self._strip_protocol(path)
        attr, held = xattrs.stat_with_xattrs(self.client.meta, path, follow=True)
        info = attr_info(path, attr)
        if held:
            info["xattrs"] = held
        return info

    # extended attributes (docs/client.md#extended-attributes) -------------------------
    def getxattr(self, path, name, follow_symlinks: bool = True) -> bytes:
        """The value of the extended attribute ``name`` (``OSError(ENODATA)`` when not set)."""
        path = self._strip_protocol(path)
        return xattrs.getxattr(self.client.meta, path, name, follow_symlinks)

    def listxattr(self, path, follow_symlinks: bool = True) -> list[str]:
        """The names of the extended attributes of ``path``, in name order."""
        path = self._strip_protocol(path)
        return xattrs.listxattr(self.client.meta, path, follow_symlinks)

    def setxattr(self, path, name, value, flags: int = 0, follow_symlinks: bool = True) -> None:
        """Set ``name`` to ``value``; ``flags`` as ``os.setxattr``'s (``os.XATTR_CREATE``,
        ``os.XATTR_REPLACE``)."""
        path = self._strip_protocol(path)
        xattrs.setxattr(self.client.meta, path, name, value, flags, follow_symlinks)

    def removexattr(self, path, name, follow_symlinks: bool = True) -> None:
        """Remove the extended attribute ``name`` (``OSError(ENODATA)`` when not set)."""
        path = self._strip_protocol(path)
        xattrs.removexattr(self.client.meta, path, name, follow_symlinks)

    def ls(self, path, detail: bool = True, **kwargs):
        path = self._strip_protocol(path)
        try:
            entries = list(self.client.meta.list(path, page=self.list_page))
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
            self.client.meta.stat(self._strip_protocol(path), follow=True)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def modified(self, path) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.UTC)

    def created(self, path) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.UTC)

    def ukey(self, path) -> str:
        """Changes whenever the file's content may have changed."""
        attr = self.client.meta.stat(self._strip_protocol(path), follow=True)
        return tokenize(self.meta, attr.inode, attr.size, attr.mtime_ns, attr.ctime_ns)

    def checksum(self, path) -> int:
        return int(self.ukey(path), 16)

    def statfs(self, path: str = "") -> dict:
        """Capacity and usage of the cluster; with ``path``, those of the nearest quota over it
        with a limit (``quota_path`` names it; ``inode_limit`` its inode limit)."""
        r = self.client.meta.statfs(self._strip_protocol(path) if path else "")
        return {f.name: getattr(r, f.name) for f in r.DESCRIPTOR.fields}

    # directories -----------------------------------------------------------------
    def mkdir(self, path, create_parents: bool = True, **kwargs) -> None:
        path = self._strip_protocol(path)
        try:
            self.client.meta.mkdir(path, parents=False)
        except FileNotFoundError:
            if not create_parents:
                raise
            self.client.meta.mkdir(parent(path), parents=True)
            self.client.meta.mkdir(path, parents=False)

    def makedirs(self, path, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        if exist_ok:
            self.client.meta.mkdir(path, parents=True)
        else:
            self.mkdir(path, create_parents=True)

    def rmdir(self, path, skip_trash: bool = False) -> None:
        self.client.meta.remove(self._strip_protocol(path), directory=True, skip_trash=skip_trash)

    def rm_file(self, path, skip_trash: bool = False) -> None:
        """Remove a file or symlink (IsADirectoryError for a directory)."""
        path = self._strip_protocol(path)
        if self.client.meta.stat(path, follow=False).type == common_pb2.DIRECTORY:
            raise is_a_directory(path)
        self.client.meta.remove(path, skip_trash=skip_trash)

    _rm = rm_file

    def rm(
        self, path, recursive: bool = False, maxdepth: int | None = None, skip_trash: bool = False
    ) -> None:
        """Remove files, or whole trees with ``recursive`` (one metaserver call per tree).

        Many paths (a list, or what a glob or ``maxdepth`` expands to) go in
        one ``BatchRemove`` call per 1000, each removed on its own: every
        path is attempted, then the first failure in their order is raised.
        ``skip_trash`` deletes what goes even when the metaserver keeps a
        trash (its chunks go to garbage collection; nothing to restore).
        """
        meta = self.client.meta
        paths = path if isinstance(path, list | tuple) else [path]
        if maxdepth is None and not any(_MAGIC.search(str(p)) for p in paths):
            stripped = [self._strip_protocol(p) for p in paths]
            if len(stripped) == 1:
                meta.remove(stripped[0], recursive=recursive, skip_trash=skip_trash)
                return
            for got in meta.batch_remove(stripped, recursive=recursive, skip_trash=skip_trash):
                if isinstance(got, OSError):
                    raise got
            return
        expanded = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        deepest_first = sorted(expanded, key=lambda s: (-s.count("/"), s))
        for got in meta.batch_remove(deepest_first, recursive=recursive, skip_trash=skip_trash):
            if isinstance(got, OSError) and not isinstance(got, FileNotFoundError):
                raise got  # a missing path went with its parent

    def trash_list(self, user: int | None = None, all_users: bool = False) -> list[dict]:
        """The caller's trash entries, oldest first (see :mod:`emberfs.client.trash`)."""
        return trash.list_entries(self.client.meta, user, all_users)

    def trash_restore(self, entries=None, every: bool = False, to: str = "") -> list[dict]:
        """Restore trash entries (ids) or ``every`` one, all or none; ``to``: one entry's path."""
        to = self._strip_protocol(to) if to else ""
        return trash.restore(self.client.meta, entries, every, to)

    def trash_purge(self, entries=None, every: bool = False, before=None) -> int:
        """Delete trash entries for real (``before``: only those removed earlier)."""
        return trash.purge(self.client.meta, entries, every, before)

    def quota_set(self, path, max_bytes=None, max_inodes=None) -> tuple[dict, bool]:
        """Set or change a directory's quota (root only; see :mod:`emberfs.client.quotas`); the
        quota and whether its usage is above a limit now."""
        return quotas.set_quota(self.client.meta, self._strip_protocol(path), max_bytes, max_inodes)

    def quota_get(self, path) -> dict:
        """A directory's quota and usage (FileNotFoundError when it has none)."""
        return quotas.get(self.client.meta, self._strip_protocol(path))

    def quota_list(self) -> list[dict]:
        """Every quota and its usage."""
        return quotas.list_quotas(self.client.meta)

    def quota_remove(self, path) -> dict:
        """Remove a directory's quota (root only); the quota as it was."""
        return quotas.remove(self.client.meta, self._strip_protocol(path))

    def mv(
        self, path1, path2, recursive: bool = False, maxdepth=None, skip_trash=False, **kwargs
    ) -> None:
        """Rename a file or directory (atomic, one call); into ``path2`` if it is a directory.

        What a rename cannot move across quota directories (a directory, a file
        with hard links: EXDEV) is copied and then removed, as ``mv`` does.
        ``skip_trash`` deletes a replaced file even when the metaserver keeps
        a trash. Many paths (a list or a glob) are copied, then the sources
        removed (fsspec's way), those sources never kept in the trash: their
        data lives on at ``path2``.
        """
        if not (isinstance(path1, str) and isinstance(path2, str)) or _MAGIC.search(path1):
            if path1 != path2:
                self.copy(path1, path2, recursive=recursive, maxdepth=maxdepth, on_error="raise")
                self.rm(path1, recursive=recursive, skip_trash=True)
            return None
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        try:
            if self.info(dst)["type"] == "directory" and src != dst:
                dst = f"{dst.rstrip('/')}/{src.rsplit('/', 1)[-1]}"
        except FileNotFoundError:
            pass
        try:
            self.client.meta.rename(src, dst, skip_trash=skip_trash)
        except FileNotFoundError:
            if not self.auto_mkdir or not self.exists(src):
                raise
            self.makedirs(parent(dst), exist_ok=True)
            self.client.meta.rename(src, dst, skip_trash=skip_trash)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            self.copy(src, dst, recursive=True)
            self.rm(src, recursive=True, skip_trash=True)  # its bytes are at dst now

    rename = mv

    def exchange(self, path1: str, path2: str) -> None:
        """Swap two existing entries (files or directories) in one atomic step.

        The way to replace a non-empty directory, such as a checkpoint, whole:
        write the new one beside it, exchange the two, remove the old one.
        """
        self.client.meta.rename(
            self._strip_protocol(path1), self._strip_protocol(path2), exchange=True
        )

    # opening ---------------------------------------------------------------------
    def _open_handle(self, path: str, flags: int) -> OpenHandle:
        return self.client.open(path, flags, mkdir=self.auto_mkdir)

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
        self.client.meta.close_file(h.inode, h.session_id, 0 if truncate else h.size, True, path)

    def truncate(self, path, length: int) -> None:
        """Set a file's length: cut chunks past it on every replica, or extend with zeros."""
        if length < 0:
            raise OSError(errno.EINVAL, "negative length", path)
        self.client.meta.truncate(self._strip_protocol(path), int(length))
        self.invalidate_cache(parent(self._strip_protocol(path)))

    # reading and writing -------------------------------------------------------------
    def cat_file(self, path, start=None, end=None, **kwargs) -> bytes:
        """The bytes of ``path`` (all its chunks fetched in parallel into one buffer)."""
        path = self._strip_protocol(path)
        h = self._open_handle(path, meta_pb2.OPEN_READ)
        return self.client.files.read_range(h, start, end)

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
        # expand_path gave them stripped
        return self.transfers.cat(paths, kwargs.get("start"), kwargs.get("end"), on_error)

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs) -> list:
        """Byte ranges of files, all fetched concurrently (one ``BatchOpen`` for the files)."""
        return self.transfers.cat_ranges(paths, starts, ends, on_error)

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
        self.transfers.pipe(path, mode, **kwargs)

    # copying, uploading, downloading ----------------------------------------------
    def cp_file(self, path1, path2, **kwargs) -> None:
        """Copy a file by streaming its chunks (reads ahead while writing)."""
        self.transfers.copy_file(self._strip_protocol(path1), self._strip_protocol(path2))

    def put_file(self, lpath, rpath, callback=None, mode: str = "overwrite", **kwargs) -> None:
        """Upload one local file (or make the directory for a local directory)."""
        self.transfers.put_file(lpath, self._strip_protocol(rpath), callback, mode)

    def get_file(self, rpath, lpath, callback=None, outfile=None, **kwargs) -> None:
        """Download one file (or make the local directory for a directory)."""
        self.transfers.get_file(self._strip_protocol(rpath), lpath, callback, outfile)

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
        pairs = plan.get_pairs(self, rpath, lpath, recursive=recursive, maxdepth=maxdepth, **kwargs)
        self.transfers.get(pairs, callback)

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
        pairs = plan.copy_pairs(
            self, path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs
        )
        self.transfers.copy(pairs, on_error)

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
        mode = kwargs.pop("mode", "overwrite")
        pairs = plan.put_pairs(self, lpath, rpath, recursive=recursive, maxdepth=maxdepth, **kwargs)
        self.transfers.put(pairs, callback, mode)
