"""The one writer of an open inode: buffered bytes, chunk writes in flight, length, truncate.

Both the fsspec file (:class:`~emberfs.client.file.EmberFile`) and the FUSE
mount's open files (:mod:`emberfs.client.mountfiles`) write through a
:class:`FileWriter`, built by :meth:`Client.writer <emberfs.client.core.Client.writer>`:

* written bytes gather into one contiguous run that goes out as a chunk write
  when it reaches a chunk boundary or stops being contiguous; the whole chunks
  of a ``bytes`` object, or of any buffer of :data:`BORROW_MIN` bytes or more
  (a tensor's storage that ``torch.save`` writes in one call), go out without
  a copy, and a write of such a buffer returns once the chains hold it;
* :class:`ChunkWrites` keeps at most ``write_depth`` chunk writes in flight,
  writes to one chunk in the order they were sent;
* :meth:`FileWriter.flush` waits until the chains hold every write,
  :meth:`FileWriter.sync` also makes the length exact on the metaserver
  (``Sync``), :meth:`FileWriter.close` ends the write session (``Close``);
* a write past the end first records the gap as a hole (``Truncate``);
* in a directory with a quota, a write first reserves its room there
  (``QuotaReserve``, only when it passes what the file holds already), so a
  write that would pass the quota fails with EDQUOT before any byte is kept.

While the writer is open its session's lease is renewed
(:class:`~emberfs.client.handles.SessionLeases`); a session the metaserver
ended makes the next write or close fail with ESTALE. A writer is not
thread-safe: its owner serialises calls (the mount holds a lock per inode).
"""

from __future__ import annotations

import errno
from collections import deque
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING

from emberfs.client import quotas
from emberfs.client.handles import OpenHandle, stale_session
from emberfs.proto import common_pb2

#: A write of a buffer this large (not ``bytes``) sends its whole chunks from the buffer itself.
BORROW_MIN = 8 << 20

if TYPE_CHECKING:
    from emberfs.client.core import Client
    from emberfs.client.fileio import FileIO


class ChunkWrites:
    """The chunk writes of one open file in flight, as a writer sends them.

    At most ``depth`` are in flight, and writes to one chunk stay in the order
    they were sent (a write waits for the earlier ones to its chunk). The first
    failure (with ``path`` as the error's file name) is kept as :attr:`failed`
    and raised by every later :meth:`send`.

    Parameters
    ----------
    files : FileIO
    handle : OpenHandle
    depth : int
    path : str
    """

    def __init__(self, files: FileIO, handle: OpenHandle, depth: int, path: str) -> None:
        self._files = files
        self._handle = handle
        self._depth = max(1, depth)
        self._path = path
        self._inflight: deque[tuple[int, Future]] = deque()
        self.failed: BaseException | None = None

    def __bool__(self) -> bool:
        """True while writes are in flight."""
        return bool(self._inflight)

    def send(self, offset: int, data) -> None:
        """Start a write of ``data`` at file ``offset`` (within one chunk)."""
        if self.failed is not None:
            raise self.failed
        index = offset // self._handle.chunk_size
        while self._inflight and (
            len(self._inflight) >= self._depth or any(i == index for i, _ in self._inflight)
        ):
            self._reap(self._inflight.popleft()[1])
        self._inflight.append((index, self._files.submit_write(self._handle, offset, data)))

    def _reap(self, fut: Future) -> None:
        try:
            fut.result()
        except BaseException as exc:
            if isinstance(exc, OSError) and exc.filename is None:
                exc.filename = self._path  # the file whose write failed
            if self.failed is None:
                self.failed = exc
            raise

    def wait_all(self) -> None:
        """Wait until the chains hold every write sent; raises the first that failed."""
        while self._inflight:
            self._reap(self._inflight.popleft()[1])

    def abandon(self) -> None:
        """Wait for the writes in flight without raising (after a failure) and forget them."""
        wait([f for _, f in self._inflight])
        self._inflight.clear()


