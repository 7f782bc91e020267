"""Sizing a KV cache: bytes per token and per block of a model's layout, and totals.

A transformer keeps, per token and per layer, a key and a value vector for
each KV head: ``kv x layers x kv_heads x head_dim x dtype bytes`` per token
(``kv`` is 2, or 1 for a latent cache such as MLA's). A 70B model with 80
layers and a hidden size of 8192 (no grouped-query attention) in 16-bit
precision keeps 2 x 80 x 8192 x 2 = 2,621,440 bytes (2.5 MiB) per token, so ten
users with 32K-token contexts need 10 x 32768 x 2.5 MiB = 800 GiB. A block
of the cache holds ``tokens_per_block`` tokens of every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}


@dataclass(frozen=True)
class KVLayout:
    """A model's KV layout and the block it is stored in.

    Parameters
    ----------
    layers : int
    kv_heads : int
        KV heads per layer (the attention heads, without grouped-query attention).
    head_dim : int
    tokens_per_block : int, default 16
    dtype : str, default "bfloat16"
        A name of :data:`DTYPE_BYTES`.
    kv : int, default 2
        Tensors per head: 2 (key and value), 1 for a latent cache.
    """

    layers: int
    kv_heads: int
    head_dim: int
    tokens_per_block: int = 16
    dtype: str = "bfloat16"
    kv: int = 2

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim", "tokens_per_block", "kv"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.dtype.lower() not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r} (one of {', '.join(DTYPE_BYTES)})")

    @classmethod
    def from_hidden(cls, layers: int, hidden: int, **kwargs) -> KVLayout:
        """A layout whose KV heads span the hidden size (``kv_heads x head_dim = hidden``)."""
        return cls(layers=layers, kv_heads=1, head_dim=hidden, **kwargs)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype.lower()]

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token over all layers."""
        return self.kv * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def block_size(self) -> int:
        """Bytes of one block: ``tokens_per_block`` tokens."""
        return self.bytes_per_token * self.tokens_per_block

    def total_bytes(self, users: int, context: int) -> int:
        """KV bytes of ``users`` contexts of ``context`` tokens each."""
        return users * context * self.bytes_per_token

    def blocks(self, users: int, context: int) -> int:
        """Blocks of ``users`` contexts of ``context`` tokens (each context's last one partly full)."""
        return users * -(-context // self.tokens_per_block)
