"""``emberfs kvcache``: make, inspect and size KV caches for inference (:mod:`emberfs.kvcache`).

::

    emberfs kvcache plan --layers 80 --hidden 8192 --users 10 --context 32768
    emberfs kvcache create /kv/llama-70b --layers 80 --hidden 8192 --capacity 2TiB
    emberfs kvcache stats /kv/llama-70b [--json]
    emberfs kvcache ls /kv/llama-70b [--limit 100]
    emberfs kvcache clear /kv/llama-70b
    emberfs kvcache rm /kv/llama-70b

``plan`` sizes a model's KV cache (:class:`~emberfs.kvcache.layout.KVLayout`)
and needs no cluster. The other subcommands take the cluster's address and
report errors as the file commands do (:mod:`emberfs.cli.files`): ``--meta``,
else ``EMBERFS_META``, else the client config; exit codes 0 success, 1 a file
error (not a KV cache, exists already...), 2 wrong usage, 3 the cluster could
not be reached. Sizes take units: ``64GiB``, ``512MiB``, ``4096``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable

from emberfs.cli.files import EXIT_OK, EXIT_USAGE, command_parser, filesystem, run_command
from emberfs.common import kvgeometry
from emberfs.common.units import format_size, parse_size
from emberfs.kvcache.layout import DTYPE_BYTES, KVLayout
from emberfs.kvcache.store import KVCache

LIST_PAGE = 1000  # keys per index call of ``ls`` (the metaserver answers up to 10000)


# argument types ----------------------------------------------------------------------------
def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _mode(text: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an octal mode: {text!r}") from None
    if not 0 <= value <= 0o7777:
        raise argparse.ArgumentTypeError(f"not a permission mode: {text!r}")
    return value


# the model's layout ------------------------------------------------------------------------
def _add_layout_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "model layout", "--layers with --hidden, or with --kv-heads and --head-dim"
    )
    g.add_argument("--layers", type=_positive, help="transformer layers")
    g.add_argument(
        "--hidden", type=_positive, help="hidden size (KV heads x head dim, no grouped-query)"
    )
    g.add_argument("--kv-heads", type=_positive, help="KV heads per layer")
    g.add_argument("--head-dim", type=_positive, help="dimension of one head")
    g.add_argument(
        "--tokens-per-block", type=_positive, default=16, help="tokens of one block (default 16)"
    )
    g.add_argument(
        "--dtype",
        type=str.lower,
        default="bfloat16",
        choices=list(DTYPE_BYTES),
        metavar="DTYPE",
        help=f"element type (default bfloat16; one of {', '.join(DTYPE_BYTES)})",
    )
    g.add_argument(
        "--kv",
        type=int,
        default=2,
        choices=(1, 2),
        help="tensors per head: 2 (key and value, default), 1 for a latent cache (MLA)",
    )


def _layout(p: argparse.ArgumentParser, args: argparse.Namespace) -> KVLayout | None:
    """The layout the arguments describe, None when they give none (usage errors exit)."""
    if args.layers is None:
        if args.hidden or args.kv_heads or args.head_dim:
            p.error("--hidden, --kv-heads and --head-dim need --layers")
        return None
    shape = {"tokens_per_block": args.tokens_per_block, "dtype": args.dtype, "kv": args.kv}
    if args.hidden is not None:
        if args.kv_heads or args.head_dim:
            p.error("give --hidden, or --kv-heads and --head-dim, not both")
        return KVLayout.from_hidden(args.layers, args.hidden, **shape)
    if args.kv_heads is None or args.head_dim is None:
        p.error("--layers needs --hidden, or --kv-heads and --head-dim")
    return KVLayout(layers=args.layers, kv_heads=args.kv_heads, head_dim=args.head_dim, **shape)


def _decimal(n: float) -> str:
    """``n`` bytes in decimal units (``2.62 MB``)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n} B"


def _amount(n: int, decimal: bool = False) -> str:
    """``n`` bytes exactly, and in binary (and decimal) units: ``2,621,440 bytes (2.5 MiB)``."""
    if n < 1024:
        return f"{n:,} bytes"
    units = f"{format_size(n)}, {_decimal(n)}" if decimal else format_size(n)
    return f"{n:,} bytes ({units})"


def _print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")


# plan --------------------------------------------------------------------------------------
def _plan_figures(layout: KVLayout, users: int | None, context: int | None) -> dict:
    out = dataclasses.asdict(layout)
    out.update(
        dtype_bytes=layout.dtype_bytes,
        bytes_per_token=layout.bytes_per_token,
        block_size=layout.block_size,
    )
    if users is not None:
        out.update(
            users=users,
            context=context,
            total_bytes=layout.total_bytes(users, context),
            blocks=layout.blocks(users, context),
        )
    return out


