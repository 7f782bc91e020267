"""Every failure surfaces as the builtin exception a Python user expects."""

from __future__ import annotations

import errno
import time

import pytest

from emberfs.cli.admin import AdminClient
from emberfs.client.fs import EmberFileSystem


def test_file_not_found(fs, base):
    missing = f"{base}/missing"
    for call in (
        lambda: fs.info(missing),
        lambda: fs.open(missing, "rb"),
        lambda: fs.cat_file(missing),
        lambda: fs.ls(missing),
        lambda: fs.rm(missing),
        lambda: fs.rmdir(missing),
        lambda: fs.mv(missing, f"{base}/elsewhere"),
        lambda: fs.modified(missing),
    ):
        with pytest.raises(FileNotFoundError):
            call()
    strict = EmberFileSystem(fs.meta, auto_mkdir=False, skip_instance_cache=True)
    with pytest.raises(FileNotFoundError):
        strict.open(f"{base}/no/parent", "wb")
    with pytest.raises(FileNotFoundError):
        strict.pipe_file(f"{base}/no/parent", b"x")
    strict.close()


def test_file_exists(fs, base):
    fs.pipe_file(f"{base}/f", b"1")
    fs.mkdir(f"{base}/d")
    with pytest.raises(FileExistsError):
        fs.open(f"{base}/f", "xb")
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{base}/f", b"2", mode="create")
    with pytest.raises(FileExistsError):
        fs.mkdir(f"{base}/d")
    with pytest.raises(FileExistsError):
        fs.mkdir(f"{base}/f")
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{base}/d")
    assert fs.cat_file(f"{base}/f") == b"1"


def test_is_a_directory(fs, base):
    fs.mkdir(f"{base}/d")
    with pytest.raises(IsADirectoryError):
        fs.open(f"{base}/d", "rb")
    with pytest.raises(IsADirectoryError):
        fs.open(f"{base}/d", "wb")
    with pytest.raises(IsADirectoryError):
        fs.cat_file(f"{base}/d")
    with pytest.raises(IsADirectoryError):
        fs.rm_file(f"{base}/d")


def test_not_a_directory(fs, base):
    fs.pipe_file(f"{base}/f", b"1")
    with pytest.raises(NotADirectoryError):
        fs.info(f"{base}/f/below")
    with pytest.raises(NotADirectoryError):
        fs.mkdir(f"{base}/f/sub", create_parents=False)
    with pytest.raises(NotADirectoryError):
        fs.open(f"{base}/f/new", "wb")
    with pytest.raises(NotADirectoryError):
        fs.rmdir(f"{base}/f")


def test_directory_not_empty(fs, base):
    fs.pipe_file(f"{base}/d/f", b"1")
    with pytest.raises(OSError) as exc:
        fs.rmdir(f"{base}/d")
    assert exc.value.errno == errno.ENOTEMPTY
    with pytest.raises(OSError) as exc:
        fs.rm(f"{base}/d")
    assert exc.value.errno in (errno.ENOTEMPTY, errno.EISDIR)
    assert fs.cat_file(f"{base}/d/f") == b"1"


def test_permission_denied(cluster, base):
    # the metaserver checks permission bits against the identity of the caller's token
    admin = AdminClient(cluster.admin_url, cluster.admin_token)

    def user(uid: int) -> EmberFileSystem:
        made = admin.post(
            "/api/v1/tokens", {"uid": uid, "gid": uid, "groups": [], "name": f"{base}-{uid}"}
        )
        return EmberFileSystem(cluster.meta_address, token=made["token"], skip_instance_cache=True)

    fs = user(4242)
    try:
        root_owned = f"/perm-{base.strip('/')}"
        owner = user(4343)
        owner.makedirs(root_owned)
        owner.client.meta.setattr(root_owned, mode=0o700)
        owner.pipe_file(f"{root_owned}/secret", b"s")
        with pytest.raises(PermissionError):
            fs.ls(root_owned)
        with pytest.raises(PermissionError):
            fs.pipe_file(f"{root_owned}/new", b"x")
        with pytest.raises(PermissionError):
            fs.cat_file(f"{root_owned}/secret")
        owner.rm(root_owned, recursive=True)
        owner.close()
    finally:
        fs.close()


def test_invalid_names(fs, base):
    with pytest.raises(OSError) as exc:
        fs.pipe_file(f"{base}/" + "n" * 300, b"x")
    assert exc.value.errno in (errno.ENAMETOOLONG, errno.EINVAL)


def test_unreachable_metaserver_is_a_clear_error():
    fs = EmberFileSystem("127.0.0.1:1", retry_timeout=1.0, skip_instance_cache=True)
    start = time.monotonic()
    with pytest.raises(OSError) as exc:
        fs.info("/")
    assert exc.value.errno in (errno.EAGAIN, errno.ETIMEDOUT)
    assert time.monotonic() - start < 10
    fs.close()
