from __future__ import annotations

import errno

import grpc
import pytest

from emberfs.common import errors, paths


@pytest.mark.parametrize("name", ["a", "x" * 255, "é" * 127, "with space", "dot.file", "..."])
def test_valid_names(name):
    paths.validate_name(name)


@pytest.mark.parametrize(
    "name,exc",
    [
        ("", errors.InvalidArgument),
        (".", errors.InvalidArgument),
        ("..", errors.InvalidArgument),
        ("a/b", errors.InvalidArgument),
        ("a\0b", errors.InvalidArgument),
        ("x" * 256, errors.NameTooLong),
        ("é" * 128, errors.NameTooLong),
    ],
)
def test_invalid_names(name, exc):
    with pytest.raises(exc):
        paths.validate_name(name)


def test_split_path():
    assert paths.split_path("/") == []
    assert paths.split_path("") == []
    assert paths.split_path("//a///b/") == ["a", "b"]
    with pytest.raises(errors.InvalidArgument):
        paths.split_path("/a/../b")
    with pytest.raises(errors.NameTooLong):
        paths.split_path("/" + "/".join(["d" * 200] * 21))


class _FakeRpcError(grpc.RpcError):
    """A failed call as the client sees it (code, details, trailing metadata)."""

    def __init__(self, code, details, trailers=()):
        self._code, self._details, self._trailers = code, details, trailers

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailers


@pytest.mark.parametrize(
    "err,builtin",
    [
        (errors.NotFound(), FileNotFoundError),
        (errors.AlreadyExists(), FileExistsError),
        (errors.NotADirectory(), NotADirectoryError),
        (errors.IsADirectory(), IsADirectoryError),
        (errors.PermissionDenied(), PermissionError),
        (errors.NotPermitted(), PermissionError),
    ],
)
def test_errno_trailer_gives_builtin_exception(err, builtin):
    rpc = _FakeRpcError(err.code, "msg", ((errors.ERRNO_KEY, str(err.errno)),))
    exc = errors.from_grpc(rpc, "/p")
    assert type(exc) is builtin
    assert exc.errno == err.errno and exc.filename == "/p"


def test_not_empty_is_oserror_with_errno():
    err = errors.NotEmpty()
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    exc = errors.from_grpc(_FakeRpcError(err.code, "x", ((errors.ERRNO_KEY, "39"),)))
    assert type(exc) is OSError and exc.errno == errno.ENOTEMPTY


def test_status_without_trailer_falls_back_to_code():
    exc = errors.from_grpc(_FakeRpcError(grpc.StatusCode.NOT_FOUND, "gone"))
    assert isinstance(exc, FileNotFoundError)
    exc = errors.from_grpc(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "slow"))
    assert isinstance(exc, TimeoutError)


def test_error_for_errno():
    assert isinstance(errors.error_for_errno(errno.ENOENT), errors.NotFound)
    assert isinstance(errors.error_for_errno(errno.ENOTEMPTY), errors.NotEmpty)
    assert isinstance(errors.error_for_errno(9999), errors.Internal)
