"""File commands of the ``emberfs`` CLI: ls, stat, cat, put, get, rm, mkdir, mv.

Every command takes ``--meta HOST:PORT`` (else ``EMBERFS_META``, else
127.0.0.1:9400); paths are ``/a/b`` or ``emberfs://HOST:PORT/a/b`` URLs (whose
address is used when ``--meta`` is not given). Errors are one line on stderr;
exit codes: 0 success, 1 a file error (missing, exists, not a directory...),
2 wrong usage, 3 the cluster could not be reached.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
import time
from collections.abc import Callable

from fsspec.callbacks import Callback

from emberfs.client.paths import strip_protocol

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

PROGRESS_MIN_BYTES = 64 * 1024 * 1024


class _Unreachable(Exception):
    pass


def command_parser(name: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"emberfs {name}", description=description)
    p.add_argument("--meta", help="metaserver HOST:PORT (default: $EMBERFS_META or 127.0.0.1:9400)")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to keep trying an unreachable metaserver (default 10)",
    )
    return p


def filesystem(args, paths: list[str], **options):
    from emberfs.client.fs import EmberFileSystem
    from emberfs.client.paths import meta_of_url

    meta = args.meta
    if not meta:
        for p in paths:
            meta = meta_of_url(p)
            if meta:
                break
    return EmberFileSystem(
        meta=meta or None,
        retry_timeout=args.timeout,
        rpc_timeout=max(args.timeout, 5.0),
        skip_instance_cache=True,
        **options,
    )


def run_command(name: str, body: Callable[[], int | None], fs_holder: list) -> int:
    """Run a command body, turning errors into one line and an exit code."""
    try:
        return int(body() or 0)
    except KeyboardInterrupt:
        print(f"emberfs {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (``emberfs cat x | head``)
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return EXIT_OK
    except OSError as exc:
        address = fs_holder[0].meta if fs_holder else "?"
        if exc.errno in (errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNREFUSED):
            detail = exc.strerror or str(exc)
            # the cluster answered, but its metadata store (etcd) did not
            where = (
                ""
                if "metadata store" in detail
                else f"cannot reach the EmberFS cluster at {address}: "
            )
            print(f"emberfs {name}: {where}{detail}", file=sys.stderr)
            return EXIT_UNREACHABLE
        where = f"{exc.filename}: " if exc.filename else ""
        what = exc.strerror or str(exc)
        if exc.filename and what.endswith(f": {exc.filename}"):
            what = what[: -len(exc.filename) - 2]
        print(f"emberfs {name}: {where}{what}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as exc:
        print(f"emberfs {name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if fs_holder:
            fs_holder[0].close()


# progress ------------------------------------------------------------------------
class Progress(Callback):
    """Byte progress of a transfer: a rich bar when available, else a stderr line."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        super().__init__(size=total, value=0)
        self.label = label
        self.enabled = enabled and total > 0
        self._rich = None
        self._task = None
        self._last = 0.0
        self._start = time.monotonic()
        if self.enabled:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    DownloadColumn,
                    TransferSpeedColumn,
                )
                from rich.progress import (
                    Progress as RichProgress,
                )

                self._rich = RichProgress(
                    "[progress.description]{task.description}",
                    BarColumn(),
                    DownloadColumn(),
                    TransferSpeedColumn(),
                    console=Console(stderr=True),
                )
                self._rich.start()
                self._task = self._rich.add_task(label, total=total)
            except ImportError:
                self._rich = None

    def set_size(self, size) -> None:  # sizes of files or counts come from fsspec: ignore
        pass

    def relative_update(self, inc: int = 1) -> None:
        self.value += inc
        self.call()

    def branched(self, path_1, path_2, **kwargs):
        return self

    def call(self, *args, **kwargs) -> None:
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, completed=self.value)
            return
        now = time.monotonic()
        if now - self._last < 0.5 and self.value < self.size:
            return
        self._last = now
        rate = self.value / max(now - self._start, 1e-6) / 2**20
        pct = 100.0 * self.value / self.size
        print(
            f"\r{self.label}: {self.value / 2**20:.0f}/{self.size / 2**20:.0f} MiB "
            f"({pct:.0f}%, {rate:.0f} MiB/s)",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.stop()
        else:
            print(file=sys.stderr)


def _want_progress(args, total: int) -> bool:
    if args.quiet:
        return False
    return args.progress or (total >= PROGRESS_MIN_BYTES and sys.stderr.isatty())


# commands ------------------------------------------------------------------------
def _format_long(info: dict) -> str:
    mode = stat.filemode(info.get("mode", 0))
    mtime = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.get("mtime", 0)))
    name = info["name"].rsplit("/", 1)[-1] or "/"
    if info["type"] == "directory":
        name += "/"
    return f"{mode} {info.get('nlink', 1):>3} {info['size']:>14} {mtime} {name}"


