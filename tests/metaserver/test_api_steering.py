"""Drain and offline: the pure rules, the cluster manager, and the admin API on top of them."""

from __future__ import annotations

import re

import pytest
from fastapi.staticfiles import StaticFiles
from fastapi.testclient import TestClient
from starlette.routing import Mount

from emberfs.common import errors
from emberfs.metaserver.api import create_app
from emberfs.metaserver.clustermgr import chainstate
from emberfs.metaserver.clustermgr.chainstate import (
    LASTSRV,
    OFFLINE,
    SERVING,
    SYNCING,
    WAITING,
    Chain,
)
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.proto import cluster_pb2

try:  # FastAPI keeps included routers as such in app.routes; this walks their routes too
    from fastapi.routing import iter_route_contexts
except ImportError:  # earlier FastAPI: app.routes holds every route itself

    def iter_route_contexts(routes):
        return iter(routes)


TOKEN = "s3cret-token"


# ------------------------------------------------------------------ pure rules


def test_pick_replacement_avoids_nodes_of_the_chain():
    chain = Chain.new(1, [1, 2, 3])
    node_of = {1: "a", 2: "b", 3: "c", 4: "a", 5: "d", 6: "e"}
    assert chainstate.pick_replacement(chain, node_of, [(4, "a"), (6, "e"), (5, "d")]) == 5
    assert chainstate.pick_replacement(chain, node_of, [(4, "a")]) is None
    assert chainstate.pick_replacement(chain, node_of, []) is None


def test_drain_start_adds_a_syncing_tail_and_bumps():
    chain = Chain.new(7, [1, 2, 3])
    new = chainstate.drain_start(chain, 2, 9)
    assert new.version == 2
    assert new.targets == (1, 2, 3, 9)
    assert new.states == (SERVING, SERVING, SERVING, SYNCING)


def test_drain_start_waits_behind_a_running_sync():
    chain = Chain(1, 5, (1, 2, 3), (SERVING, SERVING, SYNCING))
    new = chainstate.drain_start(chain, 1, 4)
    assert new.version == 6
    assert new.targets == (1, 2, 3, 4)
    assert new.states == (SERVING, SERVING, SYNCING, WAITING)


def test_drain_start_rejects_bad_members():
    chain = Chain.new(1, [1, 2, 3])
    with pytest.raises(errors.NotFound):
        chainstate.drain_start(chain, 8, 9)
    with pytest.raises(errors.Busy):
        chainstate.drain_start(chain, 1, 3)


def test_drain_finish_only_once_the_replacement_serves():
    chain = chainstate.drain_start(Chain.new(1, [1, 2, 3]), 1, 4)
    assert chainstate.drain_finish(chain, 1, 4) is chain
    served = chainstate.on_sync_done(chain, chain.version, 4)
    done = chainstate.drain_finish(served, 1, 4)
    assert done.targets == (2, 3, 4)
    assert done.states == (SERVING, SERVING, SERVING)
    assert done.version == served.version + 1


def test_drain_of_an_offline_member_still_finishes():
    chain = chainstate.on_timeout(Chain.new(1, [1, 2, 3]), 2)
    chain = chainstate.drain_start(chain, 2, 4)
    assert chain.state_of(4) == SYNCING and chain.state_of(2) == OFFLINE
    chain = chainstate.on_sync_done(chain, chain.version, 4)
    done = chainstate.drain_finish(chain, 2, 4)
    assert done.targets == (1, 3, 4) and set(done.states) == {SERVING}


def test_chain_health():
    assert chainstate.chain_health([SERVING, SERVING]) == "healthy"
    assert chainstate.chain_health([SERVING, OFFLINE]) == "degraded"
    assert chainstate.chain_health([LASTSRV, OFFLINE]) == "unavailable"
    assert chainstate.chain_health([]) == "unavailable"


# -------------------------------------------------------------- cluster manager


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def register(cm: ClusterManager, node: str, port: int, targets: int = 1, ids=()):
    reports = [cluster_pb2.TargetReport(target_id=t, capacity=1000) for t in ids] or [
        cluster_pb2.TargetReport(capacity=1000) for _ in range(targets)
    ]
    return cm.register_node(
        cluster_pb2.RegisterNodeRequest(
            node_id=node,
            data_address=f"127.0.0.1:{port}",
            grpc_address=f"127.0.0.1:{port + 1}",
            targets=reports,
        )
    )


