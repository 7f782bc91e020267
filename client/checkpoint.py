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
staging name, removed. A save killed at any point (``kill -9`` of any rank)
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

import io
import os
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor

from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader, FsspecWriter

METADATA = ".metadata"
MiB = 1 << 20


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
    existing checkpoint.
    """

    def __init__(self, path: str | os.PathLike, *, sync_files: bool = False, **kwargs) -> None:
        self.final_path = os.fspath(path)
        super().__init__(staging_path(path), sync_files=sync_files, **kwargs)

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
        self.fs.fs.rm(self.path, recursive=True)
        self.fs.mkdir(self.path)
        return super().prepare_global_plan(plans)

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)  # writes .metadata into the staging directory
        fs = self.fs.fs
        if fs.exists(self.final_path):
            fs.exchange(self.path, self.final_path)
            fs.rm(self.path, recursive=True)  # the previous checkpoint
        else:
            fs.mv(self.path, self.final_path)


class CheckpointReader(FsspecReader):
    """DCP's fsspec storage reader, fetching items ahead of DCP's deserialization.

    ``ahead`` bytes of items are fetched (``fs.cat_file`` of each item's range,
    ``threads`` at a time) before DCP asks for them. Other arguments are
    :class:`FsspecReader`'s.
    """

    def __init__(
        self, path: str | os.PathLike, *, ahead: int = 256 * MiB, threads: int = 2, **kwargs
    ):
        super().__init__(path, **kwargs)
        self.ahead, self.threads = ahead, threads
        self.fetcher: ItemFetcher | None = None

    def read_data(self, plan, planner):
        per_file: dict[str, list[tuple[str, int, int]]] = {}
        for item in plan.items:  # grouped by file, in the order DCP reads them
            info = self.storage_data[item.storage_index]
            per_file.setdefault(info.relative_path, []).append(
                (info.relative_path, info.offset, info.length)
            )
        fetch = self.fs.fs.cat_file
        base = os.fspath(self.path).rstrip("/")
        self.fetcher = ItemFetcher(
            [r for ranges in per_file.values() for r in ranges],
            lambda r: fetch(f"{base}/{r[0]}", start=r[1], end=r[1] + r[2]),
            self.ahead,
            self.threads,
        )
        try:
            return super().read_data(plan, planner)
        finally:
            self.fetcher.close()
            self.fetcher = None

    def _slice_file(self, file, sinfo):
        if self.fetcher is None:  # DCP read outside read_data
            return super()._slice_file(file, sinfo)
        return io.BytesIO(self.fetcher.take((sinfo.relative_path, sinfo.offset, sinfo.length)))


class ItemFetcher:
    """Byte ranges fetched ahead in an expected order, at most ``ahead`` bytes not yet taken.

    ``take(key)`` waits for a range (fetching it now if it was not started) and
    starts the next ones in the window. A range asked for twice is fetched once.
    """

    def __init__(self, order: list, fetch, ahead: int, threads: int) -> None:
        self.order, self.fetch, self.ahead = order, fetch, max(1, ahead)
        self.uses = Counter(order)
        self.started: dict[tuple, Future] = {}
        self.next = 0  # index in order of the next range to start
        self.held = 0  # bytes started and not yet taken for the last time
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="emberfs-ckpt")
        self.fill()

    def start(self, key) -> Future:
        fut = self.started.get(key)
        if fut is None:
            fut = self.started[key] = self.pool.submit(self.fetch, key)
            self.held += key[2]
        return fut

    def fill(self) -> None:
        with self.lock:
            while self.next < len(self.order) and (self.held < self.ahead or not self.started):
                key = self.order[self.next]
                self.next += 1
                if self.uses[key] > 0:  # not taken already (out of order) for the last time
                    self.start(key)

    def take(self, key) -> bytes:
        with self.lock:
            fut = self.start(key)
        data = fut.result()
        with self.lock:
            self.uses[key] -= 1
            if self.uses[key] <= 0:
                self.started.pop(key, None)
                self.held -= key[2]
        self.fill()
        return data

    def close(self) -> None:
        for fut in self.started.values():
            fut.cancel()
        self.pool.shutdown(wait=True)
