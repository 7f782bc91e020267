"""The retry helper, request ids and the routing cache (no cluster needed)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from emberfs.client.meta import MetaClient
from emberfs.client.retry import RequestIds, TransientError, is_retryable, retry
from emberfs.client.routing import RoutingCache
from emberfs.common.routing import RoutingView
from emberfs.proto import common_pb2


class _RpcError(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code


def test_retry_until_success():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise TransientError("not yet")
        return "done"

    seen = []
    assert retry(flaky, timeout=5, backoff=0.001, on_retry=seen.append) == "done"
    assert len(calls) == 3 and len(seen) == 2


def test_retry_stops_at_non_retryable_errors():
    calls = []

    def broken():
        calls.append(1)
        raise ValueError("bad")

    with pytest.raises(ValueError):
        retry(broken, timeout=5)
    assert len(calls) == 1


def test_retry_gives_up_after_timeout_and_attempts():
    start = time.monotonic()
    with pytest.raises(TransientError):
        retry(lambda: (_ for _ in ()).throw(TransientError("x")), timeout=0.3, backoff=0.01)
    assert 0.25 < time.monotonic() - start < 2
    calls = []

    def always():
        calls.append(1)
        raise TransientError("x")

    with pytest.raises(TransientError):
        retry(always, timeout=10, attempts=4, backoff=0.001)
    assert len(calls) == 4


def test_retryable_grpc_codes():
    assert is_retryable(_RpcError(grpc.StatusCode.UNAVAILABLE))
    assert is_retryable(_RpcError(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert is_retryable(_RpcError(grpc.StatusCode.CANCELLED))  # a server shutting down
    assert not is_retryable(_RpcError(grpc.StatusCode.NOT_FOUND))
    assert not is_retryable(OSError(5, "io"))


def test_request_ids_unique_across_threads():
    ids = RequestIds()
    other = RequestIds()
    assert ids.client_id != other.client_id and len(ids.client_id) == 32
    got = []

    def take():
        got.extend(ids.next() for _ in range(1000))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 8001))


def test_request_context_carries_credentials():
    import os

    client = MetaClient("127.0.0.1:1")
    ctx = client.context()
    assert ctx.client_id == client.ids.client_id and ctx.request_id == 1
    assert (ctx.uid, ctx.gid) == (os.getuid(), os.getgid())
    assert client.context().request_id == 2
    client.close()


def _routing(version, states):
    targets = [
        common_pb2.TargetInfo(target_id=i + 1, data_address=f"h:{i + 1}", state=s)
        for i, s in enumerate(states)
    ]
    chain = common_pb2.ChainInfo(chain_id=3, version=version, targets=[1, 2, 3])
    return common_pb2.RoutingInfo(version=version, targets=targets, chains=[chain])


def test_chain_head_tail_and_serving():
    up, down = common_pb2.SERVING, common_pb2.OFFLINE
    chain = RoutingView.from_proto(_routing(1, [up, up, down])).chains[3]
    assert chain.head.target_id == 1 and chain.tail.target_id == 2
    assert [t.target_id for t in chain.serving] == [1, 2]
    chain = RoutingView.from_proto(_routing(2, [down, up, up])).chains[3]
    assert chain.head is None and chain.tail.target_id == 3


def test_refresh_is_coalesced():
    fetches = []

    def fetch():
        fetches.append(1)
        time.sleep(0.05)
        return _routing(len(fetches), [common_pb2.SERVING] * 3)

    cache = RoutingCache(fetch, min_interval=0)
    first = cache.get()
    assert cache.get() is first and len(fetches) == 1
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.refresh(first))) for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fetches) == 2 and all(r is results[0] for r in results)
    assert results[0].version == 2
    with pytest.raises(KeyError):
        cache.chain(99)
