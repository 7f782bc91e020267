"""Chunk cuts of shrinking truncations, kept until storage holds them.

A truncation that shrinks a file (``Truncate``, or an ``Open`` with
OPEN_TRUNCATE) commits the file's new length together with a *pending cut*
(``CUTS`` + inode: the new length and a request id), and only then has the
storage servers cut the chunks
(:func:`~emberfs.metaserver.fs.chunk_truncation.truncate_chunks`); the record is
deleted once every chain has cut. The length and the cut are so one outcome:
when the metaserver stops waiting for storage (a chain cut off from its peers,
a restart) the file has its new length all the same, and the cut is finished
later with the same request id, so that a head which applied it answers from
memory rather than cutting again.

Until its cut is done a file reads as its new length (no reader looks past
it), and nothing may let it grow, since growing would show the old bytes past
the cut: an open for write, a growing truncate, and a sync or close that
lengthens the file raise :class:`CutPending` in their transaction; the
namespace finishes the cut and runs the operation again (Unavailable while the
cut cannot be done). :meth:`PendingCuts.run` finishes the cuts nobody asks for.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections.abc import Callable

from emberfs.common.errors import EmberError
from emberfs.metaserver.fs import records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine, Transaction, run_transaction
from emberfs.proto import common_pb2

log = logging.getLogger(__name__)

SWEEP_INTERVAL = 2.0  # seconds between two passes over the pending cuts
LOCK_STRIPES = 64  # inodes are finished under one of this many locks

TruncateChunks = Callable[[common_pb2.InodeAttr, int, int], None]

_request_ids = itertools.count(secrets.randbits(62) + 1)


def new_request_id() -> int:
    """A request id for a chunk cut, unlike any other of this process (0 is never one)."""
    return next(_request_ids)


class CutPending(Exception):
    """An operation would grow a file whose chunks are not cut yet."""

    def __init__(self, inode: int) -> None:
        super().__init__(f"inode {inode} has a chunk cut pending")
        self.inode = inode


def get(txn: Transaction, inode: int) -> records.PendingCut | None:
    raw = txn.get(keys.cut_key(inode))
    return None if raw is None else records.decode_cut(raw)


def put(txn: Transaction, inode: int, length: int) -> None:
    """Record a cut of ``inode`` to ``length``, replacing any cut pending (a new request id)."""
    cut = records.PendingCut(length, new_request_id())
    txn.put(keys.cut_key(inode), records.encode_cut(cut))


def delete(txn: Transaction, inode: int) -> None:
    txn.delete(keys.cut_key(inode))


def require_none(txn: Transaction, inode: int) -> None:
    """Raise :class:`CutPending` when ``inode`` has a cut pending."""
    if txn.get(keys.cut_key(inode)) is not None:
        raise CutPending(inode)


class PendingCuts:
    """Finishes the pending cuts of a namespace's store.

    Parameters
    ----------
    engine : KVEngine
        The metadata store.
    truncate_chunks : callable
        ``truncate_chunks(attr, length, request_id)`` cuts the file's chunks
        on every chain, raising Unavailable when it could not.
    """

    def __init__(self, engine: KVEngine, truncate_chunks: TruncateChunks) -> None:
        self._engine = engine
        self._truncate_chunks = truncate_chunks
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]

    def finish(self, inode: int) -> bool:
        """Cut the chunks of ``inode`` if a cut is pending; True when there was one.

        One finish of an inode runs at a time (the operation's own, the sweep's),
        and each reads the record once it holds the inode: a cut that another
        finished is not sent again, where it could reach the replicas after the
        file was removed and bring back a chunk the GC queue had taken.
        Raises what ``truncate_chunks`` raises (the record then stays).
        """
        with self._locks[inode % LOCK_STRIPES]:
            return self._finish(inode)

    def _finish(self, inode: int) -> bool:
        def read(txn: Transaction):
            raw = txn.get(keys.inode_key(inode))
            return get(txn, inode), None if raw is None else records.decode_inode(raw)

        cut, attr = run_transaction(self._engine, read)
        if cut is None:
            return False
        if attr is not None:  # a removed file's chunks go with the GC queue
            # The record is durable before storage cuts (a batch commits without a sync
            # of its own), so that no restart forgets a length that storage already holds.
            self._engine.sync()
            self._truncate_chunks(attr, cut.length, cut.request_id)

        def drop(txn: Transaction) -> None:
            if get(txn, inode) == cut:  # not replaced by a later truncation meanwhile
                delete(txn, inode)

        run_transaction(self._engine, drop)
        return True

    def pending(self) -> list[int]:
        """The inodes with a cut pending."""
        return [keys.cut_inode(key) for key, _ in self._engine.scan_prefix(keys.CUT)]

    def finish_all(self) -> int:
        """Try every pending cut once; the number finished (failures are logged)."""
        done = 0
        for inode in self.pending():
            try:
                done += self.finish(inode)
            except EmberError as exc:
                log.warning("inode %d: the pending chunk cut failed again: %s", inode, exc)
        return done

    def run(
        self,
        stop: threading.Event,
        interval: float = SWEEP_INTERVAL,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        """Finish pending cuts every ``interval`` seconds until ``stop`` is set.

        Rounds in which ``active()`` is false are skipped (the metaserver that
        leads sweeps; operations still finish their own cuts anywhere).
        """
        while not stop.wait(interval):
            if not active():
                continue
            try:
                self.finish_all()
            except Exception:
                log.exception("pending chunk cut sweep failed")
