"""Fixtures of the KV cache tests: caches of their own on the shared cluster."""

from __future__ import annotations

import uuid

import pytest

from emberfs.kvcache import KVCache


@pytest.fixture
def make_cache(fs):
    """``make_cache(block_size, blocks, slab_blocks=None)``: a new cache, removed after the test."""
    made: list[KVCache] = []

    def make(block_size: int = 64 * 1024, blocks: int = 64, slab_blocks: int | None = None):
        path = f"/kv-{uuid.uuid4().hex[:12]}"
        slab = (slab_blocks or blocks) * block_size
        cache = KVCache.create(
            path, block_size=block_size, capacity=blocks * block_size, slab_size=slab, fs=fs
        )
        made.append(cache)
        return cache

    yield make
    for cache in made:
        try:
            cache.destroy()
        except FileNotFoundError:
            pass


@pytest.fixture
def kv_path(fs):
    """A cache directory no other test uses, removed afterwards."""
    path = f"/kv-backend-{uuid.uuid4().hex[:12]}"
    yield path
    if fs.exists(path):
        fs.rm(path, recursive=True)
