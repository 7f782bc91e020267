"""``emberfs mount`` and ``emberfs umount``: EmberFS as a FUSE file system.

``emberfs mount MOUNTPOINT`` checks the mountpoint and the cluster, mounts,
and returns once the mount answers (exit 0); the file system keeps running in
a daemon process until it is unmounted (``emberfs umount MOUNTPOINT``,
``fusermount3 -u``, ``umount``) or gets SIGTERM, SIGINT or SIGHUP, which
unmount it. ``--foreground`` serves in the calling process instead.

Exit codes: 0 mounted (or unmounted), 1 the mount failed, 2 wrong usage or a
mountpoint that is missing, not a directory, not empty or mounted already,
3 the cluster could not be reached.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import shutil
import subprocess
import sys
import threading
import time

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
READY_TIMEOUT = 30.0
UNREACHABLE = "cannot reach the EmberFS cluster"
UNREACHABLE_ERRNOS = (errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNREFUSED, errno.EHOSTUNREACH)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="emberfs mount",
        description="Mount EmberFS at MOUNTPOINT (FUSE). Returns once the mount is ready.",
    )
    p.add_argument("mountpoint", help="an existing, empty directory")
    p.add_argument("--meta", help="metaserver HOST:PORT[,HOST:PORT...] (default: $EMBERFS_META)")
    p.add_argument("--token", help="client token (default: $EMBERFS_TOKEN or the config file)")
    p.add_argument("--foreground", "-f", action="store_true", help="serve in this process")
    p.add_argument("--read-only", action="store_true", help="refuse every change (EROFS)")
    p.add_argument(
        "--attr-timeout",
        type=float,
        default=1.0,
        help="seconds attributes and names are cached (default 1; 0 asks every time)",
    )
    p.add_argument(
        "--direct-io",
        action="store_true",
        help="bypass the kernel's page cache (no cached second reads)",
    )
    p.add_argument(
        "--readahead-kb",
        type=int,
        default=16384,
        help="kernel readahead window for the mount, in KiB (default 16384; needs root)",
    )
    p.add_argument(
        "--readahead-depth",
        type=int,
        default=8,
        help="chunks the mount reads ahead of a sequential reader (default 8)",
    )
    p.add_argument(
        "--write-depth", type=int, default=8, help="chunk writes in flight per file (default 8)"
    )
    p.add_argument(
        "--on-outage",
        choices=("eio", "block"),
        default="eio",
        help="while the metaserver is away: fail calls with EIO after --meta-timeout "
        "(default) or block until it is back",
    )
    p.add_argument(
        "--meta-timeout",
        type=float,
        default=10.0,
        help="seconds a call retries an unreachable metaserver before EIO (default 10)",
    )
    p.add_argument("--allow-other", action="store_true", help="let other users use the mount too")
    p.add_argument(
        "--cache-dir",
        help="a local disk cache of the chunks read (default: $EMBERFS_CACHE_DIR or the config "
        "file's cache_dir; '' for none)",
    )
    p.add_argument(
        "--cache-size", help="what the disk cache holds at most, e.g. 100G (default 10G)"
    )
    p.add_argument("--log", help="log file of the daemon (default: none)")
    p.add_argument("--debug", action="store_true", help="log every FUSE request (foreground)")
    return p


def check_mountpoint(path: str) -> str | None:
    """Why ``path`` cannot be mounted on (None when it can)."""
    if not os.path.exists(path):
        return f"mountpoint {path} does not exist"
    if not os.path.isdir(path):
        return f"mountpoint {path} is not a directory"
    if os.path.ismount(path):
        return f"{path} is a mountpoint already"
    try:
        if os.listdir(path):
            return f"mountpoint {path} is not empty"
    except OSError as exc:
        return f"mountpoint {path}: {exc.strerror}"
    return None


def _set_readahead(mountpoint: str, kb: int) -> None:
    """Set the kernel readahead of the mount's backing device (best effort)."""
    dev = os.stat(mountpoint).st_dev
    path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(kb))
    except OSError as exc:
        logging.getLogger(__name__).info("could not set %s: %s", path, exc.strerror)


def _report(fd: int | None, message: str) -> None:
    if fd is None:
        if message != "ok":
            print(f"emberfs mount: {message}", file=sys.stderr)
        return
    try:
        os.write(fd, message.encode())
        os.close(fd)
    except OSError:
        pass


