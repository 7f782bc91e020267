"""Fixtures of the FUSE mount tests: real ``emberfs mount`` daemons on real clusters.

``mounter`` mounts with the ``emberfs mount`` command (a daemon process, as a user runs it)
and unmounts whatever is left at the end; ``mount`` is one mount of the shared cluster for a
whole module, ``mdir`` a fresh directory in it with its EmberFS path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid

import pytest

from emberfs.cli.processes import emberfs_command

pytestmark = pytest.mark.slow


def fuse_available() -> str | None:
    """Why FUSE mounts cannot be tested here (None when they can)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse3: {exc}"
    return None


def mounted(path) -> bool:
    """True while ``path`` is a mountpoint (read from the mount table: no call into the mount,
    which may be waiting for a metaserver that is gone)."""
    path = os.path.realpath(str(path))
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def unmount(path) -> None:
    """Unmount ``path`` if it is mounted, waiting until it is gone."""
    path = str(path)
    if not mounted(path):
        return
    subprocess.run(["fusermount3", "-u", path], capture_output=True)
    deadline = time.monotonic() + 15
    while mounted(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    if mounted(path):
        subprocess.run(["fusermount3", "-uz", path], capture_output=True)


class Mounter:
    """Runs ``emberfs mount`` against a cluster; remembers what to unmount."""

    def __init__(self, tmp_path_factory) -> None:
        self._tmp = tmp_path_factory
        self.mounted: list = []
        self.made: list[str] = []

    def command(self, mountpoint, meta: str, *args: str, check: bool = True):
        """Run ``emberfs mount MOUNTPOINT --meta META ARGS`` and return the finished process."""
        log = os.path.join(str(self._tmp.getbasetemp()), f"mount-{uuid.uuid4().hex[:8]}.log")
        done = subprocess.run(
            emberfs_command() + ["mount", str(mountpoint), "--meta", meta, "--log", log, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode == 0:
            self.mounted.append(mountpoint)
        if check:
            assert done.returncode == 0, done.stderr
        return done

    def mountpoint(self) -> str:
        """A fresh empty directory to mount on, outside pytest's temporary tree.

        (pytest deletes old temporary trees; a mount inside one would have its files deleted.)
        """
        mp = tempfile.mkdtemp(prefix="emberfs-mnt-")
        self.made.append(mp)
        return mp

    def __call__(self, meta: str, *args: str):
        """Mount at a fresh directory; returns the mountpoint."""
        mp = self.mountpoint()
        self.command(mp, meta, *args)
        assert os.path.ismount(mp)
        return mp

    def unmount_all(self) -> None:
        for mp in self.mounted:
            unmount(mp)
        for mp in self.made:
            if not mounted(mp):
                shutil.rmtree(mp, ignore_errors=True)


@pytest.fixture(scope="module")
def mounter(tmp_path_factory):
    why = fuse_available()
    if why:
        pytest.skip(why)
    m = Mounter(tmp_path_factory)
    try:
        yield m
    finally:
        m.unmount_all()


@pytest.fixture(scope="module")
def mount(cluster, mounter):
    """One mount of the shared cluster for the module (defaults of ``emberfs mount``)."""
    return mounter(cluster.meta_address)


@pytest.fixture
def mdir(mount):
    """A fresh directory on the mount: ``(local path, EmberFS path)``."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    local = os.path.join(str(mount), name)
    os.mkdir(local)
    yield local, f"/{name}"
    shutil.rmtree(local, ignore_errors=True)