def main_plan(argv: list[str]) -> int:
    """``emberfs kvcache plan --layers N (--hidden H | --kv-heads K --head-dim D) ...``."""
    p = argparse.ArgumentParser(
        prog="emberfs kvcache plan",
        description="Size a model's KV cache: bytes per token and per block, and the total "
        "for USERS contexts of CONTEXT tokens. Needs no cluster.",
    )
    _add_layout_arguments(p)
    p.add_argument("--users", type=_positive, help="contexts held at once")
    p.add_argument("--context", type=_positive, help="tokens of each context")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    layout = _layout(p, args)
    if layout is None:
        p.error("--layers is required")
    if (args.users is None) != (args.context is None):
        p.error("--users and --context go together")
    figures = _plan_figures(layout, args.users, args.context)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
        return EXIT_OK
    if args.hidden is not None:
        shape = f"{layout.layers} layers x {layout.head_dim} hidden"
    else:
        heads = f"{layout.kv_heads} KV head" + ("s" if layout.kv_heads > 1 else "")
        shape = f"{layout.layers} layers x {heads} x {layout.head_dim} head dim"
    tensors = "keys and values" if layout.kv == 2 else "one latent tensor"
    element = f"{layout.dtype_bytes} byte" + ("s" if layout.dtype_bytes > 1 else "")
    rows = [
        ("model", f"{shape}, {tensors}, {layout.dtype} ({element})"),
        ("per token", _amount(layout.bytes_per_token, decimal=True)),
        (
            "per block",
            f"{_amount(layout.block_size, decimal=True)}: {layout.tokens_per_block} tokens",
        ),
    ]
    if args.users is not None:
        rows += [
            ("contexts", f"{args.users:,} users x {args.context:,} tokens"),
            ("total", _amount(figures["total_bytes"], decimal=True)),
            ("blocks", f"{figures['blocks']:,}"),
        ]
    _print_rows(rows)
    return EXIT_OK


# commands on a cluster ---------------------------------------------------------------------
def _on_cache(name: str, description: str, argv: list[str], extra=None):
    """Parse a subcommand that works on the cache at PATH; ``(parser, args, run)``.

    ``run(body)`` opens the filesystem and calls ``body(fs)`` with the
    error handling of the file commands.
    """
    p = command_parser(f"kvcache {name}", description)
    p.add_argument("path", help="the cache directory")
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)

    def run(body: Callable) -> int:
        holder: list = []

        def opened() -> int | None:
            fs = filesystem(args, [args.path])
            holder.append(fs)
            return body(fs)

        return run_command(f"kvcache {name}", opened, holder)

    return p, args, run


def main_create(argv: list[str]) -> int:
    """``emberfs kvcache create PATH (--block-size SIZE | --layers ...) --capacity SIZE``."""

    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--block-size", type=parse_size, help="bytes of one block (or give the layout)"
        )
        _add_layout_arguments(p)
        p.add_argument(
            "--capacity", type=parse_size, required=True, help="bytes the cache may hold (64GiB)"
        )
        p.add_argument(
            "--slab-size",
            type=parse_size,
            default=kvgeometry.DEFAULT_SLAB_SIZE,
            help="about how large each slab file is (default 1GiB)",
        )
        p.add_argument(
            "--mode",
            type=_mode,
            default=0o755,
            help="permission bits of a new cache directory (default 0755)",
        )

    p, args, run = _on_cache(
        "create",
        "Make a KV cache: a directory of slab files holding up to CAPACITY bytes of blocks.",
        argv,
        extra,
    )
    layout = _layout(p, args)
    if (layout is None) == (args.block_size is None):
        p.error("give --block-size or the model's layout (--layers ...), one of the two")
    block_size = layout.block_size if layout is not None else args.block_size

    def body(fs) -> int:
        cache = KVCache.create(
            args.path,
            block_size=block_size,
            capacity=args.capacity,
            slab_size=args.slab_size,
            mode=args.mode,
            fs=fs,
        )
        g = cache.geometry
        rows = [
            ("KV cache", cache.path),
            ("block size", _amount(g.block_size)),
            (
                "capacity",
                f"{g.capacity_slots:,} blocks, {_amount(g.capacity_slots * g.block_size)}",
            ),
            ("slab files", f"{len(cache.info.slabs):,} of up to {g.slab_slots:,} blocks"),
        ]
        if g.stride != g.block_size:
            rows.insert(2, ("slot size", f"{_amount(g.stride)} (whole pages)"))
        _print_rows(rows)
        return EXIT_OK

    return run(body)


