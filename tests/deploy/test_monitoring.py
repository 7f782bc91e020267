"""Monitoring of the compose cluster: Prometheus, its alert rules and the Grafana dashboard.

The files checked (deploy/monitoring/): ``prometheus.yml`` (what Prometheus scrapes),
``alerts.yml`` (alert rules) and ``emberfs-dashboard.json`` (a Grafana dashboard).

Without Docker: the dashboard's structure as Grafana reads it (required keys, panel types,
datasource references, unique ids and refIds, a grid without overlaps), the rules' labels
and annotations, and that every EmberFS metric they name is one the servers define.

With Docker, on one cluster started by ``deploy/cluster.sh up --monitoring``: Prometheus
scrapes every server, ``promtool`` (from the Prometheus container) passes the rules and the
configuration, and after some traffic (writes and reads from the host and through the client
container's mount, a KV cache put and gets, a directory quota, a scrub pass) every query of the
dashboard returns data, and so does every alert expression evaluated with ``bool`` comparisons:
``X > 0`` becomes ``X > bool 0``, which returns every series the alert watches (0 where it
would not fire) instead of none, so an alert that is quiet in a healthy cluster is checked as
well.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest
import yaml

from emberfs.cli.ports import free_port
from emberfs.kvcache.store import KVCache
from tests.deploy.test_compose import (
    ROOT,
    SKIP_REASON,
    STORAGE_SERVICES,
    TARGETS_PER_NODE,
    ComposeCluster,
    project_leftovers,
    wait_until,
)

MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "emberfs-dashboard.json"
ALERTS = MONITORING / "alerts.yml"
MiB = 1024 * 1024

#: what Grafana's variables stand for when a query is sent to Prometheus directly
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "text"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
METRIC_SOURCES = (ROOT / "metaserver" / "metrics.py", ROOT / "storageserver" / "metrics.py")


def in_docker(func):
    """The marks of a test on the compose cluster (the first one may build the images)."""
    for mark in (
        pytest.mark.docker,
        pytest.mark.slow,
        pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or ""),
        pytest.mark.timeout(1500),
    ):
        func = mark(func)
    return func


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title and refId, PromQL)`` of every query of the dashboard, variables replaced."""
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            out.append((f"{panel['title']} {target['refId']}", expr))
    return out


def alert_rules() -> list[dict]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


_OPERATOR = re.compile(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)\s*")


def with_bool(expr: str) -> str:
    """``expr`` with every comparison made a ``bool`` one (every series kept, valued 0 or 1).

    Comparisons are binary operators outside label matchers (``{...}``) and strings.
    """
    out, i, braces, quote = [], 0, 0, ""
    while i < len(expr):
        ch = expr[i]
        if quote:
            if ch == "\\":
                out.append(expr[i : i + 2])
                i += 2
                continue
            quote = "" if ch == quote else quote
        elif ch in "\"'`":
            quote = ch
        elif ch in "{}":
            braces += 1 if ch == "{" else -1
        elif braces == 0 and (m := _OPERATOR.match(expr, i)):
            out.append(f"{m.group(1)} bool ")
            i = m.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out)


# ------------------------------------------------------------------ without Docker


def test_dashboard_structure():
    d = dashboard()
    for key, kind in (
        ("title", str),
        ("uid", str),
        ("panels", list),
        ("schemaVersion", int),
        ("templating", dict),
        ("time", dict),
        ("tags", list),
        ("editable", bool),
    ):
        assert isinstance(d.get(key), kind), key
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", d["uid"]), d["uid"]
    assert set(d["time"]) == {"from", "to"}
    # the datasource every panel names is the dashboard's variable of type datasource
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids, cells = set(), set()
    for panel in d["panels"]:
        where = panel.get("title", panel.get("id"))
        assert panel["type"] in PANEL_TYPES, where
        assert isinstance(panel["id"], int) and panel["id"] not in ids, where
        ids.add(panel["id"])
        assert isinstance(panel["title"], str) and panel["title"], where
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"}, where
        assert all(isinstance(v, int) and v >= 0 for v in grid.values()), where
        assert grid["w"] >= 1 and grid["h"] >= 1 and grid["x"] + grid["w"] <= 24, where
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{where} overlaps another panel"
                cells.add((x, y))
        if panel["type"] == "row":
            assert panel["panels"] == [] and panel["collapsed"] is False, where
            assert grid["w"] == 24 and grid["h"] == 1, where
            continue
        assert panel["datasource"] == DATASOURCE, where
        assert isinstance(panel["description"], str) and panel["description"], where
        assert isinstance(panel["fieldConfig"]["defaults"], dict), where
        targets = panel["targets"]
        assert targets, where
        assert len({t["refId"] for t in targets}) == len(targets), where
        for t in targets:
            assert t["datasource"] == DATASOURCE, where
            assert isinstance(t["expr"], str) and t["expr"].strip(), where
            assert isinstance(t["legendFormat"], str), where


