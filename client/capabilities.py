"""The chunk capabilities a client holds: one or two per open file, renewed before they expire.

The metaserver hands out a signed capability with every open of a file
(:mod:`emberfs.metaserver.service`); the client puts it in the auth section
of the file's chunk reads and writes (:class:`~emberfs.common.auth.CapabilityCredential`).
:class:`Capabilities` keeps them by inode, and asks the metaserver for a
fresh one (``Authorize``) when the one it has is missing, near its expiry,
or was refused by a storage server. Against a cluster without authentication
the metaserver hands out none, and frames go without credentials.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from emberfs.common.auth import MAC_SIZE, CapabilityCredential
from emberfs.proto import data_pb2

#: renew a capability once less than this share of its lifetime is left
RENEW_SHARE = 1 / 3
#: files with capabilities kept before the expired ones are dropped (at least)
PRUNE_AT = 4096


@dataclass(slots=True)
class _Held:
    credential: CapabilityCredential
    read: bool
    write: bool
    expires: float  # Unix time, seconds
    renew_at: float
    session_id: int


class Capabilities:
    """The capabilities of this client's open files.

    Parameters
    ----------
    authorize : callable
        ``authorize(inode, session_id)`` -> a fresh signed capability (empty:
        the cluster runs without authentication); ``session_id`` 0 asks for
        read access, else write access through that write session. Raises the
        OSError of a refusal (PermissionError for a revoked token).
    """

    def __init__(self, authorize: Callable[[int, int], bytes]) -> None:
        self._authorize = authorize
        self._held: dict[int, list[_Held]] = {}
        self._lock = threading.Lock()
        self._insecure = False
        self._prune_at = PRUNE_AT

    def __len__(self) -> int:
        """Inodes it holds capabilities of (expired ones included until pruned)."""
        return len(self._held)

    def learn(self, token: bytes, session_id: int = 0) -> None:
        """Keep a capability the metaserver sent (an empty one: the cluster is insecure)."""
        if not token:
            self._insecure = True
            return
        try:
            cap = data_pb2.Capability.FromString(token[:-MAC_SIZE])
        except DecodeError:
            return  # the storage servers would refuse it: renewed when needed
        now = time.time()
        expires = cap.expires_ms / 1000
        held = _Held(
            CapabilityCredential(token),
            cap.read,
            cap.write,
            expires,
            expires - (expires - now) * RENEW_SHARE,
            session_id,
        )
        with self._lock:
            if len(self._held) >= self._prune_at:
                self._prune(now)
                # what is left is live: look again once it has doubled, so pruning stays cheap
                self._prune_at = max(PRUNE_AT, 2 * len(self._held))
            kept = [
                h
                for h in self._held.get(cap.inode, ())
                if (h.read, h.write) != (held.read, held.write)
            ]
            self._held[cap.inode] = [*kept, held]

    def _prune(self, now: float) -> None:
        for inode in [i for i, hs in self._held.items() if all(h.expires <= now for h in hs)]:
            del self._held[inode]

    def _find(self, inode: int, write: bool) -> tuple[_Held | None, int]:
        """A held capability for the access, and a write session to renew one with."""
        session = 0
        best = None
        with self._lock:
            for h in self._held.get(inode, ()):
                session = session or h.session_id
                if (h.write if write else h.read) and (best is None or h.expires > best.expires):
                    best = h
        return best, session

    def credential(self, inode: int, write: bool) -> CapabilityCredential | None:
        """The credential of ``inode``'s reads (or writes), renewed first if due; None: insecure."""
        held, session = self._find(inode, write)
        if held is not None and time.time() < held.renew_at:
            return held.credential
        if self._insecure and held is None:
            return None
        if write and not session:
            return held.credential if held is not None else None
        token = self._authorize(inode, session if write else 0)
        self.learn(token, session if write else 0)
        if not token:
            return None
        held, _ = self._find(inode, write)
        return held.credential if held is not None else None

    def forget(self, inode: int, write: bool) -> None:
        """A storage server refused ``inode``'s capability: the next use renews it."""
        with self._lock:
            for h in self._held.get(inode, ()):
                if h.write if write else h.read:
                    h.renew_at = 0.0