def main_ls(argv: list[str]) -> int:
    """``emberfs ls [-l] [PATH...]``: list directories (a file lists itself)."""
    p = command_parser("ls", "List directories.")
    p.add_argument("-l", "--long", action="store_true", help="mode, links, size, mtime")
    p.add_argument("paths", nargs="*", default=["/"])
    args = p.parse_args(argv)
    holder: list = []

    def body() -> int:
        fs = filesystem(args, args.paths)
        holder.append(fs)
        for i, path in enumerate(args.paths):
            if len(args.paths) > 1:
                print(("\n" if i else "") + f"{strip_protocol(path)}:")
            entries = sorted(fs.ls(path, detail=True), key=lambda e: e["name"])
            for e in entries:
                if args.long:
                    print(_format_long(e))
                else:
                    name = e["name"].rsplit("/", 1)[-1]
                    print(name + ("/" if e["type"] == "directory" else ""))
        return EXIT_OK

    return run_command("ls", body, holder)


def main_stat(argv: list[str]) -> int:
    """``emberfs stat [--json] PATH...``: show attributes."""
    p = command_parser("stat", "Show a path's attributes.")
    p.add_argument("--json", action="store_true", help="one JSON object per path")
    p.add_argument("paths", nargs="+")
    args = p.parse_args(argv)
    holder: list = []

    def body() -> int:
        fs = filesystem(args, args.paths)
        holder.append(fs)
        for path in args.paths:
            info = fs.info(path)
            if args.json:
                print(json.dumps(info, sort_keys=True))
                continue
            print(f"  path: {info['name']}")
            print(f"  type: {info['type']}")
            print(f"  size: {info['size']}")
            print(f"  mode: {stat.filemode(info['mode'])} ({info['mode'] & 0o7777:o})")
            print(f" inode: {info['ino']}  links: {info['nlink']}")
            print(f"   uid: {info['uid']}  gid: {info['gid']}")
            for key in ("mtime", "ctime", "created"):
                t = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info[key]))
                print(f"{key:>6}: {t}")
            if "chunk_size" in info:
                print(f" chunk: {info['chunk_size']}")
        return EXIT_OK

    return run_command("stat", body, holder)


def main_cat(argv: list[str]) -> int:
    """``emberfs cat PATH...``: write files to stdout (parallel chunk fetches)."""
    p = command_parser("cat", "Write files to stdout.")
    p.add_argument("paths", nargs="+")
    args = p.parse_args(argv)
    holder: list = []

    def body() -> int:
        from emberfs.client.transfer import stream_out

        fs = filesystem(args, args.paths)
        holder.append(fs)
        out = sys.stdout.buffer
        for path in args.paths:
            with fs.open(path, "rb") as f:
                unit = max(f.blocksize, 1 << 20) * max(1, min(4, fs.readahead_depth))
                stream_out(f, out, min(unit, max(f.size, 1)))
        out.flush()
        return EXIT_OK

    return run_command("cat", body, holder)


def _add_transfer_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-r", "--recursive", action="store_true", help="copy directories")
    p.add_argument("--progress", action="store_true", help="always show progress")
    p.add_argument("-q", "--quiet", action="store_true", help="never show progress")


