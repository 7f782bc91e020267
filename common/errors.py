"""One error vocabulary for the whole system, and the tables at its edges.

Servers raise :class:`EmberError` subclasses. The gRPC edge turns them into a
status code plus the ``emberfs-errno`` trailing-metadata entry
(:func:`to_grpc`); the client turns a failed call back into the builtin
``OSError`` subclass a Python user expects (:func:`from_grpc`).
"""

from __future__ import annotations

import errno as _errno
import os

import grpc

ERRNO_KEY = "emberfs-errno"
LEADER_KEY = "emberfs-leader"  # trailer of NotLeader: the address of the metaserver that leads


class EmberError(Exception):
    """Base of every typed EmberFS error."""

    errno: int = _errno.EIO
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retryable: bool = False

    def __init__(self, message: str = "", *, errno: int | None = None):
        super().__init__(message or os.strerror(errno or self.errno))
        if errno is not None:
            self.errno = errno

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class NotFound(EmberError):
    errno = _errno.ENOENT
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(EmberError):
    errno = _errno.EEXIST
    code = grpc.StatusCode.ALREADY_EXISTS


class NotADirectory(EmberError):
    errno = _errno.ENOTDIR
    code = grpc.StatusCode.FAILED_PRECONDITION


class IsADirectory(EmberError):
    errno = _errno.EISDIR
    code = grpc.StatusCode.FAILED_PRECONDITION


class NotEmpty(EmberError):
    errno = _errno.ENOTEMPTY
    code = grpc.StatusCode.FAILED_PRECONDITION


class InvalidArgument(EmberError):
    errno = _errno.EINVAL
    code = grpc.StatusCode.INVALID_ARGUMENT


class NameTooLong(EmberError):
    errno = _errno.ENAMETOOLONG
    code = grpc.StatusCode.INVALID_ARGUMENT


class PermissionDenied(EmberError):
    errno = _errno.EACCES
    code = grpc.StatusCode.PERMISSION_DENIED


class NotPermitted(EmberError):
    errno = _errno.EPERM
    code = grpc.StatusCode.PERMISSION_DENIED


class TooManyLinks(EmberError):
    """Symlink loop or too many levels of symlinks."""

    errno = _errno.ELOOP
    code = grpc.StatusCode.FAILED_PRECONDITION


class CrossDevice(EmberError):
    errno = _errno.EXDEV
    code = grpc.StatusCode.FAILED_PRECONDITION


class Busy(EmberError):
    errno = _errno.EBUSY
    code = grpc.StatusCode.FAILED_PRECONDITION


class NoSpace(EmberError):
    errno = _errno.ENOSPC
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class QuotaExceeded(EmberError):
    errno = _errno.EDQUOT
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(EmberError):
    """No replica, chain or service can take the request now; try again."""

    errno = _errno.EAGAIN
    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


class NotLeader(Unavailable):
    """This metaserver does not run the cluster manager now; ``leader`` does ("": none known yet).

    Storage servers send their cluster calls to ``leader`` (the trailer
    :data:`LEADER_KEY` carries it); without one they try the next metaserver.
    """

    def __init__(self, message: str = "", *, leader: str = "") -> None:
        super().__init__(
            message
            or (
                f"this metaserver does not lead the cluster; {leader} does"
                if leader
                else "this metaserver does not lead the cluster and no leader is known yet"
            )
        )
        self.leader = leader


class ChecksumMismatch(EmberError):
    errno = _errno.EIO
    code = grpc.StatusCode.DATA_LOSS
    retryable = True


class Internal(EmberError):
    errno = _errno.EIO
    code = grpc.StatusCode.INTERNAL


# errno -> typed error, for the client side and for BatchStat results.
_BY_ERRNO: dict[int, type[EmberError]] = {
    cls.errno: cls
    for cls in (
        NotFound,
        AlreadyExists,
        NotADirectory,
        IsADirectory,
        NotEmpty,
        InvalidArgument,
        NameTooLong,
        PermissionDenied,
        NotPermitted,
        TooManyLinks,
        CrossDevice,
        Busy,
        NoSpace,
        QuotaExceeded,
    )
}

# gRPC status -> errno when a response carries no errno (e.g. a transport error).
_ERRNO_BY_CODE: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.NOT_FOUND: _errno.ENOENT,
    grpc.StatusCode.ALREADY_EXISTS: _errno.EEXIST,
    grpc.StatusCode.INVALID_ARGUMENT: _errno.EINVAL,
    grpc.StatusCode.PERMISSION_DENIED: _errno.EACCES,
    grpc.StatusCode.UNAUTHENTICATED: _errno.EACCES,
    grpc.StatusCode.FAILED_PRECONDITION: _errno.EINVAL,
    grpc.StatusCode.RESOURCE_EXHAUSTED: _errno.ENOSPC,
    grpc.StatusCode.UNAVAILABLE: _errno.EAGAIN,
    grpc.StatusCode.DEADLINE_EXCEEDED: _errno.ETIMEDOUT,
    grpc.StatusCode.DATA_LOSS: _errno.EIO,
}

# Codes a client retries (with backoff) rather than surfacing. CANCELLED is what
# a server that is shutting down answers to the calls it drops; clients never
# cancel their own calls, and every mutating call carries a request id, so a
# retried one is applied once.
RETRYABLE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


def error_for_errno(err: int, message: str = "") -> EmberError:
    """The typed error for an errno value."""
    cls = _BY_ERRNO.get(err, Internal)
    return cls(message, errno=err)


def to_grpc(context: grpc.ServicerContext, exc: EmberError) -> None:
    """Abort the current RPC with the status and errno of ``exc`` (and a NotLeader's leader)."""
    trailers = [(ERRNO_KEY, str(exc.errno))]
    if isinstance(exc, NotLeader):
        trailers.append((LEADER_KEY, exc.leader))
    context.set_trailing_metadata(tuple(trailers))
    context.abort(exc.code, exc.message)


def leader_of(exc: grpc.RpcError) -> str | None:
    """The leader a failed call named (NotLeader): its address, "" when none is known yet,
    None when the call did not fail for that."""
    for key, value in exc.trailing_metadata() or ():
        if key == LEADER_KEY:
            return value
    return None


def errno_of(exc: grpc.RpcError) -> int:
    """The errno carried by a failed call, or the one its status code implies."""
    for key, value in exc.trailing_metadata() or ():
        if key == ERRNO_KEY:
            try:
                return int(value)
            except ValueError:
                break
    return _ERRNO_BY_CODE.get(exc.code(), _errno.EIO)


def oserror(err: int, message: str, path: str | None = None) -> OSError:
    """A builtin OSError subclass for ``err`` (FileNotFoundError for ENOENT, ...)."""
    if path is not None:
        return OSError(err, message or os.strerror(err), path)
    return OSError(err, message or os.strerror(err))


def from_grpc(exc: grpc.RpcError, path: str | None = None) -> OSError:
    """Turn a failed gRPC call into the matching builtin OSError subclass.

    ``OSError(errno, ...)`` itself picks the subclass: ENOENT gives
    FileNotFoundError, EEXIST FileExistsError, ENOTDIR NotADirectoryError,
    EISDIR IsADirectoryError, EACCES/EPERM PermissionError, ETIMEDOUT
    TimeoutError.
    """
    return oserror(errno_of(exc), exc.details() or "", path)
