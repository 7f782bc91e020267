"""The gRPC ``ClusterService``: a thin adapter over :class:`ClusterManager` and :class:`GCQueue`.

Each method hands the request to the manager (nodes, heartbeats, routing,
resync reports), to the GC queue (``FetchGC``, ``AckGC``) or to read repair
(``ReportLostChunk``) and maps typed
errors to gRPC status codes (with the ``emberfs-errno`` trailer) through
:func:`emberfs.common.errors.to_grpc`.
"""

from __future__ import annotations

import logging

import grpc

from emberfs.common import errors
from emberfs.metaserver.cluster import ClusterManager
from emberfs.metaserver.gcqueue import GCQueue
from emberfs.metaserver.repair import ReadRepair
from emberfs.proto import cluster_pb2_grpc

log = logging.getLogger(__name__)


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

    def __init__(self, cluster: ClusterManager, gc: GCQueue, repair: ReadRepair | None = None):
        self.cluster = cluster
        self.gc = gc
        self.repair = repair

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
        return self._call(self.gc.fetch, request, context)

    def AckGC(self, request, context):
        return self._call(self.gc.ack, request, context)

    def ReportLostChunk(self, request, context):
        if self.repair is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this metaserver does no read repair")
        return self._call(self.repair.report, request, context)


def add_to_server(servicer: ClusterServicer, server: grpc.Server) -> None:
    """Register ``servicer`` as the ``ClusterService`` of ``server``."""
    cluster_pb2_grpc.add_ClusterServiceServicer_to_server(servicer, server)
