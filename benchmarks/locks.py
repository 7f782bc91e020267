"""Locks through the FUSE mount: uncontended lock and unlock, and the hand-over across mounts.

    python -m benchmarks.locks [--pairs N] [--handovers N]

Starts a ``LocalCluster`` (2 storage servers, R = 2) and two ``emberfs mount`` daemons of it,
then measures, on one file: ``flock`` ``LOCK_EX`` + ``LOCK_UN`` pairs and ``lockf`` lock +
unlock pairs of 10 bytes through one mount (nobody else holds a lock), and the time from a
release on one mount to the grant of a process blocked in ``flock`` on the other. Needs
``/dev/fuse`` and ``fusermount3`` (docs/mount.md#locks).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from emberfs.cli.localcluster import LocalCluster
from emberfs.cli.processes import emberfs_command

WAITER = (
    "import fcntl, sys, time\n"
    "f = open(sys.argv[1], 'rb')\n"
    "print('waiting', flush=True)\n"
    "fcntl.flock(f, fcntl.LOCK_EX)\n"
    "print(time.monotonic(), flush=True)\n"
)


def mount(meta: str) -> str:
    mp = tempfile.mkdtemp(prefix="emberfs-locks-")
    subprocess.run(emberfs_command() + ["mount", mp, "--meta", meta], check=True)
    return mp


def pairs(fd: int, n: int, lock, unlock) -> float:
    """Seconds one lock + unlock pair takes, the mean of ``n``."""
    started = time.perf_counter()
    for _ in range(n):
        lock(fd)
        unlock(fd)
    return (time.perf_counter() - started) / n


def handover(holder_path: str, waiter_path: str) -> float:
    """Seconds from the holder's release to the grant of a waiter blocked on another mount."""
    fd = os.open(holder_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, waiter_path], stdout=subprocess.PIPE, text=True
        )
        assert waiter.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # it is blocked in flock(2) by now
        released = time.monotonic()
        fcntl.flock(fd, fcntl.LOCK_UN)
        granted = float(waiter.stdout.readline())
        waiter.wait(10)
        return granted - released
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=300)
    p.add_argument("--handovers", type=int, default=11)
    args = p.parse_args(argv)
    token = os.environ.get("EMBERFS_ADMIN_TOKEN") or secrets.token_urlsafe(32)
    os.environ["EMBERFS_TOKEN"] = token
    root = Path(tempfile.mkdtemp(prefix="emberfs-locks-bench-"))
    with LocalCluster(root, storage_servers=2, replicas=2, admin_token=token) as cluster:
        mounts = [mount(cluster.meta_address) for _ in range(2)]
        try:
            name = f"locks-{uuid.uuid4().hex[:8]}"
            paths = [os.path.join(mp, name) for mp in mounts]
            open(paths[0], "wb").close()
            fd = os.open(paths[0], os.O_RDWR)
            try:
                flock = pairs(
                    fd,
                    args.pairs,
                    lambda f: fcntl.flock(f, fcntl.LOCK_EX),
                    lambda f: fcntl.flock(f, fcntl.LOCK_UN),
                )
                lockf = pairs(
                    fd,
                    args.pairs,
                    lambda f: fcntl.lockf(f, fcntl.LOCK_EX, 10, 0),
                    lambda f: fcntl.lockf(f, fcntl.LOCK_UN, 10, 0),
                )
            finally:
                os.close(fd)
            hand = [handover(paths[0], paths[1]) for _ in range(args.handovers)]
        finally:
            for mp in mounts:
                subprocess.run(["fusermount3", "-u", mp], check=False)
    print(f"uncontended flock LOCK_EX + LOCK_UN: {flock * 1e3:.2f} ms a pair")
    print(f"uncontended lockf 10 bytes, lock + unlock: {lockf * 1e3:.2f} ms a pair")
    print(
        f"hand-over to a process blocked on the other mount: median "
        f"{statistics.median(hand) * 1e3:.0f} ms, max {max(hand) * 1e3:.0f} ms ({len(hand)} runs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