@pytest.fixture
def four_nodes():
    """R=3 over nodes a, b, c (chain 1 = targets 1, 2, 3) and a free target 4 on node d."""
    engine = MemoryEngine()
    clock = Clock()
    cm = ClusterManager(engine, replicas=3, heartbeat_timeout=5.0, clock=clock)
    for i, node in enumerate("abcd"):
        register(cm, node, 7000 + 10 * i)
    assert cm.chain(1).targets == (1, 2, 3)
    return cm, engine, clock


def test_drain_moves_membership_and_persists(four_nodes):
    cm, engine, clock = four_nodes
    assert cm.drain_target(2) == (1, 4)
    assert cm.drain_target(2) == (1, 4)  # repeated: the same drain
    chain = cm.chain(1)
    assert chain.targets == (1, 2, 3, 4) and chain.state_of(4) == SYNCING
    # a restarted metaserver sees the drain under way
    again = ClusterManager(engine, replicas=3, heartbeat_timeout=5.0, clock=clock)
    assert again.drains() == {2: 4}
    version = again.chain(1).version
    again.sync_done(cluster_pb2.SyncDoneRequest(chain_id=1, chain_version=version, target_id=4))
    chain = again.chain(1)
    assert chain.targets == (1, 3, 4) and set(chain.states) == {SERVING}
    assert again.drains() == {}
    routing = again.routing()
    drained = next(t for t in routing.targets if t.target_id == 2)
    assert drained.chain_id == 0 and drained.state == OFFLINE
    # heartbeats do not bring it back or into a chain; a restart of its node frees it
    again.heartbeat(cluster_pb2.HeartbeatRequest(node_id="b"))
    assert next(t for t in again.routing().targets if t.target_id == 2).state == OFFLINE
    register(again, "b", 7010, ids=[2])
    info = next(t for t in again.routing().targets if t.target_id == 2)
    assert info.state == SERVING and info.chain_id == 0
    assert 2 not in again.fenced()


def test_drain_conflicts(four_nodes):
    cm, _, _ = four_nodes
    with pytest.raises(errors.NotFound):
        cm.drain_target(99)
    with pytest.raises(errors.Busy, match="in no chain"):
        cm.drain_target(4)
    cm.drain_target(1)
    with pytest.raises(errors.Busy, match="replacing"):
        cm.drain_target(4)
    with pytest.raises(errors.Busy, match="no free target"):
        cm.drain_target(3)  # target 4 is taken now


def test_offline_holds_until_the_node_registers_again(four_nodes):
    cm, _, clock = four_nodes
    before = cm.chain(1).version
    info = cm.offline_target(1)
    assert info.state == OFFLINE
    chain = cm.chain(1)
    assert chain.version == before + 1 and chain.targets[-1] == 1
    clock.now = 1.0
    for node in "abcd":
        cm.heartbeat(cluster_pb2.HeartbeatRequest(node_id=node))
    assert cm.chain(1).state_of(1) == OFFLINE
    register(cm, "a", 7000, ids=[1])
    assert cm.chain(1).state_of(1) == SYNCING
    with pytest.raises(errors.NotFound):
        cm.offline_target(42)


def test_last_serving_target_goes_lastsrv(four_nodes):
    cm, _, _ = four_nodes
    cm.offline_target(1)
    cm.offline_target(2)
    cm.offline_target(3)
    assert cm.chain(1).state_of(3) == LASTSRV


# --------------------------------------------------------------------- the API


@pytest.fixture
def api(four_nodes):
    cm, _, _ = four_nodes
    return cm, TestClient(create_app(cm, GCQueue(cm), admin_token=TOKEN))


STEERING = [
    ("post", "/api/v1/targets/1/offline", None),
    ("post", "/api/v1/targets/1/drain", None),
    ("post", "/api/v1/gc/run", None),
    ("put", "/api/v1/layouts?path=/", {"chunk_size": 1 << 20, "stripe": 1}),
    ("post", "/api/v1/scrub/start", None),
    ("post", "/api/v1/scrub/pause", None),
]


