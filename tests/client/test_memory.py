"""``keep_memory``: whole-file results come from the process's heap and their pages are reused."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

# Larger than glibc's largest mmap threshold (32 MiB): without keep_memory every
# result of this size gets a mapping of its own.
SIZE = 40 * 1024 * 1024

CHILD = textwrap.dedent(
    """
    import ctypes, hashlib, json, sys
    from emberfs.client.fs import EmberFileSystem

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2

    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

    meta, path, keep = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    fs = EmberFileSystem(meta, keep_memory=keep, skip_instance_cache=True)
    out = {"rounds": [], "rss_before": rss()}
    for how in ("read", "cat", "read"):
        if how == "read":
            with fs.open(path, "rb") as f:
                data = f.read()
        else:
            data = fs.cat_file(path)
        info = libc.mallinfo2()
        out["rounds"].append({
            "how": how,
            "sha": hashlib.sha256(data).hexdigest(),
            "mapped": info.hblkhd,
            "heap": info.arena,
        })
        del data
        out["rounds"][-1]["rss_after_free"] = rss()
    print(json.dumps(out), flush=True)
    """
)


def run_child(cluster, path: str, keep: bool) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, cluster.meta_address, path, "1" if keep else "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="keep_memory sets glibc's malloc",
)
def test_keep_memory_serves_results_from_the_heap_and_keeps_it(cluster, fs, base):
    payload = os.urandom(SIZE)
    fs.pipe_file(f"{base}/big", payload)
    want = hashlib.sha256(payload).hexdigest()

    plain = run_child(cluster, f"{base}/big", keep=False)
    kept = run_child(cluster, f"{base}/big", keep=True)

    for report in (plain, kept):
        assert [r["sha"] for r in report["rounds"]] == [want] * 3
    # default malloc: every whole-file result is a mapping of its own, returned when freed
    for r in plain["rounds"]:
        assert r["mapped"] >= SIZE
        assert r["rss_after_free"] - plain["rss_before"] < SIZE // 2
    # keep_memory: the results come from the heap, which keeps the freed pages
    # for the next result instead of growing by another result's size
    for r in kept["rounds"]:
        assert r["mapped"] < SIZE
        assert r["heap"] >= SIZE
        assert r["rss_after_free"] - kept["rss_before"] >= SIZE
    heaps = [r["heap"] for r in kept["rounds"]]
    assert max(heaps) - min(heaps) < SIZE // 2, heaps


def test_keep_freed_memory_reports_what_it_did():
    code = textwrap.dedent(
        """
        import os
        from emberfs.client.memory import keep_freed_memory
        glibc = os.confstr("CS_GNU_LIBC_VERSION") is not None
        first, again = keep_freed_memory(), keep_freed_memory()
        print(glibc, first, again)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    glibc = out[0] == "True"
    assert out[1:] == [str(glibc), str(glibc)]
