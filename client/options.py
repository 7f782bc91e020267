"""``ClientOptions``: the tunables of one EmberFS client, in one value.

:class:`~emberfs.client.fs.EmberFileSystem` takes them as keyword arguments
and class attributes (as fsspec filesystems do); the FUSE mount, the KV cache
and the batch transfers get them through the
:class:`~emberfs.client.core.Client` they are built on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ClientOptions:
    """What a client's connections, threads, reads and writes are sized and timed by.

    Attributes
    ----------
    readahead_depth : int
        Chunks fetched ahead of a sequential reader.
    write_depth : int
        Chunk writes in flight per open file.
    max_workers : int
        Threads of the data-path pool (parallel chunk reads and writes).
    max_connections : int
        Connections to one storage server at most.
    default_block_size : int
        Buffer size of copies; files use their own chunk size for readahead.
    connect_timeout, io_timeout : float
        Data connections: connect and per-operation socket timeouts (seconds).
    rpc_timeout : float
        Deadline of each metaserver call.
    retry_timeout : float
        How long metaserver calls are retried while it is unavailable.
    read_timeout, write_timeout : float
        How long a chunk read or write keeps retrying replicas while chains
        are reconfigured.
    stall_check : float
        Seconds a data transfer waits on a storage server before the client
        asks the metaserver whether that server is still up.
    auto_mkdir : bool
        Create missing parent directories when a file is written.
    list_page : int
        Entries per ``List`` call.
    session_renew_interval : float
        Seconds between lease renewals of the write sessions of open files.
    keep_memory : bool
        Keep freed memory in this process (see
        :func:`emberfs.client.memory.keep_freed_memory`).
    interceptors : tuple
        gRPC client interceptors wrapped around the metaserver channels
        (tracing, or faults injected by tests).
    cache_dir : str or None
        Directory of the local disk cache of file chunks
        (:mod:`emberfs.client.diskcache`); None takes ``EMBERFS_CACHE_DIR``,
        then the client config file's ``cache_dir``; ``""`` (or nothing set
        anywhere) reads without one.
    cache_size : int, str or None
        Bytes the disk cache may hold (``"20G"`` too); None takes
        ``EMBERFS_CACHE_SIZE``, then the config file's ``cache_size``, then
        :data:`DEFAULT_CACHE_SIZE`.
    """

    readahead_depth: int = 8
    write_depth: int = 8
    max_workers: int = 16
    max_connections: int = 8
    default_block_size: int = 4 * 1024 * 1024
    connect_timeout: float = 5.0
    io_timeout: float = 30.0
    rpc_timeout: float = 30.0
    retry_timeout: float = 30.0
    read_timeout: float = 60.0
    write_timeout: float = 60.0
    stall_check: float = 1.0
    auto_mkdir: bool = True
    list_page: int = 2000
    session_renew_interval: float = 60.0
    keep_memory: bool = False
    interceptors: tuple = ()
    cache_dir: str | None = None
    cache_size: int | str | None = None

    @classmethod
    def of(cls, source) -> ClientOptions:
        """The options as the attributes of ``source`` (a filesystem, its class's defaults) set them."""
        return cls(**{f.name: getattr(source, f.name, f.default) for f in dataclasses.fields(cls)})


#: what the disk cache holds at most when no size is given
DEFAULT_CACHE_SIZE = 10 * 1024**3

#: the option names a filesystem's ``__init__`` takes as keyword arguments
TUNABLES = tuple(f.name for f in dataclasses.fields(ClientOptions))
