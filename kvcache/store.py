"""The KV cache block store: fixed-size blocks under opaque keys, in the slab files of a directory.

A cache is a directory holding slab files, preallocated (sparse) files whose
blocks sit at fixed slots (:mod:`emberfs.common.kvgeometry`), and an index
from key to ``(slot, generation, CRC32C)`` that the metaserver keeps in its
store (:mod:`emberfs.metaserver.kvcache.index`), so every inference server that
opens the cache shares it. Block bytes never pass through the metaserver:

* :meth:`KVCache.batch_get` asks the index once for every key (``KvLookup``,
  which also hands out the read capabilities of the slabs), then reads every
  hit from its slab's chains in parallel, straight into the caller's
  buffers, and checks each block's CRC32C against the index: a slot evicted
  and written again while it was read is a miss, never another key's bytes.
* :meth:`KVCache.batch_put` reserves a slot for every new key in one call
  (``KvReserve``: the first writer of a key wins, a full cache evicts its
  least recently used blocks), writes the blocks to their slots in parallel,
  then commits them in one call (``KvCommit``); only committed blocks are
  found by readers.
* :meth:`KVCache.batch_exists` is the length of the longest stored prefix of
  the keys (one ``KvLookup`` that reads nothing).

One :class:`KVCache` may be shared by threads, and survives ``os.fork``
(each process builds its own connections, as the filesystem does).
"""

from __future__ import annotations

import enum
import errno
import posixpath
import re
from collections.abc import Sequence
from concurrent.futures import wait
from dataclasses import dataclass

import crc32c

from emberfs.client.fs import EmberFileSystem
from emberfs.client.meta import MetaClient
from emberfs.client.paths import strip_protocol
from emberfs.common import kvgeometry
from emberfs.common.layout import MAX_STRIPE
from emberfs.kvcache.transfers import (
    BlockTransfer,
    batches,
    plan_transfers,
    read_failed,
    storage_failure,
)
from emberfs.proto import common_pb2, kvcache_pb2, meta_pb2

SLAB_NAME = "slab-{:05d}"
_SLAB_FILE = re.compile(r"slab-\d{5}")


class PutStatus(enum.IntEnum):
    """What :meth:`KVCache.batch_put` did with one key."""

    STORED = 1  # this call stored the block
    EXISTS = 2  # the key was stored already (the first writer wins)
    BUSY = 3  # another writer is storing the key now
    FULL = 4  # no slot free and nothing the cache could evict
    FAILED = 5  # the block could not be written (storage unavailable); the key is not stored

    @property
    def present(self) -> bool:
        """Whether the key is (or is being) stored."""
        return self in (PutStatus.STORED, PutStatus.EXISTS, PutStatus.BUSY)


_RESERVE_STATES = {
    kvcache_pb2.KV_EXISTS: PutStatus.EXISTS,
    kvcache_pb2.KV_BUSY: PutStatus.BUSY,
    kvcache_pb2.KV_FULL: PutStatus.FULL,
}


