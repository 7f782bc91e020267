"""The admin REST API of a real metaserver process, on real local clusters."""

from __future__ import annotations

import os
import time
import uuid

import httpx
import pytest

from emberfs.client.fs import EmberFileSystem

TOKEN = os.environ["EMBERFS_ADMIN_TOKEN"]  # the suite's admin token (tests/conftest.py)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


#: target fields that each heartbeat reports afresh
REPORTED = ("capacity", "used", "chunks", "full")


def api(cluster, path: str, method: str = "GET", **kwargs) -> httpx.Response:
    return httpx.request(method, cluster.admin_url + path, timeout=10, **kwargs)


def wait_api(cluster, path: str, predicate, timeout: float = 30.0, what: str = "condition"):
    """Poll ``GET path`` until ``predicate(json)``; the JSON that satisfied it."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = api(cluster, path).json()
        if predicate(last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached after {timeout:.0f} s: {last}")


@pytest.fixture
def fs(cluster):
    instance = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        yield instance
    finally:
        instance.close()


def test_probes_docs_and_dashboard(cluster):
    assert api(cluster, "/healthz").json() == {"status": "ok"}
    assert api(cluster, "/readyz").json() == {"status": "ready", "reason": None}
    spec = api(cluster, "/openapi.json").json()
    for path in ("/api/v1/cluster", "/api/v1/targets/{target_id}/drain", "/api/v1/layouts"):
        assert path in spec["paths"]
    assert "TargetPublic" in spec["components"]["schemas"]
    assert "swagger" in api(cluster, "/docs").text.lower()
    page = api(cluster, "/")
    assert page.status_code == 200 and 'id="chains"' in page.text
    assert api(cluster, "/static/app.js").status_code == 200
    assert api(cluster, "/static/nope.js").status_code == 404


def test_cluster_nodes_targets_chains(cluster):
    summary = api(cluster, "/api/v1/cluster").json()
    assert summary["health"] == "healthy"
    assert summary["nodes"] == 3
    assert summary["targets"] == {
        "total": 6,
        "serving": 6,
        "syncing": 0,
        "waiting": 0,
        "lastsrv": 0,
        "offline": 0,
        "full": 0,
    }
    assert summary["chains"] == {"total": 2, "healthy": 2, "degraded": 0, "unavailable": 0}
    assert summary["capacity"] > 0 and summary["namespace"]["directories"] >= 1
    assert summary["routing_version"] >= 1 and summary["version"]

    nodes = api(cluster, "/api/v1/nodes").json()
    assert len(nodes) == 3 and all(n["up"] and len(n["targets"]) == 2 for n in nodes)
    assert {n["address"] for n in nodes} == {cluster.storage_address(i) for i in range(3)}

    targets = api(cluster, "/api/v1/targets").json()
    assert len(targets) == 6
    for t in targets:
        assert set(t) == {
            "id",
            "node",
            "address",
            "grpc_address",
            "state",
            "capacity",
            "used",
            "chunks",
            "chain",
            "full",
        }
        assert t["state"] == "serving" and t["chain"] in (1, 2)
        # usage comes with heartbeats, which may land between the two calls (GC of
        # files that earlier tests removed changes it)
        one = api(cluster, f"/api/v1/targets/{t['id']}").json()
        assert set(one) == set(t)
        assert {k: v for k, v in one.items() if k not in REPORTED} == {
            k: v for k, v in t.items() if k not in REPORTED
        }
        assert all(one[k] >= 0 for k in REPORTED) and one["full"] is False
    missing = api(cluster, "/api/v1/targets/4242")
    assert missing.status_code == 404 and missing.json() == {"detail": "no target 4242"}
    bad = api(cluster, "/api/v1/targets/abc")
    assert bad.status_code == 422 and isinstance(bad.json()["detail"], str)

    chains = api(cluster, "/api/v1/chains").json()
    assert [c["id"] for c in chains] == [1, 2]
    for c in chains:
        assert len(c["targets"]) == 3 and c["version"] >= 1
        assert {m["state"] for m in c["targets"]} == {"serving"}
        assert api(cluster, f"/api/v1/chains/{c['id']}").json() == c
    assert api(cluster, "/api/v1/chains/99").status_code == 404


def test_sessions_gc_layouts_and_metrics(cluster, fs):
    base = f"/api-{uuid.uuid4().hex[:8]}"
    fs.makedirs(base)
    f = fs.open(f"{base}/open", "wb")
    try:
        f.write(b"x" * 100)
        f.flush()
        sessions = api(cluster, "/api/v1/sessions").json()
        fields = {"inode", "session_id", "client_id", "since", "renewed", "expires"}
        assert sessions and all(set(s) == fields for s in sessions)
        assert all(s["since"] <= s["renewed"] < s["expires"] for s in sessions)
    finally:
        f.close()
    fs.pipe(f"{base}/gone", os.urandom(1000))
    fs.rm(f"{base}/gone")
    items = api(cluster, "/api/v1/gc").json()
    assert isinstance(items, list)
    for item in items:
        assert set(item) == {"gc_id", "inode", "chains", "acked", "waiting"}
    assert api(cluster, "/api/v1/gc?limit=0").status_code == 422

    layout = api(cluster, "/api/v1/layouts", params={"path": base}).json()
    assert layout["path"] == base and layout["chunk_size"] == 0
    assert api(cluster, "/api/v1/layouts", params={"path": f"{base}/none"}).status_code == 404
    assert api(cluster, "/api/v1/layouts", params={"path": "/" + "n" * 300}).status_code == 400

    text = api(cluster, "/metrics").text
    assert 'emberfs_meta_requests_total{code="OK",method="Mkdir",service="MetaService"}' in text
    assert "emberfs_meta_request_duration_seconds_bucket" in text
    assert 'emberfs_targets{state="serving"} 6.0' in text
    assert "emberfs_targets_full 0.0" in text
    assert 'emberfs_chains{health="healthy"} 2.0' in text
    assert 'emberfs_inodes{type="directories"}' in text


def test_steering_refused_with_a_wrong_token(cluster):
    for method, path in (
        ("POST", "/api/v1/targets/1/offline"),
        ("POST", "/api/v1/targets/1/drain"),
        ("POST", "/api/v1/gc/run"),
    ):
        resp = api(cluster, path, method, headers={"Authorization": "Bearer guess"})
        assert resp.status_code == 403
        assert resp.json() == {"detail": "wrong admin token"}
    assert api(cluster, "/api/v1/targets/1").json()["state"] == "serving"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_killed_storage_server_shows_offline(private_cluster):
    c = private_cluster(env={"EMBERFS_ADMIN_TOKEN": TOKEN})
    victim = c.storage_address(0)
    killed = [t["id"] for t in api(c, "/api/v1/targets").json() if t["address"] == victim]
    assert len(killed) == 2
    c.kill_storage(0)
    targets = wait_api(
        c,
        "/api/v1/targets",
        lambda ts: all(t["state"] == "offline" for t in ts if t["id"] in killed),
        what="targets of the killed server offline",
    )
    assert all(t["state"] == "serving" for t in targets if t["id"] not in killed)
    for chain in api(c, "/api/v1/chains").json():
        states = {m["id"]: m["state"] for m in chain["targets"]}
        for tid in killed:
            if tid in states:
                assert states[tid] == "offline"
                assert chain["targets"][-1]["id"] in killed  # offline members go last
    summary = api(c, "/api/v1/cluster").json()
    assert summary["health"] == "degraded" and summary["targets"]["offline"] == 2
    ready = api(c, "/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "unavailable"
    node = next(n for n in api(c, "/api/v1/nodes").json() if n["address"] == victim)
    assert node["up"] is False and node["last_heartbeat_seconds"] >= 2.0
    text = api(c, "/metrics").text
    assert 'emberfs_targets{state="offline"} 2.0' in text
    assert 'emberfs_chains{health="degraded"} 2.0' in text


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_drain_moves_a_target_and_keeps_the_data(private_cluster):
    # 4 servers with one target each and R=3: one chain and one free target
    c = private_cluster(
        storage_servers=4,
        targets_per_server=1,
        env={"EMBERFS_ADMIN_TOKEN": TOKEN},
    )
    chains = api(c, "/api/v1/chains").json()
    assert len(chains) == 1
    members = [m["id"] for m in chains[0]["targets"]]
    free = [t["id"] for t in api(c, "/api/v1/targets").json() if t["chain"] == 0]
    assert len(free) == 1

    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    try:
        files = {f"/drain/f{i}": os.urandom(n) for i, n in enumerate((1, 70_000, 9_000_000))}
        fs.makedirs("/drain")
        for path, data in files.items():
            fs.pipe(path, data)

        drained = members[0]
        resp = api(c, f"/api/v1/targets/{drained}/drain", "POST", headers=AUTH)
        assert resp.status_code == 202, resp.text
        assert resp.json()["replacement"] == free[0] and resp.json()["chain"] == 1
        # a second drain has no free target left
        other = api(c, f"/api/v1/targets/{members[1]}/drain", "POST", headers=AUTH)
        assert other.status_code == 409 and "no free target" in other.json()["detail"]

        target = wait_api(
            c,
            f"/api/v1/targets/{drained}",
            lambda t: t["chain"] == 0,
            timeout=60,
            what="drained target out of its chain",
        )
        assert target["state"] == "offline"
        chain = api(c, "/api/v1/chains/1").json()
        ids = [m["id"] for m in chain["targets"]]
        assert drained not in ids and free[0] in ids and len(ids) == 3
        assert {m["state"] for m in chain["targets"]} == {"serving"}
        assert all(
            drained not in [m["id"] for m in ch["targets"]]
            for ch in api(c, "/api/v1/chains").json()
        )
        assert api(c, "/api/v1/cluster").json()["drains"] == []

        # only the replacement serves: the data must come from it
        for tid in members[1:]:
            assert (
                api(c, f"/api/v1/targets/{tid}/offline", "POST", headers=AUTH).json()["state"]
                == "offline"
            )
        chain = api(c, "/api/v1/chains/1").json()
        assert chain["targets"][0] == {"id": free[0], "state": "serving"}
        fresh = EmberFileSystem(c.meta_address, skip_instance_cache=True)
        try:
            for path, data in files.items():
                assert fresh.cat(path) == data
        finally:
            fresh.close()

        # layouts and a GC sweep with the token
        resp = api(
            c,
            "/api/v1/layouts",
            "PUT",
            params={"path": "/drain"},
            json={"chunk_size": 1 << 20, "stripe": 1, "chain_table": [1]},
            headers=AUTH,
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["chunk_size"] == 1 << 20 and resp.json()["chain_table"] == [1]
        for body, code in (
            ({"chunk_size": 1000, "stripe": 1}, 400),
            ({"chunk_size": 1 << 20, "stripe": 1, "chain_table": [9]}, 400),
            ({"chunk_size": "big"}, 422),
            ({"chunk_size": -1}, 422),
        ):
            bad = api(
                c, "/api/v1/layouts", "PUT", params={"path": "/drain"}, json=body, headers=AUTH
            )
            assert bad.status_code == code, (body, bad.text)
            assert isinstance(bad.json()["detail"], str)
        bad = api(
            c,
            "/api/v1/layouts",
            "PUT",
            params={"path": "/drain/f0"},
            json={"chunk_size": 0},
            headers=AUTH,
        )
        assert bad.status_code == 400
        run = api(c, "/api/v1/gc/run", "POST", headers=AUTH)
        assert run.status_code == 200 and set(run.json()) == {"removed", "pending"}
    finally:
        fs.close()
