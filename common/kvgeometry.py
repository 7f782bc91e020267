"""Where a KV cache's slots lie in its slab files: one function for clients and metaserver.

A cache's geometry (``KvGeometry``) fixes its block size, the bytes a slot
takes (``stride``: the block size rounded up to whole pages), the slab
files' chunk size and slots, and the cache's capacity in slots. Slots never
straddle chunks: a chunk holds ``chunk_size // stride`` whole slots (the rest
of it stays a hole), or a slot takes whole chunks when it is larger than
one, so reading a block is one chunk read per chunk it takes.
"""

from __future__ import annotations

from emberfs.common.layout import MAX_CHUNK_SIZE, validate_chunk_size
from emberfs.proto import kvcache_pb2

PAGE = 4096
MIN_SLAB_CHUNK = 1024 * 1024  # small blocks share chunks of at least this size
DEFAULT_SLAB_SIZE = 1 << 30
MAX_SLABS = 65536


def plan(
    block_size: int, capacity: int, slab_size: int = DEFAULT_SLAB_SIZE
) -> kvcache_pb2.KvGeometry:
    """The geometry of a cache of ``capacity`` bytes of ``block_size`` blocks, in slabs of ~``slab_size``."""
    if block_size <= 0:
        raise ValueError("the block size must be positive")
    stride = -(-block_size // PAGE) * PAGE
    if stride > MAX_CHUNK_SIZE:
        chunk = MAX_CHUNK_SIZE
        stride = -(-stride // chunk) * chunk
    else:
        chunk = max(MIN_SLAB_CHUNK, 1 << (stride - 1).bit_length())
    slots = capacity // stride
    if slots <= 0:
        raise ValueError(f"a capacity of {capacity} bytes holds no block of {block_size} bytes")
    per_chunk = max(1, chunk // stride)
    # whole chunks (or whole slots of several chunks) per slab, at least one
    slab_slots = max(1, slab_size // max(chunk, stride)) * per_chunk
    g = kvcache_pb2.KvGeometry(
        block_size=block_size,
        stride=stride,
        chunk_size=chunk,
        slab_slots=min(slab_slots, slots),
        capacity_slots=slots,
    )
    if slab_count(g) > MAX_SLABS:
        raise ValueError(f"{slab_count(g)} slab files: give a larger slab size")
    return g


def check(g: kvcache_pb2.KvGeometry) -> None:
    """ValueError unless ``g`` is a geometry :func:`slot_offset` can place slots by."""
    if g.block_size <= 0:
        raise ValueError("the block size must be positive")
    if g.stride < g.block_size:
        raise ValueError("a slot must hold a block (stride below the block size)")
    validate_chunk_size(g.chunk_size)
    if g.stride > g.chunk_size and g.stride % g.chunk_size:
        raise ValueError("a slot larger than a chunk must take whole chunks")
    if g.slab_slots <= 0 or g.capacity_slots <= 0:
        raise ValueError("a cache needs at least one slot")
    if slab_count(g) > MAX_SLABS:
        raise ValueError(f"more than {MAX_SLABS} slab files")


def slab_count(g: kvcache_pb2.KvGeometry) -> int:
    """Slab files of the cache."""
    return -(-g.capacity_slots // g.slab_slots)


def slab_capacity(g: kvcache_pb2.KvGeometry, slab: int) -> int:
    """Slots of slab ``slab`` (the last slab holds what is left of the capacity)."""
    first = slab * g.slab_slots
    return max(0, min(g.slab_slots, g.capacity_slots - first))


def slot_offset(g: kvcache_pb2.KvGeometry, index: int) -> int:
    """Where slot ``index`` of a slab starts in the slab file."""
    if g.stride > g.chunk_size:
        return index * g.stride
    per_chunk = g.chunk_size // g.stride
    return (index // per_chunk) * g.chunk_size + (index % per_chunk) * g.stride


def slab_bytes(g: kvcache_pb2.KvGeometry, slots: int) -> int:
    """The length of a slab file of ``slots`` slots."""
    if slots <= 0:
        return 0
    return slot_offset(g, slots - 1) + g.stride


def locate(g: kvcache_pb2.KvGeometry, slot: int) -> tuple[int, int]:
    """``(slab, offset)`` of a cache-wide slot number."""
    slab, index = divmod(slot, g.slab_slots)
    return slab, slot_offset(g, index)
