"""`emberfs up`: a whole cluster in the foreground, stopped by SIGTERM, back with its data."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from emberfs.cli import localcluster
from emberfs.cli import ports as port_picking
from emberfs.cli.ports import free_port
from emberfs.cli.processes import emberfs_command

pytestmark = pytest.mark.slow


def _user_env(config) -> dict[str, str]:
    """The environment of a user of this host who has set nothing but where the config is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBERFS_")}
    env.update(EMBERFS_CONFIG=str(config), PYTHONUNBUFFERED="1")
    return env


def _start(data_dir, meta, admin, storage, config, *extra):
    env = _user_env(config)
    proc = subprocess.Popen(
        emberfs_command()
        + [
            "up",
            "--data-dir",
            str(data_dir),
            "--meta-port",
            str(meta),
            "--admin-port",
            str(admin),
            "--storage-port",
            str(storage),
            "--heartbeat-timeout",
            "3",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if "Press Ctrl-C to stop." in line or time.monotonic() > deadline:
            break
    return proc, "".join(lines)


def _stop(proc) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        rest = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert "Stopped." in rest
    return proc.returncode


def _children_roles(pid: int) -> list[str]:
    out = subprocess.run(
        ["ps", "-ww", "-o", "args=", "--ppid", str(pid)], capture_output=True, text=True
    )
    roles = []
    for line in out.stdout.splitlines():
        words = line.split()
        at = [i for i, w in enumerate(words) if w.endswith("emberfs") or w == "emberfs.cli.main"]
        if at and at[0] + 1 < len(words):
            roles.append(words[at[0] + 1])
    return roles


def test_up_runs_every_role_and_keeps_data_across_restarts(tmp_path):
    meta = free_port()
    admin = free_port(avoid={meta})
    storage = free_port(count=9, avoid={meta, admin})
    data_dir = tmp_path / "data"
    config = tmp_path / "client.toml"
    cli = emberfs_command()
    env = _user_env(config)
    payload = os.urandom(3 * 1024 * 1024 + 123)
    (tmp_path / "in.bin").write_bytes(payload)

    proc, banner = _start(data_dir, meta, admin, storage, config)
    try:
        assert proc.poll() is None, banner
        assert f"metaserver   127.0.0.1:{meta}" in banner
        assert f"http://127.0.0.1:{admin}" in banner
        token = (data_dir / "admin.token").read_text().strip()
        assert f"admin token  {token}" in banner
        assert str(config) in banner
        for i in range(3):
            assert f"storage-{i}    data 127.0.0.1:{storage + 3 * i}" in banner
        roles = _children_roles(proc.pid)
        assert sorted(roles) == ["metaserver", "storageserver", "storageserver", "storageserver"]
        # secure by default: a key file and an admin token only the owner reads
        for secret in (data_dir / "cluster.key", data_dir / "admin.token", config):
            assert secret.stat().st_mode & 0o077 == 0, secret

        # the user's commands work with nothing set: the config has the address and token
        run = lambda *a, env=env: subprocess.run(  # noqa: E731
            cli + list(a), env=env, capture_output=True, timeout=60
        )
        assert run("mkdir", "/d").returncode == 0
        r = run("put", str(tmp_path / "in.bin"), "/d/file.bin")
        assert r.returncode == 0, r.stderr
        r = run("admin", "token", "create", "--uid", "1000", "--gid", "1000", "--name", "u")
        assert r.returncode == 0, r.stderr
        # without a token: refused, and said so
        stranger = dict(env, EMBERFS_CONFIG=str(tmp_path / "none.toml"))
        stranger["EMBERFS_META"] = f"127.0.0.1:{meta}"
        r = run("ls", "/d", env=stranger)
        assert r.returncode != 0 and b"token" in r.stderr, r.stderr
    finally:
        code = _stop(proc)
    assert code == 0
    assert _children_roles(proc.pid) == []

    proc, banner = _start(data_dir, meta, admin, storage, config)
    try:
        assert proc.poll() is None, banner
        assert f"admin token  {token}" in banner  # the same cluster, the same token
        r = subprocess.run(cli + ["cat", "/d/file.bin"], env=env, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout == payload
    finally:
        assert _stop(proc) == 0


def test_up_on_etcd_runs_two_metaservers_and_survives_the_loss_of_either(tmp_path):
    """``--kv etcd``: a local etcd and two metaservers; kill -9 one, the other serves."""
    if shutil.which("etcd") is None:
        pytest.skip("needs the etcd server (apt-get install etcd-server)")
    meta, admin = free_port(), free_port()
    taken = {meta, admin, meta + 10, admin + 10}  # the second metaserver's ports
    storage = free_port(count=9, avoid=taken)
    etcd = free_port(count=2, avoid=taken | set(range(storage, storage + 9)))
    data_dir = tmp_path / "data"
    config = tmp_path / "client.toml"
    cli = emberfs_command()
    env = _user_env(config)
    run = lambda *a: subprocess.run(cli + list(a), env=env, capture_output=True, timeout=90)  # noqa: E731
    proc, banner = _start(
        data_dir, meta, admin, storage, config, "--kv", "etcd", "--etcd-port", str(etcd)
    )
    try:
        assert proc.poll() is None, banner
        assert f"metaservers  127.0.0.1:{meta},127.0.0.1:{meta + 10}" in banner
        assert f"etcd         127.0.0.1:{etcd}" in banner
        roles = _children_roles(proc.pid)
        assert sorted(roles) == ["metaserver"] * 2 + ["storageserver"] * 3, roles
        assert f'meta = "127.0.0.1:{meta},127.0.0.1:{meta + 10}"' in config.read_text()
        assert run("mkdir", "/d").returncode == 0
        first = subprocess.run(
            ["pgrep", "-f", f"metaserver .*--listen 127.0.0.1:{meta} "],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert len(first) == 1
        os.kill(int(first[0]), signal.SIGKILL)  # the other metaserver serves meanwhile
        r = run("mkdir", "/d/e")
        assert r.returncode == 0, r.stderr
        r = run("ls", "/d")
        assert r.returncode == 0 and b"e/" in r.stdout, r.stderr
    finally:
        assert _stop(proc) == 0
    assert _children_roles(proc.pid) == []
    proc, banner = _start(
        data_dir, meta, admin, storage, config, "--kv", "etcd", "--etcd-port", str(etcd)
    )
    try:
        r = run("ls", "/d")  # the store came back with the cluster
        assert r.returncode == 0 and b"e/" in r.stdout, r.stderr
    finally:
        assert _stop(proc) == 0


def test_up_refuses_bad_replica_count(tmp_path):
    r = subprocess.run(
        emberfs_command()
        + ["up", "--data-dir", str(tmp_path), "--storage-servers", "2", "--replicas", "3"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert "--replicas" in r.stderr


def test_free_ports_lie_outside_the_ephemeral_range_and_avoid_the_ones_taken(tmp_path, monkeypatch):
    """A picked port can't be taken as an outgoing connection's source port before its bind."""
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("20000\t60999\n")
    monkeypatch.setattr(port_picking, "EPHEMERAL_PORTS", ephemeral)
    taken: set[int] = set()
    for _ in range(50):
        first = free_port(count=3, avoid=taken)
        ports = set(range(first, first + 3))
        assert not ports & taken
        assert all(10000 <= p < 20000 or 60999 < p <= 65535 for p in ports)
        taken |= ports
    # A range that leaves no room outside it: the kernel picks, still avoiding the ones taken.
    ephemeral.write_text("1024 65535\n")
    assert free_port(avoid=taken) not in taken


def test_clusters_made_before_either_binds_never_share_a_port(tmp_path):
    """Two clusters side by side (benchmarks.compare's authentication cost) pick their ports
    before either starts: no port may be picked twice."""
    clusters = [localcluster.LocalCluster(tmp_path / str(i), insecure=True) for i in range(40)]
    ports = []
    for c in clusters:
        ports += [c.meta_port, c.admin_port]
        for port in c.storage_ports:
            ports += [port, port + 1, port + 2]
    assert len(ports) == len(set(ports))
