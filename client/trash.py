"""The trash through the metaserver: ``TrashList``, ``TrashRestore``, ``TrashPurge``.

A metaserver with ``--trash-days`` above 0 keeps what a removal takes (a
file's last link, a directory, a whole tree) as a trash entry of the remover
until it is restored or purged (docs/client.md, "The trash"). Entries are
plain dicts: ``entry`` (its id, the removed inode's id), ``path`` (where it
was; for a restored one, where it is now), ``uid`` (who removed it),
``removed`` (a UTC ``datetime``), ``type`` (``"file"``, ``"directory"`` or
``"link"``) and ``entries`` (what it holds, itself included).

Each function makes its calls on a :class:`~emberfs.client.meta.MetaClient`
with its retries, request ids (a retried restore or purge applies once) and
error mapping: restoring onto a name that exists raises ``FileExistsError``
and restores nothing; restoring into a directory that is gone
``FileNotFoundError`` (``to`` picks another path); an entry that is not the
caller's ``FileNotFoundError``.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from emberfs.proto import common_pb2, meta_pb2

if TYPE_CHECKING:
    from emberfs.client.meta import MetaClient

_TYPES = {common_pb2.FILE: "file", common_pb2.DIRECTORY: "directory", common_pb2.SYMLINK: "link"}


def as_dict(entry: meta_pb2.TrashEntry) -> dict:
    """A trash entry as the dict the functions here return."""
    return {
        "entry": entry.entry,
        "path": entry.path,
        "uid": entry.uid,
        "removed": datetime.datetime.fromtimestamp(entry.removed_ns / 1e9, datetime.UTC),
        "type": _TYPES.get(entry.type, "other"),
        "entries": entry.entries,
    }


def list_entries(meta: MetaClient, user: int | None = None, all_users: bool = False) -> list[dict]:
    """The caller's entries, oldest first (uid 0: ``user``'s, or ``all_users``')."""
    req = meta_pb2.TrashListRequest(ctx=meta.context(), all_users=all_users)
    if user is not None:
        req.user = user
    return [as_dict(e) for e in meta.meta("TrashList", req).entries]


def restore(
    meta: MetaClient, entries: list[int] | None = None, every: bool = False, to: str = ""
) -> list[dict]:
    """Put ``entries`` (or ``every`` entry of the caller's) back, all or none; the entries
    restored, with the paths they have now. ``to``: the one entry's new path."""
    req = meta_pb2.TrashRestoreRequest(
        ctx=meta.context(), entries=list(entries or []), all=every, to=to
    )
    return [as_dict(e) for e in meta.meta("TrashRestore", req, to or None).restored]


def purge(
    meta: MetaClient,
    entries: list[int] | None = None,
    every: bool = False,
    before: datetime.datetime | None = None,
) -> int:
    """Delete ``entries`` (or ``every`` entry of the caller's) for real, only those removed
    before ``before`` when given; the number purged."""
    before_ns = 0 if before is None else int(before.timestamp() * 1e9)
    purged = 0
    while True:
        req = meta_pb2.TrashPurgeRequest(
            ctx=meta.context(), entries=list(entries or []), all=every, before_ns=before_ns
        )
        resp = meta.meta("TrashPurge", req)
        purged += resp.purged
        if not resp.more:
            return purged
