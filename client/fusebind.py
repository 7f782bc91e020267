"""The bindings of a FUSE mount to libfuse3 (through mfusepy's ctypes layer).

:func:`fuse_class` is mfusepy's ``FUSE`` with the callbacks a fast mount
needs, :func:`serve` mounts and serves, :func:`invalidate_path` tells the
kernel to forget a path's attributes from inside a request, and
:func:`fuse_errors` turns every failure of an operation into the errno FUSE
answers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import logging
import os

log = logging.getLogger("emberfs.client.mount")

# errors of a metaserver that cannot be reached (after the client's retries)
_OUTAGE = frozenset({errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNREFUSED, errno.EHOSTUNREACH})


def fuse_errors(method):
    """Run a FUSE operation; every failure becomes an OSError with the errno FUSE answers.

    The client's errors keep their errno; a metaserver that cannot be reached
    is EIO; anything else is logged and answered EIO.
    """

    @functools.wraps(method)
    def run(self, *args):
        try:
            return method(self, *args)
        except OSError as exc:
            code = exc.errno if isinstance(exc.errno, int) and exc.errno > 0 else errno.EIO
            if code in _OUTAGE:
                log.warning("%s: the metaserver cannot be reached: %s", method.__name__, exc)
                code = errno.EIO
            elif code == errno.EIO:
                log.warning("%s%r: %s", method.__name__, args[:1], exc)
            raise OSError(code, os.strerror(code)) from None
        except Exception:
            log.exception("%s%r failed", method.__name__, args[:1])
            raise OSError(errno.EIO, os.strerror(errno.EIO)) from None

    return run


def fuse_class():
    """mfusepy's ``FUSE`` with the callbacks a fast mount needs (imported on first use).

    Reads land straight in libfuse's reply buffer and writes are taken from its
    request buffer (no bytes objects in between); ``open`` and ``create`` get
    the ``fuse_file_info`` (``keep_cache``, ``direct_io``); ``truncate``,
    ``rename`` and ``utimens`` keep the descriptor, the flags and the raw times
    that mfusepy's defaults drop; ``lock``, ``flock`` and ``release`` get the
    kernel's lock owner (and whether a release ends flock locks).
    """
    import mfusepy

    class Fuse(mfusepy.FUSE):
        def _path(self, path):
            return None if path is None else path.decode(self.encoding, self.errors)

        def open(self, path, fip):
            return self.operations.open(self._path(path), fip.contents)

        def create(self, path, mode, fip):
            return self.operations.create(self._path(path), mode, fip.contents)

        def read(self, path, buf, size, offset, fip):
            addr = ctypes.cast(buf, ctypes.c_void_p).value
            view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
            return self.operations.readinto(self._path(path), view, offset, fip.contents.fh)

        def write(self, path, buf, size, offset, fip):
            addr = ctypes.cast(buf, ctypes.c_void_p).value
            view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
            return self.operations.write(self._path(path), view, offset, fip.contents.fh)

        def truncate_fuse_3(self, path, length, fip):
            fh = fip.contents.fh if fip else None
            return self.operations.truncate(self._path(path), length, fh)

        def rename_fuse_3(self, old, new, flags):
            return self.operations.rename(self._path(old), self._path(new), flags)

        def utimens_fuse_3(self, path, buf, fip):
            times = (buf.contents.actime, buf.contents.modtime) if buf else None
            return self.operations.utimens_raw(self._path(path), times)

        def lock(self, path, fip, cmd, flock):
            return self.operations.lock(self._path(path), fip.contents, cmd, flock)

        def flock(self, path, fip, op):
            return self.operations.flock(self._path(path), fip.contents, op)

        def release(self, path, fip):
            fi = fip.contents
            owner = fi.lock_owner if fi.flock_release else None
            return self.operations.release(self._path(path), fi.fh, owner)

    return Fuse


def serve(operations, mountpoint: str, *, debug: bool = False, fsname: str = "emberfs"):
    """Mount ``operations`` at ``mountpoint`` and serve requests until it is unmounted.

    Runs in the foreground (the caller daemonises first); SIGINT, SIGTERM and
    SIGHUP unmount. Raises RuntimeError when libfuse fails to mount.
    """
    options = operations.options
    kwargs = {
        "foreground": True,
        "debug": debug,
        "fsname": fsname.replace("\\", "\\\\").replace(",", "\\,"),  # -o splits at commas
        "subtype": "emberfs",
        "default_permissions": True,
    }
    if options.read_only:
        kwargs["ro"] = True
    if options.allow_other:
        kwargs["allow_other"] = True
    fuse_class()(operations, mountpoint, **kwargs)


class _Context(ctypes.Structure):
    """The head of libfuse3's ``struct fuse_context`` (the fields used here)."""

    _fields_ = [("fuse", ctypes.c_void_p), ("uid", ctypes.c_uint32)]


_LIB = None


def _library():
    """libfuse3, as loaded for mfusepy (the same library, found by its name)."""
    global _LIB
    if _LIB is None:
        import mfusepy  # noqa: F401 - it loads libfuse3 first

        lib = ctypes.CDLL(ctypes.util.find_library("fuse3") or "libfuse3.so.3")
        lib.fuse_get_context.restype = ctypes.POINTER(_Context)
        lib.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.fuse_invalidate_path.restype = ctypes.c_int
        lib.fuse_interrupted.restype = ctypes.c_int
        _LIB = lib
    return _LIB


def invalidate_path(path: str) -> None:
    """Make the kernel forget ``path``'s attributes (inside a request; nothing outside one)."""
    lib = _library()
    ctx = lib.fuse_get_context()
    if ctx:
        lib.fuse_invalidate_path(ctx.contents.fuse, path.encode("utf-8", "surrogateescape"))


def caller_uid() -> int | None:
    """The uid of the process whose request is being served (None outside a request)."""
    ctx = _library().fuse_get_context()
    return ctx.contents.uid if ctx and ctx.contents.fuse else None


def interrupted() -> bool:
    """True when the kernel interrupted the request being served (a signal to its caller)."""
    return bool(_library().fuse_interrupted())
