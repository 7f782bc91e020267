"""What the chaos checker expects of a file: which write's bytes each offset may hold.

Content scheme
    Byte ``o`` written by write ``w`` of file ``f`` is byte ``o % 16`` of the
    16-byte cell ``(MAGIC ^ f, w, o // 16, mix(f, w, o // 16))`` (four
    little-endian 32-bit words). Any 16 aligned bytes of a file so name the
    file, the write and the offset that produced them, and a read that returns
    the wrong bytes says whose bytes they are. Write id 0 stands for zeros:
    holes, and chunks cut by a truncation.

The model
    :class:`ContentMap` keeps, for every offset of a file's storage (also
    past its length: a failed write may leave bytes there that a later
    truncation that grows the file exposes), the set of write ids whose
    bytes a read may return there. An acknowledged write makes it one id; a
    write that failed adds its id to the set (it may be applied, in part or
    whole, or not at all). :class:`FileModel` adds the possible lengths and
    the file's writes; a file whose sets are all single and whose length is
    known is *certain* and read back exactly.

:func:`check_read` compares what a read returned with the model and names
every byte that no allowed write produced: bytes of an older write of the
file at that offset (a stale read, or a lost write once the cluster healed)
or bytes that no write of the file put there (never written).

Nothing here does I/O; the tests drive it directly.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

CELL = 16
ZERO = 0  # the write id of zeros
MAGIC = 0x45464D43  # "CMFE": no file id, so a zero cell never decodes
INF = 1 << 62
_MASK = 0xFFFFFFFF


def _mix(file_id, write_id, cell):
    """The fourth word of a cell (numpy arrays or ints, 32 bits)."""
    h = (file_id * 0x9E3779B1 + write_id * 0x85EBCA77 + cell * 0xC2B2AE3D) & _MASK
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & _MASK
    return h ^ (h >> 12)


def pattern(file_id: int, write_id: int, start: int, end: int) -> np.ndarray:
    """The bytes [start, end) of write ``write_id`` of file ``file_id`` (uint8 array)."""
    if end <= start:
        return np.zeros(0, dtype=np.uint8)
    if write_id == ZERO:
        return np.zeros(end - start, dtype=np.uint8)
    first, last = start // CELL, (end - 1) // CELL
    cells = np.arange(first, last + 1, dtype=np.uint64)
    words = np.empty((len(cells), 4), dtype="<u4")
    words[:, 0] = (MAGIC ^ file_id) & _MASK
    words[:, 1] = write_id & _MASK
    words[:, 2] = cells & _MASK
    words[:, 3] = _mix(np.uint64(file_id), np.uint64(write_id), cells) & np.uint64(_MASK)
    raw = words.view(np.uint8).reshape(-1)
    lo = start - first * CELL
    return raw[lo : lo + (end - start)]


def pattern_bytes(file_id: int, write_id: int, start: int, end: int) -> bytes:
    return pattern(file_id, write_id, start, end).tobytes()


def decode_cell(cell: bytes) -> tuple[int, int, int] | None:
    """``(file id, write id, offset)`` of a whole 16-byte cell of the scheme, or None."""
    if len(cell) != CELL:
        return None
    w = np.frombuffer(cell, dtype="<u4")
    file_id, write_id, index, check = (int(x) for x in w)
    file_id ^= MAGIC
    if write_id == ZERO or _mix(file_id, write_id, index) != check:
        return None
    return file_id, write_id, index * CELL


class ContentMap:
    """A piecewise-constant map of offsets [0, INF) to sets of write ids."""

    def __init__(self) -> None:
        self.bounds: list[int] = [0]
        self.sets: list[frozenset[int]] = [frozenset({ZERO})]

    def _split(self, x: int) -> int:
        """Make ``x`` a boundary; its index."""
        i = bisect.bisect_right(self.bounds, x) - 1
        if self.bounds[i] == x:
            return i
        self.bounds.insert(i + 1, x)
        self.sets.insert(i + 1, self.sets[i])
        return i + 1

    def _merge(self) -> None:
        bounds, sets = [self.bounds[0]], [self.sets[0]]
        for b, s in zip(self.bounds[1:], self.sets[1:], strict=True):
            if s != sets[-1]:
                bounds.append(b)
                sets.append(s)
        self.bounds, self.sets = bounds, sets

    def update(self, start: int, end: int, fn) -> None:
        """Replace the set of every piece of [start, end) by ``fn(set)``."""
        if end <= start:
            return
        i = self._split(start)
        j = self._split(end) if end < INF else len(self.bounds)
        for k in range(i, j):
            self.sets[k] = frozenset(fn(self.sets[k]))
        self._merge()

    def assign(self, start: int, end: int, write_id: int) -> None:
        self.update(start, end, lambda _: {write_id})

    def add(self, start: int, end: int, write_id: int) -> None:
        self.update(start, end, lambda s: s | {write_id})

    def pieces(self, start: int, end: int) -> list[tuple[int, int, frozenset[int]]]:
        """The pieces of [start, end) with their sets."""
        out = []
        i = bisect.bisect_right(self.bounds, start) - 1
        while i < len(self.bounds) and self.bounds[i] < end:
            hi = self.bounds[i + 1] if i + 1 < len(self.bounds) else INF
            out.append((max(start, self.bounds[i]), min(end, hi), self.sets[i]))
            i += 1
        return out

    def certain(self) -> bool:
        return all(len(s) == 1 for s in self.sets)


@dataclass
class WriteInfo:
    """One write of a file: which operation, which range, and how it ended."""

    op: int
    start: int
    end: int
    acked: bool | None = None  # None while in flight, False: failed (indeterminate)


@dataclass
class FileModel:
    """A file of one client: its content sets, possible lengths and writes.

    ``paths`` are the places the file may be (None: removed); one path when
    its name is known.
    """

    file_id: int
    paths: set[str | None]
    content: ContentMap = field(default_factory=ContentMap)
    lengths: set[int] = field(default_factory=lambda: {0})
    writes: dict[int, WriteInfo] = field(default_factory=dict)
    inodes: set[int] = field(default_factory=set)
    next_write: int = 1
    uncertain_since: int | None = None  # the first failed operation since it was certain

    @property
    def path(self) -> str | None:
        """The path when it is known and the file exists."""
        if len(self.paths) == 1:
            return next(iter(self.paths))
        return None

    @property
    def removed(self) -> bool:
        return self.paths == {None}

    @property
    def certain(self) -> bool:
        return len(self.paths) == 1 and len(self.lengths) == 1 and self.content.certain()

    @property
    def length(self) -> int | None:
        return next(iter(self.lengths)) if len(self.lengths) == 1 else None

    def new_write(self, op: int, start: int, end: int) -> int:
        wid = self.next_write
        self.next_write += 1
        self.writes[wid] = WriteInfo(op, start, end)
        return wid

    def _failed(self, op: int) -> None:
        if self.uncertain_since is None:
            self.uncertain_since = op

    def _settle(self) -> None:
        if self.certain:
            self.uncertain_since = None

    # operations --------------------------------------------------------------------------
    def write_whole(self, wid: int, ok: bool, op: int) -> None:
        """An open with truncation (``wb``/``xb``) writing ``[0, end)`` of write ``wid``."""
        w = self.writes[wid]
        w.acked = ok
        cut = 0 not in self.lengths  # OPEN_TRUNCATE cuts chunks only of a non-empty file
        maybe_cut = any(n > 0 for n in self.lengths)
        if ok:
            if cut:
                self.content.assign(0, INF, ZERO)
            elif maybe_cut:
                self.content.add(0, INF, ZERO)
            self.content.assign(w.start, w.end, wid)
            self.lengths = {w.end}
            self._settle()
            return
        if maybe_cut:
            self.content.add(0, INF, ZERO)
        self.content.add(w.start, w.end, wid)
        self.lengths |= {0, w.end}
        self._failed(op)

    def write_at(self, wid: int, ok: bool, op: int) -> None:
        """A write of ``[start, end)`` without truncation (a range overwrite or an append)."""
        w = self.writes[wid]
        w.acked = ok
        grown = {max(n, w.end) for n in self.lengths}
        if ok:
            self.content.assign(w.start, w.end, wid)
            self.lengths = grown
            self._settle()
            return
        self.content.add(w.start, w.end, wid)
        self.lengths |= grown
        self._failed(op)

    def truncate(self, length: int, ok: bool, op: int) -> None:
        """Truncate to ``length``: chunks are cut when it is below the file's length."""
        if all(length < n for n in self.lengths) and ok:
            self.content.assign(length, INF, ZERO)
        elif any(length < n for n in self.lengths):
            self.content.add(length, INF, ZERO)
        if ok:
            self.lengths = {length}
            self._settle()
        else:
            self.lengths |= {length}
            self._failed(op)

    def observe_length(self, length: int) -> bool:
        """An open reported ``length``: False when the model did not allow it."""
        allowed = length in self.lengths
        self.lengths = {length}
        self._settle()
        return allowed

    def moved(self, old: str, new: str, ok: bool, op: int) -> None:
        if ok:
            self.paths = {new}
        else:
            self.paths = {old, new}
            self._failed(op)

    def unlinked(self, ok: bool, op: int) -> None:
        if ok:
            self.paths = {None}
        else:
            self.paths = self.paths | {None}
            self._failed(op)

    def resolved(self, path: str | None) -> None:
        """A look at the namespace found the file at ``path`` (None: gone)."""
        self.paths = {path}
        self._settle()

    # reads ---------------------------------------------------------------------------------
    def read_lengths(self, start: int, end: int | None) -> set[int]:
        """The lengths a read of [start, end) may return (end None: to the end of the file)."""
        out = set()
        for n in self.lengths:
            hi = n if end is None else min(end, n)
            out.add(max(0, hi - start))
        return out

    def expected(self, start: int, end: int) -> bytes | None:
        """The exact bytes [start, end) when every piece is certain, else None."""
        parts = []
        for a, b, ids in self.content.pieces(start, end):
            if len(ids) != 1:
                return None
            parts.append(pattern(self.file_id, next(iter(ids)), a, b))
        return np.concatenate(parts).tobytes() if parts else b""


