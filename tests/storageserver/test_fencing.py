"""A storage server cut off from the metaserver alone stops serving before the chain moves on.

Real processes: a local cluster whose storage server 0 reaches the metaserver
(its main address and the cluster address that heartbeats go to) only through
TCP relays on another loopback address that the test can cut, while clients
and chain peers still reach it directly: a partition between one server and
the metaserver.
"""

from __future__ import annotations

import os
import time

import pytest

from emberfs.cli.ports import free_port
from emberfs.client.fs import EmberFileSystem
from emberfs.common import framing, wire
from emberfs.common.auth import CapabilityCredential
from emberfs.common.framing import Op
from emberfs.proto import common_pb2, data_pb2
from tests.relay import OTHER_LOOPBACK, Relay, Relays

MiB = 1024 * 1024
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def read_from(cluster, address: str, chain, target_id: int, inode: int) -> bytes:
    """Chunk 0 of ``inode`` read from one target, with no chain version check (an old routing).

    The read carries a capability for the file, as a client that opened it has.
    """
    req = data_pb2.ChunkReadRequest(
        chain_id=chain.chain_id,
        target_id=target_id,
        chunk=data_pb2.ChunkId(inode=inode, index=0),
        offset=0,
        length=MiB,
    )

    def receive(sock):
        header, meta, crcs = wire.recv_answer(sock, Op.READ)
        data = framing.recv_exact(sock, header.data_len)
        framing.verify(data, crcs, header.block_size)
        resp = data_pb2.ChunkReadResponse.FromString(meta)
        return bytes(data[resp.skip :])

    token = cluster.keys.sign_capability(inode, read=True, write=False, ttl=60)
    pool = wire.ConnectionPool(
        connect_timeout=5, io_timeout=10, credential=CapabilityCredential(token)
    )
    try:
        return wire.call(pool, address, Op.READ, req.SerializeToString(), receive=receive)
    finally:
        pool.close()


def test_a_server_cut_from_the_metaserver_stops_serving_before_it_is_replaced(private_cluster):
    # Nodes send heartbeats to the cluster address; told a wildcard host, each uses the host
    # it reached the metaserver by, so server 0's heartbeats go through a relay too.
    cluster_port = free_port()
    c = private_cluster(
        targets_per_server=1,
        heartbeat_timeout=2.0,
        extra_meta_args=[
            "--cluster-listen",
            f"127.0.0.1:{cluster_port}",
            "--cluster-advertise",
            f"0.0.0.0:{cluster_port}",
        ],
    )
    meta_port = int(c.meta_address.rsplit(":", 1)[1])
    relays = [
        Relay(f"127.0.0.1:{port}", listen=(OTHER_LOOPBACK, port))
        for port in (meta_port, cluster_port)
    ]
    relay = Relays(relays)
    try:
        # storage server 0 talks to the metaserver through the relays from now on
        c.storage[0].stop()
        argv = c.storage[0].argv
        argv[argv.index("--meta") + 1] = relays[0].address
        c.start_storage(0)
        c.wait_serving(60)
        fs = EmberFileSystem(c.meta_address, skip_instance_cache=True, read_timeout=20.0)
        old_reader = EmberFileSystem(c.meta_address, skip_instance_cache=True, read_timeout=20.0)
        v1, v2 = os.urandom(MiB // 2), os.urandom(MiB // 2)
        fs.pipe_file("/f.bin", v1)
        assert old_reader.cat_file("/f.bin") == v1  # this reader keeps the routing of now
        inode = fs.info("/f.bin")["ino"]
        routing = c.routing()
        address0 = c.storage_address(0)
        target0 = next(t for t in routing.targets if t.data_address == address0)
        chain = next(ch for ch in routing.chains if target0.target_id in ch.targets)
        assert read_from(c, address0, chain, target0.target_id, inode) == v1

        relay.cut()  # server 0 still takes requests, but hears nothing from the metaserver
        c.wait_for(
            lambda r: any(
                t.target_id == target0.target_id and t.state == common_pb2.OFFLINE
                for t in r.targets
            ),
            30,
            "server 0's target offline",
        )
        fs.pipe_file("/f.bin", v2)  # the chain moved on without server 0
        with pytest.raises(wire.NotServing, match="fenced"):
            read_from(c, address0, chain, target0.target_id, inode)
        for _ in range(6):  # whichever replica it picks, never the old bytes
            assert old_reader.cat_file("/f.bin") == v2

        relay.heal()  # server 0 hears from the metaserver again, is resynced and serves
        c.wait_serving(60)

        deadline = time.monotonic() + 30
        while True:
            try:  # once its own routing has caught up with the metaserver's
                assert read_from(c, address0, chain, target0.target_id, inode) == v2
                break
            except wire.NotServing:
                assert time.monotonic() < deadline, "server 0 does not serve again"
                time.sleep(0.2)
        fs.close()
        old_reader.close()
    finally:
        relay.close()
