"""``Client``: the public core that every EmberFS client is built on.

One client is one identity (metaserver address, token, CA) with its
:class:`~emberfs.client.options.ClientOptions`, and the per-process runtime
(:mod:`emberfs.client.runtime`: gRPC channel, data connections, threads) that
serves it before and after ``os.fork``. On it:

* :attr:`Client.meta` is the metaserver client of the calling process;
* :attr:`Client.files` reads and writes byte ranges of open files as chunk
  I/O (:class:`~emberfs.client.fileio.FileIO`);
* :attr:`Client.sessions` renews and ends write sessions;
* :meth:`Client.open` opens a path (making parents when asked) and
  :meth:`Client.writer` gives the one per-inode writer
  (:class:`~emberfs.client.writer.FileWriter`) of an open file.

:class:`~emberfs.client.fs.EmberFileSystem`, the FUSE mount
(:mod:`emberfs.client.mount`), the KV cache (:mod:`emberfs.kvcache.store`) and
the batch transfers (:mod:`emberfs.client.transfer`) are each built on a
``Client``, and none of them reaches into another.
"""

from __future__ import annotations

from emberfs.client import config
from emberfs.client.diskcache import DiskCache, open_cache
from emberfs.client.fileio import FileIO
from emberfs.client.handles import OpenHandle, WriteSessions, is_a_directory
from emberfs.client.memory import keep_freed_memory
from emberfs.client.meta import MetaClient
from emberfs.client.options import DEFAULT_CACHE_SIZE, ClientOptions
from emberfs.client.paths import parent
from emberfs.client.runtime import ProcessRuntime, Runtime
from emberfs.client.writer import FileWriter
from emberfs.proto import common_pb2, meta_pb2


class Client:
    """An EmberFS client: who it is, its options, and its per-process runtime.

    Parameters
    ----------
    meta : str or None
        ``host:port`` of the metaserver (several, comma-separated, for a
        highly available metadata service); None reads ``EMBERFS_META``, then
        the client config file (:mod:`emberfs.client.config`).
    token : str or None
        The client's token; None reads ``EMBERFS_TOKEN``, then the config file.
    tls_ca : str or None
        CA certificate (PEM) of a metaserver that speaks TLS; None reads the
        config file's ``tls_ca``.
    options : ClientOptions, optional
    """

    def __init__(
        self,
        meta: str | None = None,
        token: str | None = None,
        tls_ca: str | None = None,
        options: ClientOptions | None = None,
    ) -> None:
        self.address = meta or config.default_meta()
        self.token = token or config.default_token()
        self.tls_ca = tls_ca or config.setting("tls_ca")
        self.options = options or ClientOptions()
        if self.options.keep_memory:
            keep_freed_memory()
        self._processes = ProcessRuntime(self)
        self.cache = disk_cache(self.options)
        self.files = FileIO(self._processes, self.cache)
        self.sessions = WriteSessions(self._processes)

    def runtime(self) -> Runtime:
        """The runtime of the calling process (built now after a fork or a close)."""
        return self._processes.get()

    @property
    def meta(self) -> MetaClient:
        """The metaserver client of the calling process."""
        return self._processes.get().meta

    def open(self, path: str, flags: int, *, mkdir: bool | None = None) -> OpenHandle:
        """Open ``path`` (``meta_pb2.OPEN_*`` flags): a handle, or IsADirectoryError.

        With ``OPEN_CREATE`` the missing parents are made first when ``mkdir``
        (the ``auto_mkdir`` option by default) allows it.
        """
        mkdir = self.options.auto_mkdir if mkdir is None else mkdir
        meta = self.meta
        try:
            resp = meta.open(path, flags)
        except FileNotFoundError:
            if not (flags & meta_pb2.OPEN_CREATE and mkdir):
                raise
            meta.mkdir(parent(path), parents=True)
            resp = meta.open(path, flags)
        if resp.attr.type == common_pb2.DIRECTORY:
            raise is_a_directory(path)
        return OpenHandle.from_open(path, resp)

    def writer(self, handle: OpenHandle, *, touched: bool = False, on_change=None) -> FileWriter:
        """The writer of ``handle``, an inode open for writing (its session renewed meanwhile).

        ``touched``: the open itself changed the file (a create or truncate), so
        :meth:`FileWriter.close` makes the length exact even without a write.
        ``on_change(size)`` hears the length after every change of the file.
        """
        return FileWriter(self, handle, touched=touched, on_change=on_change)

    def metrics(self) -> dict:
        """What this client did in this process: ``{"disk_cache": counters or None}``.

        The disk cache's counters (``hits``, ``hit_bytes``, ``misses``,
        ``miss_bytes``, ``fills``, ``fill_bytes``, ``fill_skips``,
        ``fill_errors``, ``evictions``, ``evicted_bytes``, ``corrupt``) count
        this process's reads and fills, with its ``directory`` and ``limit``;
        ``emberfs cache stats`` adds up every process's.
        """
        if self.cache is None:
            return {"disk_cache": None}
        counts = self.cache.counters()
        return {
            "disk_cache": {"directory": self.cache.directory, "limit": self.cache.limit, **counts}
        }

    def close(self) -> None:
        """Release connections and threads (the client stays usable)."""
        if self.cache is not None:
            self.cache.close()
        self._processes.close()

    def __repr__(self) -> str:
        return f"Client({self.address!r})"


def disk_cache(options: ClientOptions) -> DiskCache | None:
    """The disk cache ``options`` ask for (or the environment or config file), or None."""
    directory, size = config.cache_settings(options.cache_dir, options.cache_size)
    if not directory:
        return None
    return open_cache(directory, DEFAULT_CACHE_SIZE if size is None else size)