class FileWriter:
    """The writes of one inode open for writing (see the module's description).

    Parameters
    ----------
    client : Client
    handle : OpenHandle
        The open file; ``handle.attr.size`` is kept at the length the writes
        made (:attr:`size`).
    touched : bool
        The open changed the file already (create, truncate): :meth:`close`
        then makes the length exact even without a write.
    on_change : callable or None
        Called with the length after every write, truncation and attribute
        update (readers of the file drop the bytes they hold).
    """

    def __init__(self, client: Client, handle: OpenHandle, *, touched=False, on_change=None):
        self.client = client
        self.handle = handle
        self.path = handle.path
        self.dirty = touched  # written since the last Sync or Close
        self._on_change = on_change
        self._pending = bytearray()
        self._pending_at = 0  # file offset of _pending[0]
        self._writes = ChunkWrites(client.files, handle, client.options.write_depth, handle.path)
        if handle.session_id:
            client.sessions.register(handle)

    @property
    def size(self) -> int:
        """The file's length as this writer's writes left it."""
        return self.handle.attr.size

    def _resize(self, size: int) -> None:
        """Set the length; ``on_change`` hears it (bytes may have changed even if it did not)."""
        self.handle.attr.size = size
        if self._on_change is not None:
            self._on_change(size)

    @property
    def busy(self) -> bool:
        """Bytes buffered or writes in flight."""
        return bool(self._pending or self._writes)

    def check(self) -> None:
        """Raise what makes a write impossible: an earlier failure, a lost or ended session."""
        if self._writes.failed is not None:
            raise self._writes.failed
        if self.handle.expired:
            raise stale_session(self.path)
        if not self.handle.session_id:
            raise OSError(errno.EBADF, "the file is not open for writing", self.path)

    def write(self, offset: int, data, path: str | None = None) -> int:
        """Write ``data`` at file ``offset``; every completed chunk goes out at once.

        ``path`` names the file now (it may have been renamed since it opened).
        """
        self.check()
        mv = memoryview(data).cast("B")
        n = len(mv)
        self._reserve(offset + n, path)
        if offset > self.size:
            self._grow_to(offset, path)
        # whole chunks of bytes go out as they are; so do those of a large buffer of the
        # caller's, which this call then waits for (no copy, and nothing read after return)
        borrow = isinstance(data, bytes) or n >= BORROW_MIN
        borrowed = False
        if self._pending and offset != self._pending_at + len(self._pending):
            self._send_pending()
        if not self._pending:
            self._pending_at = offset
        cs = self.handle.chunk_size
        while len(mv):
            end = self._pending_at + len(self._pending)
            room = (end // cs + 1) * cs - end
            if not self._pending and borrow and len(mv) >= room:
                self._writes.send(self._pending_at, mv[:room])  # no copy of a whole piece
                borrowed = True
                self._pending_at += room
                mv = mv[room:]
                continue
            take = min(room, len(mv))
            self._pending += mv[:take]
            mv = mv[take:]
            if take == room:
                self._send_pending()
        if borrowed and not isinstance(data, bytes):  # the caller may reuse its buffer next
            try:
                self._writes.wait_all()
            except BaseException:
                self._writes.abandon()  # none still reads the buffer once this raises
                raise
        self.dirty = True
        self._resize(max(self.size, offset + n))
        return n

    def _reserve(self, end: int, path: str | None) -> None:
        """Reserve room up to ``end`` in the file's quota before anything of a write is kept
        (EDQUOT when it does not fit; nothing then changes)."""
        attr = self.handle.attr
        if attr.quota_realm and end > attr.quota_charged:
            got = quotas.reserve(
                self.client.meta, self.handle.inode, self.handle.session_id, end, path or self.path
            )
            attr.quota_charged = got.quota_charged

    def _send_pending(self) -> None:
        if not self._pending:
            return
        data, self._pending = self._pending, bytearray()
        at = self._pending_at
        self._pending_at += len(data)
        self._writes.send(at, data)

    def flush(self) -> None:
        """Send the buffered bytes and wait until the chains hold every write."""
        try:
            self._send_pending()
            self._writes.wait_all()
        except BaseException:
            self._writes.abandon()
            raise
        if self._writes.failed is not None:
            raise self._writes.failed

    def sync(self) -> None:
        """Make every write durable and the length exact on the metaserver (fsync)."""
        if not self.handle.session_id:
            return
        self.flush()
        if not self.dirty:
            return
        self.check()
        self.learn(self.client.meta.sync(self.handle.inode, self.handle.session_id, self.size))
        self.dirty = False

    def learn(self, attr: common_pb2.InodeAttr) -> None:
        """New attributes from the metaserver (the length this writer made still counts)."""
        unsynced = self.busy or self.dirty  # writes the metaserver has no length for yet
        size = max(self.size, attr.size) if unsynced else attr.size
        self.handle.attr.CopyFrom(attr)
        self._resize(size)

    def _grow_to(self, offset: int, path: str | None) -> None:
        """Record ``[size, offset)`` as a hole before a write at ``offset`` past the end."""
        self.sync()
        attr = self.client.meta.truncate(path or self.path, offset, inode=self.handle.inode)
        self.learn(attr)

    def truncate(self, length: int, path: str | None = None) -> common_pb2.InodeAttr:
        """Set the length (after the writes before it); ``path`` names the file now."""
        if self.handle.session_id:
            self.sync()
        attr = self.client.meta.truncate(path or self.path, length, inode=self.handle.inode)
        self.learn(attr)
        return attr

    def close(self) -> common_pb2.InodeAttr | None:
        """Send and wait for every write, then end the session (``Close`` with the length).

        Returns the attributes the metaserver answered (None when the session
        had ended already). A failure of the writes still ends the session
        (without changing the length) and is raised after it.
        """
        h = self.handle
        if not h.session_id:
            return None
        error: BaseException | None = None
        attr = None
        try:
            self.flush()
        except BaseException as exc:
            error = exc
        sessions = self.client.sessions
        try:
            if h.expired:
                raise stale_session(self.path)
            attr = sessions.close(h, self.size, wrote=self.dirty and error is None, path=self.path)
        except BaseException as exc:
            if isinstance(exc, OSError) and exc.errno == errno.EINVAL and sessions.gone(h):
                exc = stale_session(self.path)
            error = error or exc
        finally:
            sessions.unregister(h)
            h.session_id = 0
            self.dirty = False
        if error is not None:
            if isinstance(error, OSError):
                raise error
            raise OSError(errno.EIO, f"writing {self.path} failed: {error}") from error
        self.learn(attr)
        return attr
