"""A client's local disk cache of file chunks, shared by every process of a machine that uses it.

Repeated reads of the same files (the epochs of a training job) read the
chunks they read before from a local directory instead of the storage
servers. :class:`DiskCache` owns that directory:

* **One file per chunk.** An entry holds the bytes of one whole chunk of one
  version of one file, a CRC32C per 64 KiB block of them and a footer
  (:mod:`emberfs.client.cacheentry`); a read checks the blocks it returns and drops an entry
  that fails (counted as ``corrupt``), then reads the chunk from the cluster.
* **Keyed so that a changed file misses.** The key (:class:`ChunkKey`) is the
  inode, its creation time, its data version and the chunk's index and
  length. The metaserver moves a file's data version whenever its bytes may
  change (a write session opened or ended, Sync, a truncation), so a file
  rewritten, truncated or replaced by another (a new inode) is a miss from
  its next open on. Nothing of a file is cached while a write session is
  open on it anywhere (``writers``), nor of a file whose version is unknown
  or that is written without sessions (a KV cache slab): :meth:`key`
  returns None for them.
* **Shared without a daemon.** A fill is written to ``tmp/`` and linked into
  ``data/`` whole (a concurrent fill of the same chunk leaves the first one),
  so DataLoader workers, several jobs and a mount on one machine share the
  directory safely; what is kept survives the processes. The directory
  itself is the index.
* **LRU to a size limit.** A hit renews its entry's mtime (at most once a
  second); a fill that would pass the limit first evicts the entries with the
  oldest mtimes, down to 90 % of it, under an ``flock`` of ``state``, which
  also holds the bytes in use and the counters every process adds to.
* **Fills never hold up a read.** :meth:`offer` copies a chunk just read into
  a bounded buffer that background threads write out
  (:mod:`emberfs.client.cachefill`); when that buffer is full (the disk
  writes slower than the cluster is read), or the cache's file system nearly
  is, the fill is skipped (``fill_skips``) and a later epoch fills it. A fill
  that fails (ENOSPC, EIO) is dropped and counted (``fill_errors``), fills
  pause for a few seconds, and reads go on from the cluster.
* **A hit costs what a read of the local disk does**: entries are read with
  direct I/O into aligned buffers (:mod:`emberfs.client.cacheentry`), a
  whole chunk straight into the readahead block that the reader copies from.

Layout of the directory::

    emberfs-cache     what the directory is (its format); clear touches nothing else
    state             flock'd; bytes in use, size limit, the counters of every process
    data/XX/NAME      one entry per cached chunk (XX from the inode and chunk index)
    tmp/NAME          fills being written
"""

from __future__ import annotations

import argparse
import atexit
import errno
import itertools
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass

from emberfs.client.cacheentry import AlignedPool, entry_size, read_entry, read_whole, write_entry
from emberfs.client.cachefill import FILL_BUFFER, FillQueue
from emberfs.client.cachestate import COUNTERS, CacheState, PerProcess
from emberfs.common.units import parse_size
from emberfs.proto import common_pb2

log = logging.getLogger(__name__)

FORMAT = "emberfs disk cache, format 1\n"
LOW_WATER = 0.9  # an eviction leaves at most this share of the limit in use
TOUCH_AFTER_NS = 10**9  # a hit renews an entry's mtime when it is older than this
BLOCKS_KEPT = 64 * 1024 * 1024  # bytes of read blocks' buffers kept for reuse
STALE_TMP_NS = 3600 * 10**9  # a fill left in tmp/ this long ago belongs to a dead process


@dataclass(frozen=True, slots=True)
class ChunkKey:
    """One whole chunk of one version of one file: what an entry holds."""

    inode: int
    born: int  # the inode's creation time (ns): another store's inode of that number misses
    version: int
    index: int
    length: int

    @property
    def name(self) -> str:
        return f"{self.inode:x}.{self.born:x}.{self.version:x}.{self.index:x}"

    @property
    def shard(self) -> str:
        return f"{(self.inode * 0x9E3779B1 + self.index) & 0xFF:02x}"


