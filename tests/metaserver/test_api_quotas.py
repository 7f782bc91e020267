"""``/api/v1/quotas`` of a real metaserver process: list, read, set, remove, errors."""

from __future__ import annotations

import errno
import os
import uuid

import httpx
import pytest

TOKEN = os.environ["EMBERFS_ADMIN_TOKEN"]  # the suite's admin token (tests/conftest.py)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MiB = 1 << 20
FIELDS = {"path", "inode", "max_bytes", "max_inodes", "used_bytes", "used_inodes"}


def api(cluster, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, cluster.admin_url + path, timeout=10, **kwargs)


@pytest.fixture
def base(fs):
    path = f"/apiquota-{uuid.uuid4().hex[:10]}"
    fs.mkdir(path)
    yield path
    fs.rm(path, recursive=True)


def test_set_read_list_and_remove(cluster, fs, base):
    fs.makedirs(f"{base}/d")
    fs.pipe_file(f"{base}/d/a", b"a" * MiB)
    resp = api(cluster, "PUT", f"/api/v1/quotas{base}", json={"max_bytes": 8 * MiB}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    q = resp.json()
    assert q == {
        "path": base,
        "inode": q["inode"],
        "max_bytes": 8 * MiB,
        "max_inodes": 0,
        "used_bytes": MiB,
        "used_inodes": 2,
        "over": False,
    }
    # what the API set, the file system enforces
    with pytest.raises(OSError) as exc:
        fs.pipe_file(f"{base}/big", os.urandom(8 * MiB))
    assert exc.value.errno == errno.EDQUOT
    # a limit left out is kept; a leading slash or none, the same directory
    resp = api(cluster, "PUT", f"/api/v1/quotas/{base}", json={"max_inodes": 1}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert resp.json()["max_bytes"] == 8 * MiB and resp.json()["over"] is True
    got = api(cluster, "GET", f"/api/v1/quotas{base}").json()
    assert set(got) == FIELDS and got["max_inodes"] == 1
    assert got == {k: v for k, v in fs.quota_get(base).items()}
    listed = api(cluster, "GET", "/api/v1/quotas").json()["quotas"]
    assert [x for x in listed if x["path"] == base] == [got]
    assert [x["path"] for x in listed] == sorted(x["path"] for x in listed)

    resp = api(cluster, "DELETE", f"/api/v1/quotas{base}", headers=AUTH)
    assert resp.status_code == 200 and resp.json() == got
    assert api(cluster, "GET", f"/api/v1/quotas{base}").status_code == 404
    assert all(x["path"] != base for x in api(cluster, "GET", "/api/v1/quotas").json()["quotas"])
    fs.pipe_file(f"{base}/big", b"b")  # no limit any more


def test_errors(cluster, fs, base):
    fs.pipe_file(f"{base}/file", b"f")
    for method in ("GET", "DELETE"):
        resp = api(cluster, method, f"/api/v1/quotas{base}", headers=AUTH)
        assert resp.status_code == 404 and resp.json() == {"detail": "no quota on this directory"}
    resp = api(cluster, "PUT", f"/api/v1/quotas{base}/none", json={}, headers=AUTH)
    assert resp.status_code == 404, resp.text
    resp = api(cluster, "PUT", f"/api/v1/quotas{base}/file", json={"max_bytes": 1}, headers=AUTH)
    assert resp.status_code == 400 and "not a directory" in resp.json()["detail"]
    assert api(cluster, "GET", f"/api/v1/quotas{base}/file").status_code == 400
    for body in ({"max_bytes": -1}, {"max_inodes": 1 << 63}, {"max_bytes": "lots"}, []):
        resp = api(cluster, "PUT", f"/api/v1/quotas{base}", json=body, headers=AUTH)
        assert resp.status_code == 422, (body, resp.text)
    resp = api(cluster, "GET", "/api/v1/quotas/" + "n" * 300)
    assert resp.status_code == 400, resp.text
    # setting and removing need the admin token; nothing is applied without it
    resp = api(cluster, "PUT", f"/api/v1/quotas{base}", json={"max_bytes": 1})
    assert resp.status_code == 401
    resp = api(
        cluster,
        "PUT",
        f"/api/v1/quotas{base}",
        json={"max_bytes": 1},
        headers={"Authorization": "Bearer guess"},
    )
    assert resp.status_code == 403 and resp.json() == {"detail": "wrong admin token"}
    assert api(cluster, "GET", f"/api/v1/quotas{base}").status_code == 404
    assert api(cluster, "PUT", f"/api/v1/quotas{base}", json={}, headers=AUTH).status_code == 200
    assert api(cluster, "DELETE", f"/api/v1/quotas{base}").status_code == 401
    assert api(cluster, "GET", f"/api/v1/quotas{base}").status_code == 200
