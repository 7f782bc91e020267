"""EmberFS as a FUSE file system: every program can read and write it through a mount.

:class:`EmberFuse` implements the path operations of libfuse3's high-level
API (bound in :mod:`emberfs.client.fusebind`) on a
:class:`~emberfs.client.core.Client`: its metaserver client for the namespace,
the per-inode :class:`~emberfs.client.writer.FileWriter` for writes, and
:class:`~emberfs.client.readahead.SharedReadahead` for sequential reads that
the kernel sends from several threads at once.

How it keeps the client's speed and POSIX's rules:

* **One state per open inode** (:class:`OpenNode`). Every descriptor of a file
  open in this mount shares it: the write session, the buffered writes and the
  file's length as this mount's writes made it. A read through any of them
  first sends the buffered writes, so a process reads what it wrote, and
  ``getattr`` of an open file answers its local length, never a shorter one.
* **Writes gather into whole chunks** before they go to their chains, up to
  ``write_depth`` chunk writes in flight. ``flush`` (every ``close(2)``) and
  ``fsync`` wait for them and make the length exact on the metaserver
  (``Sync``); the last ``release`` ends the write session. A write past the
  end first records the gap as a hole (``Truncate`` by inode), so it reads as
  zeros and never as lost data.
* **The page cache survives an unchanged file.** An open compares the file's
  size, mtime and ctime with those of the pages the kernel may hold for it;
  when they match the open keeps the page cache (``keep_cache``), so a second
  read of the file comes from memory. When they differ the kernel drops the
  pages and, if it was told other attributes, those too
  (``fuse_invalidate_path``), so a file changed by another client is never
  read stale after it is opened again (close-to-open consistency, as NFS).
* **Attributes are cached briefly**: the kernel keeps them for
  ``attr_timeout`` seconds, and this process keeps the attributes a listing
  returned for as long, so ``ls -l`` costs one ``List`` call.
* **Locks** (``fcntl`` ranges, ``flock``) are the metaserver's, held for a lease the
  mount renews, so mounts on different machines contend (:mod:`emberfs.client.mountlocks`).
* **A metaserver that is away** makes calls fail with EIO once
  ``meta_timeout`` has passed (``on_outage="eio"``), or wait until it is back
  (``"block"``), retrying with the same request id so nothing applies twice.

The mount acts as one identity: the client's token, or the mounting user. The
kernel checks each caller's access against the files' mode bits
(``default_permissions``), and the metaserver checks the mount's identity.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emberfs.client.fusebind import fuse_errors, invalidate_path
from emberfs.client.handles import OpenHandle
from emberfs.client.mountcache import AttrCache, Versions, content_version
from emberfs.client.mountfiles import Descriptor, OpenNode
from emberfs.client.mountlocks import LockOps
from emberfs.client.mountxattrs import XattrCache, XattrOps
from emberfs.client.readahead import SharedReadahead
from emberfs.proto import common_pb2, meta_pb2

if TYPE_CHECKING:
    from emberfs.client.core import Client

log = logging.getLogger(__name__)

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
STATFS_BLOCK = 4096


@dataclass
class MountOptions:
    """How a mount caches, reads and meets outages (``emberfs mount --help``).

    Attributes
    ----------
    attr_timeout : float
        Seconds the kernel (and this process) keep attributes and names.
    direct_io : bool
        Bypass the page cache: every read and write reaches the mount in
        requests of up to 1 MiB. Off by default: reads go through the page
        cache, whose kernel readahead sends large requests too, and repeated
        reads of an unchanged file come from memory.
    read_only : bool
        Refuse every change (EROFS).
    readahead_kb : int
        The kernel's readahead window for the mount (its bdi's
        ``read_ahead_kb``, set when the mount may): how far ahead of a
        sequential reader the kernel asks.
    on_outage : {"eio", "block"}
        What a call does while the metaserver cannot be reached.
    meta_timeout : float
        With ``"eio"``, how long a call keeps retrying before EIO.
    allow_other : bool
        Let users other than the mounting one use the mount.
    """

    attr_timeout: float = 1.0
    direct_io: bool = False
    read_only: bool = False
    readahead_kb: int = 16384
    on_outage: str = "eio"
    meta_timeout: float = 10.0
    allow_other: bool = False


class EmberFuse(XattrOps, LockOps):
    """The FUSE operations of a mount, on one :class:`~emberfs.client.core.Client`
    (extended attributes: :class:`~emberfs.client.mountxattrs.XattrOps`; fcntl and flock
    locks: :class:`~emberfs.client.mountlocks.LockOps`).

    Parameters
    ----------
    client : Client
        Its options' ``retry_timeout`` decides how long a metaserver call
        keeps trying (see :class:`MountOptions`).
    options : MountOptions
    """

    use_ns = True  # times in nanoseconds

    def __init__(self, client: Client, options: MountOptions) -> None:
        self.client = client
        self.options = options
        self.attrs = AttrCache(options.attr_timeout)
        self.xattr_cache = XattrCache()
        self._nodes: dict[int, OpenNode] = {}
        self._nodes_lock = threading.Lock()
        self._handles: dict[int, Descriptor] = {}
        self._next_fh = 1
        self._pages = Versions()  # version of the pages the kernel may hold per inode
        self._recent = Versions()  # attributes of files last closed or changed here
        self._told = Versions()  # version of the attributes the kernel was last given
        self.ready = threading.Event()
        self._init_locks()

    @property
    def meta(self):
        """The metaserver client of this process."""
        return self.client.meta

    # set-up ------------------------------------------------------------------------
    def init_with_config(self, conn, config) -> None:
        if config is not None:
            config.use_ino = 1  # st_ino is the EmberFS inode
            config.hard_remove = 1  # an unlinked open file keeps working, with no hidden name
            config.attr_timeout = self.options.attr_timeout
            config.entry_timeout = self.options.attr_timeout
            config.negative_timeout = 0.0  # a name another client creates is seen at once
            config.kernel_cache = 0
            config.auto_cache = 0
            config.direct_io = int(self.options.direct_io)
        self.ready.set()

    def destroy(self, path) -> None:
        """Unmounting: send what is buffered and end every write session.

        Waits ``meta_timeout`` seconds at most (also with ``on_outage="block"``):
        a session left open then ends when its lease runs out, with the length
        of its last flush.
        """
        with self._nodes_lock:
            nodes = list(self._nodes.values())
            self._nodes.clear()
            self._handles.clear()

        def close_all() -> None:
            self.close_locks()
            for node in nodes:
                try:
                    node.close_session()
                except OSError as exc:
                    log.warning("closing %s at unmount: %s", node.handle.path, exc)

        closer = threading.Thread(target=close_all, name="emberfs-unmount", daemon=True)
        closer.start()
        closer.join(self.options.meta_timeout)
        if closer.is_alive():
            log.warning("unmounted with write sessions still open (the metaserver is away)")

    # attributes -------------------------------------------------------------------------
    def _stat_dict(self, attr: common_pb2.InodeAttr, size: int | None = None) -> dict:
        fmt = {
            common_pb2.FILE: stat.S_IFREG,
            common_pb2.DIRECTORY: stat.S_IFDIR,
            common_pb2.SYMLINK: stat.S_IFLNK,
        }.get(attr.type, stat.S_IFREG)
        if attr.type == common_pb2.FILE:
            size = attr.size if size is None else size
            self._told.put(attr.inode, (size, attr.mtime_ns, attr.ctime_ns))
        elif attr.type == common_pb2.SYMLINK:
            size = len(attr.symlink_target.encode())
        else:
            size = 4096
        return {
            "st_ino": attr.inode,
            "st_mode": fmt | (attr.mode & 0o7777),
            "st_nlink": max(1, attr.nlink),
            "st_uid": attr.uid,
            "st_gid": attr.gid,
            "st_size": size,
            "st_blocks": (size + 511) // 512,
            "st_blksize": attr.layout.chunk_size if attr.HasField("layout") else 4096,
            "st_mtime": attr.mtime_ns,
            "st_ctime": attr.ctime_ns,
            "st_atime": attr.mtime_ns,
            "st_birthtime": attr.crtime_ns,
        }

    def _lookup(self, path: str) -> common_pb2.InodeAttr:
        attr = self.attrs.get(path)
        if attr is None:
            attr = self.meta.stat(path, follow=False)
            self.attrs.put(path, attr)
            return attr
        # a cached copy may predate what this mount did to the file since (a close, a
        # truncation): the newer of the two
        recent = self._recent.get(attr.inode)
        if recent is not None and recent.ctime_ns > attr.ctime_ns:
            return recent
        return attr

    @fuse_errors
    def getattr(self, path: str, fh: int | None = None) -> dict:
        handle = self._handles.get(fh) if fh is not None else None
        if handle is not None:
            node = handle.node
            return self._stat_dict(node.handle.attr, node.size)
        attr = self._lookup(path)
        node = self._nodes.get(attr.inode)
        if node is not None:  # open here: its length as this mount's writes made it
            with node.lock:
                return self._stat_dict(node.handle.attr, node.size)
        return self._stat_dict(attr)

    @fuse_errors
    def readdir(self, path: str, fh: int) -> list:
        here = self._lookup(path).inode  # entries with inode 0 are skipped by readdir(3)
        out = [(".", {"st_mode": stat.S_IFDIR, "st_ino": here}, 0)]
        out.append(("..", {"st_mode": stat.S_IFDIR, "st_ino": 1}, 0))
        base = "" if path == "/" else path
        for entry in self.meta.list(path, page=self.client.options.list_page):
            self.attrs.put(f"{base}/{entry.name}", entry.attr)
            mode = self._stat_dict(entry.attr)["st_mode"]
            out.append((entry.name, {"st_mode": mode, "st_ino": entry.attr.inode}, 0))
        return out

    @fuse_errors
    def readlink(self, path: str) -> str:
        attr = self.meta.stat(path, follow=False)
        if attr.type != common_pb2.SYMLINK:
            raise OSError(errno.EINVAL, "not a symbolic link", path)
        return attr.symlink_target

    @fuse_errors
    def statfs(self, path: str) -> dict:
        r = self.meta.statfs(path)  # under a quota: the quota's figures (df of its directory)
        used_inodes = r.inodes if r.inode_limit else r.files + r.directories
        total_inodes = r.inode_limit or max(r.inodes, used_inodes + (1 << 32))
        used_inodes = min(used_inodes, total_inodes)
        return {
            "f_bsize": STATFS_BLOCK,
            "f_frsize": STATFS_BLOCK,
            "f_blocks": r.capacity // STATFS_BLOCK,
            "f_bfree": r.free // STATFS_BLOCK,
            "f_bavail": r.free // STATFS_BLOCK,
            "f_files": total_inodes,
            "f_ffree": total_inodes - used_inodes,
            "f_favail": total_inodes - used_inodes,
            "f_namemax": 255,
        }

    # changes to the namespace -------------------------------------------------------------
    def _writable(self) -> None:
        if self.options.read_only:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    @fuse_errors
    def mkdir(self, path: str, mode: int) -> int:
        self._writable()
        self.attrs.put(path, self.meta.mkdir(path, parents=False, mode=mode & 0o7777))
        return 0

    @fuse_errors
    def unlink(self, path: str) -> int:
        self._writable()
        self.attrs.drop(path)
        self.meta.remove(path)
        return 0

    @fuse_errors
    def rmdir(self, path: str) -> int:
        self._writable()
        self.meta.remove(path, directory=True)
        self.attrs.clear()  # entries below it are gone too
        return 0

    @fuse_errors
    def symlink(self, path: str, target: str) -> int:
        self._writable()
        self.attrs.put(path, self.meta.symlink(path, target))
        return 0

    @fuse_errors
    def link(self, path: str, target: str) -> int:
        self._writable()
        self.attrs.drop(target)
        self.attrs.put(path, self.meta.hardlink(target, path))
        return 0

    @fuse_errors
    def rename(self, old: str, new: str, flags: int = 0) -> int:
        self._writable()
        self.attrs.clear()  # names below a renamed directory move with it
        self.meta.rename(
            old,
            new,
            no_replace=bool(flags & RENAME_NOREPLACE),
            exchange=bool(flags & RENAME_EXCHANGE),
        )
        self.attrs.clear()
        return 0

    @fuse_errors
    def chmod(self, path: str, mode: int) -> int:
        self._writable()
        self._changed(path, self.meta.setattr(path, mode=mode & 0o7777, no_follow=True))
        return 0

    @fuse_errors
    def chown(self, path: str, uid: int, gid: int) -> int:
        self._writable()
        fields = {}
        if uid != 0xFFFFFFFF and uid != -1:
            fields["uid"] = uid
        if gid != 0xFFFFFFFF and gid != -1:
            fields["gid"] = gid
        if fields:
            self._changed(path, self.meta.setattr(path, no_follow=True, **fields))
        return 0

    def utimens_raw(self, path: str, times) -> int:
        """``utimens`` with the raw ``timespec[2]`` (None: both now); atime is not kept."""
        if times is None:
            mtime_ns = time.time_ns()
        else:
            ts = times[1]
            if ts.tv_nsec == UTIME_OMIT:
                return 0
            mtime_ns = time.time_ns() if ts.tv_nsec == UTIME_NOW else ts.tv_sec * 10**9 + ts.tv_nsec
        return self._utimens(path, mtime_ns)

    utimens = utimens_raw  # what libfuse's utimens callback calls (see fusebind)

    @fuse_errors
    def _utimens(self, path: str, mtime_ns: int) -> int:
        self._writable()
        attr = self._lookup(path)
        node = self._nodes.get(attr.inode)
        if node is not None and node.handle.session_id:
            self._changed(path, node.set_times(path, mtime_ns))
        else:
            self._changed(path, self.meta.setattr(path, mtime_ns=mtime_ns, no_follow=True))
        return 0

    def _changed(self, path: str, attr: common_pb2.InodeAttr) -> None:
        self.attrs.put(path, attr)
        self._recent.put(attr.inode, attr)
        node = self._nodes.get(attr.inode)
        if node is not None:
            node.learn(attr)  # under the node's lock

    @fuse_errors
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self._writable()
        handle = self._handles.get(fh) if fh is not None else None
        node = handle.node if handle is not None else None
        if node is None and path is not None:
            node = self._nodes.get(self._lookup(path).inode)
        if node is not None:
            attr = node.truncate(path, length)
        else:
            attr = self.meta.truncate(path, length)
        if path is not None:
            self.attrs.put(path, attr)
        self._recent.put(attr.inode, attr)
        self._pages.put(attr.inode, content_version(attr))  # the kernel cut its pages itself
        return 0

    # open files ---------------------------------------------------------------------
    def _open_flags(self, flags: int) -> int:
        out = meta_pb2.OPEN_READ
        if flags & os.O_ACCMODE != os.O_RDONLY:
            out |= meta_pb2.OPEN_WRITE
        if flags & os.O_TRUNC:  # Linux truncates on O_RDONLY|O_TRUNC too
            out |= meta_pb2.OPEN_TRUNCATE
        if out != meta_pb2.OPEN_READ:
            self._writable()
        return out

    def _node_for(self, inode: int) -> OpenNode | None:
        """The node of ``inode`` open here, locked, or None; the caller releases its lock."""
        while True:
            with self._nodes_lock:
                node = self._nodes.get(inode)
            if node is None:
                return None
            node.lock.acquire()
            if not node.gone:
                return node
            node.lock.release()  # its last descriptor closed meanwhile: look again

    def _add_handle(self, node: OpenNode, write: bool) -> int:
        """A descriptor of ``node`` (whose lock the caller holds)."""
        node.opens += 1
        node.writers += write
        readahead = SharedReadahead(
            self.client.files.reader(node.handle),
            node.handle.chunk_size or self.client.options.default_block_size,
            node.size,
            self.client.options.readahead_depth,
            window=0 if self.options.direct_io else self.options.readahead_kb * 1024,
        )
        node.readers.add(readahead)
        with self._nodes_lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = Descriptor(node, write, readahead)
        return fh

    def _opened(self, path: str, resp, write: bool, fi) -> int:
        """A descriptor of the file an ``Open`` RPC returned (with a session of its own or none)."""
        attr = resp.attr
        if attr.type == common_pb2.DIRECTORY:
            if resp.session_id:
                self.meta.close_file(attr.inode, resp.session_id, 0, wrote=False, path=path)
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        self.attrs.put(path, attr)
        fresh = False
        node = self._node_for(attr.inode)
        if node is None:
            with self._nodes_lock:
                node = self._nodes.get(attr.inode)
                if node is None:
                    node = self._nodes[attr.inode] = OpenNode(
                        self.client, OpenHandle.from_open(path, resp)
                    )
                    fresh = True
            node.lock.acquire()
        try:
            if not fresh:
                if resp.session_id and not node.handle.session_id:
                    node.adopt(resp.session_id)
                elif resp.session_id:  # the node has a session already: end the new one
                    self.meta.close_file(attr.inode, resp.session_id, 0, wrote=False, path=path)
                node.learn(attr)
            fh = self._add_handle(node, write)
            self._cache_policy(path, node, fresh, fi)
        finally:
            node.lock.release()
        fi.fh = fh
        return 0

    def _cache_policy(self, path: str, node: OpenNode, fresh: bool, fi) -> None:
        """Keep the kernel's pages of an unchanged file; drop stale pages and attributes."""
        if self.options.direct_io:
            fi.direct_io = 1
            return
        version = content_version(node.handle.attr)
        if not fresh:  # open here already: the kernel's pages are this mount's writes
            fi.keep_cache = 1
            return
        fi.keep_cache = int(self._pages.get(node.inode) == version)
        self._pages.put(node.inode, version)
        told = self._told.get(node.inode)
        if told is not None and told != version:
            self._invalidate(path)
            self._told.put(node.inode, version)

    def _invalidate(self, path: str) -> None:
        """Make the kernel forget what it holds of ``path``'s attributes."""
        invalidate_path(path)

    @fuse_errors
    def open(self, path: str, fi) -> int:
        flags = self._open_flags(fi.flags)
        write = bool(flags & meta_pb2.OPEN_WRITE)
        node = self._node_for(self._lookup(path).inode)
        if node is not None:
            try:
                # open here already: share it (the kernel checked the permissions); a write
                # open needs the node's session, a truncating one cuts the file first
                if node.handle.session_id or flags == meta_pb2.OPEN_READ:
                    if flags & meta_pb2.OPEN_TRUNCATE:
                        self._changed(path, node.truncate(path, 0))
                    fh = self._add_handle(node, write)
                    self._cache_policy(path, node, False, fi)
                    fi.fh = fh
                    return 0
            finally:
                node.lock.release()
        return self._opened(path, self.meta.open(path, flags), write, fi)

    @fuse_errors
    def create(self, path: str, mode: int, fi) -> int:
        self._writable()
        flags = meta_pb2.OPEN_CREATE | meta_pb2.OPEN_WRITE
        if fi.flags & os.O_EXCL:
            flags |= meta_pb2.OPEN_EXCLUSIVE
        if fi.flags & os.O_TRUNC:
            flags |= meta_pb2.OPEN_TRUNCATE
        resp = self.meta.open(path, flags, mode=mode & 0o7777)
        return self._opened(path, resp, (fi.flags & os.O_ACCMODE) != os.O_RDONLY, fi)

    def _handle(self, fh) -> Descriptor:
        handle = self._handles.get(fh)
        if handle is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return handle

    @fuse_errors
    def readinto(self, path, out: memoryview, offset: int, fh: int) -> int:
        handle = self._handle(fh)
        node = handle.node
        with node.lock:  # every write is sent and acknowledged under it
            if node.writer.busy:
                node.writer.flush()  # read what was written
        return handle.readahead.readinto(offset, out)

    read = readinto  # what libfuse's read callback calls (see fusebind)

    @fuse_errors
    def write(self, path, data: memoryview, offset: int, fh: int) -> int:
        handle = self._handle(fh)
        if not handle.write:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return handle.node.write(path, offset, data)

    @fuse_errors
    def flush(self, path, fh: int) -> int:
        handle = self._handles.get(fh)
        if handle is not None and handle.write:
            handle.node.sync()
        return 0

    @fuse_errors
    def fsync(self, path, datasync: int, fh: int) -> int:
        handle = self._handle(fh)
        handle.node.sync()
        return 0

    @fuse_errors
    def release(self, path, fh: int, flock_owner: int | None = None) -> int:
        if flock_owner is not None and fh in self._handles:  # the descriptor's flock lock goes
            self.release_flocks(self._handles[fh].node.inode, flock_owner)
        with self._nodes_lock:
            handle = self._handles.pop(fh, None)
        if handle is None:
            return 0
        node = handle.node
        with node.lock:
            node.opens -= 1
            node.writers -= handle.write
            node.readers.discard(handle.readahead)
            handle.readahead.close()
            try:
                if node.handle.session_id and (
                    (handle.write and node.writers == 0) or node.opens == 0
                ):
                    attr = node.close_session()
                    # before the node leaves the table: what getattr answers from then on
                    self._recent.put(attr.inode, attr)
                    self._pages.put(attr.inode, content_version(attr))
                    self._told.put(attr.inode, content_version(attr))
            finally:
                if node.opens == 0:
                    node.gone = True
                    with self._nodes_lock:
                        if self._nodes.get(node.inode) is node:
                            del self._nodes[node.inode]
        return 0
