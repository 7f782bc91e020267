"""Write-session leases, judged on the metaserver's monotonic clock.

A session's record in the store (``SESS``, see :mod:`emberfs.metaserver.fs.records`)
keeps when it was opened and last renewed by the wall clock, for people to
read. Whether its lease ran out is judged here, in memory: :class:`Leases`
keeps when the running metaserver last saw each session opened or renewed,
on its monotonic clock, so a step of the wall clock ends no session early.

A session the process has not seen opened or renewed (every stored session
after a restart) counts from the moment it is first looked at, and silence
counts from :attr:`Grace.since <emberfs.metaserver.clustermgr.grace.Grace.since>` at the
earliest, so after a restart or a stall of the metaserver every session has a
full session timeout to be renewed.

Renewals may reach any metaserver of a shared store while one of them (the
leader) judges the leases, so a renewal counts twice over: the metaserver
that serves it notes it in memory, and it rewrites the session's record with
a new renewal time, which every judge notices as a change of the record
(:meth:`Leases.silence` is given the record's renewal time; a value it has not
seen before counts as a renewal now, on the judge's own clock). A renewal a
judge sees only through the record is so counted up to one sweep late,
never early.

Open and renewal note the lease inside their transaction, before it commits
(:meth:`Leases.renewed`); an expiry reads the session's record first and asks
:meth:`Leases.lapsed` after. A renewal that the expiry does not see in memory
has then not read the record yet, or commits after the expiry read it and so
makes one of the two transactions conflict: a session is never ended while
its client is told that it lives. A lease noted by a transaction that then
fails, or of a session that ended, stays until :meth:`Leases.retain` drops it
at the next sweep.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from emberfs.metaserver.clustermgr.grace import Grace

SessionRef = tuple[int, int]  # (inode, session id)


class Leases:
    """When each write session was last opened or renewed, on the monotonic clock.

    Parameters
    ----------
    grace : Grace
        The metaserver's clock, and since when it has heard without a break.
    timeout : float
        Seconds of silence after which a session's lease has run out.
    """

    def __init__(self, grace: Grace, timeout: float):
        if not timeout > 0:
            raise ValueError(f"session timeout {timeout} is not positive")
        self.grace = grace
        self.timeout = timeout
        self._lock = threading.Lock()
        self._renewed: dict[SessionRef, float] = {}
        self._records: dict[SessionRef, int] = {}  # the renewal time each record showed last

    def renewed(self, inode: int, session_id: int) -> None:
        """The session was opened or renewed now."""
        now = self.grace.clock()
        with self._lock:
            key = (inode, session_id)
            self._renewed[key] = max(self._renewed.get(key, now), now)

    def silence(
        self,
        inode: int,
        session_id: int,
        now: float | None = None,
        record_renewed_ns: int | None = None,
    ) -> float:
        """Seconds the session has gone without a renewal at ``now`` (default: the clock's now).

        A session seen for the first time counts as renewed now, and so does
        one whose record shows a renewal time (``record_renewed_ns``) other
        than the one seen before.
        """
        if now is None:
            now = self.grace.clock()
        key = (inode, session_id)
        with self._lock:
            if record_renewed_ns is not None and self._records.get(key) != record_renewed_ns:
                if key in self._records:
                    self._renewed[key] = max(self._renewed.get(key, now), now)
                self._records[key] = record_renewed_ns
            last = self._renewed.setdefault(key, now)
        return self.grace.silence(last, now)

    def lapsed(self, inode: int, session_id: int, record_renewed_ns: int | None = None) -> bool:
        """Whether the session went without a renewal for the whole timeout."""
        return self.silence(inode, session_id, None, record_renewed_ns) >= self.timeout

    def retain(self, stored: Iterable[SessionRef]) -> None:
        """Keep only the leases of ``stored`` sessions (a scan of the store).

        A session that committed after the scan loses its lease here and
        gets a new one when it is next looked at: only ever later, never earlier.
        """
        keep = set(stored)
        with self._lock:
            for key in [k for k in self._renewed if k not in keep]:
                del self._renewed[key]
            for key in [k for k in self._records if k not in keep]:
                del self._records[key]
