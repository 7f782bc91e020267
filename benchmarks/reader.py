"""One timed read or write in a process of its own, reported as one JSON line.

The comparison runs every client measurement through this module in a fresh
process, so each starts cold (no warm client caches), runs alone in its
interpreter (no GIL shared with the harness), and reports its own peak RSS
(:func:`peak_rss`), which shows whether the client's memory stays bounded.

Backends and modes:

* ``emberfs`` (``--meta``): ``read`` (``open().read()`` of the whole file),
  ``stream`` (``read(unit)`` until EOF), ``readinto`` (``readinto`` of one
  ``unit``-byte buffer until EOF), ``cat`` (``cat_file``), ``write``
  (``--size`` bytes written ``unit`` at a time);
* ``s3`` (``--endpoint``, s3fs) and ``http`` (``--endpoint``, fsspec's HTTP
  filesystem): ``read``, ``stream``, ``cat``;
* ``file``: a path of a mounted file system (a FUSE mount's) through the
  operating system's own files, every mode; reads unbuffered (one ``read(2)``
  per call, ``readinto`` straight into the caller's buffer), writes through a
  ``BufferedWriter`` (which passes each ``unit`` straight on and retries a
  short write), with ``--fsync``: ``fsync`` before the close.

``--start-at`` (a ``time.time()`` value) makes several processes begin together.
``--aligned`` makes ``readinto``'s buffer a page-aligned mapping instead of a
``bytearray`` (which starts 16 bytes past a page).
``--passes N`` repeats the transfer N times in the same process and reports the
last (every pass's rate is in ``pass_bytes_per_s``): with ``--keep-memory``
(EmberFS's ``keep_memory=True``) that is the steady state of a long-lived
loader whose whole-file results reuse the memory of the ones before.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import sys
import time


def _filesystem(args):
    if args.backend == "emberfs":
        from emberfs.client.fs import EmberFileSystem

        return EmberFileSystem(
            meta=args.meta, skip_instance_cache=True, keep_memory=args.keep_memory
        )
    if args.backend == "s3":
        import s3fs

        return s3fs.S3FileSystem(
            key="any",
            secret="any",
            endpoint_url=args.endpoint,
            skip_instance_cache=True,
            default_block_size=args.unit,
        )
    if args.backend == "http":
        from fsspec.implementations.http import HTTPFileSystem

        return HTTPFileSystem(skip_instance_cache=True, block_size=args.unit)
    if args.backend == "file":
        return _Files()
    raise ValueError(f"unknown backend {args.backend!r}")


class _Files:
    """The operating system's files, with the few calls of a filesystem the modes use."""

    def open(self, path: str, mode: str = "rb"):
        return open(path, mode, buffering=0 if mode == "rb" else -1)

    def info(self, path: str):
        return os.stat(path)

    def cat_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()


def disk_read_bytes() -> int | None:
    """Bytes the machine has read from block devices since boot (``pgpgin``), or None."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("pgpgin "):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def peak_rss() -> int:
    """Peak resident set size of this process in bytes.

    ``VmHWM`` from ``/proc/self/status`` where there is one: ``ru_maxrss``
    survives ``execve`` on Linux, so a child would report its parent's peak
    when that was higher.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _path(args) -> str:
    if args.backend == "http":
        return args.endpoint.rstrip("/") + "/" + args.path.lstrip("/")
    return args.path


def _one_pass(fs, path: str, args) -> int:
    """One timed transfer of ``args.mode``; the bytes it moved."""
    moved = 0
    if args.mode == "read":
        with fs.open(path, "rb") as f:
            data = f.read()
        moved = len(data)
        del data
    elif args.mode == "stream":
        with fs.open(path, "rb") as f:
            while True:
                data = f.read(args.unit)
                if not data:
                    break
                moved += len(data)
        del data
    elif args.mode == "readinto":
        buf = mmap.mmap(-1, args.unit) if args.aligned else bytearray(args.unit)
        with fs.open(path, "rb") as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                moved += n
    elif args.mode == "cat":
        data = fs.cat_file(path)
        moved = len(data)
        del data
    elif args.mode == "write":
        block = os.urandom(args.unit)
        with fs.open(path, "wb") as f:
            left = args.size
            while left:
                piece = block if left >= len(block) else block[:left]
                f.write(piece)
                left -= len(piece)
                moved += len(piece)
            if args.fsync:
                f.flush()
                os.fsync(f.fileno())
    else:
        raise ValueError(f"unknown mode {args.mode!r}")
    return moved


def run(args) -> dict:
    """Run the measurement described by ``args``; returns the report."""
    fs = _filesystem(args)
    path = _path(args)
    if args.mode != "write":
        fs.info(path)  # connections and routing up before the clock starts
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))
    rates = []
    for _ in range(args.passes):
        started_wall = time.time()
        cpu, disk = time.process_time(), disk_read_bytes()
        started = time.perf_counter()
        moved = _one_pass(fs, path, args)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
        after = disk_read_bytes()
        disk = None if disk is None or after is None else after - disk
        rates.append(moved / seconds if seconds > 0 else 0.0)
    return {
        "backend": args.backend,
        "mode": args.mode,
        "path": args.path,
        "bytes": moved,
        "seconds": seconds,
        "bytes_per_s": rates[-1],
        "pass_bytes_per_s": rates,
        "started": started_wall,
        "ended": started_wall + seconds,
        # of the last pass: the process's CPU (all its threads), the machine's disk reads
        "cpu_s": cpu,
        "pass_disk_read_bytes": disk,
        "maxrss_bytes": peak_rss(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("emberfs", "s3", "http", "file"), default="emberfs")
    p.add_argument("--meta", help="EmberFS metaserver HOST:PORT")
    p.add_argument("--endpoint", help="S3 endpoint URL or HTTP base URL")
    p.add_argument("--path", required=True)
    p.add_argument("--mode", choices=("read", "stream", "readinto", "cat", "write"), default="read")
    p.add_argument("--unit", type=int, default=4 << 20, help="bytes per read/write call")
    p.add_argument("--size", type=int, default=0, help="bytes to write (mode write)")
    p.add_argument("--start-at", type=float, default=0.0)
    p.add_argument("--passes", type=int, default=1, help="transfers in a row; the last is reported")
    p.add_argument(
        "--keep-memory", action="store_true", help="EmberFS keep_memory=True (freed memory reused)"
    )
    p.add_argument(
        "--aligned", action="store_true", help="readinto a page-aligned buffer, not a bytearray"
    )
    p.add_argument(
        "--fsync", action="store_true", help="write: fsync before the close (backend file)"
    )
    args = p.parse_args(argv)
    if args.passes < 1:
        p.error("--passes must be >= 1")
    if args.fsync and args.backend != "file":
        p.error("--fsync needs --backend file")
    print(json.dumps(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