def _serve(args, notify: int | None) -> int:
    """Build the client, mount, tell ``notify`` (the waiting parent) and serve until unmounted."""
    from emberfs.client.core import Client
    from emberfs.client.fusebind import serve
    from emberfs.client.mount import EmberFuse, MountOptions
    from emberfs.client.options import ClientOptions

    options = MountOptions(
        attr_timeout=args.attr_timeout,
        direct_io=args.direct_io,
        read_only=args.read_only,
        readahead_kb=args.readahead_kb,
        on_outage=args.on_outage,
        meta_timeout=args.meta_timeout,
        allow_other=args.allow_other,
    )
    try:
        client = Client(
            meta=args.meta or None,
            token=args.token or None,
            options=ClientOptions(
                auto_mkdir=False,
                readahead_depth=args.readahead_depth,
                write_depth=args.write_depth,
                retry_timeout=1e9 if args.on_outage == "block" else args.meta_timeout,
                rpc_timeout=max(args.meta_timeout, 5.0),
                cache_dir=args.cache_dir,
                cache_size=args.cache_size,
            ),
        )
    except (OSError, ValueError) as exc:  # the disk cache cannot be used
        _report(notify, getattr(exc, "strerror", None) or str(exc))
        return EXIT_FAILED
    try:
        client.meta.statfs()
    except OSError as exc:
        detail = exc.strerror or str(exc)
        if exc.errno in UNREACHABLE_ERRNOS:
            _report(notify, f"{UNREACHABLE} at {client.address}: {detail}")
            return EXIT_UNREACHABLE
        _report(notify, f"the cluster at {client.address} refused the mount: {detail}")
        return EXIT_FAILED
    ops = EmberFuse(client, options)

    def when_ready() -> None:
        if not ops.ready.wait(READY_TIMEOUT):
            return
        deadline = time.monotonic() + READY_TIMEOUT
        while not os.path.ismount(args.mountpoint) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            os.stat(args.mountpoint)  # the mount answers
            if not options.direct_io:
                _set_readahead(args.mountpoint, options.readahead_kb)
        except OSError as exc:
            _report(notify, f"the mount does not answer: {exc.strerror}")
            return
        if notify is not None:  # the caller's stderr is let go: libfuse's messages go to the log
            target = os.open(args.log or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.dup2(target, 2)
            os.close(target)
        _report(notify, "ok")

    threading.Thread(target=when_ready, name="emberfs-mount-ready", daemon=True).start()
    try:
        serve(ops, args.mountpoint, debug=args.debug, fsname=f"emberfs:{client.address}")
    except RuntimeError as exc:
        if ops.ready.is_set():  # mounted, then stopped by a signal (libfuse says so with 8)
            logging.getLogger(__name__).info("unmounted %s (%s)", args.mountpoint, exc)
            return EXIT_OK
        _report(notify, f"mounting {args.mountpoint} failed ({exc}); see the messages above")
        return EXIT_FAILED
    finally:
        client.close()
    return EXIT_OK


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    args.mountpoint = os.path.abspath(args.mountpoint)
    why = check_mountpoint(args.mountpoint)
    if why:
        print(f"emberfs mount: {why}", file=sys.stderr)
        return EXIT_USAGE
    try:
        import mfusepy  # noqa: F401  (libfuse3 is loaded here)
    except (ImportError, OSError) as exc:
        print(f"emberfs mount: FUSE is not available: {exc}", file=sys.stderr)
        return EXIT_FAILED
    level = logging.DEBUG if args.debug else logging.INFO
    if args.foreground:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return _serve(args, None)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        chunks = []
        while chunk := os.read(read_end, 4096):
            chunks.append(chunk)
        os.close(read_end)
        message = b"".join(chunks).decode(errors="replace")
        if message == "ok":
            return EXIT_OK
        if not message:  # the daemon died before it could say why
            _, status = os.waitpid(pid, 0)
            message = f"the mount process ended (status {status}) before the mount was ready"
        else:
            os.waitpid(pid, 0)
        print(f"emberfs mount: {message}", file=sys.stderr)
        return EXIT_UNREACHABLE if message.startswith(UNREACHABLE) else EXIT_FAILED
    # the daemon: its own session, no terminal; stderr stays the caller's until it is mounted
    os.close(read_end)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    if args.log:
        logging.basicConfig(
            filename=args.log,
            level=level,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    code = EXIT_FAILED
    try:
        code = _serve(args, write_end)
    finally:
        os._exit(code)


def main_umount(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="emberfs umount", description="Unmount an EmberFS mount.")
    p.add_argument("mountpoint")
    p.add_argument("--lazy", "-z", action="store_true", help="detach now, finish when unused")
    p.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the unmount (default 30)"
    )
    args = p.parse_args(argv)
    mountpoint = os.path.abspath(args.mountpoint)
    if not os.path.ismount(mountpoint):
        print(f"emberfs umount: {mountpoint} is not mounted", file=sys.stderr)
        return EXIT_USAGE
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u"] + (["-z"] if args.lazy else []) + [mountpoint] if tool else None
    if cmd is None:
        cmd = ["umount"] + (["-l"] if args.lazy else []) + [mountpoint]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"emberfs umount: {done.stderr.strip() or 'failed'}", file=sys.stderr)
        return EXIT_FAILED
    deadline = time.monotonic() + args.timeout
    while os.path.ismount(mountpoint):
        if time.monotonic() > deadline:
            print(f"emberfs umount: {mountpoint} is still mounted", file=sys.stderr)
            return EXIT_FAILED
        time.sleep(0.05)
    return EXIT_OK