class DiskCache:
    """The chunk cache in ``directory``, holding at most ``size`` bytes.

    Parameters
    ----------
    directory : str
        Made when missing. Processes that name the same directory share it.
    size : int or None
        The limit of the bytes its entries take (data and checksums). None
        (to inspect or clear a cache) takes the limit its last user set.
    fill_buffer : int
        Bytes of fills a process lets wait for its background writer.

    Raises
    ------
    OSError
        (PermissionError, or another subclass by its errno) naming the
        directory, when it cannot be made or written, or holds another
        format's cache.
    """

    def __init__(self, directory: str, size: int | None, fill_buffer: int = FILL_BUFFER) -> None:
        self.directory = os.path.abspath(os.path.expanduser(str(directory)))
        if size is not None and size <= 0:
            raise ValueError(f"the disk cache's size must be positive, not {size}")
        self.limit = 0 if size is None else int(size)
        self.data_dir = os.path.join(self.directory, "data")
        self.tmp_dir = os.path.join(self.directory, "tmp")
        try:
            self._prepare()
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"the disk cache directory {self.directory} cannot be used: {exc.strerror or exc}",
                self.directory,
            ) from None
        # aligned buffers of whole chunks, reused (fresh pages cost more than the copy into
        # them): the fills waiting, and the blocks read for readahead
        self.buffers = AlignedPool(fill_buffer + BLOCKS_KEPT)
        self.fills = FillQueue(
            self.store,
            self.state.count,
            self.directory,
            fill_buffer,
            allocate=self.buffers.get,
            release=self.buffers.put,
        )
        self._seq = itertools.count(1)  # names of fills in tmp/ (no lock: one may cross a fork)
        # the fills and counts of a process are written out when it ends: atexit, and for a
        # multiprocessing child (a DataLoader worker), which ends without atexit, a finalizer
        atexit.register(self.close)
        self._user = PerProcess(lambda: _when_process_ends(self.close))

    def _prepare(self) -> None:
        os.makedirs(self.tmp_dir, exist_ok=True)
        for n in range(256):
            os.makedirs(os.path.join(self.data_dir, f"{n:02x}"), exist_ok=True)
        marker = os.path.join(self.directory, "emberfs-cache")
        try:
            with open(marker) as f:
                found = f.read()
        except FileNotFoundError:
            with open(marker, "w") as f:
                f.write(FORMAT)
            found = FORMAT
        if found != FORMAT:
            raise OSError(errno.EINVAL, f"it holds another format ({found.strip()!r})")
        probe = os.path.join(self.tmp_dir, f"probe-{os.getpid()}-{threading.get_ident()}")
        with open(probe, "wb") as f:
            f.write(b"\0")
        os.unlink(probe)
        self.state = CacheState(os.path.join(self.directory, "state"))
        if self.limit:
            self.state.update(lambda s: s.update(limit=self.limit))
        else:
            self.limit = self.state.read()["limit"]

    @staticmethod
    def found(directory: str) -> bool:
        """True when ``directory`` holds a disk cache."""
        return os.path.exists(os.path.join(os.path.expanduser(str(directory)), "emberfs-cache"))

    # keys and paths ------------------------------------------------------------------------
    @staticmethod
    def key(attr: common_pb2.InodeAttr, index: int, session_id: int = 0) -> ChunkKey | None:
        """The key of chunk ``index`` of the file ``attr`` describes; None when it is not cached.

        Not cached: a file with a write session open (``writers``, or the
        caller's own ``session_id``), one whose data version is unknown or
        that is written without sessions, and chunks past its end.
        """
        if (
            session_id
            or attr.writers
            or attr.unversioned
            or not attr.data_version
            or attr.type != common_pb2.FILE
        ):
            return None
        cs = attr.layout.chunk_size
        length = min(cs, attr.size - index * cs) if cs else 0
        if length <= 0:
            return None
        return ChunkKey(attr.inode, attr.crtime_ns, attr.data_version, index, length)

    def path(self, key: ChunkKey) -> str:
        return os.path.join(self.data_dir, key.shard, key.name)

    def contains(self, key: ChunkKey) -> bool:
        """True when the cache holds ``key`` (it may still be evicted before it is read)."""
        return os.path.exists(self.path(key))

    # reading ---------------------------------------------------------------------------------
    def read_into(self, key: ChunkKey, offset: int, view: memoryview) -> bool:
        """Fill ``view`` with the chunk's bytes at ``offset``: True on a hit (counted).

        False when the cache does not hold them (the caller counts the miss
        with :meth:`missed`); an entry that fails its checks is removed.
        """
        n = len(view)
        if offset < 0 or offset + n > key.length:
            return False
        self._user.get()
        path = self.path(key)
        try:
            ok = read_entry(path, key.length, offset, view, TOUCH_AFTER_NS)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("disk cache entry %s unreadable: %s", path, exc)
            ok = False
        if ok:
            self.state.count(hits=1, hit_bytes=n)
        else:
            self.state.count(corrupt=1)
            self._drop(path, key)
        return ok

    def read_block(self, key: ChunkKey) -> memoryview | None:
        """The whole chunk of ``key`` in a buffer of the cache's own (read without a copy), or None.

        :meth:`release` takes the buffer back once nobody reads it. None is a
        miss, or a bad entry (then removed and counted), as for :meth:`read_into`.
        """
        self._user.get()
        buf = self.buffers.get(key.length)
        path = self.path(key)
        try:
            ok = read_whole(path, key.length, buf, TOUCH_AFTER_NS)
        except FileNotFoundError:
            self.buffers.put(buf)
            return None
        except OSError as exc:
            log.warning("disk cache entry %s unreadable: %s", path, exc)
            ok = False
        if not ok:
            self.buffers.put(buf)
            self.state.count(corrupt=1)
            self._drop(path, key)
            return None
        self.state.count(hits=1, hit_bytes=key.length)
        return memoryview(buf)[: key.length]

    def release(self, block) -> bool:
        """Take back a block of :meth:`read_block`; False when ``block`` is not one."""
        if isinstance(block, memoryview) and isinstance(block.obj, mmap.mmap):
            self.buffers.put(block.obj)
            return True
        return False

    def missed(self, nbytes: int) -> None:
        """A read of ``nbytes`` of a cached file that the cache did not hold."""
        self._user.get()
        self.state.count(misses=1, miss_bytes=nbytes)

    def _drop(self, path: str, key: ChunkKey) -> None:
        """Remove a bad entry (if it is still there)."""

        def remove(state: dict) -> None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            state["used"] -= entry_size(key.length)

        try:
            self.state.update(remove)
        except OSError as exc:
            log.warning("disk cache: could not remove %s: %s", path, exc)

    # filling -------------------------------------------------------------------------------
    def offer(self, key: ChunkKey, data, crcs: tuple | None = None) -> bool:
        """Keep ``data``, the whole chunk of ``key`` just read, without holding up the reader.

        It is copied (the caller may reuse its buffer at once) and written by
        a background thread (:class:`~emberfs.client.cachefill.FillQueue`);
        False when skipped. ``crcs``: ``(CRC32Cs, block size)`` of its blocks
        as they arrived, checked, from the storage server (reused when the
        blocks are the entry's).
        """
        self._user.get()
        return self.fills.offer(key, data, crcs)

    def store(self, key: ChunkKey, data, crcs: tuple | None = None) -> bool:
        """Write the entry of ``key`` now: True when the cache holds it afterwards.

        A fill that would pass the size limit first evicts the least recently
        used entries. A failure (a full disk, EIO) is counted and logged,
        pauses the background fills, and never raises.
        """
        size = entry_size(key.length)
        if len(data) < key.length or size > self.limit:
            self.state.count(fill_skips=1)
            return False
        tmp = os.path.join(self.tmp_dir, f"{os.getpid()}-{threading.get_ident()}-{next(self._seq)}")
        linked = False

        def link(state: dict) -> None:
            nonlocal linked
            if state["used"] + size > self.limit:
                self._evict_locked(state, int(self.limit * LOW_WATER) - size)
            try:
                os.link(tmp, self.path(key))
            except FileExistsError:
                return  # another process filled it first
            state["used"] += size
            linked = True

        try:
            write_entry(tmp, data, key.length, crcs)
            self.state.update(link)
        except OSError as exc:
            self.fills.pause()
            self.state.count(fill_errors=1)
            log.warning("disk cache fill in %s failed: %s", self.directory, exc)
            return False
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if linked:
            self.state.count(fills=1, fill_bytes=key.length)
        return True

    # eviction and inspection -----------------------------------------------------------------
    def entries(self) -> list[tuple[int, int, str]]:
        """``(mtime_ns, bytes, path)`` of every entry, oldest first."""
        out = []
        for shard in os.scandir(self.data_dir):
            if not shard.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(shard.path):
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                out.append((st.st_mtime_ns, st.st_size, e.path))
        out.sort()
        return out

    def _evict_locked(self, state: dict, target: int) -> None:
        """Remove the least recently used entries until at most ``target`` bytes remain."""
        entries = self.entries()
        used = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if used <= target:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            used -= size
            state["evictions"] += 1
            state["evicted_bytes"] += size
        state["used"] = used
        self._sweep_tmp()

    def _sweep_tmp(self) -> None:
        """Remove fills that dead processes left in ``tmp/``."""
        now = time.time_ns()
        for e in os.scandir(self.tmp_dir):
            try:
                if now - e.stat(follow_symlinks=False).st_mtime_ns > STALE_TMP_NS:
                    os.unlink(e.path)
            except FileNotFoundError:
                pass

    def stats(self) -> dict:
        """The counters of every process and what the directory holds now."""
        count = 0

        def scan(state: dict) -> None:
            nonlocal count
            entries = self.entries()
            count = len(entries)
            state["used"] = sum(size for _, size, _ in entries)

        state = self.state.update(scan)
        return {"directory": self.directory, "entries": count, **state}

    def counters(self) -> dict:
        """This process's counters since it began using the cache."""
        return self.state.totals()

    def clear(self) -> int:
        """Remove every entry and zero the counters; the number of entries removed."""
        removed = 0

        def wipe(state: dict) -> None:
            nonlocal removed
            for _, _, path in self.entries():
                try:
                    os.unlink(path)
                    removed += 1
                except FileNotFoundError:
                    pass
            self._sweep_tmp()
            for name in ("used", *COUNTERS):
                state[name] = 0

        self.state.forget()
        self.state.update(wipe)
        return removed

    def flush(self, timeout: float = 30.0) -> bool:
        """Write out this process's waiting fills and add up its counters; False on timeout."""
        done = self.fills.wait(timeout)
        self.state.flush()
        return done

    def close(self) -> None:
        """:meth:`flush` as a process ends or a client closes (30 s at most; never raises)."""
        self.fills.wait(30.0)
        try:
            self.state.flush()
        except OSError as exc:
            log.warning("disk cache %s: could not add up counters: %s", self.directory, exc)

    def __repr__(self) -> str:
        return f"DiskCache({self.directory!r}, {self.limit})"


_opened: dict[tuple[str, int], DiskCache] = {}
_opened_lock = threading.Lock()


def _after_fork() -> None:
    global _opened_lock
    _opened_lock = threading.Lock()  # a thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork)


def open_cache(directory: str, size: int | str) -> DiskCache:
    """The cache in ``directory`` holding at most ``size`` bytes (``"20G"`` too).

    Every client of a process that names the same directory and size shares
    one :class:`DiskCache` (one fill thread, one set of counters).

    Raises
    ------
    ValueError
        ``size`` is not a positive size.
    OSError
        The directory cannot be used (see :class:`DiskCache`).
    """
    if isinstance(size, str):
        try:
            size = parse_size(size)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"cache_size: {exc}") from None
    key = (os.path.abspath(os.path.expanduser(str(directory))), int(size))
    with _opened_lock:
        cache = _opened.get(key)
        if cache is None:
            cache = _opened[key] = DiskCache(*key)
        return cache


def _when_process_ends(fn) -> None:
    """Call ``fn`` as this process ends, also when it is a multiprocessing child."""
    from multiprocessing import util

    util.Finalize(None, fn, exitpriority=10)
