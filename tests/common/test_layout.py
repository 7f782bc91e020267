from __future__ import annotations

import pytest

from emberfs.common import layout


def test_splitmix64_fixed_vectors():
    # Reference values of SplitMix64 seeded with 0 (first three outputs).
    state = 0
    outs = []
    for _ in range(3):
        state, out = layout.splitmix64(state)
        outs.append(out)
    assert outs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_portable_shuffle_fixed_vectors():
    assert layout.portable_shuffle(list(range(8)), 0) == FIXED_SHUFFLE_0
    assert layout.portable_shuffle(list(range(8)), 42) == FIXED_SHUFFLE_42
    assert layout.portable_shuffle([], 7) == []
    assert layout.portable_shuffle([5], 7) == [5]


def test_choose_chains_fixed_vectors():
    table = [1, 2, 3, 4, 5, 6]
    assert layout.choose_chains(table, 4, 0) == FIXED_CHOOSE_0
    assert layout.choose_chains(table, 4, 9) == FIXED_CHOOSE_9
    # stripe is capped at the table size; every chain appears once
    chosen = layout.choose_chains(table, 16, 3)
    assert sorted(chosen) == table


def test_choose_chains_is_a_window_of_the_table():
    table = [10, 20, 30, 40, 50]
    for seed in range(50):
        chosen = layout.choose_chains(table, 3, seed)
        start = seed % len(table)
        assert sorted(chosen) == sorted(table[(start + k) % 5] for k in range(3))


def test_choose_chains_spreads_first_chunk():
    table = list(range(1, 9))
    firsts = {layout.choose_chains(table, 4, seed)[0] for seed in range(64)}
    assert len(firsts) == len(table)


def test_choose_chains_rejects_bad_input():
    with pytest.raises(ValueError):
        layout.choose_chains([], 1, 0)
    with pytest.raises(ValueError):
        layout.choose_chains([1], 0, 0)


def test_chunk_chain_round_robin():
    chains = [7, 3, 9]
    assert [layout.chunk_chain(chains, i) for i in range(7)] == [7, 3, 9, 7, 3, 9, 7]


def test_chunk_spans():
    cs = 1024 * 1024
    spans = layout.chunk_spans(cs - 10, 20 + cs, cs)
    assert [(s.index, s.chunk_offset, s.length, s.file_offset) for s in spans] == [
        (0, cs - 10, 10, cs - 10),
        (1, 0, cs, cs),
        (2, 0, 10, 2 * cs),
    ]
    assert layout.chunk_spans(5, 0, cs) == []


@pytest.mark.parametrize("size", [64 * 1024, 1 << 20, 4 << 20, 64 << 20])
def test_valid_chunk_sizes(size):
    layout.validate_chunk_size(size)


@pytest.mark.parametrize("size", [0, 32 * 1024, 3 << 20, 128 << 20])
def test_invalid_chunk_sizes(size):
    with pytest.raises(ValueError):
        layout.validate_chunk_size(size)


# Recorded once from the reference implementation: a change here moves every
# existing file's data, so these must never change.
FIXED_SHUFFLE_0 = [2, 5, 0, 3, 4, 6, 1, 7]
FIXED_SHUFFLE_42 = [3, 1, 6, 2, 4, 0, 7, 5]
FIXED_CHOOSE_0 = [3, 2, 1, 4]
FIXED_CHOOSE_9 = [6, 1, 5, 4]
