"""The operator's steering of targets: taking one offline, draining one (its chains move to
other targets first), the fenced targets, and the I/O totals nodes report.
"""

from __future__ import annotations

from emberfs.common import errors
from emberfs.metaserver.clustermgr import chainstate
from emberfs.metaserver.clustermgr.chainstate import OFFLINE, SERVING
from emberfs.metaserver.clustermgr.state import (
    Changes,
)
from emberfs.proto import common_pb2


class Steering:
    """The admin-steering part of :class:`~emberfs.metaserver.clustermgr.manager.ClusterManager`
    (its state, lock and leadership are the manager's)."""

    def _finish_drains(self, changes: Changes) -> None:
        """Drop each drained target whose replacement serves from its chain (see drain_target)."""
        for drained, replacement in sorted(self._drains.items()):
            info = self._targets[replacement]
            chain = self._chains.get(info.chain_id)
            if chain is None:
                continue
            new = chainstate.drain_finish(chain, drained, replacement)
            if new is chain:
                continue
            self._set_chain(new, changes)
            left = self._targets[drained]
            left.chain_id = 0
            left.state = OFFLINE
            self._fenced.add(drained)
            del self._drains[drained]
            changes.targets.add(drained)
            changes.admin = True

    def offline_target(self, target_id: int) -> common_pb2.TargetInfo:
        """Take a target out of service as if its heartbeats had stopped.

        The target goes offline (lastsrv when it was its chain's last serving
        member), its chain is reordered and its version bumps. It stays
        offline (heartbeats do not bring it back) until its storage server
        registers again, i.e. restarts; then it returns like any restarted
        target (waiting, then syncing from its chain's serving predecessor).

        Raises
        ------
        errors.NotFound
            No such target.
        """
        with self._lock:
            self._current()
            if target_id not in self._targets:
                raise errors.NotFound(f"no target {target_id}")
            changes = Changes(admin=target_id not in self._fenced)
            self._fenced.add(target_id)
            self._timeout_target(target_id, changes)
            self._flush(changes)
            out = common_pb2.TargetInfo()
            out.CopyFrom(self._targets[target_id])
        self._tell_offline()  # an offline target no longer holds up GC items
        return out

    def drain_target(self, target_id: int) -> tuple[int, int]:
        """Start moving a target's chain membership to a free target.

        A free target (in no chain, serving, on a node that holds no member of
        the chain) joins the chain at its tail as waiting and is resynced by
        its serving predecessor; the drained target keeps serving meanwhile.
        Once the replacement serves, the drained target leaves the chain and
        is held offline until its storage server registers again. Draining a
        target that is already draining returns the drain under way.

        Returns
        -------
        tuple of int
            ``(chain id, replacement target id)``.

        Raises
        ------
        errors.NotFound
            No such target.
        errors.Busy
            The target is in no chain, is itself the replacement of a drain,
            or no free target can replace it.
        """
        with self._lock:
            self._current()
            info = self._targets.get(target_id)
            if info is None:
                raise errors.NotFound(f"no target {target_id}")
            if target_id in self._drains:
                replacement = self._drains[target_id]
                return self._targets[replacement].chain_id, replacement
            if target_id in self._drains.values():
                raise errors.Busy(f"target {target_id} is replacing a drained target")
            if not info.chain_id:
                raise errors.Busy(f"target {target_id} is in no chain")
            chain = self._chains[info.chain_id]
            free = [
                (tid, t.node_id)
                for tid, t in self._targets.items()
                if t.chain_id == 0
                and t.state == SERVING
                and tid not in self._absent
                and tid not in self._fenced
            ]
            node_of = {tid: t.node_id for tid, t in self._targets.items()}
            replacement = chainstate.pick_replacement(chain, node_of, free)
            if replacement is None:
                raise errors.Busy(
                    f"no free target on a node outside chain {chain.chain_id} can replace "
                    f"target {target_id}"
                )
            changes = Changes(admin=True)
            self._drains[target_id] = replacement
            self._set_chain(chainstate.drain_start(chain, target_id, replacement), changes)
            self._flush(changes)
            return chain.chain_id, replacement

    def drains(self) -> dict[int, int]:
        """Drains under way: ``{drained target id: replacement target id}``."""
        with self._lock:
            return dict(self._drains)

    def fenced(self) -> set[int]:
        """Targets held offline until their node registers again."""
        with self._lock:
            return set(self._fenced)

    def io_totals(self) -> tuple[int, int]:
        """``(bytes read, bytes written)`` summed over the counters nodes last reported.

        Each node counts from its own start, so the sum drops when a node
        restarts; rates are differences of successive readings, clamped at 0.
        """
        with self._lock:
            return (
                sum(r for r, _ in self._io.values()),
                sum(w for _, w in self._io.values()),
            )
