"""Pages of SGLang's host memory pools as blocks of an EmberFS KV cache.

SGLang keeps the KV pages it offloads from the GPU in host memory pools and
hands a storage backend a pool and the slots of each page. How a page is
stored depends on where its bytes lie in the pool:

* one contiguous region (an MLA page of the ``page_first`` layouts): one
  block, read and written in place;
* two contiguous regions, keys and values (an MHA page of ``page_first``,
  ``page_first_direct`` or ``page_head``): two blocks, ``-k`` and ``-v``,
  each read and written in place, as SGLang's 3FS backend stores them;
* anything else (``layer_first``, whose page is strided over every layer,
  or a pool that assembles its pages, as Mamba's does): one block of the
  pool's flat page, written from ``get_data_page(flat=True)`` and read into
  a dummy page that the pool copies into its slots.

:func:`page_plan` tells which, by asking the pool for a page twice: a page
that is a view of the pool's own memory comes back at the same address.
Keys name the layout and the KV dtype (:func:`pool_suffix`), so servers whose
pools differ never read each other's bytes as pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from emberfs.kvcache.store import KVCache

FLAT = ("",)
SPLIT = ("-k", "-v")


def key_suffix(storage_config, sharded: bool = False) -> str:
    """What follows a page hash in a key: the model and the part of it this rank holds.

    As SGLang's own file backend names its files: the model name, the
    tensor-parallel rank and size (not for MLA models, whose ranks hold the
    same KV, unless ``sharded``: a pool such as Mamba's state is split over
    the ranks of every model), the pipeline stage and the context-parallel
    rank when there are several, the decode-context-parallel shard and
    logical page size when there are several shards.

    Parameters
    ----------
    storage_config : HiCacheStorageConfig or None
        SGLang's storage config; None adds nothing.
    sharded : bool
        Whether the pool is split over the tensor-parallel ranks of an MLA model too.
    """
    if storage_config is None:
        return ""
    parts = []
    model = getattr(storage_config, "model_name", None)
    if model:
        parts.append(str(model).replace("/", "-"))
    if sharded or not getattr(storage_config, "is_mla_model", False):
        parts.append(f"{storage_config.tp_rank}_{storage_config.tp_size}")
    pp_size = getattr(storage_config, "pp_size", 1) or 1
    if pp_size > 1:
        parts.append(f"{pp_size}_{storage_config.pp_rank}")
    cp_size = getattr(storage_config, "attn_cp_size", 1) or 1
    if cp_size > 1:
        parts.append(f"cp{storage_config.attn_cp_rank}_{cp_size}")
    dcp_size = getattr(storage_config, "dcp_size", 1) or 1
    if dcp_size > 1:
        parts.append(
            f"tp{storage_config.tp_size}_dcp{storage_config.dcp_rank}_{dcp_size}"
            f"_page{storage_config.logical_page_size}"
        )
    return "".join(f"_{p}" for p in parts)


def pool_suffix(pool) -> str:
    """What a pool adds to its keys: its layout and dtype (``_page_first_bfloat16``)."""
    layout = getattr(pool, "layout", None) or "flat"
    dtype = str(getattr(pool, "dtype", "") or "bytes").removeprefix("torch.")
    return f"_{layout}_{dtype}"


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass(frozen=True)
class PagePlan:
    """How the pages of one host pool are stored.

    Attributes
    ----------
    parts : tuple of str
        What each block of a page adds to the page hash: ``("",)`` for one
        block, ``("-k", "-v")`` for keys and values apart.
    direct : bool
        Whether the blocks are regions of the pool, read and written in
        place (else a page goes through the pool's flat page).
    page_bytes : int
        Bytes of a page.
    suffix : str
        :func:`pool_suffix` of the pool.
    """

    parts: tuple[str, ...]
    direct: bool
    page_bytes: int
    suffix: str

    @property
    def block_bytes(self) -> int:
        """Bytes of each block of a page."""
        return self.page_bytes // len(self.parts)


def page_plan(pool) -> PagePlan:
    """How the pages of ``pool`` (an SGLang host pool) are stored (see the module docstring)."""
    page_bytes = nbytes(pool.get_dummy_flat_data_page())
    suffix = pool_suffix(pool)
    flat = PagePlan(FLAT, False, page_bytes, suffix)
    try:
        first = pool.get_data_page(0, flat=False)
        again = pool.get_data_page(0, flat=False)
    except (ValueError, IndexError, NotImplementedError, RuntimeError):
        return flat
    if (
        not isinstance(first, torch.Tensor)
        or first.device.type != "cpu"
        or first.data_ptr() != again.data_ptr()  # assembled afresh: not the pool's memory
        or nbytes(first) != page_bytes
    ):
        return flat
    if first.is_contiguous():
        return PagePlan(FLAT, True, page_bytes, suffix)
    if first.dim() > 1 and first.shape[0] == 2 and all(h.is_contiguous() for h in first):
        return PagePlan(SPLIT, True, page_bytes, suffix)
    return flat


def page_regions(pool, plan: PagePlan, index: int) -> list[memoryview]:
    """Writable byte views of the regions of the page at slot ``index`` of a direct plan."""
    page = pool.get_data_page(index, flat=False)
    regions = [page] if len(plan.parts) == 1 else [page[0], page[1]]
    return [byte_view(r) for r in regions]


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host tensor, as a writable view of its memory."""
    return memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy())


