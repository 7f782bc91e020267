"""Training jobs on EmberFS with real PyTorch: DCP checkpoints, torch.save, a forked DataLoader.

Checkpoints are saved by real processes: this one, gloo ranks holding DTensor shards
(``torchjob.py``), and forked children that are killed with ``kill -9`` at the two steps of the
publish and at times spread over a whole save; the checkpoint's path then holds the previous
checkpoint or the new one, whole.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader, FsspecWriter  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from emberfs.cli.admin import AdminClient  # noqa: E402
from emberfs.client.checkpoint import (  # noqa: E402
    CheckpointReader,
    CheckpointWriter,
    ItemFetcher,
    ViewReader,
    staging_path,
)
from emberfs.client.fs import EmberFileSystem  # noqa: E402

from .torchjob import state  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "torchjob.py")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(*args, ranks: int = 1, **popen) -> subprocess.Popen:
    cmd = [sys.executable, JOB, *map(str, args), "--ranks", str(ranks), "--port", str(free_port())]
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(cmd, start_new_session=True, text=True, **popen)


def finished(proc: subprocess.Popen, timeout: float = 180) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


def url(cluster, path: str) -> str:
    return f"emberfs://{cluster.meta_address}{path}"


def loaded(cluster, path: str, like: dict, reader=CheckpointReader) -> dict:
    target = {k: torch.zeros_like(v) for k, v in like.items()}
    dcp.load(target, storage_reader=reader(url(cluster, path)))
    return target


def test_dcp_one_process_round_trip_and_replace(cluster, fs, base):
    path = f"{base}/ckpt"
    for seed in (1, 2):  # the second save replaces the first, whole
        dcp.save(state(seed, 4), storage_writer=CheckpointWriter(url(cluster, path)))
        got = loaded(cluster, path, state(0, 4))
        assert all(torch.equal(got[k], v) for k, v in state(seed, 4).items())
    assert sorted(fs.ls(base, detail=False)) == [path]  # no staging directory left
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(path, detail=False))
    assert names[0] == ".metadata" and all(n.startswith("__0_") for n in names[1:]), names


def test_reader_reads_large_tensors_in_place_and_the_rest_as_dcp_does(cluster, base):
    path = f"{base}/mixed"
    saved = state(4, 8)  # four 2 MiB matrices: read in place
    saved["bias"] = torch.arange(1000, dtype=torch.float64)  # small: deserialized
    saved["half"] = torch.randn(1024, 1024).to(torch.bfloat16)  # a dtype numpy lacks
    saved["extra"] = {"epoch": 7, "name": "run-1"}  # not a tensor: bytes
    dcp.save(saved, storage_writer=CheckpointWriter(url(cluster, path)))
    target = {k: torch.zeros_like(v) for k, v in saved.items() if isinstance(v, torch.Tensor)}
    target["extra"] = {"epoch": 0, "name": ""}
    target["layer0.weight"] = target["layer0.weight"].t().contiguous().t()  # not contiguous
    reader = CheckpointReader(url(cluster, path), ahead=1 << 20)
    dcp.load(target, storage_reader=reader)
    for k, v in saved.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(target[k], v), k
    assert target["extra"] == {"epoch": 7, "name": "run-1"}
    matrix = 8 * (1 << 20) // 4
    # three matrices and the bf16 one in place; the transposed one and the rest deserialized
    assert reader.direct_bytes == 3 * matrix + 2 * (1 << 20)
    assert reader.fetched_bytes > matrix


def test_dcp_fsspec_writer_and_reader_unchanged_work_too(cluster, base):
    path = f"{base}/plain"
    dcp.save(state(3, 2), storage_writer=FsspecWriter(url(cluster, path), sync_files=False))
    got = loaded(cluster, path, state(0, 2), reader=FsspecReader)
    assert all(torch.equal(got[k], v) for k, v in state(3, 2).items())


def test_item_fetcher_keeps_its_window_reuses_buffers_and_reads_each_range_once():
    fetched = []

    def read_into(key, view):
        fetched.append(key)
        view[:] = key[0].encode() * key[2]

    order = [("a", 0, 4), ("a", 4, 4), ("b", 0, 4), ("a", 0, 4), ("c", 0, 4), ("d", 0, 8)]
    fetcher = ItemFetcher(order, read_into, ahead=8, threads=1)
    try:
        assert fetcher.take(("b", 0, 4)) == b"bbbb"  # out of order: read at once
        first = fetcher.take(("a", 0, 4))
        assert first == b"aaaa"
        assert fetcher.take(("a", 4, 4)) == b"aaaa"
        assert fetcher.take(("a", 0, 4)) == b"aaaa"  # its second use: still held
        assert fetcher.take(("c", 0, 4)) == b"cccc"
        assert fetcher.take(("d", 0, 8)) == b"dddddddd"
        assert fetcher.held == 0
        assert fetcher.spare.kept <= 8  # spare buffers: at most ahead bytes
    finally:
        fetcher.close()
    assert sorted(fetched) == sorted(set(order))
    assert fetcher.spare.kept >= 4  # a taken range's buffer kept for reuse


def test_view_reader_reads_and_seeks_like_a_file():
    reader = ViewReader(memoryview(b"0123456789"))
    assert reader.read(3) == b"012" and reader.tell() == 3
    assert reader.seek(-2, io.SEEK_END) == 8 and reader.read() == b"89"
    assert reader.seek(1) == 1 and reader.read(100) == b"123456789" and reader.read(1) == b""
    with pytest.raises(ValueError):
        reader.seek(-1)


def test_dcp_gloo_ranks_save_shards_one_process_loads_whole(cluster, base):
    path = f"{base}/sharded"
    assert "saved" in finished(job("save", url(cluster, path), 5, 8, ranks=2))
    # the two ranks load their own shards back
    finished(job("load", url(cluster, path), 5, 8, ranks=2))
    # and one process loads the whole tensors from the two ranks' files
    got = loaded(cluster, path, state(0, 8))
    assert all(torch.equal(got[k], v) for k, v in state(5, 8).items())


def test_torch_save_and_load_through_fs_open(fs, base):
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    tmp, final = f"{base}/model.pt.tmp", f"{base}/model.pt"
    with fs.open(tmp, "wb") as f:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f)
    fs.mv(tmp, final)  # replaces an older model.pt atomically
    with fs.open(final, "rb") as f:
        back = torch.load(f, weights_only=True)
    for k, v in model.state_dict().items():
        assert torch.equal(back["model"][k], v)
    assert back["opt"]["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    # a buffer round trip gives the same bytes as the file
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    assert len(fs.cat_file(final)) == len(buf.getvalue())


class Shards(Dataset):
    """One item per shard file: its tensor, read by whichever worker gets it."""

    def __init__(self, fs: EmberFileSystem, paths: list[str]) -> None:
        self.fs, self.paths = fs, paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        with self.fs.open(self.paths[i], "rb") as f:
            data = f.read()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), os.getpid()


def test_dataloader_forked_workers_read_shards(fs, base):
    paths, digests = [], {}
    for i in range(8):
        data = os.urandom((1 << 20) + 4099 * i)
        path = f"{base}/shard-{i:02d}.bin"
        fs.pipe_file(path, data)
        paths.append(path)
        digests[i] = hashlib.sha256(data).hexdigest()
    fs.cat_file(paths[0])  # the parent's client is live before the fork
    loader = DataLoader(
        Shards(fs, paths), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    seen, pids = {}, set()
    for epoch in range(2):
        for i, (tensor, pid) in enumerate(loader):
            seen[(epoch, i)] = hashlib.sha256(tensor.numpy().tobytes()).hexdigest()
            pids.add(pid)
    assert {k: v for k, v in seen.items()} == {
        (e, i): digests[i] for e in range(2) for i in range(8)
    }
    assert os.getpid() not in pids and len(pids) >= 2


def save_in_child(path_url: str, seed: int, mib: int, started) -> None:
    """A forked child's save; it says when it starts and exits at once when it returned."""
    sd = state(seed, mib)
    started.set()
    dcp.save(sd, storage_writer=CheckpointWriter(path_url))
    os._exit(0)


