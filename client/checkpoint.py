"""PyTorch distributed checkpoints on EmberFS that are never seen half-written.

``torch.distributed.checkpoint`` (DCP) writes a checkpoint as a directory: one
file per rank (or per item) and a ``.metadata`` file, written last by the
coordinator. Its fsspec writer writes straight into the checkpoint's
directory, so a save that dies part-way leaves a mixture: files of the new
save beside the previous ``.metadata``, or no ``.metadata`` at all.

:class:`CheckpointWriter` is DCP's fsspec writer with one change: every rank
writes into a staging directory beside the checkpoint (``.NAME.staging``),
and when the coordinator has written ``.metadata`` there it publishes the
whole directory in one metaserver transaction: a rename when the checkpoint
is new, an exchange of the two directories (``EmberFileSystem.exchange``)
when it replaces one. Only then is the previous checkpoint, now under the
staging name, removed. Neither it nor a staging leftover goes to the
metaserver's trash (``skip_trash``): a job saving every half hour would keep
a day of old checkpoints there. A save killed at any point (``kill -9`` of any rank)
leaves the checkpoint's path holding the previous checkpoint or the new one,
complete; a leftover staging directory is cleared by the next save to the
same path. DCP's ``FsspecReader`` reads it; :class:`CheckpointReader` reads it
faster: DCP deserializes one item after another, each read from the stream
with seeks and small reads, so the network waits for the CPU and the CPU for
the network. The reader fetches the items' byte ranges ahead, in the order
DCP asks for them, a bounded number of bytes at a time, so the transfers run
on the client's threads while DCP deserializes the item before.

One save to a given path runs at a time (the coordinator clears the staging
directory when it plans a save). Saves must use collectives (DCP's default),
so that one coordinator publishes the checkpoint once every rank has written.

``sync_files`` defaults to False: a file on EmberFS is on every replica of
its chains when ``close()`` returns, so there is nothing for an fsync to wait
for (and an EmberFS stream has no file descriptor to fsync).
"""

from __future__ import annotations

import ctypes
import io
import os
import struct
import threading
import zipfile
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.planner import LoadItemType

from emberfs.client.buffers import BlockPool
from emberfs.client.chunkio import wait_all
from emberfs.client.paths import strip_protocol
from emberfs.proto import meta_pb2

METADATA = ".metadata"
MiB = 1 << 20
#: Tensor items from this size on are read straight into their tensors.
DIRECT_MIN = 1 * MiB


def staging_path(path: str | os.PathLike) -> str:
    """The staging directory of a checkpoint path: ``.NAME.staging`` beside it."""
    text = os.fspath(path)
    scheme, netloc, rest = "", "", text
    if "://" in text:
        scheme, _, rest = text.partition("://")
        netloc, _, rest = rest.partition("/")
        scheme, rest = f"{scheme}://{netloc}", "/" + rest
    head, sep, name = rest.rstrip("/").rpartition("/")
    if not name or name in (".", ".."):
        raise ValueError(f"a checkpoint needs a directory name of its own: {path!r}")
    return f"{scheme}{head}{sep}.{name}.staging"


