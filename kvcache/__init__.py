"""A KV cache block store for inference on EmberFS, and its SGLang and LMCache backends.

:class:`KVCache` keeps fixed-size blocks (a few tokens of every layer's keys
and values) under opaque keys, in large slab files of one directory, with an
index shared by every process that opens it; :class:`KVLayout` sizes the
blocks of a model. See ``docs/kvcache.md``.
"""

from emberfs.kvcache.layout import KVLayout
from emberfs.kvcache.store import KVCache, KVStats, PutStatus

__all__ = ["KVCache", "KVLayout", "KVStats", "PutStatus"]
