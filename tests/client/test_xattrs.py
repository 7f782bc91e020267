"""Extended attributes through ``EmberFileSystem``: the methods, ``info``, and the errors."""

from __future__ import annotations

import errno
import os

import pytest

from emberfs.cli.admin import AdminClient
from emberfs.client.fs import EmberFileSystem


def raises(errno_value, call, cls=OSError):
    with pytest.raises(cls) as info:
        call()
    assert info.value.errno == errno_value, info.value
    return info.value


def test_set_get_list_remove_and_info(fs, base):
    path = f"{base}/f"
    fs.pipe_file(path, b"data")
    info = fs.info(path)
    assert "xattrs" not in info  # none yet
    fs.setxattr(path, "user.checksum", b"\x00\xff")
    fs.setxattr(f"emberfs://{fs.meta}{path}", b"user.origin", bytearray(b"s3://b/k"))
    assert fs.getxattr(path, "user.checksum") == b"\x00\xff"
    assert fs.listxattr(path) == ["user.checksum", "user.origin"]
    info = fs.info(path)
    assert info["xattrs"] == {"user.checksum": b"\x00\xff", "user.origin": b"s3://b/k"}
    assert info["size"] == 4 and info["ctime"] >= info["mtime"]
    fs.removexattr(path, "user.origin")
    assert fs.listxattr(path) == ["user.checksum"]
    err = raises(errno.ENODATA, lambda: fs.getxattr(path, "user.origin"))
    assert err.filename == path
    raises(errno.ENODATA, lambda: fs.removexattr(path, "user.origin"))
    assert fs.cat_file(path) == b"data"  # the data is untouched
    # directories have them too
    fs.setxattr(base, "user.team", b"a")
    assert fs.info(base)["xattrs"] == {"user.team": b"a"}
    assert "xattrs" not in fs.ls(base, detail=True)[0]  # a listing carries none


def test_flags_are_os_flags(fs, base):
    path = f"{base}/f"
    fs.touch(path)
    raises(errno.ENODATA, lambda: fs.setxattr(path, "user.a", b"1", flags=os.XATTR_REPLACE))
    fs.setxattr(path, "user.a", b"1", flags=os.XATTR_CREATE)
    raises(
        errno.EEXIST,
        lambda: fs.setxattr(path, "user.a", b"2", flags=os.XATTR_CREATE),
        FileExistsError,
    )
    fs.setxattr(path, "user.a", b"3", flags=os.XATTR_REPLACE)
    assert fs.getxattr(path, "user.a") == b"3"


def test_bad_input_is_a_clear_error(fs, base):
    path = f"{base}/f"
    fs.touch(path)
    raises(errno.EOPNOTSUPP, lambda: fs.setxattr(path, "system.posix_acl_access", b""))
    raises(errno.EOPNOTSUPP, lambda: fs.getxattr(path, "nonamespace"))
    raises(errno.ERANGE, lambda: fs.setxattr(path, "user." + "n" * 251, b""))
    raises(errno.E2BIG, lambda: fs.setxattr(path, "user.big", b"x" * 65537))
    raises(errno.EINVAL, lambda: fs.setxattr(path, b"user.\xff", b""))
    raises(errno.EINVAL, lambda: fs.setxattr(path, "user.", b""))
    raises(errno.ENOENT, lambda: fs.getxattr(f"{base}/missing", "user.a"), FileNotFoundError)
    with pytest.raises(TypeError):
        fs.setxattr(path, "user.a", "not bytes")
    with pytest.raises(TypeError):
        fs.setxattr(path, 7, b"")
    fs.setxattr(path, "user.big", b"x" * 65536)
    fs.setxattr(path, "user.big2", b"x" * 65400)  # 130,953 bytes of names and values
    raises(errno.ENOSPC, lambda: fs.setxattr(path, "user.more", b"x" * 200))
    assert fs.listxattr(path) == ["user.big", "user.big2"]  # nothing half done


def test_symlinks_and_links_and_renames(fs, base):
    path = f"{base}/f"
    fs.pipe_file(path, b"x")
    fs.client.meta.symlink(f"{base}/l", path)
    fs.setxattr(f"{base}/l", "user.via-link", b"1")  # followed
    assert fs.listxattr(path) == ["user.via-link"]
    assert fs.listxattr(f"{base}/l", follow_symlinks=False) == []
    raises(
        errno.EPERM,
        lambda: fs.setxattr(f"{base}/l", "user.x", b"", follow_symlinks=False),
        PermissionError,
    )
    fs.client.meta.hardlink(path, f"{base}/h")
    fs.mv(path, f"{base}/moved")
    assert fs.getxattr(f"{base}/h", "user.via-link") == b"1"
    fs.rm(f"{base}/moved")
    assert fs.getxattr(f"{base}/h", "user.via-link") == b"1"
    # a new file under the old name starts with none
    fs.pipe_file(path, b"y")
    assert fs.listxattr(path) == []


def test_permissions_follow_the_token(cluster, fs, base):
    admin = AdminClient(cluster.admin_url, cluster.admin_token)

    def user(uid: int) -> EmberFileSystem:
        made = admin.post(
            "/api/v1/tokens", {"uid": uid, "gid": uid, "groups": [], "name": f"{base}-x{uid}"}
        )
        return EmberFileSystem(cluster.meta_address, token=made["token"], skip_instance_cache=True)

    alice, bob = user(5151), user(5252)
    try:
        fs.client.meta.setattr(base, mode=0o777)
        path = f"{base}/alices"
        alice.pipe_file(path, b"a")
        alice.setxattr(path, "user.note", b"mine")
        raises(errno.EACCES, lambda: bob.setxattr(path, "user.x", b""), PermissionError)
        raises(errno.EACCES, lambda: bob.removexattr(path, "user.note"), PermissionError)
        assert bob.getxattr(path, "user.note") == b"mine"  # 0644: readable
        alice.client.meta.setattr(path, mode=0o600)
        raises(errno.EACCES, lambda: bob.getxattr(path, "user.note"), PermissionError)
        assert bob.listxattr(path) == ["user.note"]  # names need no permission
        assert "xattrs" not in bob.info(path)  # only values the caller may read
        raises(errno.EPERM, lambda: alice.setxattr(path, "trusted.t", b""), PermissionError)
        raises(errno.EPERM, lambda: alice.setxattr(path, "security.s", b""), PermissionError)
        fs.setxattr(path, "trusted.t", b"root's")  # the admin token acts as uid 0
        assert alice.listxattr(path) == ["user.note"]
        assert fs.listxattr(path) == ["trusted.t", "user.note"]
        raises(errno.ENODATA, lambda: alice.getxattr(path, "trusted.t"))
    finally:
        alice.close()
        bob.close()