class CheckpointWriter(FsspecWriter):
    """DCP's fsspec storage writer, publishing each checkpoint whole.

    ``path`` is the checkpoint's directory (an ``emberfs://`` URL or a path of
    the filesystem that ``storage_options`` configure); the other arguments
    are :class:`FsspecWriter`'s. ``overwrite=False`` refuses to replace an
    existing checkpoint. ``thread_count`` is 4 (DCP's default is 1): each
    rank writes four files at once, whose chunks go to more chains at once.
    """

    def __init__(
        self, path: str | os.PathLike, *, sync_files: bool = False, thread_count: int = 4, **kwargs
    ) -> None:
        self.final_path = os.fspath(path)
        super().__init__(
            staging_path(path), sync_files=sync_files, thread_count=thread_count, **kwargs
        )

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.final_path = os.fspath(checkpoint_id)
            checkpoint_id = staging_path(checkpoint_id)
        super().reset(checkpoint_id)

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self.final_path

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        if not kwargs.get("use_collectives", True):
            raise ValueError(
                "CheckpointWriter publishes a checkpoint once every rank has written: "
                "save with collectives (use_collectives=True)"
            )
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)

    def _metadata_exists(self) -> bool:
        # DCP's overwrite check: about the published checkpoint, not the staging directory
        return self.fs.exists(self.fs.concat_path(self.final_path, METADATA))

    def prepare_global_plan(self, plans):
        # The coordinator runs this once every rank has planned (and made the staging
        # directory) and before any rank writes: a leftover of a killed save goes here.
        self.fs.fs.rm(self.path, recursive=True, skip_trash=True)
        self.fs.mkdir(self.path)
        return super().prepare_global_plan(plans)

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)  # writes .metadata into the staging directory
        fs = self.fs.fs
        if fs.exists(self.final_path):
            fs.exchange(self.path, self.final_path)
            fs.rm(self.path, recursive=True, skip_trash=True)  # the previous checkpoint
        else:
            fs.mv(self.path, self.final_path)