@pytest.mark.parametrize(("method", "url", "body"), STEERING)
def test_steering_needs_the_token(api, method, url, body):
    cm, client = api
    version = cm.routing_version
    resp = client.request(method, url, json=body)
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"] == "Bearer"
    assert isinstance(resp.json()["detail"], str)
    resp = client.request(method, url, json=body, headers={"Authorization": "Bearer nope"})
    assert resp.status_code == 403 and resp.json() == {"detail": "wrong admin token"}
    resp = client.request(method, url, json=body, headers={"Authorization": f"Basic {TOKEN}"})
    assert resp.status_code == 401
    assert cm.routing_version == version  # nothing applied


@pytest.mark.parametrize(("method", "url", "body"), STEERING)
def test_steering_without_a_configured_token(four_nodes, method, url, body):
    cm, _, _ = four_nodes
    client = TestClient(create_app(cm, GCQueue(cm)))
    resp = client.request(method, url, json=body, headers={"Authorization": "Bearer x"})
    assert resp.status_code == 403
    assert resp.json() == {"detail": "no admin token configured"}


READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def state_changing_routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route of ``app`` whose method is not GET, HEAD or OPTIONS."""
    found = []
    for route in iter_route_contexts(app.routes):
        original = getattr(route, "original_route", route)
        if isinstance(original, Mount):
            # a mounted application's routes are not in app.routes: only static files may be
            assert isinstance(original.app, StaticFiles), f"{route.path} mounts {original.app!r}"
            continue
        methods = route.methods
        assert methods, f"{route!r} has no methods"
        found += [(m, route.path) for m in sorted(methods) if m not in READ_ONLY_METHODS]
    return found


def with_parameters(path: str) -> str:
    """``path`` with every path parameter given a value (1: an existing target, chain, ...)."""
    return re.sub(r"\{[^}]+\}", "1", path)


@pytest.fixture
def full_app(four_nodes):
    """The app over the cluster manager and a namespace on the same store, as the metaserver."""
    cm, engine, _ = four_nodes
    namespace = Namespace(engine, chain_table=cm.chain_table)

    def make(token: str | None = TOKEN):
        return create_app(cm, GCQueue(cm), namespace, admin_token=token)

    return cm, engine, make


def test_every_state_changing_route_needs_the_admin_token(full_app):
    """Each route that may change state, found in the app itself, refuses requests without the
    token (401) and with a wrong one (403), and applies nothing."""
    cm, engine, make = full_app
    app = make()
    routes = state_changing_routes(app)
    # the enumeration finds the steering routes known here (and whatever is added later)
    assert {(m.upper(), re.sub(r"\?.*", "", url)) for m, url, _ in STEERING} <= {
        (m, with_parameters(p)) for m, p in routes
    }
    client = TestClient(app)
    before = (cm.routing_version, list(engine.scan(b"", None)))
    for method, path in routes:
        url = with_parameters(path)
        resp = client.request(method, url)
        assert resp.status_code == 401, (method, path, resp.status_code, resp.text)
        assert resp.headers["www-authenticate"] == "Bearer", (method, path)
        for header in ("Bearer nope", f"Bearer {TOKEN}x"):
            resp = client.request(method, url, headers={"Authorization": header})
            assert resp.status_code == 403, (method, path, header, resp.status_code, resp.text)
            assert resp.json() == {"detail": "wrong admin token"}, (method, path, header)
        resp = client.request(method, url, headers={"Authorization": f"Basic {TOKEN}"})
        assert resp.status_code == 401, (method, path, resp.status_code, resp.text)
    assert (cm.routing_version, list(engine.scan(b"", None))) == before  # nothing applied
    # a metaserver without an admin token refuses them all
    client = TestClient(make(None))
    for method, path in routes:
        resp = client.request(method, with_parameters(path), headers={"Authorization": "Bearer x"})
        assert resp.status_code == 403, (method, path, resp.status_code, resp.text)
        assert resp.json() == {"detail": "no admin token configured"}, (method, path)
    assert (cm.routing_version, list(engine.scan(b"", None))) == before


def test_offline_and_drain_through_the_api(api):
    cm, client = api
    auth = {"Authorization": f"Bearer {TOKEN}"}
    resp = client.post("/api/v1/targets/3/drain", headers=auth)
    assert resp.status_code == 202
    assert resp.json() == {
        "target": 3,
        "chain": 1,
        "replacement": 4,
        "replacement_state": "syncing",
    }
    cluster = client.get("/api/v1/cluster").json()
    assert cluster["drains"] == [resp.json()]
    assert client.post("/api/v1/targets/2/drain", headers=auth).status_code == 409
    assert client.post("/api/v1/targets/4/drain", headers=auth).status_code == 409
    resp = client.post("/api/v1/targets/77/drain", headers=auth)
    assert resp.status_code == 404 and resp.json() == {"detail": "no target 77"}
    resp = client.post("/api/v1/targets/1/offline", headers=auth)
    assert resp.status_code == 200 and resp.json()["state"] == "offline"
    chain = client.get("/api/v1/chains/1").json()
    assert [m["id"] for m in chain["targets"]] == [2, 3, 4, 1]
    assert client.get("/api/v1/chains/1").json()["version"] == cm.chain(1).version
    assert client.post("/api/v1/targets/x/offline", headers=auth).status_code == 422


def test_read_routes_without_namespace(api):
    _, client = api
    assert client.get("/api/v1/sessions").status_code == 503
    assert client.get("/api/v1/layouts?path=/").json() == {
        "detail": "the namespace is not available"
    }
    summary = client.get("/api/v1/cluster").json()
    assert summary["namespace"] is None
    assert summary["targets"]["total"] == 4 and summary["chains"]["healthy"] == 1
    assert client.get("/readyz").json() == {"status": "ready", "reason": None}
    nodes = client.get("/api/v1/nodes").json()
    assert [n["id"] for n in nodes] == ["a", "b", "c", "d"]
    assert nodes[3]["targets"] == [4] and nodes[3]["up"] is True


def test_readyz_without_chains():
    cm = ClusterManager(MemoryEngine(), replicas=3)
    client = TestClient(create_app(cm, GCQueue(cm)))
    resp = client.get("/readyz")
    assert resp.status_code == 503
    assert resp.json()["status"] == "unavailable" and "no chains" in resp.json()["reason"]


def test_metrics_report_states(api):
    cm, client = api
    cm.offline_target(2)
    text = client.get("/metrics").text
    assert 'emberfs_targets{state="offline"} 1.0' in text
    assert 'emberfs_targets{state="serving"} 3.0' in text
    assert 'emberfs_chains{health="degraded"} 1.0' in text
    assert "process_cpu_seconds_total" in text or "python_info" in text


def test_scrub_control_reaches_heartbeats_and_outlives_a_restart(four_nodes):
    cm, engine, _ = four_nodes
    client = TestClient(create_app(cm, GCQueue(cm), admin_token=TOKEN))
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def beat(node: str, target: int, **progress) -> cluster_pb2.HeartbeatResponse:
        report = cluster_pb2.TargetReport(target_id=target, capacity=1000)
        report.scrub.CopyFrom(cluster_pb2.ScrubReport(**progress))
        return cm.heartbeat(cluster_pb2.HeartbeatRequest(node_id=node, targets=[report]))

    assert (beat("a", 1).scrub.paused, beat("a", 1).scrub.start) == (False, 0)
    shown = client.post("/api/v1/scrub/pause", headers=auth).json()
    assert shown["paused"] is True and shown["starts"] == 0
    assert beat("a", 1).scrub.paused
    shown = client.post("/api/v1/scrub/start", headers=auth).json()
    assert (shown["paused"], shown["starts"]) == (False, 1)
    resp = beat("b", 2, running=True, pass_started_ns=5, bytes_verified=4096, errors=2, repairs=1)
    assert (resp.scrub.paused, resp.scrub.start) == (False, 1)
    shown = {t["id"]: t for t in client.get("/api/v1/scrub").json()["targets"]}
    assert set(shown) == {1, 2}  # the targets that reported
    assert shown[2] == {
        "id": 2,
        "node": "b",
        "running": True,
        "paused": False,
        "pass_started": 5,
        "last_full_pass": 0,
        "bytes_verified": 4096,
        "chunks_verified": 0,
        "errors": 2,
        "repairs": 1,
        "passes": 0,
    }
    client.post("/api/v1/scrub/pause", headers=auth)
    again = ClusterManager(engine, replicas=3)  # a restarted metaserver keeps the control
    assert (again.scrub.control().paused, again.scrub.control().start) == (True, 1)
