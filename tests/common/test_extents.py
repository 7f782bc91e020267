"""Which chunks of a file hold data: every chunk with a byte below the size outside the holes."""

from __future__ import annotations

import random

from emberfs.common import extents


def by_bytes(holes, size, chunk):
    """The chunks with data, byte range by byte range (the definition, slowly)."""
    return [
        i
        for i in range(-(-size // chunk))
        if extents.data_end(holes, size, i * chunk, (i + 1) * chunk) > i * chunk
    ]


def test_data_chunks_are_the_chunks_with_a_byte_of_data():
    rng = random.Random(7)
    for _ in range(5000):
        size = rng.randrange(0, 80)
        cuts = sorted(rng.sample(range(size + 1), min(size + 1, rng.randrange(0, 7))))
        holes = []
        for a, b in zip(cuts[::2], cuts[1::2], strict=False):
            if a < b and (not holes or a > holes[-1][1]):
                holes.append((a, b))
        assert list(extents.data_chunks(holes, size, 4)) == by_bytes(holes, size, 4)


def test_a_petabyte_hole_has_no_chunks():
    size = 1 << 50
    assert list(extents.data_chunks([(10, size)], size, 4 << 20)) == [0]
    assert list(extents.data_chunks([(0, size)], size, 4 << 20)) == []
