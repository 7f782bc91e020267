"""Path resolution: from a path to its parent directories, final name and inode.

Paths from clients are normalised (no '.' or '..', see
:mod:`emberfs.common.paths`). Symlink targets are stored as given, so while
a symlink is expanded its '.' and '..' components are honoured against the
directories walked so far ('..' at the root stays at the root). Every
symlink followed counts towards :data:`MAX_SYMLINKS`; beyond it the walk
fails with ELOOP. Intermediate symlinks are always followed, the final one
only when asked.

Every directory walked needs search permission, and every inode and entry
read lands in the transaction's read set, so a concurrent change to any of
them makes the operation retry.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from emberfs.common import paths
from emberfs.common.errors import (
    Busy,
    InvalidArgument,
    NameTooLong,
    NotADirectory,
    NotFound,
    TooManyLinks,
)
from emberfs.metaserver import access, records
from emberfs.metaserver.opcontext import OpContext
from emberfs.proto import common_pb2

MAX_SYMLINKS = 40


@dataclass
class Resolved:
    """The result of a walk.

    ``parents`` are the directories from the root down to the one holding the
    final entry (empty when the path names the root). ``name`` is the final
    entry's name (None when the walk ended on a directory reached by '/',
    '.' or '..'). ``attr`` is the final inode, None when the entry is missing.
    """

    parents: list[common_pb2.InodeAttr]
    name: str | None
    attr: common_pb2.InodeAttr | None

    @property
    def parent(self) -> common_pb2.InodeAttr:
        return self.parents[-1]

    def require(self, path: str) -> common_pb2.InodeAttr:
        """The final inode, or NotFound."""
        if self.attr is None:
            raise NotFound(f"no such file or directory: {path}")
        return self.attr

    def require_entry(self, path: str) -> str:
        """The final entry's name; paths naming the root or a '.'/'..' cannot be changed."""
        if self.name is None:
            raise Busy(f"cannot change {path or '/'} itself")
        return self.name


def symlink_components(target: str) -> list[str]:
    """The components of a symlink target, '.' and '..' kept."""
    out = []
    for part in target.split("/"):
        if not part or part == ".":
            continue
        if part != "..":
            paths.validate_name(part)
        out.append(part)
    return out


def validate_symlink_target(target: str) -> None:
    """A symlink target: 1..4096 bytes, no NUL."""
    raw = target.encode("utf-8", "surrogateescape")
    if not raw:
        raise InvalidArgument("empty symlink target")
    if len(raw) > paths.MAX_PATH_BYTES:
        raise NameTooLong(f"symlink target longer than {paths.MAX_PATH_BYTES} bytes")
    if "\0" in target:
        raise InvalidArgument("NUL in symlink target")


def root(op: OpContext) -> common_pb2.InodeAttr:
    return op.load_inode(records.ROOT_INODE)


def resolve(op: OpContext, path: str, *, follow: bool) -> Resolved:
    """Walk ``path``; ``follow`` says whether a final symlink is followed."""
    pending = deque(paths.split_path(path))
    stack = [root(op)]
    links = 0
    while pending:
        comp = pending.popleft()
        if comp == "..":
            if len(stack) > 1:
                stack.pop()
            continue
        directory = stack[-1]
        access.check(directory, op.creds, access.SEARCH, path)
        entry = op.get_dentry(directory.inode, comp)
        last = not pending
        if entry is None:
            if last:
                return Resolved(stack, comp, None)
            raise NotFound(f"no such file or directory: {path}")
        child = op.load_inode(entry.inode)
        if child.type == common_pb2.SYMLINK and (follow or not last):
            links += 1
            if links > MAX_SYMLINKS:
                raise TooManyLinks(f"too many levels of symbolic links: {path}")
            target = child.symlink_target
            if target.startswith("/"):
                stack = stack[:1]
            pending.extendleft(reversed(symlink_components(target)))
            continue
        if last:
            return Resolved(stack, comp, child)
        if child.type != common_pb2.DIRECTORY:
            raise NotADirectory(f"not a directory: {path}")
        stack.append(child)
    return Resolved(stack[:-1], None, stack[-1])


def resolve_parent(op: OpContext, path: str) -> Resolved:
    """Walk to the entry ``path`` names without following a final symlink.

    The result always has a parent and a name (Busy for the root).
    """
    found = resolve(op, path, follow=False)
    found.require_entry(path)
    return found
