"""Path and name rules shared by the metaserver and the client."""

from __future__ import annotations

from emberfs.common.errors import InvalidArgument, NameTooLong

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


def validate_name(name: str) -> None:
    """A directory entry name: 1..255 bytes, no '/', no NUL, not '.' or '..'."""
    raw = name.encode("utf-8", "surrogateescape")
    if not raw:
        raise InvalidArgument("empty name")
    if len(raw) > MAX_NAME_BYTES:
        raise NameTooLong(f"name longer than {MAX_NAME_BYTES} bytes")
    if "/" in name or "\0" in name:
        raise InvalidArgument(f"invalid character in name {name!r}")
    if name in (".", ".."):
        raise InvalidArgument(f"invalid name {name!r}")


def split_path(path: str) -> list[str]:
    """The components of an absolute or relative path, each validated.

    '' and '/' are the root (no components). Repeated slashes are folded;
    '.' and '..' components are refused rather than resolved (clients send
    normalised paths).
    """
    if "\0" in path:
        raise InvalidArgument("NUL in path")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise NameTooLong(f"path longer than {MAX_PATH_BYTES} bytes")
    parts = [p for p in path.split("/") if p]
    for p in parts:
        validate_name(p)
    return parts


def join(parts: list[str]) -> str:
    return "/" + "/".join(parts)
