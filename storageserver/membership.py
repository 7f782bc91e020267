"""A storage node's line to the metaserver: which metaserver it talks to, and its lease.

Node calls (heartbeats, GC, resync and damage reports) go to the cluster
address the metaserver names in its answers (``ClusterService`` on worker
threads that metadata calls never occupy) once a connection to it is up, else
to ``meta_address``; a heartbeat that fails there is sent again to
``meta_address`` at once. With several metaservers (one etcd store), node
calls go to the one that leads: a metaserver that does not answers
:class:`~emberfs.common.errors.NotLeader` naming the leader, and the node
moves there; one that does not answer at all is left for the next in the list.

Each answered heartbeat (or registration) extends the :class:`Lease` the node
serves under.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import grpc

from emberfs.common import errors, grpcauth
from emberfs.common.addresses import join_address, split_address, split_addresses
from emberfs.common.auth import ClusterKeys
from emberfs.proto import cluster_pb2, cluster_pb2_grpc

log = logging.getLogger(__name__)

RPC_TIMEOUT = 5.0


class Lease:
    """How long the node may serve: until the metaserver's last grant runs out."""

    def __init__(self) -> None:
        self._until = 0.0  # monotonic: serving stops then unless the metaserver answers

    def expired(self) -> bool:
        """Whether the last grant has run out (or none came yet)."""
        return time.monotonic() >= self._until

    def extend(self, sent: float, seconds: float) -> None:
        """An answer to a request sent at ``sent`` (monotonic) grants ``seconds`` (0: no limit)."""
        until = sent + seconds if seconds > 0 else float("inf")
        if until > self._until:
            if self.expired():
                log.warning("the metaserver answers again: serving")
            self._until = until


class Lane(NamedTuple):
    """A channel to the metaserver's cluster address, and whether it has connected."""

    address: str
    channel: grpc.Channel
    stub: cluster_pb2_grpc.ClusterServiceStub
    connected: grpc.Future


class MetaserverLink:
    """The channels a node's calls to the metaserver take.

    Parameters
    ----------
    meta_address : str
        ``HOST:PORT`` of the metaserver's ``ClusterService``, or several,
        comma-separated (the metaservers of one shared store).
    keys, tls
        The cluster's keys and TLS files the channels use.
    """

    def __init__(
        self,
        meta_address: str,
        keys: ClusterKeys | None = None,
        tls: grpcauth.TLSFiles | None = None,
    ):
        self.meta_addresses = split_addresses(meta_address)
        self.meta_address = self.meta_addresses[0]  # the metaserver node calls go to now
        self._keys = keys
        self._tls = tls
        self._channel: grpc.Channel | None = None
        self.cluster: cluster_pb2_grpc.ClusterServiceStub | None = None  # at meta_address
        self._lane: Lane | None = None  # the metaserver's cluster address
        self._retired: Lane | None = None  # the one before, closed at the next change

    @property
    def lane(self) -> Lane | None:
        """The channel to the metaserver's cluster address (None: there is none)."""
        return self._lane

    def connect(self) -> None:
        """Open the channel to :attr:`meta_address`."""
        self._channel = grpcauth.channel(self.meta_address, keys=self._keys, tls=self._tls)
        self.cluster = cluster_pb2_grpc.ClusterServiceStub(self._channel)

    def close(self) -> None:
        """Close every channel."""
        self.set_cluster_address("")
        if self._retired is not None:
            self._retired.channel.close()
            self._retired = None
        if self._channel is not None:
            self._channel.close()

    def set_cluster_address(self, address: str) -> None:
        """Send node calls to the metaserver's cluster ``address`` once it connects ("": never).

        A wildcard host stands for the host of ``meta_address``.
        """
        if address:
            host, port = split_address(address)
            if host in ("", "0.0.0.0", "::"):
                host = split_address(self.meta_address)[0]
            address = join_address(host, port)
        lane = self._lane
        if lane is not None and lane.address == address:
            return
        self._lane = None
        if address:
            channel = grpcauth.channel(address, keys=self._keys, tls=self._tls)
            stub = cluster_pb2_grpc.ClusterServiceStub(channel)
            self._lane = Lane(address, channel, stub, grpc.channel_ready_future(channel))
        if lane is not None:
            lane.connected.cancel()
            # calls may still run on its channel (a GC round, a report): it closes at the next
            # change or when the node stops, not under them
            retired, self._retired = self._retired, lane
            if retired is not None:
                retired.channel.close()

    def node_calls(self) -> cluster_pb2_grpc.ClusterServiceStub:
        """Where node calls go: the cluster address once connected, else ``meta_address``."""
        lane = self._lane
        if lane is not None and lane.connected.done() and not lane.connected.cancelled():
            return lane.stub
        return self.cluster

    def follow(self, exc: grpc.RpcError) -> bool:
        """A call to :attr:`meta_address` failed: move to the leader it named, or to the
        next metaserver when it named none or did not answer; whether the node moved."""
        leader = errors.leader_of(exc)
        if leader:
            target = leader
            if target not in self.meta_addresses:
                self.meta_addresses.append(target)
        elif len(self.meta_addresses) > 1:
            i = self.meta_addresses.index(self.meta_address)
            target = self.meta_addresses[(i + 1) % len(self.meta_addresses)]
        else:
            return False
        if target == self.meta_address:
            return False
        log.warning(
            "metaserver %s %s; node calls go to %s",
            self.meta_address,
            "does not lead"
            if leader
            else "knows no leader"
            if leader is not None
            else f"failed ({exc.code().name})",
            target,
        )
        self.set_cluster_address("")
        old, self.meta_address = self._channel, target
        self._channel = grpcauth.channel(target, keys=self._keys, tls=self._tls)
        self.cluster = cluster_pb2_grpc.ClusterServiceStub(self._channel)
        if old is not None:
            retired, self._retired = self._retired, Lane(target, old, None, None)
            if retired is not None:
                retired.channel.close()
        return True

    def heartbeat(self, req: cluster_pb2.HeartbeatRequest) -> cluster_pb2.HeartbeatResponse:
        """Send a heartbeat where node calls go; to ``meta_address`` again if it fails there."""
        stub, lane = self.node_calls(), self._lane
        try:
            resp = stub.Heartbeat(req, timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            if stub is self.cluster:
                raise
            # the cluster address is gone (a restart moved it) or stalled: the main one tells
            log.warning(
                "heartbeat to %s failed (%s); sending it to %s",
                lane.address,
                exc.code(),
                self.meta_address,
            )
            self.set_cluster_address("")
            resp = self.cluster.Heartbeat(req, timeout=RPC_TIMEOUT)
        self.set_cluster_address(resp.cluster_address)
        return resp
