"""List: a page of a directory's entries with their attributes."""

from __future__ import annotations

from emberfs.common import paths
from emberfs.common.errors import NotADirectory
from emberfs.metaserver.fs import access, lookup
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2, meta_pb2

DEFAULT_PAGE = 2000
MAX_PAGE = 10000


def list_dir(op: OpContext, req: meta_pb2.ListRequest) -> meta_pb2.ListResponse:
    """Up to ``limit`` entries (0: 2000, at most 10000) after ``start_after``, in name order.

    A final symlink is followed. Needs read and search permission on the
    directory (the attributes of the entries come back too). ``more`` says
    whether entries follow the page; pass the last name as ``start_after``.
    """
    if req.start_after:
        paths.validate_name(req.start_after)
    limit = min(req.limit or DEFAULT_PAGE, MAX_PAGE)
    directory = lookup.resolve(op, req.path, follow=True).require(req.path)
    if directory.type != common_pb2.DIRECTORY:
        raise NotADirectory(f"not a directory: {req.path}")
    access.check(directory, op.creds, access.READ | access.SEARCH, req.path)
    out = meta_pb2.ListResponse()
    page = list(op.entries(directory.inode, req.start_after or None, limit + 1))
    if len(page) > limit:
        out.more = True
        del page[limit:]
    op.txn.prefetch(keys.inode_key(entry.inode) for _, entry in page)  # together, where it counts
    for name, entry in page:
        out.entries.add(name=name, attr=op.load_inode(entry.inode))
    return out
