"""The gRPC ``ClusterService``: a thin adapter over :class:`ClusterManager` and :class:`GCQueue`.

Each method hands the request to the manager (nodes, heartbeats, routing,
resync reports), to the GC queue (``FetchGC``, ``AckGC``) or to read repair
(``ReportLostChunk``) and maps typed
errors to gRPC status codes (with the ``emberfs-errno`` trailer) through
:func:`emberfs.common.errors.to_grpc`.
"""

from __future__ import annotations

import logging
import threading

import grpc

from emberfs.common import errors, grpcauth
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.clustermgr.repair import ReadRepair
from emberfs.proto import cluster_pb2_grpc

log = logging.getLogger(__name__)

FORWARD_TIMEOUT = 5.0


class LeaderForwarder:
    """Passes a call on to the metaserver that leads, as this metaserver (server credential).

    A reader reports a lost chunk to the metaserver it talks to; where that
    one does not lead, the report goes on to the leader rather than back to
    the reader. :class:`~emberfs.common.errors.NotLeader` while no leader is known.
    """

    def __init__(self, cluster: ClusterManager) -> None:
        self.cluster = cluster
        self._lock = threading.Lock()
        self._channel: tuple[str, grpc.Channel] | None = None

    def _stub(self) -> cluster_pb2_grpc.ClusterServiceStub:
        leader = self.cluster.leadership.leader()
        if leader is None or leader.id == self.cluster.leadership.me.id or not leader.address:
            raise errors.NotLeader()
        with self._lock:
            if self._channel is None or self._channel[0] != leader.address:
                if self._channel is not None:
                    self._channel[1].close()
                channel = grpcauth.channel(
                    leader.address, keys=self.cluster.keys, tls=self.cluster.tls
                )
                self._channel = (leader.address, channel)
            return cluster_pb2_grpc.ClusterServiceStub(self._channel[1])

    def __call__(self, method: str, request):
        try:
            return getattr(self._stub(), method)(request, timeout=FORWARD_TIMEOUT)
        except grpc.RpcError as exc:
            raise errors.Unavailable(
                f"the leading metaserver did not take the call: {exc.details()}"
            ) from None


class ClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    """Serves node registration, heartbeats, routing, resync reports and the GC queue.

    Parameters
    ----------
    cluster : ClusterManager
        The manager that holds and changes the cluster state.
    gc : GCQueue
        The garbage-collection queue over the same store.
    repair : ReadRepair, optional
        Takes readers' reports of replicas without data; without it they
        are refused (UNIMPLEMENTED).
    """

    def __init__(
        self,
        cluster: ClusterManager,
        gc: GCQueue,
        repair: ReadRepair | None = None,
        *,
        forward: LeaderForwarder | None = None,
    ):
        self.cluster = cluster
        self.gc = gc
        self.repair = repair
        self.forward = forward

    def _leading(self, method):
        """``method`` on the leader only: NotLeader (naming the leader) elsewhere."""

        def call(request):
            self.cluster.leadership.require()
            return method(request)

        return call

    def _call(self, method, request, context: grpc.ServicerContext):
        try:
            return method(request)
        except errors.EmberError as exc:
            errors.to_grpc(context, exc)
        except Exception as exc:  # a bug: report it as INTERNAL, keep serving
            log.exception("ClusterService call failed")
            errors.to_grpc(context, errors.Internal(f"{type(exc).__name__}: {exc}"))

    def RegisterNode(self, request, context):
        return self._call(self.cluster.register_node, request, context)

    def Heartbeat(self, request, context):
        return self._call(self.cluster.heartbeat, request, context)

    def GetRouting(self, request, context):
        return self._call(self.cluster.get_routing, request, context)

    def SyncDone(self, request, context):
        return self._call(self.cluster.sync_done, request, context)

    def FetchGC(self, request, context):
        return self._call(self._leading(self.gc.fetch), request, context)

    def AckGC(self, request, context):
        return self._call(self._leading(self.gc.ack), request, context)

    def ReportLostChunk(self, request, context):
        if self.repair is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this metaserver does no read repair")
        if self.forward is not None and not self.cluster.leadership.leading():
            return self._call(lambda r: self.forward("ReportLostChunk", r), request, context)
        return self._call(self.repair.report, request, context)


def add_to_server(servicer: ClusterServicer, server: grpc.Server) -> None:
    """Register ``servicer`` as the ``ClusterService`` of ``server``."""
    cluster_pb2_grpc.add_ClusterServiceServicer_to_server(servicer, server)