@dataclass(frozen=True)
class KVStats:
    """A cache's counters (since it was made) and its use."""

    block_size: int
    capacity_blocks: int
    used_blocks: int
    used_bytes: int
    hits: int
    misses: int
    hit_bytes: int
    puts: int
    put_bytes: int
    evictions: int
    slab_files: int
    slabs_used: int

    @property
    def hit_rate(self) -> float:
        """Hits over lookups that read (0 before any)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_blocks * self.block_size


def as_key(key: bytes | str) -> bytes:
    """A key as the index stores it: bytes as they are, a str in UTF-8."""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(f"a key is bytes or str, not {type(key).__name__}")


def _view(buf, writable: bool) -> memoryview:
    view = memoryview(buf)
    if writable and view.readonly:
        raise ValueError("a get needs writable buffers")
    if not view.contiguous:
        raise ValueError("a block buffer must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class KVCache:
    """A KV cache block store in the directory ``path`` of an EmberFS cluster.

    Open one that exists with ``KVCache(path)``; make one with
    :meth:`create`.

    Parameters
    ----------
    path : str
        The cache directory.
    fs : EmberFileSystem, optional
        The filesystem to use; by default one is made with ``fs_options``
        (``meta``, ``token``, and the options of :class:`EmberFileSystem`).
        The cache moves its blocks through the filesystem's
        :class:`~emberfs.client.core.Client` (``fs.client``).
    info : KvCacheInfo, optional
        The cache's description, when the caller has it (no ``KvOpen`` call).

    Attributes
    ----------
    block_size : int
        The largest block a key takes.
    capacity : int
        Blocks the cache holds at most.
    """

    def __init__(
        self,
        path: str,
        fs: EmberFileSystem | None = None,
        *,
        info: kvcache_pb2.KvCacheInfo | None = None,
        **fs_options,
    ) -> None:
        self.fs = fs if fs is not None else EmberFileSystem(**fs_options)
        self.client = self.fs.client
        self.path = strip_protocol(path)
        if info is None:
            req = kvcache_pb2.KvOpenRequest(ctx=self._meta.context(), path=self.path)
            info = self._meta.meta("KvOpen", req, self.path)
        self.info = info
        self.cache_id = info.cache_id
        self.geometry = info.geometry
        self.block_size = info.geometry.block_size
        self.capacity = info.geometry.capacity_slots
        self.slabs = [(s.inode, list(s.chains)) for s in info.slabs]

    @classmethod
    def create(
        cls,
        path: str,
        *,
        block_size: int,
        capacity: int,
        slab_size: int = kvgeometry.DEFAULT_SLAB_SIZE,
        exist_ok: bool = False,
        mode: int = 0o755,
        fs: EmberFileSystem | None = None,
        **fs_options,
    ) -> KVCache:
        """Make a cache of ``capacity`` bytes of ``block_size`` blocks at ``path`` and open it.

        Parameters
        ----------
        path : str
            The cache directory (made, with its parents, when missing).
        block_size : int
            Bytes of one block (:class:`~emberfs.kvcache.layout.KVLayout` gives a model's).
        capacity : int
            Bytes the cache may hold; it holds ``capacity // stride`` blocks,
            the stride being the block size rounded up to 4 KiB.
        slab_size : int, default 1 GiB
            About how large each slab file is; each writer fills a slab of
            its own first.
        exist_ok : bool, default False
            Open a cache already at ``path`` (with the same block size)
            instead of raising FileExistsError.
        mode : int, default 0o755
            Permission bits of a new directory: who may read (get) and write
            (put, delete) the cache.
        fs : EmberFileSystem, optional
        """
        fs = fs if fs is not None else EmberFileSystem(**fs_options)
        path = strip_protocol(path)
        meta = fs.client.meta
        try:
            existing = cls(path, fs=fs)
        except FileNotFoundError:
            pass
        else:
            if not exist_ok:
                raise FileExistsError(errno.EEXIST, "a KV cache exists already", path)
            if existing.block_size != block_size:
                raise FileExistsError(
                    errno.EEXIST,
                    f"a KV cache of {existing.block_size}-byte blocks exists already",
                    path,
                )
            return existing
        try:
            geometry = kvgeometry.plan(block_size, capacity, slab_size)
        except ValueError as exc:
            raise ValueError(f"cannot make a KV cache at {path}: {exc}") from None
        # an existing directory is taken only when it holds nothing but slab files: made by
        # another process creating the cache at the same time, or left by an interrupted
        # create (the slabs and the index are made idempotently)
        meta.mkdir(path, parents=True, mode=mode)
        others = [e.name for e in meta.list(path) if not _SLAB_FILE.fullmatch(e.name)]
        if others:
            raise FileExistsError(
                errno.EEXIST, f"the directory holds other entries ({others[0]!r})", path
            )
        layout = common_pb2.Layout(chunk_size=geometry.chunk_size, stripe=MAX_STRIPE)
        meta.meta(
            "SetLayout",
            meta_pb2.SetLayoutRequest(ctx=meta.context(), path=path, layout=layout),
            path,
        )
        slabs = []
        for n in range(kvgeometry.slab_count(geometry)):
            slab = posixpath.join(path, SLAB_NAME.format(n))
            req = meta_pb2.CreateRequest(ctx=meta.context(), path=slab, mode=0o644)
            attr = meta.meta("Create", req, slab).attr
            if attr.layout.chunk_size != geometry.chunk_size:
                raise FileExistsError(errno.EEXIST, "a file of another layout is in the way", slab)
            length = kvgeometry.slab_bytes(geometry, kvgeometry.slab_capacity(geometry, n))
            if attr.size > length:
                raise FileExistsError(errno.EEXIST, "a larger file is in the way", slab)
            if attr.size < length:
                meta.truncate(slab, length)  # grows it as a hole: nothing is written
            slabs.append(attr.inode)
        req = kvcache_pb2.KvCreateRequest(
            ctx=meta.context(), path=path, geometry=geometry, slabs=slabs
        )
        return cls(path, fs=fs, info=meta.meta("KvCreate", req, path))

    @classmethod
    def open_or_create(
        cls,
        path: str,
        *,
        block_size: int | None,
        capacity: int,
        fs: EmberFileSystem | None = None,
        **create_options,
    ) -> KVCache | None:
        """The cache at ``path``, made when missing (None when missing and ``block_size`` is None).

        Many processes (the ranks of an inference server) may call it at once
        with the same arguments: they all get the one cache.
        """
        fs = fs if fs is not None else EmberFileSystem()
        try:
            return cls(path, fs=fs)
        except FileNotFoundError:
            if block_size is None:
                return None
        return cls.create(
            path, block_size=block_size, capacity=capacity, exist_ok=True, fs=fs, **create_options
        )

    @property
    def _meta(self) -> MetaClient:
        return self.client.meta

    def _plan(self, blocks: list[tuple[int, memoryview]], slots: int, rt) -> list[BlockTransfer]:
        """The transfers of ``blocks``, those less than ``slots`` slot strides apart together."""
        gap = slots * self.geometry.stride - 1
        return plan_transfers(self.geometry, self.slabs, blocks, gap, rt.blocks)

    def _learn(self, capabilities) -> None:
        caps = self._meta.capabilities
        for token in capabilities:
            caps.learn(token)

    # reads ------------------------------------------------------------------------------------
    def batch_get(self, keys: Sequence[bytes | str], into: Sequence | None = None) -> list:
        """Read the blocks of ``keys``: one index call, then every block in parallel.

        Parameters
        ----------
        keys : sequence of bytes or str
        into : sequence of writable buffers, optional
            One per key (bytearray, numpy array, pinned host memory...): the
            block is read straight into it. A block longer than its buffer is
            not read (a miss).

        Returns
        -------
        list
            Per key: with ``into``, the length of the block read into its
            buffer, or None for a miss; without, the block (a bytearray) or None.
            A block that cannot be read (storage unavailable, or damaged) is
            a miss, never wrong bytes.
        """
        keys = [as_key(k) for k in keys]
        views = None
        if into is not None:
            if len(into) != len(keys):
                raise ValueError("batch_get needs one buffer per key")
            views = [_view(b, writable=True) for b in into]
        if views is None:
            return [got for part in batches(keys) for got in self._get_part(part, None)]
        return [
            got
            for part, part_views in zip(batches(keys), batches(views), strict=True)
            for got in self._get_part(part, part_views)
        ]

    def _lookup(self, keys: list[bytes], **flags) -> kvcache_pb2.KvLookupResponse:
        """One ``KvLookup`` of ``keys`` (``prefix``, ``touch`` as the request takes them)."""
        req = kvcache_pb2.KvLookupRequest(
            ctx=self._meta.context(), cache_id=self.cache_id, keys=keys, **flags
        )
        return self._meta.meta("KvLookup", req, self.path)

    def _get_part(self, keys: list[bytes], views: list[memoryview] | None) -> list:
        resp = self._lookup(keys, touch=True)
        self._learn(resp.capabilities)
        rt = self.client.runtime()
        hits: list[tuple[int, kvcache_pb2.KvLocation, memoryview]] = []
        for i, loc in enumerate(resp.locations):
            if not loc.found:
                continue
            if views is None:
                dest = memoryview(bytearray(loc.length))
            elif len(views[i]) < loc.length:
                continue  # the block does not fit its buffer (another layout's): a miss
            else:
                dest = views[i][: loc.length]
            hits.append((i, loc, dest))
        # blocks of one chunk with at most one other slot between them are read as one
        # range, then copied apart: fewer, larger requests for small blocks
        transfers = self._plan([(loc.slot, dest) for _, loc, dest in hits], 2, rt)
        for t in transfers:
            t.io.need = t.io.length  # every byte of a stored block was written
        futures = [rt.executor.submit(rt.data.read, t.io) for t in transfers]
        wait(futures)
        failed: set[int] = set()  # hits (by their number in ``hits``) not read
        dests = [dest for _, _, dest in hits]
        for t, fut in zip(transfers, futures, strict=True):
            if read_failed(fut):
                failed.update(t.blocks())
            else:
                t.scatter(dests)
            t.release(rt.blocks)
        jobs = [(i, loc, dest) for h, (i, loc, dest) in enumerate(hits) if h not in failed]
        out: list = [None] * len(keys)
        damaged: list[tuple[bytes, int]] = []
        for i, loc, dest in jobs:  # the others were unreadable now: misses
            if crc32c.crc32c(dest) != loc.crc:
                # evicted and reused while read, or damaged: dropped if it is still this block
                damaged.append((keys[i], loc.generation))
                continue
            out[i] = loc.length if views is not None else dest.obj
        if damaged:
            self._drop(damaged)
        return out

    def _drop(self, damaged: list[tuple[bytes, int]]) -> None:
        req = kvcache_pb2.KvDeleteRequest(
            ctx=self._meta.context(),
            cache_id=self.cache_id,
            keys=[k for k, _ in damaged],
            generations=[g for _, g in damaged],
        )
        try:
            self._meta.meta("KvDelete", req, self.path)
        except PermissionError:
            pass  # a reader without write permission leaves it; lookups keep missing it

    def get(self, key: bytes | str, into=None):
        """The block of one key (see :meth:`batch_get`)."""
        return self.batch_get([key], None if into is None else [into])[0]

    def batch_exists(self, keys: Sequence[bytes | str]) -> int:
        """How many leading ``keys`` are stored (the longest cached prefix); reads no block."""
        keys = [as_key(k) for k in keys]
        found = 0
        for part in batches(keys):
            n = self._lookup(part, prefix=True).found
            found += n
            if n < len(part):
                break
        return found

    def contains(self, keys: Sequence[bytes | str]) -> list[bool]:
        """Per key whether it is stored (not only the prefix); reads no block."""
        keys = [as_key(k) for k in keys]
        return [loc.found for part in batches(keys) for loc in self._lookup(part).locations]

    def exists(self, key: bytes | str) -> bool:
        """Whether one key is stored."""
        return self.contains([key])[0]

    # writes -----------------------------------------------------------------------------------
    def batch_put(self, keys: Sequence[bytes | str], buffers: Sequence) -> list[PutStatus]:
        """Store blocks under ``keys``: one reservation, parallel writes, one commit.

        A key stored already keeps its block (the first writer wins), so a
        put is idempotent. Returns a :class:`PutStatus` per key; a block is
        found by readers once its status is STORED (or EXISTS).
        """
        keys = [as_key(k) for k in keys]
        if len(buffers) != len(keys):
            raise ValueError("batch_put needs one buffer per key")
        views = [_view(b, writable=False) for b in buffers]
        for v in views:
            if not 0 < len(v) <= self.block_size:
                raise ValueError(
                    f"a block of {len(v)} bytes (the cache takes 1 to {self.block_size})"
                )
        return [
            status
            for part, part_views in zip(batches(keys), batches(views), strict=True)
            for status in self._put_part(part, part_views)
        ]

    def _put_part(self, keys: list[bytes], views: list[memoryview]) -> list[PutStatus]:
        meta = self._meta
        req = kvcache_pb2.KvReserveRequest(
            ctx=meta.context(),
            cache_id=self.cache_id,
            keys=keys,
            lengths=[len(v) for v in views],
        )
        resp = meta.meta("KvReserve", req, self.path)
        if len(resp.reservations) != len(keys):
            raise OSError(errno.EIO, "KvReserve answered for the wrong number of keys")
        self._learn(resp.capabilities)
        rt = self.client.runtime()
        out = [PutStatus.FAILED] * len(keys)
        jobs = []  # (key number, reservation)
        for i, r in enumerate(resp.reservations):
            if r.state == kvcache_pb2.KV_RESERVED:
                jobs.append((i, r))
            else:
                out[i] = _RESERVE_STATES.get(r.state, PutStatus.FAILED)
        if not jobs:
            return out
        # blocks in consecutive slots of one chunk are written as one range (a slot's
        # padding past its block is its own), so a chunk is rewritten once, not per block
        sources = [views[i] for i, _ in jobs]
        transfers = self._plan(
            [(r.slot, v) for (_, r), v in zip(jobs, sources, strict=True)], 1, rt
        )
        for t in transfers:
            t.gather(sources)
        futures = [rt.executor.submit(rt.data.write, t.io) for t in transfers]
        crcs = [crc32c.crc32c(v) for v in sources]
        wait(futures)
        for t in transfers:
            t.release(rt.blocks)
        unwritten: set[int] = set()  # jobs (by number) a transfer of which failed
        refused: BaseException | None = None
        for t, fut in zip(transfers, futures, strict=True):
            exc = fut.exception()
            if exc is None:
                continue
            if not storage_failure(exc):
                refused = refused or exc
            unwritten.update(t.blocks())
        items = [
            kvcache_pb2.KvCommitItem(
                key=keys[i], generation=r.generation, crc=crc, written=n not in unwritten
            )
            for n, ((i, r), crc) in enumerate(zip(jobs, crcs, strict=True))
        ]
        # blocks that were not written give their slots back in the same call
        req = kvcache_pb2.KvCommitRequest(ctx=meta.context(), cache_id=self.cache_id, items=items)
        done = meta.meta("KvCommit", req, self.path).committed
        if len(done) != len(items):
            raise OSError(errno.EIO, "KvCommit answered for the wrong number of keys")
        if refused is not None:
            raise refused
        for (i, _), item, ok in zip(jobs, items, done, strict=True):
            out[i] = PutStatus.STORED if ok and item.written else PutStatus.FAILED
        return out

    def put(self, key: bytes | str, buffer) -> PutStatus:
        """Store one block (see :meth:`batch_put`)."""
        return self.batch_put([key], [buffer])[0]

    def delete(self, keys: Sequence[bytes | str]) -> int:
        """Remove keys; their slots are reused. How many stored blocks went."""
        keys = [as_key(k) for k in keys]
        total = 0
        for part in batches(keys):
            req = kvcache_pb2.KvDeleteRequest(
                ctx=self._meta.context(), cache_id=self.cache_id, keys=part
            )
            total += self._meta.meta("KvDelete", req, self.path).deleted
        return total

    def clear(self) -> int:
        """Remove every key (the slab files stay, for reuse). How many stored blocks went."""
        req = kvcache_pb2.KvClearRequest(ctx=self._meta.context(), cache_id=self.cache_id)
        return self._meta.meta("KvClear", req, self.path).deleted

    def keys(self, start_after: bytes | str = b"", page: int = 1000):
        """Every stored key, in byte order, a page per index call."""
        after = as_key(start_after) if start_after else b""
        while True:
            req = kvcache_pb2.KvListRequest(
                ctx=self._meta.context(), cache_id=self.cache_id, start_after=after, limit=page
            )
            resp = self._meta.meta("KvList", req, self.path)
            yield from resp.keys
            if not resp.more or not resp.keys:
                return
            after = resp.keys[-1]

    def stats(self) -> KVStats:
        """The cache's counters and use."""
        req = kvcache_pb2.KvStatsRequest(ctx=self._meta.context(), cache_id=self.cache_id)
        resp = self._meta.meta("KvStats", req, self.path)
        s = resp.stats
        return KVStats(
            block_size=self.block_size,
            capacity_blocks=self.capacity,
            used_blocks=s.used_blocks,
            used_bytes=s.used_bytes,
            hits=s.hits,
            misses=s.misses,
            hit_bytes=s.hit_bytes,
            puts=s.puts,
            put_bytes=s.put_bytes,
            evictions=s.evictions,
            slab_files=len(self.slabs),
            slabs_used=s.slabs_used,
        )

    def destroy(self) -> None:
        """Remove the cache: its directory with the slab files (the index goes with it)."""
        self._meta.remove(self.path, recursive=True, directory=True)

    def __repr__(self) -> str:
        return (
            f"KVCache({self.path!r}, block_size={self.block_size}, capacity={self.capacity} blocks)"
        )
