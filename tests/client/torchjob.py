"""A PyTorch job for the training tests, run as its own process: ``python torchjob.py ...``.

``save URL SEED MIB [--ranks N]`` saves :func:`state` with ``torch.distributed.checkpoint``
and EmberFS's :class:`CheckpointWriter`: with ``--ranks N`` as N gloo ranks, forked, each
holding its shard of every tensor as a DTensor (the layout of a sharded model). It prints
``saving`` just before the save starts and ``saved`` when it returned.

``load URL SEED MIB [--ranks N]`` loads the checkpoint back into DTensors of N ranks and
exits 0 when every rank's shards equal those of :func:`state` of ``SEED``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from emberfs.client.checkpoint import CheckpointReader, CheckpointWriter

MiB = 1 << 20


def state(seed: int, mib: int) -> dict[str, torch.Tensor]:
    """A model-like state dict of about ``mib`` MiB: four float32 matrices and a step."""
    gen = torch.Generator().manual_seed(seed)
    rows = max(1, mib * MiB // 4 // 4 // 1024)
    out = {f"layer{i}.weight": torch.randn(rows, 1024, generator=gen) for i in range(4)}
    out["step"] = torch.tensor([seed])
    return out


def sharded(full: dict[str, torch.Tensor], ranks: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (ranks,))
    return {
        k: distribute_tensor(v, mesh, [Shard(0)]) if v.dim() == 2 else v for k, v in full.items()
    }


def run(rank: int, args) -> None:
    if args.ranks > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    full = state(args.seed, args.mib)
    sd = sharded(full, args.ranks) if args.ranks > 1 else full
    if args.verb == "save":
        if rank == 0:
            print("saving", flush=True)
        dcp.save(sd, storage_writer=CheckpointWriter(args.url))
        if rank == 0:
            print("saved", flush=True)
    else:
        target = {k: torch.zeros_like(v) for k, v in sd.items()}
        dcp.load(target, storage_reader=CheckpointReader(args.url, ahead=3 << 20))
        for k, v in sd.items():
            got = target[k].to_local() if hasattr(target[k], "to_local") else target[k]
            want = v.to_local() if hasattr(v, "to_local") else v
            if not torch.equal(got, want):
                raise SystemExit(f"rank {rank}: {k} differs from the state of seed {args.seed}")
    if args.ranks > 1:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("verb", choices=("save", "load"))
    parser.add_argument("url")
    parser.add_argument("seed", type=int)
    parser.add_argument("mib", type=int)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.ranks == 1:
        run(0, args)
        return
    ctx = mp.start_processes(run, args=(args,), nprocs=args.ranks, join=False, start_method="fork")
    while not ctx.join():
        pass


if __name__ == "__main__":
    sys.exit(main())
