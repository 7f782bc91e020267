"""``EmberFile``: a file of EmberFS opened for reading or writing.

Reading builds on fsspec's :class:`~fsspec.spec.AbstractBufferedFile` (seek,
tell, readline and iteration come from it) with the ``"emberfs"`` readahead
cache; ``readinto`` and large ``read`` calls fetch chunks in parallel straight
into one buffer. ``block_size=0`` streams: no cache, every read goes through.

Writing goes through the file's :class:`~emberfs.client.writer.FileWriter`
(the same writer the FUSE mount uses): whole chunks go to their chain heads as
soon as they are complete, several in flight (memory stays bounded by
``write_depth`` chunks); ``close`` waits for all of them and then ends the
write session with the exact length. A session the metaserver ended (its
lease ran out) makes the next write or close fail with ESTALE.
"""

from __future__ import annotations

from fsspec.spec import AbstractBufferedFile

from emberfs.client.buffers import as_bytes, result_buffer
from emberfs.client.chunkio import wait_all
from emberfs.client.handles import OpenHandle, attr_info
from emberfs.client.readahead import ReadaheadCache

# reads at least this large bypass the cache and land in one buffer
DIRECT_READ_THRESHOLD = 1024 * 1024
STREAM_READ_UNIT = 1024 * 1024


class EmberFile(AbstractBufferedFile):
    """A file of an :class:`~emberfs.client.fs.EmberFileSystem`.

    Parameters
    ----------
    fs : EmberFileSystem
    path : str
    mode : {"rb", "wb", "ab", "xb"}
    handle : OpenHandle
        The result of the ``Open`` call (size, layout, write session).
    block_size : int, "default" or None
        Readahead block / write unit; the file's chunk size by default.
        ``0`` opens a read stream without cache.
    cache_type : str, default "emberfs"
        fsspec cache name for reads.
    cache_options : dict or None
    """

    def __init__(
        self,
        fs,
        path: str,
        mode: str = "rb",
        *,
        handle: OpenHandle,
        block_size="default",
        autocommit: bool = True,
        cache_type: str = "emberfs",
        cache_options: dict | None = None,
        **kwargs,
    ) -> None:
        self.handle = handle
        self._io = fs.client.files
        chunk = handle.chunk_size or fs.client.options.default_block_size
        self._streaming = block_size == 0
        if block_size in ("default", None):
            block_size = chunk
        elif self._streaming:
            block_size = STREAM_READ_UNIT
            cache_type = "none"
        cache_options = dict(cache_options or {})
        if mode == "rb" and cache_type == "emberfs":
            cache_options.setdefault("reader", self._io.reader(handle))
            cache_options.setdefault("depth", fs.client.options.readahead_depth)
        super().__init__(
            fs,
            path,
            mode=mode,
            block_size=block_size,
            autocommit=autocommit,
            cache_type=cache_type,
            cache_options=cache_options,
            size=handle.size if mode == "rb" else None,
            **kwargs,
        )
        if mode != "rb":
            if mode != "ab":
                handle.attr.size = 0  # the open truncated or created it
            self.loc = handle.attr.size
            self.writer = fs.client.writer(handle, touched=True)

    @property
    def details(self):
        if self._details is None:
            self._details = attr_info(self.path, self.handle.attr)
        return self._details

    @details.setter
    def details(self, value):
        self._details = value
        self.size = value["size"]

    # reading -------------------------------------------------------------------
    def _fetch_range(self, start: int, end: int) -> bytes:
        return self._io.read_range(self.handle, start, min(end, self.size))

    def readinto(self, b) -> int:
        """Read into ``b`` (fetching straight into it where nothing is cached)."""
        if self.mode != "rb":
            raise ValueError("File not in read mode")
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        out = memoryview(b).cast("B")
        n = min(len(out), max(0, self.size - self.loc))
        if n == 0:
            return 0
        if isinstance(self.cache, ReadaheadCache):
            got = self.cache.readinto(self.loc, out[:n])
        elif type(self.cache).name == "none":
            wait_all(self._io.submit_into(self.handle, self.loc, out[:n]))
            got = n
        else:
            data = super().read(n)
            out[: len(data)] = data
            return len(data)
        self.loc += got
        return got

    def read(self, length: int = -1) -> bytes:
        """Read up to ``length`` bytes (all the rest when negative)."""
        length = -1 if length is None else int(length)
        if self.mode != "rb":
            raise ValueError("File not in read mode")
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if length < 0:
            length = max(0, self.size - self.loc)
        length = min(length, max(0, self.size - self.loc))
        direct = isinstance(self.cache, ReadaheadCache) or type(self.cache).name == "none"
        if length >= DIRECT_READ_THRESHOLD and direct:
            buf, view = result_buffer(length)
            got = self.readinto(view)
            return as_bytes(buf, got)
        return super().read(length)

    def readuntil(self, char: bytes = b"\n", blocks: int | None = None) -> bytes:
        """Bytes up to and including the next ``char`` (or to the end of the file).

        Reads small pieces (64 KiB, doubling while no ``char`` is found) so a
        line costs a few cache hits, not a whole block.
        """
        out = []
        step = blocks or 64 * 1024
        while True:
            start = self.tell()
            part = self.read(step)
            if not part:
                break
            found = part.find(char)
            if found > -1:
                out.append(part[: found + len(char)])
                self.seek(start + found + len(char))
                break
            out.append(part)
            if blocks is None:
                step = min(step * 2, DIRECT_READ_THRESHOLD // 2)
        return b"".join(out)

    # writing ---------------------------------------------------------------------
    def _initiate_upload(self) -> None:
        """Nothing to do: the write session was opened with the file."""

    def write(self, data) -> int:
        """Buffer ``data``; every completed chunk is sent at once."""
        if not self.writable():
            raise ValueError("File not in write mode")
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if self.forced:
            raise ValueError("This file has been force-flushed, can only close")
        n = self.writer.write(self.loc, data)
        self.loc += n
        return n

    def _upload_chunk(self, final: bool = False) -> bool:
        """fsspec's hook: with ``final`` send the buffered bytes and wait for every write."""
        if final:
            self.writer.flush()
        return True

    def flush(self, force: bool = False) -> None:
        """Buffered data goes out chunk by chunk; ``force`` sends the rest and waits."""
        if self.closed:
            raise ValueError("Flush on closed file")
        if self.readable() or not force:
            return
        if self.forced:
            raise ValueError("Force flush cannot be called more than once")
        self.forced = True
        self.writer.flush()

    def close(self) -> None:
        """Finish the file: all writes, then ``Close`` with the exact length."""
        if self.closed or getattr(self, "_unclosable", False):
            return
        if self.mode == "rb":
            if isinstance(self.cache, ReadaheadCache):
                self.cache.close()  # reads sent ahead give their connections back
            super().close()
            return
        self.closed = True
        self.writer.close()

    def discard(self) -> None:
        """Writes already sent cannot be taken back; the session ends on close."""
