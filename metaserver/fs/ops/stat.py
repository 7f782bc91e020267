"""Stat by path or inode id, and BatchStat."""

from __future__ import annotations

from collections.abc import Callable

from emberfs.common.errors import EmberError, InvalidArgument, NotFound
from emberfs.metaserver.fs import lookup
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.fs.ops import xattrs
from emberfs.proto import common_pb2, meta_pb2

MAX_BATCH = 10000


def stat(op: OpContext, req: meta_pb2.StatRequest) -> meta_pb2.StatResponse:
    """The attributes of a path (``inode`` 0) or of an inode id (``path`` empty).

    By id there is no path to check permissions on, so none are checked; an
    unlinked file that is still open stays visible by id until its last close.
    With ``xattrs``, the extended attributes whose values the caller may read
    come too (:func:`~emberfs.metaserver.fs.ops.xattrs.readable_xattrs`).
    """
    if req.inode:
        if req.path:
            raise InvalidArgument("give a path or an inode id, not both")
        attr = op.get_inode(req.inode)
        if attr is None:
            raise NotFound(f"no inode {req.inode}")
    else:
        attr = lookup.resolve(op, req.path, follow=req.follow).require(req.path)
    resp = meta_pb2.StatResponse(attr=attr)
    if req.xattrs:
        resp.xattrs.extend(xattrs.readable_xattrs(op, attr))
    return resp


def per_path(paths, attr_of: Callable[[str], common_pb2.InodeAttr], results) -> None:
    """Add to ``results`` (``BatchStatResult``) each path's ``attr_of(path)``, or its errno.

    InvalidArgument, and nothing added, for more than :data:`MAX_BATCH` paths.
    """
    if len(paths) > MAX_BATCH:
        raise InvalidArgument(f"more than {MAX_BATCH} paths in one batch")
    for path in paths:
        result = results.add()
        try:
            result.attr.CopyFrom(attr_of(path))
        except EmberError as exc:
            result.errno = exc.errno


def batch_stat(op: OpContext, req: meta_pb2.BatchStatRequest) -> meta_pb2.BatchStatResponse:
    """Stat many paths in one call; each result has the attributes or an errno."""
    out = meta_pb2.BatchStatResponse()
    if len(req.paths) <= MAX_BATCH:
        lookup.prefetch_paths(op, req.paths)
    per_path(req.paths, lambda p: lookup.resolve(op, p, follow=req.follow).require(p), out.results)
    return out
