"""Fixtures shared by the whole suite: real local clusters of real processes.

Also the suite-wide Hypothesis profiles: ``default`` is deterministic (the same examples on
every run, no deadline), so a CI run is reproducible; ``long`` draws many more random examples.
``HYPOTHESIS_PROFILE=long python -m pytest ...`` selects it.

With ``EMBERFS_REQUIRE_ALL_TESTS=1`` (set by ``.ci/run``) every skip, whether from a mark,
``pytest.skip``, ``pytest.importorskip`` or a module skipped at collection, is reported as a
failure naming its reason: in CI a missing test dependency must not pass unnoticed.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import Phase, settings

from emberfs.cli.localcluster import LocalCluster
from emberfs.cli.localetcd import LocalEtcd
from emberfs.client.fs import EmberFileSystem

pytest_plugins = ("pytester",)  # tests/test_conftest.py runs pytest on sample test files

# no explain phase: on a failure it reruns the shrunk example hundreds of times for a comment
_PHASES = tuple(p for p in Phase if p != Phase.explain)
settings.register_profile(
    "default", derandomize=True, deadline=None, max_examples=60, phases=_PHASES
)
settings.register_profile("long", deadline=None, max_examples=2000, phases=_PHASES)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REQUIRE_ALL_TESTS = os.environ.get("EMBERFS_REQUIRE_ALL_TESTS", "") not in ("", "0")

# Every cluster of the suite runs with authentication, and every client in it (in this
# process or a child) acts as its administrator unless a test says otherwise: one admin
# token for the session, which each cluster's metaserver takes (LocalCluster reads it from
# EMBERFS_ADMIN_TOKEN) and clients present (EMBERFS_TOKEN). A developer's own client
# config file is kept out of the way.
SUITE_TOKEN = "suite-admin-" + secrets.token_urlsafe(24)
os.environ["EMBERFS_ADMIN_TOKEN"] = SUITE_TOKEN
os.environ["EMBERFS_TOKEN"] = SUITE_TOKEN
os.environ["EMBERFS_CONFIG"] = os.path.join(
    tempfile.gettempdir(), f"emberfs-suite-{os.getpid()}-no-config.toml"
)


def _skip_reason(longrepr) -> str:
    """The reason of a skip report (its longrepr is ``(path, line, "Skipped: reason")``)."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, line, reason = longrepr
        return f"{reason} ({path}:{line})"
    return str(longrepr)


def _as_failure(report) -> None:
    report.outcome = "failed"
    report.longrepr = (
        "EMBERFS_REQUIRE_ALL_TESTS is set, so this skip is a failure: "
        + _skip_reason(report.longrepr)
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    # an expected failure (xfail) is reported as skipped too: it is no skip
    if REQUIRE_ALL_TESTS and report.skipped and not hasattr(report, "wasxfail"):
        _as_failure(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if REQUIRE_ALL_TESTS and report.skipped:
        _as_failure(report)
    return report


NEEDS_ETCD = "needs the etcd server (apt-get install etcd-server; scripts/test-deps.sh does it)"


def require_etcd() -> None:
    """Skip the test where the etcd server is not installed (a failure in CI, see above)."""
    if shutil.which("etcd") is None:
        pytest.skip(NEEDS_ETCD)


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    """One local etcd server for the whole session (etcd's default limits).

    Each user takes a key prefix of its own (:func:`etcd_url`), so tests never see
    each other's keys.
    """
    require_etcd()
    server = LocalEtcd(tmp_path_factory.mktemp("etcd"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


_etcd_prefixes = itertools.count(1)


@pytest.fixture
def etcd_url(etcd):
    """An ``etcd://`` URL on the session's etcd with a key prefix no other test uses."""
    return etcd.url(f"test-{os.getpid()}-{next(_etcd_prefixes)}")


def make_cluster(tmp_path_factory, name: str, **kwargs) -> LocalCluster:
    if kwargs.get("kv") == "etcd":
        require_etcd()
    kwargs.setdefault("heartbeat_timeout", 2.0)
    data_dir = tmp_path_factory.mktemp(name)
    return LocalCluster(data_dir, **kwargs)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """One 3-server, R=3 cluster shared by the tests that only read and write.

    Tests that kill or restart processes use :func:`make_cluster` (their own cluster).
    """
    c = make_cluster(tmp_path_factory, "cluster")
    c.start(timeout=90)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def fs(cluster):
    """A filesystem instance of its own, talking to the shared cluster."""
    instance = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def private_cluster(tmp_path_factory):
    """A cluster of its own for a test that kills, partitions or restarts processes."""
    clusters: list[LocalCluster] = []

    def start(**kwargs) -> LocalCluster:
        c = make_cluster(tmp_path_factory, "private", **kwargs)
        clusters.append(c)
        c.start(timeout=90)
        return c

    try:
        yield start
    finally:
        for c in clusters:
            c.stop()


@pytest.fixture
def tmpfs():
    """Mount small tmpfs file systems, each a disk that really fills up; unmounted after the test.

    ``tmpfs(path, size)`` mounts one of ``size`` bytes on ``path`` (made when missing) and
    returns ``path``. Skips the test where mounting is not allowed (not root, or a container
    without the capability). Whatever keeps files open there must stop before the test ends.
    """
    mounted = []

    def mount(path, size: int):
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}")
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for path in reversed(mounted):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(path)], check=True)
