"""How an LMCache chunk is stored in one KV cache block: a small header, then its bytes.

The header (:class:`ChunkHeader`) records the chunk's memory format, shapes,
dtypes and length, so a reader can allocate the memory object before copying
the bytes in. Dtypes and formats come back as torch dtypes and LMCache's
``MemoryFormat``: like :mod:`emberfs.kvcache.lmcache`, this module needs LMCache.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import torch
from lmcache.v1.memory_management import MemoryFormat

HEADER_ROOM = 4096  # bytes a block keeps for the chunk header
MAGIC = b"EKV1"
_PREFIX = struct.Struct("<4sI")  # magic, bytes of the JSON that follows


def dtype_name(dtype) -> str:
    text = str(dtype)
    return text.removeprefix("torch.")


def chunk_bytes(shapes, dtypes) -> int:
    """Bytes of a chunk of these shapes and torch dtypes."""
    return sum(
        math.prod(shape) * dtype.itemsize for shape, dtype in zip(shapes, dtypes, strict=True)
    )


def byte_view(obj) -> memoryview:
    """A byte view of a memory object's ``byte_array``."""
    view = memoryview(obj.byte_array)
    if not view.contiguous:
        raise ValueError("a memory object's byte_array must be contiguous")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def payload(obj) -> memoryview:
    """The bytes of a chunk: ``get_size()`` bytes of its ``byte_array``."""
    view = byte_view(obj)
    return view[: min(obj.get_size(), len(view))]


@dataclass(frozen=True)
class ChunkHeader:
    """What allocating a stored chunk again takes: its length, shapes, dtypes and format.

    Encoded as ``EKV1``, the length of a JSON document (4 bytes, little
    endian) and the document.
    """

    length: int
    shapes: list[list[int]]
    dtypes: list[str]
    fmt: str

    @classmethod
    def of(cls, memory_obj, length: int) -> ChunkHeader:
        """The header of ``memory_obj`` holding ``length`` bytes."""
        shapes, dtypes = memory_obj.get_shapes(), memory_obj.get_dtypes()
        return cls(
            length=length,
            shapes=[[int(n) for n in shape] for shape in shapes],
            dtypes=[dtype_name(d) for d in dtypes],
            fmt=memory_obj.get_memory_format().name,
        )

    def encode(self) -> bytes:
        doc = {"length": self.length, "shapes": self.shapes, "dtypes": self.dtypes, "fmt": self.fmt}
        body = json.dumps(doc, separators=(",", ":")).encode()
        return _PREFIX.pack(MAGIC, len(body)) + body

    @classmethod
    def decode(cls, block) -> tuple[ChunkHeader, int]:
        """The header at the start of ``block`` and where the chunk's bytes start.

        Raises ValueError when ``block`` does not start with a header.
        """
        view = memoryview(block)
        if len(view) < _PREFIX.size:
            raise ValueError("a block shorter than a chunk header")
        magic, size = _PREFIX.unpack(view[: _PREFIX.size])
        end = _PREFIX.size + size
        if magic != MAGIC or end > len(view):
            raise ValueError("a block without a chunk header")
        try:
            doc = json.loads(bytes(view[_PREFIX.size : end]))
            header = cls(
                length=int(doc["length"]),
                shapes=[[int(n) for n in s] for s in doc["shapes"]],
                dtypes=[str(d) for d in doc["dtypes"]],
                fmt=str(doc["fmt"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"a damaged chunk header: {exc}") from None
        if end + header.length > len(view):
            raise ValueError("a block shorter than its chunk")
        return header, end

    def allocation(self) -> tuple[list, list, Any]:
        """``(shapes, dtypes, fmt)`` for ``local_cpu_backend.allocate``.

        Raises ValueError for a dtype or format this torch or LMCache does not know.
        """
        dtypes = [getattr(torch, d, None) for d in self.dtypes]
        if not all(isinstance(d, torch.dtype) for d in dtypes):
            raise ValueError(f"a chunk of unknown dtypes {self.dtypes}")
        if self.fmt not in MemoryFormat.__members__:
            raise ValueError(f"a chunk of unknown memory format {self.fmt!r}")
        return [torch.Size(s) for s in self.shapes], dtypes, MemoryFormat[self.fmt]
