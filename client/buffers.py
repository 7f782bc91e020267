"""Buffers of chunk reads: whole-file results handed over without a copy, and reused blocks.

:class:`ResultBuffer` is the destination of a read whose result is returned
as ``bytes`` (``cat_file``, a whole-file ``read()``): chunk reads receive into
its view in place and the filled bytes are handed over as they are.
:class:`BlockPool` keeps the buffers of readahead blocks for reuse, so a long
sequential read keeps landing in memory the process has already touched.
"""

from __future__ import annotations

import io
import threading


class ResultBuffer:
    """``n`` zeroed bytes that chunk reads fill in place, returned as ``bytes`` without a copy.

    The storage is an :class:`io.BytesIO` over a fresh zeroed ``bytes`` of
    its own: :meth:`io.BytesIO.getbuffer` gives the writable view that
    receivers ``recv_into`` and, once that view is released,
    :meth:`io.BytesIO.getvalue` hands over the same object (CPython shares
    it when no view is left; otherwise it copies, which is slower but equally
    correct). The zeroed pages are mapped lazily, so they are faulted in by
    the threads that receive into them rather than zeroed up front.

    Attributes
    ----------
    view : memoryview
        Writable view of the ``n`` bytes; valid until :meth:`getvalue`.
    """

    __slots__ = ("_bio", "view")

    def __init__(self, n: int) -> None:
        self._bio = io.BytesIO(bytes(n))
        self.view = self._bio.getbuffer()

    def __len__(self) -> int:
        return len(self.view)

    def getvalue(self, n: int | None = None) -> bytes:
        """The first ``n`` bytes (all by default); the buffer is spent afterwards.

        Call it only when nothing writes into :attr:`view` any more.
        """
        view, self.view = self.view, None
        if view is None:
            raise ValueError("the result buffer was already taken")
        size = view.nbytes
        view.release()
        if n is not None and n < size:
            self._bio.truncate(n)
        data, self._bio = self._bio.getvalue(), None
        return data


def result_buffer(n: int) -> tuple[ResultBuffer, memoryview]:
    """A :class:`ResultBuffer` of ``n`` bytes and its writable view."""
    buf = ResultBuffer(n)
    return buf, buf.view


def as_bytes(buf: ResultBuffer, n: int | None = None) -> bytes:
    """The ``bytes`` of a filled :class:`ResultBuffer` (its first ``n`` bytes)."""
    return buf.getvalue(n)


class BlockPool:
    """Spare block buffers, reused by size, at most ``max_bytes`` of them kept.

    Parameters
    ----------
    max_bytes : int
        Total size of the buffers kept for reuse; beyond it released buffers
        are left to the garbage collector.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self._free: dict[int, list[bytearray]] = {}
        self._kept = 0
        self._lock = threading.Lock()

    @property
    def kept(self) -> int:
        """Bytes of the buffers kept for reuse."""
        return self._kept

    def get(self, n: int) -> bytearray:
        """A bytearray of ``n`` bytes (old content: the caller overwrites all of it)."""
        with self._lock:
            free = self._free.get(n)
            if free:
                self._kept -= n
                return free.pop()
        return bytearray(n)

    def put(self, buf) -> None:
        """Give back a buffer nobody reads or writes any more."""
        if not isinstance(buf, bytearray):
            return
        n = len(buf)
        with self._lock:
            if n and self._kept + n <= self.max_bytes:
                self._free.setdefault(n, []).append(buf)
                self._kept += n

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._kept = 0
