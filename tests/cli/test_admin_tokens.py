"""``emberfs admin token create|list|revoke`` against an admin API served over HTTP.

The API is the metaserver's app (:func:`~emberfs.metaserver.api.create_app`)
with a token store on a memory engine, served by uvicorn in this process on a
free port; the commands run in-process (``admin.main``), and once as a user
runs them, in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from emberfs.cli import admin
from emberfs.cli.processes import emberfs_command
from emberfs.metaserver.api import create_app
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.metaserver.tokens import TokenStore

ADMIN_TOKEN = "cli-token-admin"
TOKEN_RE = re.compile(r"^emb1\.([0-9a-f]{12})\.[A-Za-z0-9_-]{43}$")


@pytest.fixture
def served(monkeypatch) -> Iterator[tuple[str, TokenStore]]:
    """``(admin API URL, token store)`` of an app served on 127.0.0.1."""
    for name in ("EMBERFS_ADMIN", "EMBERFS_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    cm = ClusterManager(MemoryEngine(), replicas=3)
    store = TokenStore(MemoryEngine(), admin_token=ADMIN_TOKEN)
    app = create_app(cm, GCQueue(cm), admin_token=ADMIN_TOKEN, tokens=store)
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", store
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def run_admin(capsys, *args: str) -> tuple[int, str, str]:
    """``emberfs admin ARGS`` in-process: exit code, stdout, stderr."""
    try:
        code = admin.main(list(args))
    except SystemExit as exc:  # argparse
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_create_list_revoke(served, capsys):
    url, store = served
    base = ("--admin", url, "--token", ADMIN_TOKEN)
    code, out, err = run_admin(
        capsys, *base, "token", "create", "--uid", "1000", "--gid", "100", "--groups", "10,20",
        "--name", "ci",
    )  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    m = TOKEN_RE.match(lines[0])
    assert m, out  # the token string alone on the first line
    token_id = m.group(1)
    assert f"token {token_id} (ci): uid 1000, gid 100, groups 10,20" in lines[1]
    assert "not shown again" in err
    identity = store.resolve(lines[0])
    assert (identity.uid, identity.gid, identity.groups, identity.name) == (
        1000,
        100,
        (10, 20),
        "ci",
    )

    code, out, err = run_admin(
        capsys, *base, "token", "create", "--uid", "5", "--gid", "6", "--json"
    )
    assert code == 0, err
    unnamed = json.loads(out)
    assert unnamed["uid"] == 5 and unnamed["name"] == "" and unnamed["groups"] == []
    assert store.resolve(unnamed["token"]).uid == 5

    code, out, err = run_admin(capsys, *base, "token", "list")
    assert code == 0, err
    assert "Client tokens: 2" in out
    assert token_id in out and unnamed["id"] in out and "ci" in out and "10, 20" in out
    assert lines[0] not in out and unnamed["token"] not in out
    rows = [line for line in out.splitlines() if token_id in line or unnamed["id"] in line]
    assert token_id in rows[0] and unnamed["id"] in rows[1]  # oldest first

    for listing in (("--json", "token", "list"), ("token", "list", "--json")):
        code, out, err = run_admin(capsys, *base, *listing)
        assert code == 0, err
        listed = json.loads(out)["tokens"]
        assert [t["id"] for t in listed] == [token_id, unnamed["id"]]
        assert all("token" not in t for t in listed)

    code, out, err = run_admin(capsys, *base, "token", "revoke", "ci")
    assert code == 0, err
    assert f"revoked token {token_id} (ci)" in out
    assert store.resolve(lines[0]) is None
    code, out, err = run_admin(capsys, *base, "token", "revoke", unnamed["id"], "--json")
    assert code == 0, err
    assert json.loads(out)["id"] == unnamed["id"]
    code, out, err = run_admin(capsys, *base, "--json", "token", "list")
    assert json.loads(out) == {"tokens": []}


def test_errors_are_one_line(served, capsys):
    url, store = served
    base = ("--admin", url, "--token", ADMIN_TOKEN)
    code, out, err = run_admin(capsys, "--admin", url, "token", "list")
    assert code == 1 and err.startswith("emberfs admin: 401 ") and len(err.splitlines()) == 1
    code, out, err = run_admin(capsys, "--admin", url, "--token", "wrong", "token", "list")
    assert (code, err.strip()) == (1, "emberfs admin: 403 wrong admin token")
    code, out, err = run_admin(capsys, *base, "token", "revoke", "nobody")
    assert (code, err.strip()) == (1, "emberfs admin: 404 no token 'nobody'")
    code, out, err = run_admin(
        capsys, *base, "token", "create", "--uid", "1", "--gid", "1", "--name", "x"
    )
    assert code == 0, err
    code, out, err = run_admin(
        capsys, *base, "token", "create", "--uid", "2", "--gid", "2", "--name", "x"
    )
    assert code == 1 and err.startswith("emberfs admin: 409 ") and "'x'" in err
    assert "not shown again" not in err
    code, out, err = run_admin(capsys, *base, "token", "create", "--uid", "-1", "--gid", "2")
    assert code == 1 and err.startswith("emberfs admin: 422 uid") and len(err.splitlines()) == 1
    code, out, err = run_admin(
        capsys, *base, "token", "create", "--uid", "1", "--gid", "1", "--groups", "1,x"
    )
    assert code == 2 and "group ids" in err
    code, out, err = run_admin(capsys, *base, "token", "create", "--gid", "1")
    assert code == 2 and "--uid" in err
    assert [t.name for t in store.list()] == ["x"]


def test_names_with_any_printable_character(served, capsys):
    url, store = served
    base = ("--admin", url, "--token", ADMIN_TOKEN)
    name = "team/a b?#%"
    code, out, err = run_admin(
        capsys, *base, "token", "create", "--uid", "1", "--gid", "1", "--name", name
    )
    assert code == 0, err
    code, out, err = run_admin(capsys, *base, "token", "revoke", name)
    assert code == 0, err
    assert store.list() == []


def test_as_a_user_runs_it(served):
    url, store = served
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBERFS_ADMIN")}
    env["EMBERFS_ADMIN_TOKEN"] = ADMIN_TOKEN
    proc = subprocess.run(
        emberfs_command()
        + ["admin", "--admin", url, "token", "create", "--uid", "7", "--gid", "7", "--name", "sub"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    token = proc.stdout.splitlines()[0]
    assert TOKEN_RE.match(token) and store.resolve(token).uid == 7
