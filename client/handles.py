"""Open files as the metaserver describes them, and the leases of their write sessions.

An :class:`OpenHandle` is what one ``Open`` (or one item of a batch open)
returned: the path, the inode's attributes with its layout, and the write
session when opened for writing. :func:`attr_info` turns those attributes into
fsspec's ``info`` dictionary.

A write session is a lease: :class:`SessionLeases` renews the sessions of a
process's open files in one ``RenewSessions`` call per interval and marks the
handles whose session the metaserver ended; a write or close through such a
handle fails with :func:`stale_session` (ESTALE). :class:`WriteSessions` is
where the files of one filesystem hold and end their sessions, in whichever
process they run.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emberfs.common import extents
from emberfs.common.periodic import Periodic
from emberfs.proto import common_pb2

if TYPE_CHECKING:
    from emberfs.client.runtime import ProcessRuntime

log = logging.getLogger(__name__)

_TYPES = {
    common_pb2.FILE: ("file", stat.S_IFREG),
    common_pb2.DIRECTORY: ("directory", stat.S_IFDIR),
    common_pb2.SYMLINK: ("link", stat.S_IFLNK),
}


@dataclass
class OpenHandle:
    """What one ``MetaService.Open`` returned: enough to read or write the file."""

    path: str
    attr: common_pb2.InodeAttr
    session_id: int = 0
    chains: list[int] = field(default_factory=list)
    expired: bool = False  # the metaserver ended the write session (lease ran out)
    created: bool = False  # the open made the file

    @property
    def inode(self) -> int:
        return self.attr.inode

    @property
    def size(self) -> int:
        return self.attr.size

    @property
    def chunk_size(self) -> int:
        return self.attr.layout.chunk_size

    @property
    def holes(self) -> list[tuple[int, int]]:
        """The ranges a truncation grew the file over: they read as zeros."""
        return extents.holes_of(self.attr)

    @classmethod
    def from_open(cls, path: str, resp) -> OpenHandle:
        return cls(
            path, resp.attr, resp.session_id, list(resp.attr.layout.chains), created=resp.created
        )

    @classmethod
    def for_read(cls, path: str, attr: common_pb2.InodeAttr) -> OpenHandle:
        """The handle of a read-only open that returned ``attr`` (no session)."""
        return cls(path, attr, 0, list(attr.layout.chains))


def attr_info(path: str, attr: common_pb2.InodeAttr) -> dict:
    """fsspec's ``info`` dictionary of the inode ``attr`` found at ``path``."""
    kind, fmt = _TYPES.get(attr.type, ("other", 0))
    info = {
        "name": path,
        "size": attr.size if kind == "file" else 0,
        "type": kind,
        "mode": fmt | (attr.mode & 0o7777),
        "uid": attr.uid,
        "gid": attr.gid,
        "mtime": attr.mtime_ns / 1e9,
        "ctime": attr.ctime_ns / 1e9,
        "created": attr.crtime_ns / 1e9,
        "ino": attr.inode,
        "nlink": attr.nlink,
        "islink": kind == "link",
    }
    if kind == "link":
        info["destination"] = attr.symlink_target
    if kind == "file" and attr.HasField("layout"):
        info["chunk_size"] = attr.layout.chunk_size
    return info


def is_a_directory(path: str) -> IsADirectoryError:
    """The error of a file operation (open, remove) on the directory ``path``."""
    return IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)


def stale_session(path: str) -> OSError:
    """The error of a write to a file whose write session the metaserver ended."""
    return OSError(
        errno.ESTALE,
        f"the write session of {path} expired (its lease was not renewed in time); "
        "the file keeps the length of its last flush or close",
        path,
    )


class SessionLeases:
    """Renews the write sessions of a process's open files, all in one call.

    A daemon thread, started with the first :meth:`register`, calls
    ``renew(sessions)`` every ``interval`` seconds with the ``(inode,
    session_id)`` pairs of the registered handles; ``renew`` returns the
    pairs the metaserver no longer has, and those handles are marked
    ``expired``. A failed renewal is logged and retried at the next interval.

    Parameters
    ----------
    renew : callable
        ``renew(list of (inode, session_id)) -> set of expired pairs``
        (:meth:`emberfs.client.meta.MetaClient.renew_sessions`).
    interval : float
        Seconds between renewals; keep it well below the metaserver's
        session timeout.
    """

    def __init__(self, renew, interval: float) -> None:
        self._renew = renew
        self.interval = interval
        self._handles: dict[int, OpenHandle] = {}  # id(handle) -> handle
        self._lock = threading.Lock()
        self._ticker = Periodic(
            self.renew_now, interval, "emberfs-leases", "renewing write sessions"
        )

    def register(self, handle: OpenHandle) -> None:
        """Keep renewing ``handle``'s write session until :meth:`unregister`."""
        with self._lock:
            self._handles[id(handle)] = handle
        self._ticker.start()

    def unregister(self, handle: OpenHandle) -> None:
        """Stop renewing ``handle``'s session (it was closed)."""
        with self._lock:
            self._handles.pop(id(handle), None)

    def renew_now(self) -> None:
        """Renew every registered session once, marking the expired handles."""
        with self._lock:
            handles = list(self._handles.values())
        if not handles:
            return
        gone = self._renew([(h.inode, h.session_id) for h in handles])
        with self._lock:  # a handle closed meanwhile has no session because it closed it
            handles = [h for h in handles if self._handles.get(id(h)) is h]
        for h in handles:
            if (h.inode, h.session_id) in gone:
                if not h.expired:
                    log.warning("write session of %s expired", h.path)
                h.expired = True

    def stop(self) -> None:
        """Stop the renewal thread (sessions still registered then lapse)."""
        self._ticker.stop()


class WriteSessions:
    """The write sessions of one filesystem's open files, in the process that uses them.

    A file open for writing registers its handle for renewal with the
    :class:`SessionLeases` of the calling process's runtime and ends its
    session through that runtime's metaserver client.

    Parameters
    ----------
    runtime : ProcessRuntime
    """

    def __init__(self, runtime: ProcessRuntime) -> None:
        self._runtime = runtime

    def register(self, handle: OpenHandle) -> None:
        """Keep ``handle``'s session renewed until :meth:`unregister`."""
        self._runtime.get().leases.register(handle)

    def unregister(self, handle: OpenHandle) -> None:
        """Stop renewing ``handle``'s session."""
        self._runtime.get().leases.unregister(handle)

    def close(
        self, handle: OpenHandle, length: int, wrote: bool, path: str | None = None
    ) -> common_pb2.InodeAttr:
        """End ``handle``'s session (``Close``), making the length exact when ``wrote``."""
        meta = self._runtime.get().meta
        return meta.close_file(handle.inode, handle.session_id, length, wrote=wrote, path=path)

    def close_many(self, items: list[tuple[int, int, int, bool]], paths: list[str]) -> list:
        """End many sessions, one ``BatchClose`` per 1000: per item its attributes or OSError.

        ``items`` are ``(inode, session_id, length, wrote)`` and ``paths``
        name them in errors, as for
        :meth:`~emberfs.client.meta.MetaClient.batch_close`.
        """
        return self._runtime.get().meta.batch_close(items, paths)

    def gone(self, handle: OpenHandle) -> bool:
        """True when the metaserver no longer has ``handle``'s session (False if unsure)."""
        try:
            return bool(
                self._runtime.get().meta.renew_sessions([(handle.inode, handle.session_id)])
            )
        except OSError:
            return False
