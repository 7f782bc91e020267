"""PyTorch checkpoints: DCP save and load on EmberFS beside the same on local disk, in one run.

    python -m benchmarks.checkpoint [--size-mib 1024] [--rounds 3] [--threads 1] [--json PATH]

A state dict of ``--size-mib`` MiB (float32 matrices of 64 MiB, as a model's layers) is saved
with ``torch.distributed.checkpoint`` in one process:

* to local disk with DCP's ``FileSystemWriter(path, sync_files=True)``, in ``--workdir``;
* to EmberFS with :class:`~emberfs.client.checkpoint.CheckpointWriter` (staging directory,
  published whole; loaded with ``CheckpointReader``, which fetches items ahead), on a ``LocalCluster`` of 3 storage servers, R = 3, whose data is on the same
  disk, so every byte EmberFS saves is written there three times.

Each round saves to both (taking turns which goes first) into a new directory, then loads both
back into a preallocated state dict: first cold (the page cache dropped, so the local load reads
the disk and the storage servers read their chunk files from it; needs root, else the report
says so and the loads are warm), then warm. The first round's loads are checked against the
saved tensors. Figures are GB/s of state dict bytes; ratios are EmberFS / local disk per round,
the median and range printed. Targets: save >= 0.8x, load >= 1.0x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from benchmarks.figures import ratio_text, summary
from benchmarks.mount import drop_caches, machine, start_cluster
from emberfs.client.checkpoint import CheckpointReader, CheckpointWriter

MiB = 1 << 20
TENSOR_MIB = 64
TARGETS = {"save": 0.8, "load_cold": 1.0}
_STARTED = time.monotonic()


def log(message: str) -> None:
    print(
        f"[checkpoint {time.monotonic() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True
    )


def state_dict(size_mib: int) -> dict[str, torch.Tensor]:
    """Float32 matrices of 64 MiB (the last one smaller) summing to ``size_mib`` MiB."""
    gen = torch.Generator().manual_seed(0)
    out, left, i = {}, size_mib, 0
    while left > 0:
        mib = min(TENSOR_MIB, left)
        out[f"layers.{i}.weight"] = torch.randn(mib * MiB // 4096, 1024, generator=gen)
        left, i = left - mib, i + 1
    return out


def timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


class Bench:
    def __init__(self, args, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.sd = state_dict(args.size_mib)
        self.bytes = sum(t.numel() * t.element_size() for t in self.sd.values())
        self.target = {k: torch.empty_like(v) for k, v in self.sd.items()}
        self.local = workdir / "local"
        self.cluster = start_cluster(workdir)
        self.url = f"emberfs://{self.cluster.meta_address}/checkpoints"
        self.figures: dict[str, list[float]] = {}
        self.cold = None if args.no_drop_caches else True

    def record(self, name: str, seconds: float) -> None:
        self.figures.setdefault(name, []).append(self.bytes / seconds / 1e9)
        log(f"{name}: {self.bytes / seconds / 1e9:.2f} GB/s")

    def save_local(self, step: int) -> float:
        writer = FileSystemWriter(
            self.local / f"step-{step}", sync_files=True, thread_count=self.args.threads
        )
        return timed(lambda: dcp.save(self.sd, storage_writer=writer))

    def save_ember(self, step: int) -> float:
        writer = CheckpointWriter(f"{self.url}/step-{step}", thread_count=self.args.threads)
        return timed(lambda: dcp.save(self.sd, storage_writer=writer))

    def load(self, reader) -> float:
        return timed(lambda: dcp.load(self.target, storage_reader=reader))

    def check(self) -> None:
        for k, v in self.sd.items():
            if not torch.equal(self.target[k], v):
                raise RuntimeError(f"loaded {k} differs from the saved tensor")
        for t in self.target.values():
            t.zero_()

    def drop(self) -> None:
        if self.cold:
            why = drop_caches()
            if why:
                log(f"{why}: the loads are warm")
                self.cold = False

    def round(self, step: int) -> None:
        saves = [("save_local", self.save_local), ("save_ember", self.save_ember)]
        for name, save in saves if step % 2 == 0 else saves[::-1]:
            self.record(name, save(step))
        local = FileSystemReader(self.local / f"step-{step}")
        ember = CheckpointReader(f"{self.url}/step-{step}")
        for kind in ("cold", "warm") if self.cold is not False else ("warm",):
            if kind == "cold":
                self.drop()
            self.record(f"load_{kind}_local", self.load(local))
            if step == 0:
                self.check()
            if kind == "cold":
                self.drop()
            self.record(f"load_{kind}_ember", self.load(ember))
            if step == 0:
                self.check()
        shutil.rmtree(self.local / f"step-{step}")
        ember.fs.fs.rm(f"{self.url}/step-{step}", recursive=True)

    def report(self) -> dict:
        ratios = {}
        for what in ("save", "load_cold", "load_warm"):
            local, ember = self.figures.get(f"{what}_local"), self.figures.get(f"{what}_ember")
            if local and ember:
                ratios[what] = summary([e / lo for e, lo in zip(ember, local, strict=True)])
        print(
            f"DCP checkpoint of {self.bytes / MiB:.0f} MiB, {self.args.rounds} rounds, "
            f"{self.args.threads} writer thread(s); GB/s median (range)"
        )
        for name, values in sorted(self.figures.items()):
            s = summary(values)
            print(f"  {name:18s} {s['median']:6.2f} ({s['min']:.2f}-{s['max']:.2f})")
        for what, s in ratios.items():
            target = TARGETS.get(what)
            met = (
                ""
                if target is None
                else f"  target >= {target}x: {'met' if s['median'] >= target else 'not met'}"
            )
            print(f"  EmberFS / local disk, {what}: {ratio_text(s)}{met}")
        return {
            "machine": machine(),
            "size_bytes": self.bytes,
            "rounds": self.args.rounds,
            "threads": self.args.threads,
            "cold_loads": bool(self.cold),
            "figures_gbps": {k: summary(v) for k, v in self.figures.items()},
            "ratios": ratios,
            "targets": TARGETS,
        }

    def close(self) -> None:
        self.cluster.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="DCP writer threads (both writers)")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    p.add_argument("--no-drop-caches", action="store_true", help="warm loads only")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="emberfs-ckpt-", dir=args.workdir))
    bench = None
    try:
        bench = Bench(args, workdir)
        for step in range(args.rounds):
            log(f"round {step + 1} of {args.rounds}")
            bench.round(step)
        result = bench.report()
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if bench is not None:
            bench.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
