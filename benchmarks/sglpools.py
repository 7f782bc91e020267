"""Real SGLang host memory pools, built on the CPU for the SGLang backend's tests and benchmark.

SGLang mirrors the GPU's KV pool in host memory; the pools are built here
from CPU tensors standing for the device buffers, with pinned memory off.
"""

from __future__ import annotations

import torch
from sglang.srt.mem_cache.device_pool_info import (
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
    MLABufferInfo,
)
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

CPU = torch.device("cpu")


def _pointers(tensors) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.uint64)


def mha_pool(
    layout: str = "page_first",
    *,
    layers: int = 4,
    heads: int = 2,
    head_dim: int = 64,
    page_size: int = 16,
    tokens: int = 256,
    dtype: torch.dtype = torch.bfloat16,
) -> MHATokenToKVPoolHost:
    """An MHA host pool of ``tokens`` device tokens and twice as many host tokens."""
    k = tuple(torch.zeros(tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    info = MHABufferInfo(
        buffers=KVBuffers(
            k=k, v=v, k_data_ptrs=_pointers(k), v_data_ptrs=_pointers(v), layout=KVBufferLayout.NHD
        ),
        page_size=page_size,
        head_num=heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        dtype=dtype,
        device=CPU,
    )
    return MHATokenToKVPoolHost(
        info,
        2.0,
        0,
        page_size,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=tokens,
        start_layer=0,
        end_layer=layers,
    )


def mla_pool(
    layout: str = "page_first",
    *,
    layers: int = 3,
    lora_rank: int = 96,
    rope_dim: int = 32,
    page_size: int = 16,
    tokens: int = 256,
    dtype: torch.dtype = torch.bfloat16,
) -> MLATokenToKVPoolHost:
    """An MLA host pool (one latent row per token and layer)."""
    dim = lora_rank + rope_dim
    rows = tuple(torch.zeros(tokens, 1, dim, dtype=dtype) for _ in range(layers))
    info = MLABufferInfo(
        buffers=rows,
        data_ptrs=_pointers(rows),
        layer_indices=tuple(range(layers)),
        device_layer_num=layers,
        page_size=page_size,
        kv_lora_rank=lora_rank,
        qk_rope_head_dim=rope_dim,
        kv_cache_dim=dim,
        dtype=dtype,
        device=CPU,
    )
    return MLATokenToKVPoolHost(
        info,
        2.0,
        0,
        page_size,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=tokens,
        start_layer=0,
        end_layer=layers,
        target_layer_num=layers,
    )


def mamba_pool(*, layers: int = 2, states: int = 8, layout: str = "page_first") -> MambaPoolHost:
    """A Mamba state host pool: per layer and state slot a temporal and two conv states."""
    temporal = torch.zeros(layers, states, 4, 16, dtype=torch.float32)
    conv = (
        torch.zeros(layers, states, 8, 3, dtype=torch.bfloat16),
        torch.zeros(layers, states, 5, dtype=torch.bfloat16),
    )
    info = MambaStateBufferInfo(temporal=temporal, conv=conv)
    return MambaPoolHost(
        info, 2.0, 0, device_capacity=states, pin_memory=False, device="cpu", layout=layout
    )


def fill(pool, seed: int | None) -> None:
    """Random bytes (zeros when ``seed`` is None) in every page of a host pool."""
    gen = torch.Generator().manual_seed(seed or 0)
    for p in range(pool.page_num):
        data = pool.get_dummy_flat_data_page()
        if seed is not None:
            raw = data.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
        pool.set_from_flat_data_page(p * pool.page_size, data)


def page_bytes(pool, page: int) -> torch.Tensor:
    """The bytes of page ``page`` of a host pool, as a uint8 tensor (a copy)."""
    return pool.get_data_page(page * pool.page_size, flat=True).clone().view(torch.uint8)


def slots(pool, first: int, pages: int) -> torch.Tensor:
    """The host slots of ``pages`` pages of a host pool from page ``first``, as SGLang passes them."""
    start = first * pool.page_size
    return torch.arange(start, start + pages * pool.page_size, dtype=torch.int64)
