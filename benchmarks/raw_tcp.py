"""The raw ceiling of the data path: one loopback TCP connection, nothing else.

A server process answers each 16-byte request ``(offset u64, length u64)`` with
``os.sendfile`` from a file in the page cache; the client process asks for
``request_size`` bytes at a time and ``recv_into`` one preallocated buffer.
This is what the framed protocol of EmberFS does without framing, checksums,
metadata, chains or threads, so it is the figure EmberFS is measured against.

The buffer is a ``bytearray``, as the comparison's ``readinto`` reader uses;
a large one starts 16 bytes past a page boundary (malloc's chunk header). With
``aligned`` it is a page-aligned anonymous mapping instead: on some CPUs the
kernel's copy is markedly slower when the destination sits 8-24 bytes further
into its 64-byte line than the source (``docs/performance.md``).

With ``fresh`` the client instead receives each pass into a new whole-file
buffer that nothing touched before (an anonymous mapping, as a large ``bytes``
result is): the ceiling of a whole-file read, which also pays the first touch
of every page of its result. :func:`fresh_fill` measures that first touch alone,
from every CPU at once and with no network; its CPU time and the transfer's
(``measure(usage=...)``) bound any whole-file read on the machine
(``benchmarks/compare.py``).

Run alone: ``python benchmarks/raw_tcp.py --size 1GiB --request 4MiB``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_REQ = struct.Struct("<QQ")


def parse_size(text: str | int) -> int:
    """``"4MiB"``, ``"1G"``, ``"512k"`` or a plain number of bytes."""
    if isinstance(text, int):
        return text
    t = text.strip().lower().replace("ib", "").replace("b", "")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def make_file(path: Path, size: int, block: int = 4 << 20) -> Path:
    """Write ``size`` pseudo-random bytes to ``path`` (kept if it already has that size)."""
    if path.exists() and path.stat().st_size == size:
        return path
    pattern = os.urandom(block)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, block)
            f.write(pattern[:n])
            left -= n
    return path


def warm(path: Path) -> None:
    """Read the file once so it sits in the page cache."""
    buf = bytearray(4 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def fill(buf, value: int, threads: int = 1, piece: int = 4 << 20) -> float:
    """Write ``value`` over every byte of the writable buffer ``buf`` from ``threads`` threads.

    ``piece`` bytes a call; each thread fills its own contiguous share.
    ``ctypes.memset`` releases the GIL, so the threads fault in their pages at
    the same time. Returns the CPU seconds the threads used together.
    """
    size = len(buf)
    if not size:
        return 0.0
    anchor = ctypes.c_char.from_buffer(buf)  # holds an export of buf until deleted
    cpu: list[float] = []
    try:
        base = ctypes.addressof(anchor)
        share = -(-size // max(1, threads))

        def run(start: int, end: int) -> None:
            began = time.thread_time()
            for offset in range(start, end, piece):
                ctypes.memset(base + offset, value, min(piece, end - offset))
            cpu.append(time.thread_time() - began)

        workers = [
            threading.Thread(target=run, args=(start, min(size, start + share)))
            for start in range(0, size, share)
        ]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    finally:
        del anchor
    return sum(cpu)


def fresh_fill(size: int, threads: int | None = None, usage: dict | None = None) -> float:
    """Bytes per second of filling a new, untouched anonymous mapping of ``size`` bytes.

    ``threads`` (default: one per CPU) fill it at once. Every page is faulted
    in and zeroed by the kernel on its first write, as the pages of a new large
    ``bytes`` result are. ``usage``, when given, gets ``cpu_s``, the CPU
    seconds of the filling, and ``refill_cpu_s``, those of filling the same
    buffer again once its pages are in place: the difference is what the first
    touch of ``size`` bytes costs.
    """
    threads = threads or os.cpu_count() or 1
    buf = mmap.mmap(-1, size)
    try:
        started = time.perf_counter()
        cpu = fill(buf, 1, threads)
        elapsed = time.perf_counter() - started
        if usage is not None:
            usage["cpu_s"] = cpu
            usage["refill_cpu_s"] = fill(buf, 2, threads)
    finally:
        buf.close()
    return size / elapsed


def serve(path: str) -> None:
    """Serve one connection on an ephemeral port of 127.0.0.1 (printed on stdout)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    print(listener.getsockname()[1], flush=True)
    fd = os.open(path, os.O_RDONLY)
    listener.settimeout(60)
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    began_cpu = time.process_time()
    head = bytearray(_REQ.size)
    view = memoryview(head)
    try:
        while True:
            got = 0
            while got < len(head):
                n = conn.recv_into(view[got:])
                if n == 0:
                    return
                got += n
            offset, length = _REQ.unpack(head)
            sent = 0
            while sent < length:
                n = os.sendfile(conn.fileno(), fd, offset + sent, length - sent)
                if n == 0:
                    break
                sent += n
    finally:
        conn.close()
        os.close(fd)
        print(time.process_time() - began_cpu, flush=True)  # the CPU seconds it served with


def measure(
    path: Path,
    request_size: int,
    passes: int = 1,
    fresh: bool = False,
    aligned: bool = False,
    usage: dict | None = None,
) -> float:
    """Bytes per second of reading the whole file ``passes`` times over one connection.

    ``fresh``: every pass receives into a new untouched buffer of the file's size
    instead of reusing one ``request_size`` buffer. ``aligned``: the reused
    buffer is page aligned instead of a ``bytearray``. ``usage``, when given,
    gets ``bytes`` and the CPU seconds of the transfer: ``client_cpu_s`` (the
    receiving thread) and ``server_cpu_s`` (the whole server process).
    """
    size = path.stat().st_size
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(path)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        port = int(server.stdout.readline())
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = mmap.mmap(-1, request_size) if aligned else bytearray(request_size)
        view = memoryview(buf)
        started = time.perf_counter()
        began_cpu = time.thread_time()
        total = 0
        for _ in range(passes):
            whole = mmap.mmap(-1, size) if fresh else None
            whole_view = memoryview(whole) if fresh else None
            offset = 0
            while offset < size:
                length = min(request_size, size - offset)
                sock.sendall(_REQ.pack(offset, length))
                into = whole_view[offset : offset + length] if fresh else view[:length]
                got = 0
                while got < length:
                    n = sock.recv_into(into[got:])
                    if n == 0:
                        raise ConnectionError("server closed the connection")
                    got += n
                offset += length
                total += length
            if fresh:
                into.release()
                whole_view.release()
                whole.close()
        elapsed = time.perf_counter() - started
        client_cpu = time.thread_time() - began_cpu
        sock.close()
        if usage is not None:
            usage["bytes"] = total
            usage["client_cpu_s"] = client_cpu
            usage["server_cpu_s"] = float(server.stdout.readline())
    finally:
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()
    return total / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB", help="file size (default 1GiB)")
    parser.add_argument("--request", default="4MiB", help="request size (default 4MiB)")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument(
        "--fresh", action="store_true", help="receive each pass into a new whole-file buffer"
    )
    parser.add_argument("--aligned", action="store_true", help="receive into a page-aligned buffer")
    parser.add_argument("--dir", default=None, help="where the file goes (default: a temp dir)")
    parser.add_argument("--serve", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = make_file(Path(tmp) / "raw.bin", parse_size(args.size))
        warm(path)
        rate = measure(
            path, parse_size(args.request), args.passes, fresh=args.fresh, aligned=args.aligned
        )
    print(json.dumps({"raw_tcp_bytes_per_s": rate, "gb_per_s": rate / 1e9}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