@dataclass
class BadRun:
    """Bytes [start, end) of a read that no allowed write produced there."""

    start: int
    end: int
    allowed: list[int]  # the write ids the model allowed there
    source: int | None  # the write of this file whose bytes these are (0: zeros), None: no write
    decoded: list | None = None  # for bytes of no write: what their cells say they are

    @property
    def stale(self) -> bool:
        """Bytes an older write of this file put there (or zeros)."""
        return self.source is not None

    def as_dict(self) -> dict:
        d = {
            "start": self.start,
            "end": self.end,
            "bytes": self.end - self.start,
            "allowed_writes": self.allowed,
            "found_write": self.source,
        }
        if self.decoded is not None:
            d["found_cells"] = self.decoded
        return d


def _decoded(got: np.ndarray, start: int, a: int, b: int) -> list:
    """What the whole cells in [a, b) of a read at ``start`` decode to (the first few)."""
    out = []
    first = -(-a // CELL) * CELL
    for off in range(first, b - CELL + 1, CELL):
        cell = got[off - start : off - start + CELL].tobytes()
        d = decode_cell(cell)
        item = (
            {"offset": off, "file": d[0], "write": d[1], "written_at": d[2]}
            if d
            else {"offset": off, "hex": cell.hex()}
        )
        if not out or {k: v for k, v in item.items() if k != "offset"} != {
            k: v for k, v in out[-1].items() if k != "offset"
        }:
            out.append(item)
        if len(out) >= 4:
            break
    return out


def _sources(sub: np.ndarray, ok: np.ndarray, a: int, candidates) -> np.ndarray:
    """Per byte of ``sub`` (file offset ``a``) that is not ``ok``: the write whose bytes it is.

    ``candidates`` are ``(write id, its bytes over sub)``, newest first. A 16-byte cell is
    given to the newest write that produced every wrong byte of it; a cell where no one
    write did (a write's edge inside the cell) takes each byte's newest write, if every
    wrong byte has one. The rest is -1: bytes no write put there. Judging whole cells
    keeps a foreign byte that happens to equal an older write's byte from counting as
    that write's.
    """
    front = a % CELL
    n = len(sub)
    cells = -(-(front + n) // CELL)

    def padded(x: np.ndarray, fill: bool) -> np.ndarray:
        out = np.full(cells * CELL, fill, dtype=bool)
        out[front : front + n] = x
        return out.reshape(cells, CELL)

    bad = ~ok
    bad_cells = padded(bad, False).any(axis=1)
    cell_src = np.full(cells, -1, dtype=np.int64)
    byte_src = np.full(n, -1, dtype=np.int64)
    for wid, expected in candidates:
        match = sub == expected
        whole = padded(match | ok, True).all(axis=1) & bad_cells & (cell_src < 0)
        cell_src[whole] = wid
        hit = bad & match & (byte_src < 0)
        byte_src[hit] = wid
    out = np.repeat(cell_src, CELL)[front : front + n]
    mixed = bad_cells & (cell_src < 0)
    if mixed.any():
        explained = padded(byte_src >= 0, True).all(axis=1)
        for c in np.flatnonzero(mixed & explained):
            lo, hi = max(0, c * CELL - front), min(n, (c + 1) * CELL - front)
            out[lo:hi] = byte_src[lo:hi]
    out[ok] = -2
    return out


def check_read(model: FileModel, start: int, got: bytes) -> list[BadRun]:
    """The runs of ``got`` (the file's bytes from ``start``) that the model does not allow.

    Bytes are grouped into runs of one source: an older write of the file at
    that offset (or zeros), or none (never written). Runs of one source less
    than two cells apart are merged.
    """
    arr = np.frombuffer(got, dtype=np.uint8)
    history = sorted(model.writes, reverse=True) + [ZERO]
    runs: list[BadRun] = []
    for a, b, ids in model.content.pieces(start, start + len(arr)):
        sub = arr[a - start : b - start]
        ok = np.zeros(len(sub), dtype=bool)
        for wid in ids:
            ok |= sub == pattern(model.file_id, wid, a, b)
        if ok.all():
            continue
        candidates = [
            (wid, pattern(model.file_id, wid, a, b))
            for wid in history
            if wid not in ids
            and (wid == ZERO or (model.writes[wid].start < b and model.writes[wid].end > a))
        ]
        source = _sources(sub, ok, a, candidates)
        allowed = sorted(ids)
        cur = None
        for pos in np.flatnonzero(~ok):
            src = int(source[pos])
            off = a + int(pos)
            if cur is not None and cur[2] == src and off - cur[1] < 2 * CELL:
                cur[1] = off + 1
                continue
            if cur is not None:
                runs.append(BadRun(cur[0], cur[1], allowed, None if cur[2] < 0 else cur[2]))
            cur = [off, off + 1, src]
        if cur is not None:
            runs.append(BadRun(cur[0], cur[1], allowed, None if cur[2] < 0 else cur[2]))
    for r in runs:
        if r.source is None:
            r.decoded = _decoded(arr, start, r.start, r.end)
    return runs
