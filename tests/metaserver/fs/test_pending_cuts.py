"""A truncation whose chunk cut reaches storage after the metaserver stopped waiting.

Real processes: a two-server chain whose tail is reached (by its head's
forwards) only through a relay that the test holds, so the head's cut stays
in flight past the metaserver's deadline and lands once the relay lets it
through. The file must end with the cut's length and its bytes, readable;
before the pending cuts, it kept its old length over chunks already cut, and
every read of it failed.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request

import pytest

from emberfs.client.fs import EmberFileSystem
from tests.client.test_lost_data import chunk_metas
from tests.relay import Relay

MiB = 1024 * 1024
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def pending_cuts(cluster) -> int:
    """The metaserver's count of cuts storage may not hold yet, from the admin API."""
    with urllib.request.urlopen(cluster.admin_url + "/api/v1/cluster", timeout=5) as resp:
        return json.load(resp)["namespace"]["pending_cuts"]


def test_a_cut_that_lands_after_the_metaserver_gave_up_still_sets_the_length(private_cluster):
    c = private_cluster(storage_servers=2, replicas=2, targets_per_server=1)
    routing = c.routing()
    (chain,) = routing.chains
    tail = next(t for t in routing.targets if t.target_id == chain.targets[-1])
    i = next(k for k in range(2) if c.storage_address(k) == tail.data_address)
    relay = Relay(tail.data_address)
    try:
        # the tail now tells everyone (its head's forwards included) to reach it through the relay
        c.storage[i].stop()
        argv = c.storage[i].argv
        if "--advertise" in argv:
            argv[argv.index("--advertise") + 1] = relay.address
        else:
            argv += ["--advertise", relay.address]
        c.start_storage(i)
        c.wait_for(
            lambda r: any(t.data_address == relay.address for t in r.targets),
            60,
            "the tail registered behind the relay",
        )
        c.wait_serving(60)
        fs = EmberFileSystem(
            c.meta_address, skip_instance_cache=True, retry_timeout=2.0, rpc_timeout=30.0
        )
        data = os.urandom(3 * MiB // 2)
        fs.pipe_file("/f.bin", data)
        inode = fs.info("/f.bin")["ino"]
        assert pending_cuts(c) == 0

        relay.hold()  # the head's forward of the cut now waits in the relay
        outcome: list = []

        def truncate() -> None:
            try:
                fs.truncate("/f.bin", 1000)
                outcome.append(None)
            except OSError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=truncate)
        worker.start()
        worker.join(40)  # the metaserver gives up after 10 s, the client after its retries
        assert outcome and isinstance(outcome[0], OSError), outcome
        assert pending_cuts(c) == 1
        relay.release()  # the cut reaches the tail and commits on both replicas

        deadline = time.monotonic() + 30
        while {m[1] for m in chunk_metas(c, inode, 0).values()} != {1000}:
            assert time.monotonic() < deadline, chunk_metas(c, inode, 0)
            time.sleep(0.2)
        assert fs.info("/f.bin")["size"] == 1000
        assert fs.cat_file("/f.bin") == data[:1000]
        deadline = time.monotonic() + 30
        while pending_cuts(c):
            assert time.monotonic() < deadline, "the metaserver still counts the cut pending"
            time.sleep(0.2)
        fs.truncate("/f.bin", 5000)  # growing shows zeros past the cut, not the old bytes
        assert fs.cat_file("/f.bin") == data[:1000] + bytes(4000)
        fs.close()
    finally:
        relay.close()
