"""SGLang's HiCache storage on EmberFS: pages read into the host pool against flat buffers.

Run from the repository root (SGLang installed, see tests/engines.txt)::

    python -m benchmarks.hicache --json hicache-run.json   # 64 pages of 2 MiB, 5 rounds
    python -m benchmarks.hicache --smoke                   # a smoke run, well under a minute

One :class:`~emberfs.cli.localcluster.LocalCluster` (3 storage servers, R = 3)
and one :class:`~emberfs.kvcache.sglang.EmberHiCacheStorage` over a real
SGLang MHA host pool in the ``page_first`` layout (``--layers``, ``--heads``,
``--head-dim``, ``--page-size`` tokens, bf16: 2 MiB pages by default, each
stored as a key block and a value block). ``--pages`` pages are stored once
with ``batch_set_v1``; then each round reads them back three ways, in an order
that rotates from round to round:

* ``v1``: ``batch_get_v1`` straight into the pool's pages (the target: at
  least 0.95x ``flat``, so the pool costs no extra copy);
* ``flat``: ``batch_get`` into preallocated flat buffers of a page each (the
  generic call, no pool);
* ``v1_via_flat``: ``batch_get`` into flat buffers, then the pool's
  ``set_from_flat_data_page`` per page (what a read through the flat page
  costs: the path of layouts that split a page over every layer).

Every read is checked: the pool's target pages and the buffers are zeroed
before each read and compared after it with the bytes that were stored. Then,
once, a hybrid model's pool set (the KV pool, a Mamba state pool kept for
trailing pages, an MLA-shaped indexer pool kept for every page) goes through
``batch_set_v1``/``batch_set_v2``, ``batch_exists_v2`` and
``batch_get_v1``/``batch_get_v2`` into zeroed pools, every byte checked.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import mount  # noqa: E402
from benchmarks.figures import ratio_text, summary  # noqa: E402

KINDS = ("v1", "flat", "v1_via_flat")
TARGET = 0.95  # v1 / flat


class DataError(AssertionError):
    """A read returned a miss or bytes other than those stored."""


def log(message: str) -> None:
    print(f"[hicache] {message}", file=sys.stderr, flush=True)


def check(what: str, got: list, want: list) -> None:
    import torch

    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g is None or g is False:
            raise DataError(f"{what}: page {i} missed")
        if g is not True and not torch.equal(g, w):
            raise DataError(f"{what}: wrong bytes in page {i}")


def storage_config(meta: str, path: str, capacity: int):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    extra = {"emberfs_meta": meta, "emberfs_path": path, "emberfs_capacity": capacity}
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench/model", extra_config=extra,
    )  # fmt: skip


def reads(backend, pool, keys: list[str], saved: list, rnd: int) -> dict[str, float]:
    """One round: seconds of each way to read the stored pages, every byte checked."""
    from benchmarks.sglpools import page_bytes, slots

    n = len(keys)
    buffers = [pool.get_dummy_flat_data_page() for _ in keys]
    target = n  # the pool's pages n..2n-1 receive the reads

    def v1() -> None:
        check("v1", backend.batch_get_v1(keys, slots(pool, target, n)), [True] * n)

    def flat() -> None:
        check("flat", [x is not None for x in backend.batch_get(keys, buffers)], [True] * n)

    def via_flat() -> None:
        got = backend.batch_get(keys, buffers)
        for p, page in enumerate(got):
            if page is None:
                raise DataError(f"v1_via_flat: page {p} missed")
            pool.set_from_flat_data_page((target + p) * pool.page_size, page)

    ways = {"v1": v1, "flat": flat, "v1_via_flat": via_flat}
    order = KINDS[rnd % 3 :] + KINDS[: rnd % 3]
    seconds = {}
    for kind in order:
        for b in buffers:
            b.zero_()
        for p in range(n):
            pool.set_from_flat_data_page((target + p) * pool.page_size, buffers[0])
        start = time.perf_counter()
        ways[kind]()
        seconds[kind] = time.perf_counter() - start
        if kind == "flat":
            check(kind, [b.view(saved[0].dtype) for b in buffers], saved)
        else:
            check(kind, [page_bytes(pool, target + p) for p in range(n)], saved)
    return seconds


def hybrid(meta: str, path: str, capacity: int, pages: int) -> dict:
    """A hybrid model's pools through the v1 and v2 calls, every byte checked."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    from benchmarks.sglpools import fill, mamba_pool, mha_pool, mla_pool, page_bytes, slots
    from emberfs.kvcache.sglang import EmberHiCacheStorage

    backend = EmberHiCacheStorage(storage_config(meta, path, capacity), {})
    try:
        kv, states, indexer = mha_pool(tokens=pages * 16), mamba_pool(states=pages), mla_pool()
        backend.register_mem_pool_host(kv)
        backend.register_mem_host_pool_v2(states, PoolName.MAMBA)
        backend.register_mem_host_pool_v2(indexer, PoolName.INDEXER)
        backend.on_host_pools_registered()
        for seed, pool in enumerate((kv, states, indexer), start=7):
            fill(pool, seed)
        n = min(pages, indexer.page_num // 2, states.page_num // 2)
        keys = [f"hybrid-{i}" for i in range(n)]

        def transfer(name, pool, keys, first, policy=PoolHitPolicy.ALL_PAGES):
            return PoolTransfer(
                name=name, keys=keys, host_indices=slots(pool, first, len(keys)), hit_policy=policy
            )

        last = PoolHitPolicy.TRAILING_PAGES
        want = {
            "kv": [page_bytes(kv, p) for p in range(n)],
            "mamba": [page_bytes(states, n - 1)],
            "indexer": [page_bytes(indexer, p) for p in range(n)],
        }
        check("set kv", backend.batch_set_v1(keys, slots(kv, 0, n)), [True] * n)
        stored = backend.batch_set_v2(
            [
                transfer(PoolName.MAMBA, states, keys[-1:], n - 1, last),
                transfer(PoolName.INDEXER, indexer, keys, 0),
            ]
        )
        check("set mamba", stored[PoolName.MAMBA], [True])
        check("set indexer", stored[PoolName.INDEXER], [True] * n)
        query = [
            transfer(PoolName.MAMBA, states, keys[-1:], 0, last),
            transfer(PoolName.INDEXER, indexer, keys, 0),
        ]
        found = backend.batch_exists_v2(keys, query)
        if found.kv_hit_pages != n:
            raise DataError(f"batch_exists_v2: {found.kv_hit_pages} of {n} pages restorable")
        cut = backend.batch_exists_v2(keys[:-1], query).kv_hit_pages
        if cut != 0:
            raise DataError(f"batch_exists_v2: {cut} pages restorable without their last state")
        for pool in (kv, states, indexer):
            fill(pool, None)
        check("get kv", backend.batch_get_v1(keys, slots(kv, n, n)), [True] * n)
        got = backend.batch_get_v2(
            [
                transfer(PoolName.MAMBA, states, keys[-1:], n, last),
                transfer(PoolName.INDEXER, indexer, keys, n),
            ]
        )
        check("get mamba", got[PoolName.MAMBA], [True])
        check("get indexer", got[PoolName.INDEXER], [True] * n)
        check("kv bytes", [page_bytes(kv, n + p) for p in range(n)], want["kv"])
        check("mamba bytes", [page_bytes(states, n)], want["mamba"])
        check("indexer bytes", [page_bytes(indexer, n + p) for p in range(n)], want["indexer"])
        return {"pages": n, "pools": ["kv", "mamba", "indexer"], "verified": True}
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=64, help="pages stored and read (64)")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=8, help="KV heads (8)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=32, help="tokens of a page (32)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="8 small pages, one round")
    p.add_argument("--json", metavar="PATH", help="write every figure here")
    p.add_argument("--workdir", default=None, help="where the cluster lives")
    args = p.parse_args(argv)
    if args.smoke:
        args.pages, args.layers, args.heads, args.rounds = 8, 4, 2, 1
    if args.pages < 1 or args.rounds < 1:
        p.error("--pages and --rounds must be positive")
    from benchmarks.sglpools import fill, mha_pool, page_bytes, slots
    from emberfs.kvcache.sglang import EmberHiCacheStorage

    pool = mha_pool(
        layers=args.layers, heads=args.heads, head_dim=args.head_dim,
        page_size=args.page_size, tokens=args.pages * args.page_size,
    )  # fmt: skip
    page = pool.get_dummy_flat_data_page().numel() * 2
    capacity = 4 * args.pages * page
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="emberfs-hicache-", dir=args.workdir))
    doc: dict = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": mount.machine(),
        "command": " ".join(["python -m benchmarks.hicache", *(argv or sys.argv[1:])]),
        "pages": args.pages,
        "page_bytes": page,
    }
    cluster = backend = None
    try:
        cluster = mount.start_cluster(workdir)
        meta = cluster.meta_address
        backend = EmberHiCacheStorage(storage_config(meta, "/hicache", capacity), {})
        backend.register_mem_pool_host(pool)
        fill(pool, 1)
        keys = [f"page-{i}" for i in range(args.pages)]
        saved = [page_bytes(pool, i) for i in range(args.pages)]
        log(f"storing {args.pages} pages of {page / 2**20:.1f} MiB")
        check("set", backend.batch_set_v1(keys, slots(pool, 0, args.pages)), [True] * args.pages)
        rounds = []
        for rnd in range(args.rounds):
            seconds = reads(backend, pool, keys, saved, rnd)
            rounds.append(seconds)
            log(f"round {rnd + 1}: " + ", ".join(f"{k} {seconds[k] * 1e3:.0f} ms" for k in KINDS))
        doc["hybrid"] = hybrid(meta, "/hicache-hybrid", capacity, min(args.pages, 16))
    finally:
        if backend is not None:
            backend.close()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    total = args.pages * page
    doc["gb_per_s"] = {k: summary([total / r[k] / 1e9 for r in rounds]) for k in KINDS}
    doc["ratios"] = {
        "v1/flat": summary([r["flat"] / r["v1"] for r in rounds]),
        "v1/v1_via_flat": summary([r["v1_via_flat"] / r["v1"] for r in rounds]),
    }
    met = doc["ratios"]["v1/flat"]["median"] >= TARGET
    doc["target"] = {"v1/flat": TARGET, "met": met}
    doc["rounds"] = rounds
    for kind in KINDS:
        g = doc["gb_per_s"][kind]
        print(f"{kind:12} {g['median']:.2f} GB/s ({g['min']:.2f}-{g['max']:.2f})")
    for name, r in doc["ratios"].items():
        print(f"{name:16} {ratio_text(r)}")
    print(f"target v1/flat >= {TARGET}: {'met' if met else 'not met'}")
    print(f"hybrid pools {doc['hybrid']['pools']}: {doc['hybrid']['pages']} pages verified")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
        print(f"\nresults: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
