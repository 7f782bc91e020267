"""The calls of storage nodes to the cluster manager: ``RegisterNode``, ``Heartbeat``,
``GetRouting``, ``SyncDone``; resyncs, and the heartbeat timeout applied to silent nodes.
"""

from __future__ import annotations

from emberfs.common import errors
from emberfs.metaserver.clustermgr import chainstate
from emberfs.metaserver.clustermgr.chainstate import OFFLINE, SERVING
from emberfs.metaserver.clustermgr.state import (
    MAX_TARGETS_PER_NODE,
    Changes,
    Node,
    validate_address,
    validate_node_id,
)
from emberfs.proto import cluster_pb2, common_pb2


class NodeCalls:
    """The node-protocol part of :class:`~emberfs.metaserver.clustermgr.manager.ClusterManager`
    (its state, lock and leadership are the manager's)."""

    def register_node(
        self, req: cluster_pb2.RegisterNodeRequest
    ) -> cluster_pb2.RegisterNodeResponse:
        """Register a node (first start or restart) and its targets.

        Targets reported with id 0 get the next id; known ids must belong to
        the node. Known targets of a node that registers again are treated as
        returning (see :func:`chainstate.on_return` with ``restarted``); its
        known targets that it no longer reports time out at once.
        """
        validate_node_id(req.node_id)
        validate_address(req.data_address, "data address")
        validate_address(req.grpc_address, "gRPC address")
        if len(req.targets) > MAX_TARGETS_PER_NODE:
            raise errors.InvalidArgument(f"more than {MAX_TARGETS_PER_NODE} targets")
        with self._lock:
            self._current()
            seen: set[int] = set()
            for report in req.targets:
                tid = report.target_id
                if tid == 0:
                    continue
                if tid in seen:
                    raise errors.InvalidArgument(f"target {tid} is reported twice")
                seen.add(tid)
                info = self._targets.get(tid)
                if info is None:
                    raise errors.InvalidArgument(
                        f"target {tid} is unknown to this metaserver (report it with id 0 "
                        "to add it as a new, empty target)"
                    )
                if info.node_id != req.node_id:
                    raise errors.InvalidArgument(
                        f"target {tid} belongs to node {info.node_id!r}, not {req.node_id!r}"
                    )
            changes = Changes()
            node = Node(req.node_id, req.data_address, req.grpc_address)
            if self._nodes.get(req.node_id) != node:
                self._nodes[req.node_id] = node
                changes.nodes.add(req.node_id)
            ids = []
            for report in req.targets:
                tid = report.target_id
                if tid == 0:
                    tid = self._next_target
                    self._next_target += 1
                    self._targets[tid] = common_pb2.TargetInfo(
                        target_id=tid, node_id=req.node_id, state=SERVING
                    )
                    changes.targets.add(tid)
                else:
                    self._absent.discard(tid)
                    if tid in self._fenced:
                        self._fenced.discard(tid)
                        changes.admin = True
                    self._return_target(tid, True, changes)
                self._set_usage(tid, report, changes)
                self._io[tid] = (report.bytes_read, report.bytes_written)
                ids.append(tid)
            for tid in self._node_targets(req.node_id):
                if tid not in ids:
                    self._absent.add(tid)
                    self._timeout_target(tid, changes)
            self._form_chains(changes)
            self._flush(changes)
            self._note_seen(req.node_id, self.clock(), new=True)
            return cluster_pb2.RegisterNodeResponse(
                target_ids=ids,
                routing=self.routing(),
                cluster_address=self.cluster_address,
                lease_seconds=self.lease_seconds,
            )

    def _set_usage(self, tid: int, report: cluster_pb2.TargetReport, changes: Changes) -> None:
        info = self._targets[tid]
        reported = (report.capacity, report.used, report.chunks, report.full)
        if (info.capacity, info.used, info.chunks, info.full) != reported:
            info.capacity, info.used, info.chunks, info.full = reported
            changes.usage.add(tid)

    def heartbeat(self, req: cluster_pb2.HeartbeatRequest) -> cluster_pb2.HeartbeatResponse:
        """Refresh a node's liveness and its targets' usage (and whether each is full).

        Targets of the node that were offline (or lastsrv) come back. The
        response carries the routing info when the node's version is older,
        and ``reregister`` when the node is unknown. The node counts as heard
        from when the call arrives, before it waits for the cluster lock.
        """
        self._note_seen(req.node_id, self.clock())
        with self._lock:
            if not self.leadership.leading() and self.leadership.granting():
                return self._frozen_heartbeat(req)
            self._current()
            if req.node_id not in self._nodes:
                return cluster_pb2.HeartbeatResponse(
                    routing_version=self._routing_version,
                    reregister=True,
                    cluster_address=self.cluster_address,
                )
            own = set(self._node_targets(req.node_id))
            for report in req.targets:
                if report.target_id not in own:
                    raise errors.InvalidArgument(
                        f"target {report.target_id} does not belong to node {req.node_id!r}"
                    )
            changes = Changes()
            for report in req.targets:
                self._set_usage(report.target_id, report, changes)
                self._io[report.target_id] = (report.bytes_read, report.bytes_written)
                if report.HasField("scrub"):
                    self.scrub.reported(report.target_id, report.scrub)
            for tid in sorted(own - self._absent - self._fenced):
                if self._targets[tid].state in (OFFLINE, chainstate.LASTSRV):
                    self._return_target(tid, False, changes)
            if changes.targets:
                self._form_chains(changes)
            self._flush(changes)
            resp = cluster_pb2.HeartbeatResponse(
                routing_version=self._routing_version,
                cluster_address=self.cluster_address,
                lease_seconds=self.lease_seconds,
                scrub=self.scrub.control(),
            )
            if req.routing_version < self._routing_version:
                resp.routing.CopyFrom(self.routing())
            return resp

    def _frozen_heartbeat(self, req: cluster_pb2.HeartbeatRequest) -> cluster_pb2.HeartbeatResponse:
        """A heartbeat answer of a leader cut off from the store: the lease, the last stored
        routing, no change (see :mod:`emberfs.metaserver.clustermgr.leadership`)."""
        routing = self._routing_cache
        resp = cluster_pb2.HeartbeatResponse(
            routing_version=routing.version,
            reregister=req.node_id not in self._nodes,
            cluster_address=self.cluster_address,
            lease_seconds=self.lease_seconds,
            scrub=self.scrub.control(),
        )
        if req.routing_version < routing.version:
            resp.routing.CopyFrom(routing)
        return resp

    def get_routing(self, req: cluster_pb2.GetRoutingRequest) -> cluster_pb2.GetRoutingResponse:
        """The routing info (always sent; ``known_version`` is advisory).

        A metaserver that does not lead first brings its copy up to date (it
        answers with the copy it has while the store cannot be read).
        """
        try:
            self.follow()
        except errors.EmberError:
            pass  # the store cannot be read: the copy as it is
        return cluster_pb2.GetRoutingResponse(routing=self.routing())

    def sync_done(self, req: cluster_pb2.SyncDoneRequest) -> cluster_pb2.SyncDoneResponse:
        """A syncing target caught up: it serves from now on.

        Raises :class:`errors.NotFound` for an unknown chain or a target not
        in it, and :class:`errors.Busy` (FAILED_PRECONDITION) for a stale
        chain version or a target that is not syncing.
        """
        with self._lock:
            self._current()
            chain = self.chain(req.chain_id)
            new = chainstate.on_sync_done(chain, req.chain_version, req.target_id)
            changes = Changes()
            self._set_chain(new, changes)
            self._flush(changes)
            return cluster_pb2.SyncDoneResponse(routing=self.routing())

    def resync_target(self, target_id: int) -> bool:
        """Take a serving target that lost data out of service, to be resynced from its chain.

        See :func:`chainstate.on_lost_data`. True when the target's state
        changed (its chain's version bumped); False when it was not serving or
        no other member of its chain serves. Raises :class:`errors.NotFound`
        for an unknown target or one in no chain.
        """
        with self._lock:
            self._current()
            info = self._targets.get(target_id)
            if info is None or not info.chain_id:
                raise errors.NotFound(f"target {target_id} is in no chain")
            changes = Changes()
            self._set_chain(
                chainstate.on_lost_data(self._chains[info.chain_id], target_id), changes
            )
            self._flush(changes)
            return bool(changes.targets)

    def check_timeouts(self) -> None:
        """Time out the targets of every node silent for longer than the heartbeat timeout.

        A judging round of :attr:`grace` (see :meth:`Grace.check`): after a gap
        since the previous round that shows the metaserver itself stalled,
        every node is judged from now. The round starts once the cluster lock
        is held; heartbeats are noted without it, so a heartbeat waiting for
        the lock has already counted.

        On a store that bounds its transactions (etcd), each silent node's
        change is committed on its own, as if the nodes had gone one after
        another: many nodes going at once (a rack) never make one change
        larger than the store takes.
        """
        went_offline = False
        with self._lock:
            if not self.leadership.leading():
                return  # the leader judges
            self._current()
            now = self.grace.check()
            with self._seen_lock:
                seen_at = sorted(self._last_seen.items())
            changes = Changes()
            for node_id, seen in seen_at:
                if self.grace.silence(seen, now) > self.heartbeat_timeout:
                    for tid in self._node_targets(node_id):
                        self._timeout_target(tid, changes)
                    if self.engine.max_txn_ops is not None and changes.targets:
                        self._flush(changes)
                        went_offline = True
                        changes = Changes()
            self._flush(changes)
            went_offline = went_offline or bool(changes.targets)
        if went_offline:
            self._tell_offline()
