"""How an LMCache chunk is stored in one KV cache block: a small header, then its bytes.

The header (:class:`ChunkHeader`) records the chunk's memory format, shapes,
dtypes and length, so a reader can allocate the memory object before copying
the bytes in. Dtypes and formats come back as torch dtypes and LMCache's
``MemoryFormat`` when those are installed, as names otherwise.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from emberfs.kvcache.layout import DTYPE_BYTES

try:
    import torch
except ImportError:  # dtypes are then kept as names
    torch = None

try:
    from lmcache.v1.memory_management import MemoryFormat
except ImportError:
    MemoryFormat = None

HEADER_ROOM = 4096  # bytes a block keeps for the chunk header
MAGIC = b"EKV1"
_PREFIX = struct.Struct("<4sI")  # magic, bytes of the JSON that follows


def dtype_name(dtype) -> str:
    text = str(dtype)
    return text.removeprefix("torch.")


def itemsize(dtype) -> int:
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int):
        return size
    name = dtype_name(dtype).lower()
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return DTYPE_BYTES[name]


def byte_view(obj) -> memoryview:
    """A byte view of a memory object's ``byte_array``."""
    view = memoryview(obj.byte_array)
    if not view.contiguous:
        raise ValueError("a memory object's byte_array must be contiguous")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def payload(obj) -> memoryview:
    """The bytes of a chunk: ``get_size()`` bytes of its ``byte_array``."""
    view = byte_view(obj)
    size = obj.get_size() if hasattr(obj, "get_size") else len(view)
    return view[: min(size, len(view))]


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
        if hasattr(memory_obj, "get_shapes"):
            shapes, dtypes = memory_obj.get_shapes(), memory_obj.get_dtypes()
        else:
            shapes, dtypes = [memory_obj.get_shape()], [memory_obj.get_dtype()]
        fmt = memory_obj.get_memory_format()
        return cls(
            length=length,
            shapes=[[int(n) for n in shape] for shape in shapes],
            dtypes=[dtype_name(d) for d in dtypes],
            fmt=getattr(fmt, "name", None) or str(fmt),
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

        torch sizes and dtypes and LMCache's ``MemoryFormat`` where they are
        installed, else tuples and names.
        """
        if torch is None:
            shapes: list = [tuple(s) for s in self.shapes]
            dtypes: list = list(self.dtypes)
        else:
            shapes = [torch.Size(s) for s in self.shapes]
            dtypes = [getattr(torch, d) for d in self.dtypes]
        fmt = MemoryFormat[self.fmt] if MemoryFormat is not None else self.fmt
        return shapes, dtypes, fmt