def main_put(argv: list[str]) -> int:
    """``emberfs put [-r] LOCAL... REMOTE``: upload files or trees."""
    p = command_parser("put", "Upload local files or directories.")
    _add_transfer_flags(p)
    p.add_argument("sources", nargs="+")
    p.add_argument("target")
    args = p.parse_args(argv)
    holder: list = []

    def body() -> int:
        for src in args.sources:
            if not os.path.exists(src):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), src)
            if os.path.isdir(src) and not args.recursive:
                raise IsADirectoryError(errno.EISDIR, "is a directory (use -r)", src)
        total = 0
        for src in args.sources:
            if os.path.isdir(src):
                for root, _, files in os.walk(src):
                    total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
            else:
                total += os.path.getsize(src)
        fs = filesystem(args, [args.target])
        holder.append(fs)
        target = args.target
        sources = args.sources if len(args.sources) > 1 else args.sources[0]
        if len(args.sources) > 1 and not target.endswith("/"):
            target += "/"
        progress = Progress(total, "put", _want_progress(args, total))
        try:
            fs.put(sources, target, recursive=args.recursive, callback=progress)
        finally:
            progress.close()
        return EXIT_OK

    return run_command("put", body, holder)


def main_get(argv: list[str]) -> int:
    """``emberfs get [-r] REMOTE... LOCAL``: download files or trees."""
    p = command_parser("get", "Download files or directories.")
    _add_transfer_flags(p)
    p.add_argument("sources", nargs="+")
    p.add_argument("target")
    args = p.parse_args(argv)
    holder: list = []

    def body() -> int:
        fs = filesystem(args, args.sources)
        holder.append(fs)
        total = 0
        for src in args.sources:
            info = fs.info(src)
            if info["type"] == "directory":
                if not args.recursive:
                    raise IsADirectoryError(errno.EISDIR, "is a directory (use -r)", info["name"])
                total += fs.du(src)
            else:
                total += info["size"]
        target = args.target
        sources = args.sources if len(args.sources) > 1 else args.sources[0]
        if len(args.sources) > 1 and not target.endswith(os.sep):
            os.makedirs(target, exist_ok=True)
            target += os.sep
        progress = Progress(total, "get", _want_progress(args, total))
        try:
            fs.get(sources, target, recursive=args.recursive, callback=progress)
        finally:
            progress.close()
        return EXIT_OK

    return run_command("get", body, holder)


def main_rm(argv: list[str]) -> int:
    """``emberfs rm [-r] [-f] [--skip-trash] PATH...``: remove files (``-r``: whole trees)."""
    p = command_parser("rm", "Remove files or directory trees.")
    p.add_argument("-r", "--recursive", action="store_true", help="remove directories and trees")
    p.add_argument("-f", "--force", action="store_true", help="ignore missing paths")
    p.add_argument(
        "--skip-trash",
        action="store_true",
        help="delete for good even when the metaserver keeps a trash (nothing to restore)",
    )
    p.add_argument("paths", nargs="+")
    args = p.parse_args(argv)
    holder: list = []

    def body() -> int:
        fs = filesystem(args, args.paths)
        holder.append(fs)
        for path in args.paths:
            try:
                if not args.recursive and fs.isdir(path):
                    raise IsADirectoryError(errno.EISDIR, "is a directory (use -r)", path)
                fs.rm(path, recursive=args.recursive, skip_trash=args.skip_trash)
            except FileNotFoundError:
                if not args.force:
                    raise
        return EXIT_OK

    return run_command("rm", body, holder)


def main_mkdir(argv: list[str]) -> int:
    """``emberfs mkdir [-p] PATH...``: make directories."""
    p = command_parser("mkdir", "Make directories.")
    p.add_argument("-p", "--parents", action="store_true", help="make parents; existing is fine")
    p.add_argument("paths", nargs="+")
    args = p.parse_args(argv)
    holder: list = []

    def body() -> int:
        fs = filesystem(args, args.paths)
        holder.append(fs)
        for path in args.paths:
            if args.parents:
                fs.makedirs(path, exist_ok=True)
            else:
                fs.mkdir(path, create_parents=False)
        return EXIT_OK

    return run_command("mkdir", body, holder)


def main_mv(argv: list[str]) -> int:
    """``emberfs mv SRC DST``: rename (into DST when it is a directory)."""
    p = command_parser("mv", "Rename or move a file or directory.")
    p.add_argument("source")
    p.add_argument("target")
    args = p.parse_args(argv)
    holder: list = []

    def body() -> int:
        fs = filesystem(args, [args.source, args.target])
        holder.append(fs)
        fs.mv(args.source, args.target)
        return EXIT_OK

    return run_command("mv", body, holder)
