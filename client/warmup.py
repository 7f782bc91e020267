"""Filling a client's disk cache ahead of a job: ``emberfs warmup PATH...``.

:func:`warm` opens the files named (directories: every file under them),
reads from the cluster every whole chunk the cache does not hold yet, and
writes it into the cache before it returns (no fill is skipped, unlike the
background fills of reads). Chunks already cached are neither read nor
written again, so a second warmup of the same unchanged files reads nothing.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import deque
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emberfs.client.chunkio import read_ios
from emberfs.client.fileio import read_chunk
from emberfs.client.handles import OpenHandle
from emberfs.client.paths import strip_protocol
from emberfs.common.units import format_size
from emberfs.proto import common_pb2

if TYPE_CHECKING:
    from emberfs.client.core import Client


@dataclass
class WarmupReport:
    """What one warmup did.

    Attributes
    ----------
    files : int
        Files found under the paths.
    files_read : int
        Files with at least one chunk read into the cache now.
    files_cached : int
        Files the cache held whole already (or that are empty).
    files_skipped : list[str]
        Files the cache does not keep: open for writing somewhere, written
        before data versions were kept, or KV cache slabs.
    bytes_read : int
        Bytes read from the cluster and written into the cache.
    bytes_cached : int
        Bytes the cache held already.
    failed : int
        Chunks whose fill failed (a full disk): they are read from the cluster.
    """

    files: int = 0
    files_read: int = 0
    files_cached: int = 0
    files_skipped: list[str] = field(default_factory=list)
    bytes_read: int = 0
    bytes_cached: int = 0
    failed: int = 0

    def as_dict(self) -> dict:
        return {
            "files": self.files,
            "files_read": self.files_read,
            "files_cached": self.files_cached,
            "files_skipped": list(self.files_skipped),
            "bytes_read": self.bytes_read,
            "bytes_cached": self.bytes_cached,
            "failed": self.failed,
        }


def expand(client: Client, paths: list[str]) -> list[tuple[str, common_pb2.InodeAttr]]:
    """Every file named by ``paths`` or under a directory among them, opened for reading.

    Symlinks to files are followed; a symlink met while walking a directory
    is not (no loops). Raises the open's error (FileNotFoundError, ...) of a
    path that cannot be opened.
    """
    meta = client.meta
    out: list[tuple[str, common_pb2.InodeAttr]] = []
    dirs: deque[str] = deque()
    named = [strip_protocol(p) for p in paths]
    for path, got in zip(named, meta.batch_open(named), strict=True):
        if isinstance(got, OSError):
            raise got
        if got.type == common_pb2.DIRECTORY:
            dirs.append(path)
        else:
            out.append((path, got))
    found: list[str] = []
    while dirs:
        d = dirs.popleft()
        base = d.rstrip("/")
        for e in meta.list(d, page=client.options.list_page):
            child = f"{base}/{e.name}"
            if e.attr.type == common_pb2.DIRECTORY:
                dirs.append(child)
            elif e.attr.type == common_pb2.FILE:
                found.append(child)
    for path, got in zip(found, meta.batch_open(found), strict=True):
        if isinstance(got, FileNotFoundError):
            continue  # removed while we walked
        if isinstance(got, OSError):
            raise got
        out.append((path, got))
    return out


def warm(client: Client, paths: list[str]) -> WarmupReport:
    """Read every chunk of the files under ``paths`` that the client's disk cache lacks into it.

    Up to ``max_workers`` chunks are read and written at once.

    Raises
    ------
    OSError
        EINVAL when the client has no disk cache; a path's open error.
    """
    cache = client.cache
    if cache is None:
        raise OSError(errno.EINVAL, "no disk cache: give cache_dir (or --cache-dir)")
    report = WarmupReport()
    rt = client.runtime()
    slots = threading.Semaphore(max(1, client.options.max_workers))
    lock = threading.Lock()
    futures: list[Future] = []

    def fill(h: OpenHandle, key, start: int) -> None:
        try:
            buf = bytearray(key.length)
            for io in read_ios(h, start, memoryview(buf)):
                read_chunk(rt, h, io)
            ok = cache.store(key, buf)
            with lock:
                report.bytes_read += key.length if ok else 0
                report.failed += not ok
        finally:
            slots.release()

    for path, attr in expand(client, paths):
        report.files += 1
        h = OpenHandle.for_read(path, attr)
        if attr.size == 0:
            report.files_cached += 1
            continue
        if cache.key(attr, 0) is None:
            report.files_skipped.append(path)
            continue
        cs = attr.layout.chunk_size
        wanted = 0
        for index in range(-(-attr.size // cs)):
            key = cache.key(attr, index)
            if cache.contains(key):
                report.bytes_cached += key.length
                continue
            wanted += 1
            slots.acquire()
            futures.append(rt.executor.submit(fill, h, key, index * cs))
        report.files_read += wanted > 0
        report.files_cached += wanted == 0
        futures = [f for f in futures if not f.done() or f.exception() is not None]
    wait(futures)
    for f in futures:
        f.result()
    cache.state.flush()
    return report


def describe(report: WarmupReport, limit: int) -> str:
    """What a warmup did, for people."""
    lines = [
        f"{report.files} files: {report.files_read} read into the cache "
        f"({format_size(report.bytes_read)}), {report.files_cached} cached already "
        f"({format_size(report.bytes_cached)}), {len(report.files_skipped)} not cacheable"
    ]
    for path in report.files_skipped[:10]:
        lines.append(f"  not cacheable (open for writing, or without a data version): {path}")
    if report.failed:
        lines.append(f"{report.failed} chunks could not be written (see the log): a full disk?")
    if report.bytes_read + report.bytes_cached > limit:
        lines.append(
            f"the files hold more than the cache's limit ({format_size(limit)}): "
            "the least recently used were evicted again"
        )
    return os.linesep.join(lines)
