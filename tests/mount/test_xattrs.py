"""Extended attributes on a real mount: Python's ``os`` xattr calls (the system calls
``setfattr`` and ``getfattr`` make), libc's size protocol, and the fsspec client agreeing."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import subprocess

import pytest

from emberfs.client.fs import EmberFileSystem
from tests.client.test_fs import meta_calls

pytestmark = pytest.mark.slow

LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
# a well-formed POSIX ACL (version 2; user::rw-, group::r--, other::r--), as setfacl sends it
ACL_644 = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", tag, perm, 0xFFFFFFFF) for tag, perm in ((1, 6), (4, 4), (0x20, 4))
)


@pytest.fixture(scope="module")
def efs(cluster):
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    yield fs
    fs.close()


def raises(errno_value, call, cls=OSError):
    with pytest.raises(cls) as info:
        call()
    assert info.value.errno == errno_value, info.value


def test_set_get_list_remove_through_the_mount(mdir, efs):
    local, remote = mdir
    path = os.path.join(local, "f")
    with open(path, "wb") as f:
        f.write(b"data")
    assert os.listxattr(path) == []
    os.setxattr(path, "user.checksum", b"\x00\x01\xff")
    os.setxattr(path, "user.empty", b"")
    assert os.getxattr(path, "user.checksum") == b"\x00\x01\xff"
    assert os.getxattr(path, "user.empty") == b""
    assert sorted(os.listxattr(path)) == ["user.checksum", "user.empty"]
    # the fsspec client sees what the mount set, and the mount what it sets
    assert efs.getxattr(f"{remote}/f", "user.checksum") == b"\x00\x01\xff"
    efs.setxattr(f"{remote}/f", "user.other", b"from fsspec")
    assert os.getxattr(path, "user.other") == b"from fsspec"
    os.setxattr(path, "user.checksum", b"new")
    assert os.getxattr(path, "user.checksum") == b"new"
    os.removexattr(path, "user.checksum")
    raises(errno.ENODATA, lambda: os.getxattr(path, "user.checksum"))
    raises(errno.ENODATA, lambda: os.removexattr(path, "user.checksum"))
    assert sorted(efs.listxattr(f"{remote}/f")) == ["user.empty", "user.other"]
    # a directory's, and the file's bytes untouched
    os.setxattr(local, "user.dir", b"d")
    assert os.getxattr(local, "user.dir") == b"d"
    with open(path, "rb") as f:
        assert f.read() == b"data"


def test_flags_namespaces_and_limits(mdir):
    local, _ = mdir
    path = os.path.join(local, "f")
    open(path, "wb").close()
    raises(errno.ENODATA, lambda: os.setxattr(path, "user.a", b"1", os.XATTR_REPLACE))
    os.setxattr(path, "user.a", b"1", os.XATTR_CREATE)
    raises(errno.EEXIST, lambda: os.setxattr(path, "user.a", b"2", os.XATTR_CREATE))
    os.setxattr(path, "user.a", b"3", os.XATTR_REPLACE)
    assert os.getxattr(path, "user.a") == b"3"
    raises(errno.EOPNOTSUPP, lambda: os.setxattr(path, "system.posix_acl_access", ACL_644))
    raises(errno.EOPNOTSUPP, lambda: os.getxattr(path, "system.posix_acl_access"))
    raises(errno.EOPNOTSUPP, lambda: os.setxattr(path, "os2.x", b""))
    raises(errno.ERANGE, lambda: os.setxattr(path, "user." + "n" * 251, b""))
    raises(errno.E2BIG, lambda: os.setxattr(path, "user.big", b"x" * 65537))
    os.setxattr(path, "user." + "n" * 250, b"")  # 255 bytes
    os.setxattr(path, "user.big", os.urandom(65536))
    assert len(os.getxattr(path, "user.big")) == 65536
    os.setxattr(path, "user.big2", b"x" * 65000)
    raises(errno.ENOSPC, lambda: os.setxattr(path, "user.more", b"x" * 1000))
    # trusted.* and security.*: this test runs as root, and the mount acts as uid 0
    os.setxattr(path, "trusted.t", b"t")
    os.setxattr(path, "security.s", b"s")
    assert os.getxattr(path, "trusted.t") == b"t" and os.getxattr(path, "security.s") == b"s"


def test_the_size_protocol(mdir):
    local, _ = mdir
    path = os.path.join(local, "f").encode()
    open(path, "wb").close()
    os.setxattr(path, "user.twelve", b"twelve bytes")
    assert LIBC.getxattr(path, b"user.twelve", None, 0) == 12  # size 0: the length
    small = ctypes.create_string_buffer(4)
    assert LIBC.getxattr(path, b"user.twelve", small, 4) == -1
    assert ctypes.get_errno() == errno.ERANGE
    buf = ctypes.create_string_buffer(12)
    assert LIBC.getxattr(path, b"user.twelve", buf, 12) == 12 and buf.raw == b"twelve bytes"
    names_length = len(b"user.twelve\0")
    assert LIBC.listxattr(path, None, 0) == names_length
    assert LIBC.listxattr(path, small, 4) == -1 and ctypes.get_errno() == errno.ERANGE


def test_symlinks_links_renames_and_removal(mdir, efs):
    local, remote = mdir
    path = os.path.join(local, "f")
    with open(path, "wb") as f:
        f.write(b"x")
    link = os.path.join(local, "l")
    os.symlink(path, link)
    os.setxattr(link, "user.through", b"1")  # followed: the file's
    assert os.listxattr(path) == ["user.through"]
    assert os.listxattr(link, follow_symlinks=False) == []
    raises(errno.EPERM, lambda: os.setxattr(link, "user.x", b"", follow_symlinks=False))
    os.setxattr(link, "trusted.own", b"link's", follow_symlinks=False)
    assert os.getxattr(link, "trusted.own", follow_symlinks=False) == b"link's"
    assert efs.listxattr(f"{remote}/l", follow_symlinks=False) == ["trusted.own"]
    os.link(path, os.path.join(local, "h"))
    os.rename(path, os.path.join(local, "moved"))
    assert os.getxattr(os.path.join(local, "h"), "user.through") == b"1"
    assert os.getxattr(os.path.join(local, "moved"), "user.through") == b"1"
    os.unlink(os.path.join(local, "moved"))
    os.unlink(os.path.join(local, "h"))
    with open(path, "wb") as f:  # a new file under the old name starts with none
        f.write(b"y")
    assert os.listxattr(path) == []


def test_writes_ask_the_metaserver_for_no_attribute_each(mdir, efs, cluster):
    """The kernel asks for ``security.capability`` before writes; the mount answers from what it
    read, so a stream of writes does not make a ``GetXattr`` call each."""
    local, remote = mdir
    path = os.path.join(local, "w")
    data = os.urandom(3 * 1024 * 1024 + 5)
    writes = 0
    before = meta_calls(cluster).get("GetXattr", 0)
    with open(path, "wb", buffering=0) as f:
        os.setxattr(path, "user.tag", b"t")
        for i in range(0, len(data), 65536):
            f.write(data[i : i + 65536])
            writes += 1
    calls = meta_calls(cluster).get("GetXattr", 0) - before
    assert calls < writes // 4, (calls, writes)
    assert efs.cat_file(f"{remote}/w") == data
    assert os.getxattr(path, "user.tag") == b"t"


def test_another_user_is_checked_by_the_kernel(cluster, mounter):
    """With ``--allow-other`` each caller meets Linux's rules: mode bits for ``user.*``,
    ``trusted.*`` hidden and unreadable, changes of ``trusted.*`` and ``security.*`` refused."""
    mp = mounter(cluster.meta_address, "--allow-other")
    base = os.path.join(str(mp), f"xattr-{os.getpid()}")
    os.mkdir(base, 0o755)
    shared, private = f"{base}/shared", f"{base}/private"
    for path, mode in ((shared, 0o666), (private, 0o600)):
        open(path, "wb").close()
        os.chmod(path, mode)
        os.setxattr(path, "user.u", b"u")
        os.setxattr(path, "trusted.t", b"t")
    script = (
        "import errno, os\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "out = []\n"
        "def run(call):\n"
        "    try:\n"
        "        r = call(); out.append(repr(r))\n"
        "    except OSError as e:\n"
        "        out.append(errno.errorcode[e.errno])\n"
        f"s, p = {shared!r}, {private!r}\n"
        "run(lambda: sorted(os.listxattr(s)))\n"
        "run(lambda: os.getxattr(s, 'user.u'))\n"
        "run(lambda: os.setxattr(s, 'user.mine', b'm'))\n"
        "run(lambda: os.getxattr(s, 'trusted.t'))\n"
        "run(lambda: os.setxattr(s, 'trusted.x', b''))\n"
        "run(lambda: os.setxattr(s, 'security.x', b''))\n"
        "run(lambda: os.getxattr(p, 'user.u'))\n"
        "run(lambda: os.setxattr(p, 'user.x', b''))\n"
        "print('|'.join(out))\n"
    )
    done = subprocess.run(["python", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split("|") == [
        "['user.u']",
        "b'u'",
        "None",
        "ENODATA",
        "EPERM",
        "EPERM",
        "EACCES",
        "EACCES",
    ]
    assert os.getxattr(shared, "user.mine") == b"m"
    assert sorted(os.listxattr(shared)) == ["trusted.t", "user.mine", "user.u"]
