"""Paths of EmberFS URLs: ``emberfs://HOST:PORT/path``, ``ember://...`` or ``/path``."""

from __future__ import annotations

import re

from fsspec.utils import stringify_path

PROTOCOLS = ("emberfs", "ember")
_URL = re.compile(r"^(?:emberfs|ember)://")


def strip_protocol(path):
    """The absolute, normalised path of a URL or path (a list: each of them)."""
    if isinstance(path, list):
        return [strip_protocol(p) for p in path]
    path = stringify_path(path)
    m = _URL.match(path)
    if m:
        rest = path[m.end() :]
        path = rest if rest.startswith("/") else "/" + rest.partition("/")[2]
    path = re.sub("/+", "/", "/" + path)
    if len(path) > 1:
        path = path.rstrip("/")
    return path or "/"


def meta_of_url(path) -> str | None:
    """The metaserver address a URL names (``emberfs://HOST:PORT/...``), or None."""
    path = stringify_path(path)
    m = _URL.match(path)
    if m:
        return path[m.end() :].partition("/")[0] or None
    return None


def parent(path: str) -> str:
    """The parent directory of a stripped path (``/`` of ``/``)."""
    head = path.rstrip("/").rsplit("/", 1)[0]
    return head or "/"
