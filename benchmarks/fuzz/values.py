"""Value generators: boundary and random integers, text, weighted picks."""

from __future__ import annotations

import random
import string
from typing import Any

MiB = 1 << 20
U16 = (1 << 16) - 1
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


def pick(rng: random.Random, weighted: dict[Any, float]) -> Any:
    """One key of ``weighted``, drawn by its weight."""
    return rng.choices(list(weighted), weights=list(weighted.values()))[0]


def u32(rng: random.Random) -> int:
    """A boundary u32 mostly, else a random one of 8, 16 or 32 bits."""
    if rng.random() < 0.6:
        return rng.choice((0, 1, 2, 4095, 4096, 65535, 65536, (1 << 31) - 1, 1 << 31, U32 - 1, U32))
    return rng.getrandbits(rng.choice((8, 16, 32)))


def u64(rng: random.Random) -> int:
    """A boundary u64 mostly, else a random one of 8 to 64 bits."""
    if rng.random() < 0.6:
        return rng.choice((0, 1, 2, U32, U32 + 1, I64_MAX, 1 << 63, U64 - 1, U64))
    return rng.getrandbits(rng.choice((8, 20, 40, 64)))


def text(rng: random.Random, n: int | None = None) -> str:
    """A string of printable, non-ASCII and control characters (valid UTF-8)."""
    n = rng.choice((0, 1, 5, 16, 64, 255, 256, 1000)) if n is None else n
    pools = (
        string.ascii_letters + string.digits,
        string.printable,
        "é日本語😀\u202e\u200b\ufeff\u0301",
        "\x00\x01\x7f\n\r\t",
    )
    return "".join(rng.choices(rng.choice(pools), k=n))
