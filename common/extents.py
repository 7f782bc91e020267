"""Which bytes of a file hold data: everything below its size except its holes.

Clients write a file front to back, so every byte they wrote below the size is
on storage. Only a truncation that grows a file leaves a range nobody wrote: a
hole, kept in the file's attributes (``InodeAttr.holes``) and read as zeros.
Every other byte below the size must be on storage; a chunk that should hold
it and is missing on every replica is lost, not a hole (see
:func:`data_end`), so a reader never takes lost or removed data for zeros.

Holes are ``(start, end)`` pairs, sorted, disjoint, not touching, within the size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

Hole = tuple[int, int]


def grow(holes: Iterable[Hole], size: int, new_size: int) -> list[Hole]:
    """The holes after a truncation from ``size`` up to ``new_size``: ``[size, new_size)`` added."""
    out = clip(holes, size)
    if new_size <= size:
        return out
    if out and out[-1][1] == size:
        out[-1] = (out[-1][0], new_size)
    else:
        out.append((size, new_size))
    return out


def clip(holes: Iterable[Hole], size: int) -> list[Hole]:
    """The holes of a file cut to ``size``."""
    return [(s, min(e, size)) for s, e in holes if s < size]


def data_end(holes: Sequence[Hole], size: int, start: int, end: int) -> int:
    """The end of the last byte of ``[start, end)`` that must be on storage (``start``: none).

    Bytes at or past ``size`` and bytes in holes need not be.
    """
    end = min(end, size)
    if end <= start:
        return start
    for s, e in reversed(holes):
        if s >= end:
            continue  # past the range
        if e < end:
            break  # [e, end) is data
        if s <= start:
            return start  # [start, end) lies in this hole
        end = s
    return end


def data_chunks(holes: Sequence[Hole], size: int, chunk_size: int) -> Iterator[int]:
    """The indices of the chunks that hold some data of a file, in order (a sparse file of
    petabytes that holds a few bytes has a few)."""
    last = -1
    start = 0
    for s, e in [*holes, (size, size)]:
        if s > start:  # [start, s) is data
            first = max(start // chunk_size, last + 1)
            last = (s - 1) // chunk_size
            yield from range(first, last + 1)
        start = max(start, e)


def holes_of(attr) -> list[Hole]:
    """The holes of an ``InodeAttr``."""
    return [(r.start, r.end) for r in attr.holes]


def resize(attr, new_size: int, *, hole: bool) -> None:
    """Set ``attr.size`` (an ``InodeAttr``), keeping its holes true.

    ``hole``: a growth leaves ``[size, new_size)`` unwritten (a truncation);
    otherwise the new bytes were written (a writer's close). A shrink cuts the
    holes with the file.
    """
    old = holes_of(attr)
    holes = grow(old, attr.size, new_size) if hole else clip(old, new_size)
    if holes != old:
        del attr.holes[:]
        for start, end in holes:
            attr.holes.add(start=start, end=end)
    attr.size = new_size