def test_dashboard_covers_the_topics():
    titles = {p["title"] for p in dashboard()["panels"] if p["type"] == "row"}
    assert titles == {"Cluster", "Throughput", "Scrub", "KV cache", "Metaserver", "Quotas"}
    queries = " ".join(expr for _, expr in dashboard_queries())
    for metric in (
        "emberfs_targets",
        "emberfs_chains",
        "emberfs_storage_read_bytes_total",
        "emberfs_storage_written_bytes_total",
        "emberfs_storage_client_read_bytes_total",
        "emberfs_storage_client_written_bytes_total",
        "emberfs_storage_scrub_bytes_total",
        "emberfs_storage_scrub_damaged_total",
        "emberfs_storage_scrub_last_full_pass_seconds",
        "emberfs_kvcache_hits_total",
        "emberfs_kvcache_misses_total",
        "emberfs_meta_requests_total",
        "emberfs_meta_request_duration_seconds_bucket",
        "emberfs_quota_used_bytes",
        "emberfs_quota_limit_bytes",
        "emberfs_quota_used_inodes",
        "emberfs_quota_limit_inodes",
    ):
        assert metric in queries, metric


def test_alert_rules_structure():
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(set(names)) == len(names)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"EmberFS[A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert with_bool(rule["expr"]) != rule["expr"], f"{rule['alert']} compares nothing"


def test_every_metric_named_is_one_the_servers_define():
    defined = "\n".join(p.read_text() for p in METRIC_SOURCES)
    exprs = [expr for _, expr in dashboard_queries()] + [r["expr"] for r in alert_rules()]
    named = {m for expr in exprs for m in re.findall(r"\bemberfs_[a-z0-9_]+", expr)}
    assert named
    for metric in sorted(named):
        base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
        assert f'"{base}"' in defined, f"{metric} is not defined in {METRIC_SOURCES}"


def test_with_bool():
    assert with_bool("up == 0") == "up == bool 0"
    assert with_bool("a / b > 0.85") == "a / b > bool 0.85"
    assert with_bool('x{code=~"A|B", s!="y"} >= 1') == 'x{code=~"A|B", s!="y"} >= bool 1'
    assert with_bool("max(a > bool 1) <= 2") == "max(a > bool 1) <= bool 2"


# ------------------------------------------------------------------ with Docker


