"""Directory layouts and the layout a new file takes from its directory.

A directory may store a layout (chunk size, stripe, chain table); one that
stores none (chunk size 0) uses its nearest ancestor's, and the root's
fallback is the namespace's default layout (set at start-up, so changing
the server's default changes it for every directory without its own). A new
file takes the effective layout of its directory, a seed from a counter
(consecutive files start at consecutive positions of the chain table) and
its chains from :func:`emberfs.common.layout.choose_chains`.
"""

from __future__ import annotations

from emberfs.common import layout as layouts
from emberfs.common.errors import InvalidArgument, Unavailable
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.proto import common_pb2


def validate_dir_layout(layout: common_pb2.Layout, live_chains: list[int]) -> None:
    """Check a layout given for a directory (chunk size 0 means "inherit").

    Raises InvalidArgument for a chunk size that is not a power of two in
    64 KiB..64 MiB, a stripe outside 1..256, chain ids that are unknown or
    repeated, or a seed/chains (which only files carry).
    """
    if layout.seed or layout.chains:
        raise InvalidArgument("a directory layout carries no seed or chains")
    if layout.chunk_size == 0:
        if layout.stripe or layout.chain_table:
            raise InvalidArgument("a layout with a stripe or chain table needs a chunk size")
        return
    try:
        layouts.validate_chunk_size(layout.chunk_size)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if not 1 <= layout.stripe <= layouts.MAX_STRIPE:
        raise InvalidArgument(f"stripe {layout.stripe} is outside 1..{layouts.MAX_STRIPE}")
    table = list(layout.chain_table)
    if len(set(table)) != len(table):
        raise InvalidArgument("repeated chain id in the chain table")
    unknown = sorted(set(table) - set(live_chains))
    if unknown:
        raise InvalidArgument(f"unknown chain ids {unknown}")


def dir_layout(layout: common_pb2.Layout) -> common_pb2.Layout:
    """The stored form of a validated directory layout."""
    if layout.chunk_size == 0:
        return common_pb2.Layout()
    return common_pb2.Layout(
        chunk_size=layout.chunk_size, stripe=layout.stripe, chain_table=layout.chain_table
    )


def effective_layout(op: OpContext, ancestors: list[common_pb2.InodeAttr]) -> common_pb2.Layout:
    """The layout that applies in the last of ``ancestors`` (root first)."""
    for directory in reversed(ancestors):
        if directory.layout.chunk_size:
            return directory.layout
    return op.env.default_layout


def file_layout(op: OpContext, ancestors: list[common_pb2.InodeAttr]) -> common_pb2.Layout:
    """The fixed layout of a new file created in the last of ``ancestors``.

    Raises Unavailable when no chain exists yet (or none of the directory's
    chain table is still known).
    """
    inherited = effective_layout(op, ancestors)
    live = op.env.chain_table()
    if inherited.chain_table:
        known = set(live)
        table = [c for c in inherited.chain_table if c in known]
    else:
        table = list(live)
    if not table:
        raise Unavailable("no storage chains yet")
    seed = op.env.seeds.next()
    chains = layouts.choose_chains(table, inherited.stripe or layouts.DEFAULT_STRIPE, seed)
    return common_pb2.Layout(
        chunk_size=inherited.chunk_size or layouts.DEFAULT_CHUNK_SIZE,
        stripe=len(chains),
        seed=seed,
        chains=chains,
    )