def forked_save(path_url: str, seed: int, mib: int):
    ctx = multiprocessing.get_context("fork")  # torch is imported already: a fast start
    started = ctx.Event()
    child = ctx.Process(target=save_in_child, args=(path_url, seed, mib, started))
    child.start()
    assert started.wait(60)
    return child


def killed_when(child, condition, timeout: float = 60) -> None:
    """``kill -9`` the child as soon as ``condition()`` holds (or when it has exited)."""
    deadline = time.monotonic() + timeout
    while child.is_alive() and not condition() and time.monotonic() < deadline:
        time.sleep(0.001)
    child.kill()  # SIGKILL, unless it has exited (and been reaped) already
    child.join(60)


def test_save_killed_at_any_point_leaves_one_whole_checkpoint(cluster, fs, base):
    path, mib = f"{base}/ckpt", 48
    staging = staging_path(path)
    dcp.save(state(1, mib), storage_writer=CheckpointWriter(url(cluster, path)))
    # one whole save, timed from its start: the timed kills below land across it
    child = forked_save(url(cluster, path), 2, mib)
    began = time.monotonic()
    child.join(120)
    took, current = time.monotonic() - began, 2
    assert child.exitcode == 0

    def inode() -> int:
        return fs.info(path)["ino"]

    published = inode()
    kills = [
        # the new .metadata is written but the checkpoint not yet published
        lambda: fs.exists(f"{staging}/.metadata"),
        # published: the previous checkpoint not yet removed
        lambda: inode() != published,
    ]
    fractions = (0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95)
    for seed, when in enumerate([*kills, *fractions], start=10):
        child = forked_save(url(cluster, path), seed, mib)
        if callable(when):
            killed_when(child, when)
        else:
            start = time.monotonic()
            killed_when(child, lambda t=took * when, s=start: time.monotonic() - s >= t)
        got = loaded(cluster, path, state(0, mib))
        step = int(got["step"][0])
        assert step in (current, seed), f"kill {when}: step {step}"
        assert all(torch.equal(got[k], v) for k, v in state(step, mib).items()), when
        current, published = step, inode()
    # the next save clears what a killed one left, and replaces the checkpoint
    dcp.save(state(99, 1), storage_writer=CheckpointWriter(url(cluster, path)))
    assert int(loaded(cluster, path, state(0, 1))["step"][0]) == 99
    assert fs.ls(base, detail=False) == [path]


