"""The ``emberfs`` command: one entry point, one module per command group.

Each command group lives in its own module and is imported only when used, so
``emberfs cat`` on a client-only install never imports server dependencies.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

# command -> (module, function taking argv); the function returns an exit code.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("emberfs.cli.up", "main", "start a whole local cluster in the foreground"),
    "metaserver": (
        "emberfs.metaserver.main",
        "main",
        "run the metaserver (namespace + cluster manager)",
    ),
    "storageserver": ("emberfs.storageserver.main", "main", "run one storage server"),
    "ls": ("emberfs.cli.files", "main_ls", "list a directory"),
    "stat": ("emberfs.cli.files", "main_stat", "show a path's attributes"),
    "cat": ("emberfs.cli.files", "main_cat", "write a file to stdout"),
    "put": ("emberfs.cli.files", "main_put", "upload local files"),
    "get": ("emberfs.cli.files", "main_get", "download files"),
    "rm": ("emberfs.cli.files", "main_rm", "remove files or trees"),
    "mkdir": ("emberfs.cli.files", "main_mkdir", "make a directory"),
    "mv": ("emberfs.cli.files", "main_mv", "rename or move"),
    "trash": ("emberfs.cli.trash", "main", "list, restore and purge removed files and trees"),
    "quota": ("emberfs.cli.quota", "main", "set, show, list and remove directory quotas"),
    "admin": ("emberfs.cli.admin", "main", "show and steer a cluster through its admin API"),
    "fsck": ("emberfs.cli.fsck", "main", "check a cluster's namespace and chunks (and repair)"),
    "migrate": (
        "emberfs.cli.migrate",
        "main",
        "copy a stopped cluster's metadata between RocksDB and etcd",
    ),
    "mount": ("emberfs.cli.mount", "main", "mount EmberFS as a file system (FUSE)"),
    "umount": ("emberfs.cli.mount", "main_umount", "unmount an EmberFS mount"),
    "bench": ("emberfs.cli.bench", "main", "benchmark throughput, latency and metadata rates"),
    "kvcache": ("emberfs.cli.kvcache", "main", "make, inspect and size KV caches for inference"),
    "cache": ("emberfs.cli.cache", "main", "show or clear the local disk cache of file chunks"),
    "warmup": ("emberfs.cli.cache", "main_warmup", "read files into the local disk cache"),
}


def usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = ["usage: emberfs COMMAND [ARGS...]", "", "commands:"]
    for name, (module, _, help_text) in COMMANDS.items():
        if _available(module):
            lines.append(f"  {name.ljust(width)}  {help_text}")
    lines.append("")
    lines.append("Run 'emberfs COMMAND --help' for a command's options.")
    return "\n".join(lines)


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version", "version"):
        from emberfs.common.version import __version__

        print(f"emberfs {__version__}")
        return 0
    name = argv[0]
    if name not in COMMANDS or not _available(COMMANDS[name][0]):
        print(f"emberfs: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    try:
        entry = getattr(importlib.import_module(module), func)
    except ImportError as exc:
        print(
            f"emberfs {name}: missing dependency ({exc.name}); install 'emberfs[server]'",
            file=sys.stderr,
        )
        return 2
    return int(entry(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