class CheckpointReader(FsspecReader):
    """DCP's fsspec storage reader, reading tensors straight into the state dict.

    DCP's own reader deserializes one item after another (``torch.load`` of
    its bytes into a new tensor, then a copy into the state dict's tensor),
    each read from the stream with seeks and small reads, so the network
    waits for the CPU and the CPU for the network. This reader:

    * reads a large tensor item's bytes straight into the tensor it loads
      into, when that tensor is a contiguous CPU tensor of the saved dtype
      and shape (the item's header, a few KiB at its ends, tells where its
      bytes are): no deserialization, no copy, ``threads`` items at a time;
    * fetches every other item (small tensors, other objects, tensors that
      need reshaping) ahead, at most ``ahead`` bytes not yet deserialized,
      into buffers that later items reuse (a fresh buffer per item would
      cost the first touch of all its pages, more than the transfer).

    Each file of the checkpoint is opened once. :attr:`direct_bytes` and
    :attr:`fetched_bytes` count the bytes of the last load each way. Other
    arguments are :class:`FsspecReader`'s.
    """

    def __init__(
        self, path: str | os.PathLike, *, ahead: int = 256 * MiB, threads: int = 2, **kwargs
    ):
        super().__init__(path, **kwargs)
        self.ahead, self.threads = ahead, threads
        self.fetcher: ItemFetcher | None = None
        self.direct_bytes = self.fetched_bytes = 0

    def read_data(self, plan, planner):
        by_file: dict[str, list] = {}
        for req in plan.items:  # grouped by file, in the order DCP reads them
            by_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        reqs = [req for group in by_file.values() for req in group]
        files = OpenFiles(self.fs.fs.client, strip_protocol(os.fspath(self.path)))
        if any(self.storage_data[r.storage_index].transform_descriptors for r in reqs):
            # transformed items (compressed, say): DCP reads them, from bytes fetched ahead
            self.fetcher = ItemFetcher(
                [self.key(r) for r in reqs], files.read_into, self.ahead, self.threads
            )
            try:
                return super().read_data(plan, planner)
            finally:
                self.fetcher.close()
                self.fetcher = None
        direct, fetched = [], []
        for req in reqs:
            target = None
            if (
                req.type == LoadItemType.TENSOR
                and self.storage_data[req.storage_index].length >= DIRECT_MIN
            ):
                target = planner.resolve_tensor(req).detach()
                where = direct_range(files, self.key(req), req, target)
                if where is not None:
                    direct.append((req, target, where))
                    continue
            fetched.append((req, target))
        self.direct_bytes = sum(w[2] for _, _, w in direct)
        self.fetched_bytes = sum(self.key(r)[2] for r, _ in fetched)
        fetcher = ItemFetcher(
            [self.key(r) for r, _ in fetched], files.read_into, self.ahead, self.threads
        )
        pool = ThreadPoolExecutor(max(1, self.threads), thread_name_prefix="emberfs-ckpt")
        try:
            reads = [
                (r, t, pool.submit(files.read_into, w, tensor_memory(t))) for r, t, w in direct
            ]
            for req, target in fetched:
                self.load_item(planner, req, target, ViewReader(fetcher.take(self.key(req))))
            for req, target, read in reads:
                read.result()
                planner.commit_tensor(req, target)
        finally:
            fetcher.close()
            pool.shutdown(wait=True, cancel_futures=True)
        done = torch.futures.Future()
        done.set_result(None)
        return done

    def key(self, req) -> tuple[str, int, int]:
        info = self.storage_data[req.storage_index]
        return (info.relative_path, info.offset, info.length)

    @staticmethod
    def load_item(planner, req, target, data: ViewReader) -> None:
        """Deserialize one item (as DCP does) and hand it to the planner."""
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(data.read()))
            return
        tensor = torch.load(data, map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        if target is None:
            target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise ValueError(
                f"checkpoint item {req.storage_index} has size {tuple(tensor.size())}, "
                f"the state dict's tensor {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)

    def _slice_file(self, file, sinfo):
        if self.fetcher is None:  # DCP read outside read_data
            return super()._slice_file(file, sinfo)
        return ViewReader(self.fetcher.take((sinfo.relative_path, sinfo.offset, sinfo.length)))


def tensor_memory(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable."""
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def direct_range(files: OpenFiles, key: tuple[str, int, int], req, target) -> tuple | None:
    """Where in its file the bytes of ``target`` are, or None when they cannot be read as they lie.

    The item is one ``torch.save`` of a tensor: a zip archive whose records
    are stored uncompressed. Its central directory (at the end) and the data
    record's local header give where the record's bytes start; its pickle (at
    the start) the tensor's dtype, shape, strides and storage offset, read
    with ``map_location="meta"`` (no data).
    """
    name, offset, length = key
    if target.device.type != "cpu" or not target.is_contiguous() or any(req.storage_offsets):
        return None
    header = ItemHeader(files, key)
    with zipfile.ZipFile(header) as archive:
        records = [i for i in archive.infolist() if "/data/" in f"/{i.filename}"]
    if len(records) != 1 or records[0].compress_type != zipfile.ZIP_STORED:
        return None
    header.seek(records[0].header_offset)
    local = header.read(30)  # the record's local header: its name and extra field follow it
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        return None
    name_n, extra_n = struct.unpack_from("<HH", local, 26)
    record_offset = records[0].header_offset + 30 + name_n + extra_n
    header.seek(0)
    saved = torch.load(header, map_location="meta", weights_only=True)
    if not (
        isinstance(saved, torch.Tensor)
        and saved.dtype == target.dtype
        and tuple(saved.shape) == tuple(req.lengths) == tuple(target.shape)
        and saved.is_contiguous()
    ):
        return None
    start = offset + record_offset + saved.storage_offset() * saved.element_size()
    return (name, start, target.numel() * target.element_size())


class SeekableReader(io.RawIOBase):
    """A seekable, read-only file of ``length`` bytes; subclasses read into ``b`` at :attr:`pos`."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length, self.pos = length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.pos = base + offset
        return self.pos


class ViewReader(SeekableReader):
    """A file over a buffer: what ``torch.load`` reads an item from."""

    def __init__(self, view: memoryview) -> None:
        super().__init__(len(view))
        self.view = view

    def readinto(self, b) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), len(self.view) - self.pos))
        out[:n] = self.view[self.pos : self.pos + n]
        self.pos += n
        return n


