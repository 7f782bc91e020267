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

On a store where every read is a network round trip (etcd), a walk first
fetches together the keys it expects to read (:func:`predicted_keys`): the
entries and inodes of the path as earlier walks of this metaserver found them
(:class:`PathCache`). The guess is never trusted, only fetched: the walk reads
each entry as usual, from what was fetched when the guess was right, from the
store when it was not.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

from emberfs.common import paths
from emberfs.common.errors import (
    Busy,
    EmberError,
    InvalidArgument,
    NameTooLong,
    NotADirectory,
    NotFound,
    TooManyLinks,
)
from emberfs.metaserver.fs import access, records
from emberfs.metaserver.fs.opcontext import OpContext
from emberfs.metaserver.store import keys
from emberfs.proto import common_pb2

MAX_SYMLINKS = 40
PATH_CACHE_ENTRIES = 1 << 17


class PathCache:
    """Which inode each directory entry named when a walk last read it, for the newest entries.

    ``(directory id, name) -> inode id``; only a guess of what a walk will read
    (see the module docstring), so a stale entry costs one more round trip,
    never a wrong answer.
    """

    def __init__(self, capacity: int = PATH_CACHE_ENTRIES) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, str], int] = OrderedDict()

    def get(self, parent: int, name: str) -> int | None:
        with self._lock:
            return self._entries.get((parent, name))

    def found(self, parent: int, name: str, child: int | None) -> None:
        """A walk read the entry ``name`` of ``parent``: it names ``child`` (None: nothing)."""
        key = (parent, name)
        with self._lock:
            if child is None:
                self._entries.pop(key, None)
                return
            self._entries[key] = child
            self._entries.move_to_end(key)
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)


def predicted_keys(op: OpContext, path: str) -> list[bytes]:
    """The keys a walk of ``path`` is expected to read, as far as the path cache knows it."""
    cache = op.env.paths
    out = [keys.inode_key(records.ROOT_INODE)]
    if cache is None:
        return out
    try:
        components = paths.split_path(path)
    except EmberError:
        return out  # the walk itself says what is wrong with the path
    parent = records.ROOT_INODE
    for comp in components:
        out.append(keys.dentry_key(parent, comp))
        child = cache.get(parent, comp)
        if child is None:
            break
        out.append(keys.inode_key(child))
        parent = child
    return out


def predicted_inode(op: OpContext, path: str) -> int | None:
    """The inode a walk of ``path`` is expected to end at (None: the path cache does not know)."""
    cache = op.env.paths
    if cache is None:
        return None
    try:
        components = paths.split_path(path)
    except EmberError:
        return None
    inode = records.ROOT_INODE
    for comp in components:
        inode = cache.get(inode, comp)
        if inode is None:
            return None
    return inode


def prefetch_paths(op: OpContext, path_list, extra: list[bytes] = ()) -> None:
    """Fetch what walks of ``path_list`` are expected to read (and ``extra``) at once."""
    if op.env.paths is None:
        return
    wanted = list(extra)
    for path in path_list:
        wanted += predicted_keys(op, path)
    op.txn.prefetch(wanted)


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
    if op.env.paths is not None:
        op.txn.prefetch(predicted_keys(op, path))
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
        if op.env.paths is not None:
            op.env.paths.found(directory.inode, comp, None if entry is None else entry.inode)
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
