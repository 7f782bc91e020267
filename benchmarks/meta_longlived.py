"""The metadata cost of a long-lived client: creates per round as its retry records age out.

Every mutating request stores its response for deduplication, and each store
prunes that client's records older than the retry horizon (see
``emberfs.metaserver.fs.idempotency``). In RocksDB a pruned record stays a
tombstone until compaction, so the prune scan must not start over those
tombstones. This runs a namespace in-process on a RocksDB store (WAL written,
not synced: the sync is measured by ``meta_rate``) with a clock that moves
``--ms-per-op`` per create, so that after the retry horizon every store
prunes. A flat column of figures is the expected result; a rising one means
each store pays for the records pruned before it.

    python benchmarks/meta_longlived.py [--rounds 8] [--per-round 5000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time


def measure(rounds: int, per_round: int, ms_per_op: float) -> dict:
    from emberfs.metaserver.fs.namespace import Namespace
    from emberfs.metaserver.store.kv import RocksEngine
    from emberfs.proto import common_pb2, meta_pb2

    with tempfile.TemporaryDirectory(prefix="emberfs-longlived-") as tmp:
        engine = RocksEngine(tmp, sync=False)
        clock = [time.time_ns()]
        ns = Namespace(engine, chain_table=lambda: [1, 2, 3], clock=lambda: clock[0])
        try:
            ns.mkdir(meta_pb2.MkdirRequest(path="/d"))
            step = int(ms_per_op * 1e6)
            rid = 1
            per_op_us = []
            for _ in range(rounds):
                started = time.perf_counter()
                for _ in range(per_round):
                    clock[0] += step
                    ctx = common_pb2.RequestContext(client_id="long-lived", request_id=rid)
                    ns.create(meta_pb2.CreateRequest(ctx=ctx, path=f"/d/f{rid}", exclusive=True))
                    rid += 1
                per_op_us.append((time.perf_counter() - started) / per_round * 1e6)
        finally:
            engine.close()
    return {
        "rounds": rounds,
        "per_round": per_round,
        "ms_per_op": ms_per_op,
        "create_us": per_op_us,
        "last_vs_first": per_op_us[-1] / per_op_us[0],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--per-round", type=int, default=5000)
    p.add_argument("--ms-per-op", type=float, default=30.0, help="simulated time per create")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.rounds, args.per_round, args.ms_per_op)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
