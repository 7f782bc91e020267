"""The (source, destination) pairs of ``get``, ``put`` and ``copy`` of many paths.

fsspec's path rules decide them: lists, globs, recursion, ``maxdepth``,
trailing slashes and an existing destination directory. These functions apply
those rules with fsspec's own helpers (``expand_path``, ``other_paths``,
``trailing_sep``, ``has_magic``) and return the pairs, which
:class:`~emberfs.client.transfer.BatchTransfer` then moves together instead of
one file after the other.
"""

from __future__ import annotations

from glob import has_magic

import fsspec.utils
from fsspec.implementations.local import LocalFileSystem, make_path_posix, trailing_sep
from fsspec.utils import other_paths

from emberfs.client.paths import strip_protocol

# fsspec versions that have it refuse source names that climb out of a local destination
_check_contained = getattr(fsspec.utils, "check_contained", None)


def _sources(fs, path, recursive, maxdepth, **kwargs) -> list[str]:
    """``path`` expanded on ``fs``, directories left out of a non-recursive copy of a string."""
    paths = fs.expand_path(path, recursive=recursive, maxdepth=maxdepth, **kwargs)
    if isinstance(path, str) and (not recursive or maxdepth is not None):
        paths = [p for p in paths if not (trailing_sep(p) or fs.isdir(p))]
    return paths


def _destinations(sources: list[str], source, dest, dest_is_dir: bool) -> list[str]:
    source_is_str = isinstance(source, str)
    exists = source_is_str and (
        (has_magic(source) and len(sources) == 1)
        or (not has_magic(source) and dest_is_dir and not trailing_sep(source))
    )
    return other_paths(sources, dest, exists=exists, flatten=not source_is_str)


def get_pairs(fs, rpath, lpath, recursive=False, maxdepth=None, **kwargs) -> list[tuple]:
    """``(remote, local)`` pairs of ``fs.get(rpath, lpath, ...)``."""
    if isinstance(rpath, list) and isinstance(lpath, list):
        return list(zip(rpath, lpath, strict=False))
    rpaths = _sources(fs, rpath, recursive, maxdepth, **kwargs)
    if not rpaths:
        return []
    if isinstance(lpath, str):
        lpath = make_path_posix(lpath)
    dest_is_dir = isinstance(lpath, str) and (trailing_sep(lpath) or LocalFileSystem().isdir(lpath))
    lpaths = _destinations(rpaths, rpath, lpath, dest_is_dir)
    if isinstance(lpath, str) and _check_contained is not None:
        _check_contained(lpath, lpaths)
    return list(zip(rpaths, lpaths, strict=False))


def put_pairs(fs, lpath, rpath, recursive=False, maxdepth=None, **kwargs) -> list[tuple]:
    """``(local, remote)`` pairs of ``fs.put(lpath, rpath, ...)``."""
    if isinstance(lpath, list) and isinstance(rpath, list):
        return list(zip(lpath, rpath, strict=False))
    if isinstance(lpath, str):
        lpath = make_path_posix(lpath)
    lpaths = _sources(LocalFileSystem(), lpath, recursive, maxdepth, **kwargs)
    if not lpaths:
        return []
    dest_is_dir = isinstance(rpath, str) and (trailing_sep(rpath) or fs.isdir(rpath))
    rpath = strip_protocol(rpath)
    return list(zip(lpaths, _destinations(lpaths, lpath, rpath, dest_is_dir), strict=False))


def copy_pairs(fs, path1, path2, recursive=False, maxdepth=None, **kwargs) -> list[tuple]:
    """``(source, destination)`` pairs of ``fs.copy(path1, path2, ...)``."""
    if isinstance(path1, list) and isinstance(path2, list):
        return list(zip(path1, path2, strict=False))
    paths1 = _sources(fs, path1, recursive, maxdepth, **kwargs)
    if not paths1:
        return []
    dest_is_dir = isinstance(path2, str) and (trailing_sep(path2) or fs.isdir(path2))
    return list(zip(paths1, _destinations(paths1, path1, path2, dest_is_dir), strict=False))