class ItemHeader(SeekableReader):
    """An item read for its header: its first and last bytes held, any other range fetched."""

    EDGE = 64 * 1024

    def __init__(self, files: OpenFiles, key: tuple[str, int, int]) -> None:
        super().__init__(key[2])
        self.files, self.name, self.offset = files, key[0], key[1]
        head_n = min(self.EDGE, self.length)
        tail_n = min(self.EDGE, self.length - head_n)
        self.head, self.tail = bytearray(head_n), bytearray(tail_n)
        files.read_into((self.name, self.offset, head_n), memoryview(self.head))
        if tail_n:
            at = self.offset + self.length - tail_n
            files.read_into((self.name, at, tail_n), memoryview(self.tail))

    def readinto(self, b) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), self.length - self.pos))
        lo, hi = self.pos, self.pos + n
        tail_at = self.length - len(self.tail)
        if hi <= len(self.head):
            out[:n] = self.head[lo:hi]
        elif lo >= tail_at:
            out[:n] = self.tail[lo - tail_at : hi - tail_at]
        elif n:
            self.files.read_into((self.name, self.offset + lo, n), out[:n])
        self.pos = hi
        return n


class OpenFiles:
    """The files of one checkpoint directory, each opened once for reading."""

    def __init__(self, client, directory: str) -> None:
        self.client, self.directory = client, directory.rstrip("/")
        self.handles: dict[str, object] = {}
        self.lock = threading.Lock()

    def read_into(self, key: tuple[str, int, int], view: memoryview) -> None:
        name, offset, _length = key
        with self.lock:
            handle = self.handles.get(name)
            if handle is None:
                handle = self.client.open(f"{self.directory}/{name}", meta_pb2.OPEN_READ)
                self.handles[name] = handle
        if offset + len(view) > handle.size:
            raise EOFError(f"{self.directory}/{name} ends before byte {offset + len(view)}")
        wait_all(self.client.files.submit_into(handle, offset, view))


class ItemFetcher:
    """Byte ranges read ahead in an expected order, at most ``ahead`` bytes not yet taken.

    ``order`` lists ``(name, offset, length)`` keys; ``read_into(key, view)``
    fills a buffer of ``length`` bytes. :meth:`take` waits for a range
    (starting it now if it was not started) and starts the next ones in the
    window. A range asked for twice is read once. The buffer :meth:`take`
    returns stays valid until the next :meth:`take`; buffers of the ranges
    taken for the last time are reused for later ones of the same length.
    """

    def __init__(self, order: list, read_into, ahead: int, threads: int) -> None:
        self.order, self.read_into, self.ahead = order, read_into, max(1, ahead)
        self.uses = Counter(order)
        self.started: dict[tuple, Future] = {}
        self.next = 0  # index in order of the next range to start
        self.held = 0  # bytes started and not yet taken for the last time
        self.spare = BlockPool(ahead)  # reusable buffers by length, at most ahead of them
        self.lent: bytearray | None = None  # the buffer of the range taken last
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="emberfs-ckpt")
        self.fill()

    def start(self, key) -> Future:
        fut = self.started.get(key)
        if fut is None:
            buf = self.spare.get(key[2])
            fut = self.started[key] = self.pool.submit(self.read, key, buf)
            self.held += key[2]
        return fut

    def read(self, key, buf: bytearray) -> bytearray:
        self.read_into(key, memoryview(buf))
        return buf

    def fill(self) -> None:
        with self.lock:
            while self.next < len(self.order) and (self.held < self.ahead or not self.started):
                key = self.order[self.next]
                self.next += 1
                if self.uses[key] > 0:  # not taken already (out of order) for the last time
                    self.start(key)

    def take(self, key) -> memoryview:
        with self.lock:
            lent, self.lent = self.lent, None
            if lent is not None:
                self.spare.put(lent)  # the caller is done with it
            fut = self.start(key)
        buf = fut.result()
        with self.lock:
            self.uses[key] -= 1
            if self.uses[key] <= 0:
                self.started.pop(key, None)
                self.held -= key[2]
                self.lent = buf
        self.fill()
        return memoryview(buf)

    def close(self) -> None:
        for fut in self.started.values():
            fut.cancel()
        self.pool.shutdown(wait=True)