def page_source(value) -> memoryview:
    """The bytes of a page to store, without a copy when it is contiguous host memory.

    A torch tensor is viewed as bytes (a tensor in device memory is copied
    to the host first, a non-contiguous one made contiguous); any other
    object must offer the buffer protocol.
    """
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        return byte_view(tensor.contiguous())
    view = memoryview(value)
    if not view.contiguous:
        view = memoryview(view.tobytes())
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def page_target(target) -> memoryview:
    """A writable byte view of a page buffer to read into (a contiguous host tensor or buffer)."""
    if isinstance(target, torch.Tensor):
        if target.device.type != "cpu" or not target.is_contiguous():
            raise ValueError("a page target must be a contiguous tensor in host memory")
        return byte_view(target)
    view = memoryview(target)
    if view.readonly or not view.contiguous:
        raise ValueError("a page target must be a writable contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def sized(view: memoryview, sizes, i: int) -> memoryview:
    """``view`` cut to ``sizes[i]`` bytes (all of it when there are no sizes)."""
    if sizes is None or sizes[i] is None:
        return view
    size = int(sizes[i])
    if size > len(view):
        raise ValueError(f"page {i}: a size of {size} bytes for a buffer of {len(view)}")
    return view[:size]


def page_slots(keys, host_indices, page_size: int) -> list[int]:
    """The first slot of each page of a transfer: ``host_indices[i * page_size]``.

    Raises ValueError when ``host_indices`` is not ``page_size`` slots per key.
    """
    count = 0 if host_indices is None else len(host_indices)
    if count != len(keys) * page_size:
        raise ValueError(f"{count} host slots for {len(keys)} pages of {page_size} slots each")
    if not keys:
        return []
    firsts = host_indices[::page_size]
    return [int(i) for i in (firsts.tolist() if hasattr(firsts, "tolist") else firsts)]


@dataclass
class PageStore:
    """Where the pages of one host pool go: a cache, the pool, how its pages are stored."""

    name: str
    cache: KVCache | None
    suffix: str  # of the rank and, once the pool is known, of its layout and dtype
    pool: object | None = None
    plan: PagePlan | None = None

    @property
    def parts(self) -> tuple[str, ...]:
        return self.plan.parts if self.plan is not None else FLAT

    def names(self, keys: Sequence[str]) -> list[str]:
        """The blocks' keys of the pages of ``keys``, page by page."""
        return [f"{k}{part}{self.suffix}" for k in keys for part in self.parts]

    def split(self, view: memoryview) -> list[memoryview]:
        """The blocks of a flat page (one block unless it is a whole page of a split plan)."""
        n = len(self.parts)
        if n == 1 or len(view) != self.plan.page_bytes:
            return [view]
        size = len(view) // n
        return [view[i * size : (i + 1) * size] for i in range(n)]


def restorable_pages(present: list[bool], policy, trailing: int) -> tuple[int, set[int]] | None:
    """Which lengths of a stored KV prefix a further pool can restore, by its hit policy.

    Parameters
    ----------
    present : list of bool
        Per page of the KV prefix, whether the pool's page is stored.
    policy : PoolHitPolicy
        ``all_pages``: the pool's page of every page of a prefix is needed;
        ``trailing_pages``: those of its last ``trailing`` pages.
    trailing : int
        Pages at the end of a prefix the pool keeps (at least 1).

    Returns
    -------
    (int, set of int) or None
        The longest length the pool can restore and every length it can;
        None for another policy, which gives no verdict.
    """
    if policy == "all_pages":
        boundary = present.index(False) if False in present else len(present)
        return boundary, set(range(1, boundary + 1))
    if policy == "trailing_pages":
        window = max(1, trailing)
        lengths = {n for n in range(1, len(present) + 1) if all(present[max(0, n - window) : n])}
        return max(lengths, default=0), lengths
    return None