def test_errors(cluster, fs, base):
    fs.mkdir(f"{base}/root-only")
    fs.client.meta.setattr(f"{base}/root-only", mode=0o755)
    alice = AdminClient(cluster.admin_url, cluster.admin_token).post(
        "/api/v1/tokens", {"uid": 1000, "gid": 1000, "groups": [], "name": "alice-ckpt"}
    )["token"]
    writer = CheckpointWriter(url(cluster, f"{base}/root-only/ckpt"), token=alice)
    with pytest.raises(CheckpointException) as failed:
        dcp.save(state(1, 1), storage_writer=writer)
    errors = [e for e, _trace in failed.value.failures.values()]
    assert errors and all(isinstance(e, PermissionError) for e in errors), errors
    assert "root-only" in str(errors[0])
    assert fs.ls(f"{base}/root-only", detail=False) == []  # nothing half-made
    with pytest.raises(CheckpointException) as missing:
        loaded(cluster, f"{base}/never-saved", state(0, 1))
    ((why, _trace),) = missing.value.failures.values()  # DCP words it, naming our error
    assert "no such file or directory" in str(why) and "never-saved/.metadata" in str(why)
    with pytest.raises(ValueError, match="directory name"):
        staging_path("emberfs://127.0.0.1:1/")
    assert staging_path("emberfs:///ckpt/latest/") == "emberfs:///ckpt/.latest.staging"
    assert staging_path("emberfs://h:1/latest") == "emberfs://h:1/.latest.staging"
    # overwrite=False refuses to replace a published checkpoint, and changes nothing
    dcp.save(state(1, 1), storage_writer=CheckpointWriter(url(cluster, f"{base}/kept")))
    with pytest.raises(CheckpointException, match="already exists"):
        dcp.save(
            state(2, 1),
            storage_writer=CheckpointWriter(url(cluster, f"{base}/kept"), overwrite=False),
        )
    assert int(loaded(cluster, f"{base}/kept", state(0, 1))["step"][0]) == 1