def _stats_record(cache: KVCache) -> dict:
    s = cache.stats()
    out = {"path": cache.path, **dataclasses.asdict(s)}
    out.update(capacity_bytes=s.capacity_bytes, hit_rate=s.hit_rate)
    return out


def main_stats(argv: list[str]) -> int:
    """``emberfs kvcache stats PATH [--json]``: a cache's use and counters."""

    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print one JSON object")

    _, args, run = _on_cache(
        "stats", "Show a KV cache's use and counters (since it was made).", argv, extra
    )

    def body(fs) -> int:
        s = _stats_record(KVCache(args.path, fs=fs))
        if args.json:
            print(json.dumps(s, sort_keys=True))
            return EXIT_OK
        full = s["used_blocks"] / s["capacity_blocks"] if s["capacity_blocks"] else 0.0
        _print_rows(
            [
                ("KV cache", s["path"]),
                ("block size", _amount(s["block_size"])),
                ("capacity", f"{s['capacity_blocks']:,} blocks, {_amount(s['capacity_bytes'])}"),
                ("used", f"{s['used_blocks']:,} blocks ({full:.1%}), {_amount(s['used_bytes'])}"),
                ("hits", f"{s['hits']:,}"),
                ("misses", f"{s['misses']:,}"),
                ("hit rate", f"{s['hit_rate']:.1%}"),
                ("bytes read", _amount(s["hit_bytes"])),
                ("puts", f"{s['puts']:,}, {_amount(s['put_bytes'])}"),
                ("evictions", f"{s['evictions']:,}"),
                ("slab files", f"{s['slab_files']:,}, {s['slabs_used']:,} written to"),
            ]
        )
        return EXIT_OK

    return run(body)


def show_key(key: bytes) -> str:
    """A key as hex, followed by its text when it is printable UTF-8."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    return f"{key.hex()}  {text}" if text and text.isprintable() else key.hex()


def main_ls(argv: list[str]) -> int:
    """``emberfs kvcache ls PATH [--limit N]``: the stored keys, in byte order."""

    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--limit",
            type=int,
            default=1000,
            help="list at most N keys (default 1000; 0 lists every key)",
        )

    p, args, run = _on_cache(
        "ls",
        "List a KV cache's stored keys in byte order: hex, then the text of printable UTF-8.",
        argv,
        extra,
    )
    if args.limit < 0:
        p.error("--limit must not be negative")

    def body(fs) -> int:
        cache = KVCache(args.path, fs=fs)
        page = min(args.limit + 1, LIST_PAGE) if args.limit else LIST_PAGE
        for n, key in enumerate(cache.keys(page=page)):
            if args.limit and n == args.limit:
                print(
                    f"emberfs kvcache ls: more than {args.limit:,} keys (--limit 0 lists all)",
                    file=sys.stderr,
                )
                break
            print(show_key(key))
        return EXIT_OK

    return run(body)


def main_clear(argv: list[str]) -> int:
    """``emberfs kvcache clear PATH``: remove every block (the slab files stay)."""
    _, args, run = _on_cache(
        "clear", "Remove every block of a KV cache; its slab files stay for reuse.", argv
    )

    def body(fs) -> int:
        cache = KVCache(args.path, fs=fs)
        print(f"{cache.path}: {cache.clear():,} blocks removed")
        return EXIT_OK

    return run(body)


def main_rm(argv: list[str]) -> int:
    """``emberfs kvcache rm PATH``: remove a KV cache (and only a KV cache)."""
    _, args, run = _on_cache("rm", "Remove a KV cache: its directory, slab files and index.", argv)

    def body(fs) -> int:
        KVCache(args.path, fs=fs).destroy()
        return EXIT_OK

    return run(body)


SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "plan": (main_plan, "size a model's KV cache (needs no cluster)"),
    "create": (main_create, "make a KV cache"),
    "stats": (main_stats, "show a cache's use, hits and misses"),
    "ls": (main_ls, "list a cache's keys"),
    "clear": (main_clear, "remove every block of a cache"),
    "rm": (main_rm, "remove a cache"),
}


def usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: emberfs kvcache SUBCOMMAND [ARGS...]", "", "subcommands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "Run 'emberfs kvcache SUBCOMMAND --help' for its options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``emberfs kvcache``; the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return EXIT_OK
    if not argv or argv[0] not in SUBCOMMANDS:
        what = f"unknown subcommand {argv[0]!r}\n\n" if argv else ""
        print(f"emberfs kvcache: {what}{usage()}", file=sys.stderr)
        return EXIT_USAGE
    return SUBCOMMANDS[argv[0]][0](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