class MonitoredCluster(ComposeCluster):
    """A compose project started with ``up --monitoring``: the cluster and Prometheus."""

    def __init__(self, project: str) -> None:
        super().__init__(project)
        self.prometheus_port = free_port(avoid={self.meta_port, self.admin_port})
        self.env["EMBERFS_PROMETHEUS_PORT"] = str(self.prometheus_port)
        self.env.pop("EMBERFS_MONITORING", None)
        self.prometheus = f"http://127.0.0.1:{self.prometheus_port}"

    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        if args[:1] == ("up",):
            args = (*args, "--monitoring")
        return super().script(*args, timeout=timeout)

    def settings(self) -> dict[str, str]:
        out = self.script("env").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def query(self, promql: str) -> list[dict]:
        """The result of an instant query (an error answer fails the test)."""
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{promql}: {exc.read().decode()[:500]}") from None
        assert body["status"] == "success", body
        return body["data"]["result"]

    def api(self, path: str) -> dict:
        with urllib.request.urlopen(self.prometheus + path, timeout=10) as r:
            return json.load(r)["data"]

    def admin_post(self, path: str, token: str) -> dict:
        req = urllib.request.Request(
            self.admin + path, method="POST", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.load(r)


@pytest.fixture(scope="module")
def monitored():
    cluster = MonitoredCluster(f"emberfsmon{uuid.uuid4().hex[:8]}")
    try:
        cluster.up()
        yield cluster
    finally:
        r = cluster.down()
        if r.returncode != 0:
            print(f"cluster.sh down failed: {r.stderr}")


def _scraped(c: MonitoredCluster) -> dict[str, set[str]]:
    """Instances whose last scrape succeeded, by job."""
    out: dict[str, set[str]] = {}
    for t in c.api("/api/v1/targets?state=active")["activeTargets"]:
        if t["health"] == "up":
            out.setdefault(t["labels"]["job"], set()).add(t["labels"]["instance"])
    return out


@in_docker
def test_prometheus_scrapes_every_server_on_loopback_only(monitored: MonitoredCluster):
    c = monitored
    assert c.settings()["EMBERFS_MONITORING"] == "1"  # kept for the project until 'down'
    assert c.health("prometheus") == "running/healthy"
    expected = {
        "emberfs-meta": {"metaserver"},
        "emberfs-storage": set(STORAGE_SERVICES),
        "prometheus": {"prometheus"},
    }
    wait_until(lambda: _scraped(c) == expected, 60, f"Prometheus to scrape {expected}")
    # published on this host's loopback only
    published = c.docker("port", c.container("prometheus"), "9090/tcp").split()
    assert published == [f"127.0.0.1:{c.prometheus_port}"], published


@in_docker
def test_promtool_passes_and_prometheus_loads_every_rule(monitored: MonitoredCluster):
    c = monitored
    for check, success in (
        (["rules", "/etc/emberfs/alerts.yml"], f"SUCCESS: {len(alert_rules())} rules found"),
        (["config", "/etc/emberfs/prometheus.yml"], "SUCCESS: 1 rule files found"),
    ):
        r = c.script("compose", "exec", "-T", "prometheus", "promtool", "check", *check)
        assert r.returncode == 0, f"promtool check {' '.join(check)}:\n{r.stdout}\n{r.stderr}"
        assert success in r.stdout + r.stderr, r.stdout + r.stderr
    loaded = {
        rule["name"]: rule
        for group in c.api("/api/v1/rules")["groups"]
        for rule in group["rules"]
        if rule["type"] == "alerting"
    }
    assert set(loaded) == {r["alert"] for r in alert_rules()}

    def evaluated() -> bool:
        rules = [
            rule
            for group in c.api("/api/v1/rules")["groups"]
            for rule in group["rules"]
            if rule["type"] == "alerting"
        ]
        return all(r["health"] == "ok" for r in rules)

    wait_until(evaluated, 30, "every alert rule evaluated without an error")


def _traffic(c: MonitoredCluster, token: str) -> None:
    """Writes and reads from the host and through the client container, a KV cache, a directory
    quota with both limits and usage below it, a scrub."""
    data = os.urandom(9 * MiB + 17)
    fs = c.fs()
    try:
        fs.pipe_file("/monitoring/host.bin", data)
        fs.makedirs("/monitoring/quota")
        fs.quota_set("/monitoring/quota", max_bytes=64 * MiB, max_inodes=1000)
        fs.pipe_file("/monitoring/quota/q.bin", os.urandom(MiB))
        assert fs.quota_get("/monitoring/quota")["used_bytes"] == MiB
        assert fs.cat_file("/monitoring/host.bin") == data
        cache = KVCache.create("/monitoring/kv", block_size=64 * 1024, capacity=8 * MiB, fs=fs)
        block = os.urandom(64 * 1024)
        cache.put(b"present", block)
        assert bytes(cache.get(b"present")) == block
        assert cache.get(b"absent") is None
    finally:
        fs.close()
    r = c.script(
        "compose",
        "exec",
        "-T",
        "client",
        "sh",
        "-c",
        "set -e; head -c 5242880 /dev/urandom >/mnt/emberfs/monitoring/mount.bin; "
        "sha256sum /mnt/emberfs/monitoring/host.bin",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    c.admin_post("/api/v1/scrub/start", token)

    def scrubbed() -> bool:
        targets = c.get("/api/v1/scrub")["targets"]
        return len(targets) == len(STORAGE_SERVICES) * TARGETS_PER_NODE and all(
            t["passes"] >= 1 for t in targets
        )

    wait_until(scrubbed, 90, "a scrub pass over every target")


@in_docker
def test_every_dashboard_query_and_alert_expression_returns_data(monitored: MonitoredCluster):
    c = monitored
    # the admin token: the suite's (EMBERFS_ADMIN_TOKEN), else the one 'up' made
    _traffic(c, c.env.get("EMBERFS_ADMIN_TOKEN") or c.settings()["EMBERFS_ADMIN_TOKEN"])
    queries = dashboard_queries() + [
        (f"alert {r['alert']}", with_bool(r["expr"])) for r in alert_rules()
    ]
    empty: list[str] = []

    def all_answer() -> bool:
        empty[:] = [name for name, promql in queries if not c.query(promql)]
        return not empty

    try:
        wait_until(all_answer, 90, "every query to return data", interval=3)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; without data: {empty}") from None

    # the per-client series name the host (the network's gateway) and the client container
    clients = {
        s["metric"]["client"]
        for s in c.query("sum by (client) (emberfs_storage_client_written_bytes_total)")
    }
    assert {f"{c.net_prefix}.1", f"{c.net_prefix}.40"} <= clients, clients
    # a healthy cluster: no target or chain alert fires
    for name in ("EmberFSTargetsOffline", "EmberFSChainsDegraded", "EmberFSChainsUnavailable"):
        (rule,) = (r for r in alert_rules() if r["alert"] == name)
        assert c.query(rule["expr"]) == [], name


@in_docker
def test_down_removes_prometheus_and_its_data(monitored: MonitoredCluster):
    c = monitored
    assert any("prometheus" in x for x in _volumes(c.project))
    r = c.down()
    assert r.returncode == 0, r.stderr
    assert project_leftovers(c.project) == []
    assert not (ROOT / "deploy" / ".cache" / "clusters" / f"{c.project}.env").exists()


def _volumes(project: str) -> list[str]:
    out = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"name=^{project}_"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return out.split()
