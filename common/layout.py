"""File layouts: which chain holds which chunk.

One pure, deterministic function decides where a file's data lives, used by
the metaserver (at create time), the client and the storage servers alike.
It must give the same answer on every platform and Python version, so the
shuffle is a Fisher-Yates driven by our own SplitMix64 generator and never
Python's ``random`` (whose algorithms may change between versions).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 64 * 1024 * 1024
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
DEFAULT_STRIPE = 4
MAX_STRIPE = 256

_MASK64 = (1 << 64) - 1


def splitmix64(state: int) -> tuple[int, int]:
    """One SplitMix64 step: returns (new_state, output). Pure 64-bit arithmetic."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def portable_shuffle(items: list[int], seed: int) -> list[int]:
    """A shuffled copy of ``items``: Fisher-Yates with SplitMix64, seeded by ``seed``.

    The bound is applied with a plain modulo of the 64-bit output, which is
    exact integer arithmetic and therefore identical everywhere.
    """
    out = list(items)
    state = seed & _MASK64
    for i in range(len(out) - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        out[i], out[j] = out[j], out[i]
    return out


def choose_chains(chain_table: list[int], stripe: int, seed: int) -> list[int]:
    """The chains of a new file: ``stripe`` consecutive chains of the table.

    The window starts at ``seed % len(table)`` (round-robin across files, as
    the metaserver hands out increasing seeds) and is then shuffled with the
    seed, so chunk 0 of consecutive files does not always land on the same chain.
    """
    if not chain_table:
        raise ValueError("the chain table is empty")
    if stripe < 1:
        raise ValueError("stripe must be at least 1")
    n = len(chain_table)
    stripe = min(stripe, n)
    start = seed % n
    window = [chain_table[(start + k) % n] for k in range(stripe)]
    return portable_shuffle(window, seed)


def chunk_chain(chains: list[int], index: int) -> int:
    """The chain that holds chunk ``index`` of a file whose chains are ``chains``."""
    return chains[index % len(chains)]


def validate_chunk_size(chunk_size: int) -> None:
    if chunk_size < MIN_CHUNK_SIZE or chunk_size > MAX_CHUNK_SIZE:
        raise ValueError(f"chunk size {chunk_size} is outside {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}")
    if chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk size {chunk_size} is not a power of two")


@dataclass(frozen=True)
class ChunkSpan:
    """The part of one chunk that a byte range of a file covers."""

    index: int  # chunk index in the file
    chunk_offset: int  # offset inside the chunk
    length: int
    file_offset: int


def chunk_spans(offset: int, length: int, chunk_size: int) -> list[ChunkSpan]:
    """Split the file range [offset, offset+length) at chunk boundaries."""
    spans = []
    end = offset + length
    pos = offset
    while pos < end:
        index = pos // chunk_size
        inner = pos - index * chunk_size
        n = min(chunk_size - inner, end - pos)
        spans.append(ChunkSpan(index, inner, n, pos))
        pos += n
    return spans
