"""Metadata rates of one client beside the rate of a no-op gRPC call.

Every operation is one ``MetaService`` call through the client's
:class:`~emberfs.client.meta.MetaClient` (the same channel, retry helper and
error mapping), so the difference to ``Ping`` is what the metaserver does for
the operation: ``Stat`` (a path walk in RocksDB), ``Create`` (a transaction
whose commit syncs the WAL; :meth:`MetaClient.create
<emberfs.client.meta.MetaClient.create>`, so the creates of threads that
overlap go as one ``BatchCreate``, one WAL sync for them all), ``Rename`` (a transaction moving one entry) and
``List`` (a range scan; reported as calls and as entries per second).

Each rate is measured with ``threads`` threads of one process sharing one
channel; with one thread it is the latency-bound rate of a sequential client.
The operations run in ten interleaved batches (ping, create, stat, rename,
then again), so the load of a shared machine weighs on all of them alike.
Run alone: ``python benchmarks/meta_rate.py --meta HOST:PORT``.

Given the metaserver's ``/metrics`` (``--metrics URL``, the admin API's), it
also reports the metaserver's own time per operation over the batches
(``handler_us``, from ``emberfs_meta_request_duration_seconds``: the handlers
of the operation's calls, not gRPC's receiving and answering around them,
divided by the operations done) and how many calls that covers
(``handler_calls``: fewer than the operations where creates rode together),
so what an operation adds to a ``Ping`` can be split into the server's work
and the rest.

For other benchmarks (``meta_ha``) :func:`measure` also takes several
metaservers, thread ``t`` pinned to the ``t % n``-th (one channel each); a
``batch_sync`` callable that every batch waits on before its clock starts (a
barrier shared with other processes measuring at once, whose per-batch times,
``batch_seconds``, then add up to an aggregate rate); and ``list_threads``
threads listing a given directory. Each batch's CPU time of the whole client
process, per second of the batch, is ``client_cpu_per_s``: near 1 with many
threads, the client's GIL may be what holds the rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence

ROUNDS = 10
# the MetaService methods each operation is made of (overlapping creates ride one BatchCreate)
METHODS = {
    "ping": ("Ping",),
    "create": ("Create", "BatchCreate"),
    "stat": ("Stat",),
    "rename": ("Rename",),
}


def handler_totals(metrics_url: str | Sequence[str]) -> dict[str, tuple[float, float]]:
    """(seconds, calls) the metaserver has spent in each ``MetaService`` method so far
    (several URLs: the sums over those metaservers)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, list[float]] = {}
    for url in [metrics_url] if isinstance(metrics_url, str) else metrics_url:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name != "emberfs_meta_request_duration_seconds":
                continue
            for sample in family.samples:
                if sample.labels.get("service") != "MetaService":
                    continue
                slot = {"_sum": 0, "_count": 1}.get(sample.name[len(family.name) :])
                if slot is not None:
                    totals.setdefault(sample.labels["method"], [0.0, 0.0])[slot] += sample.value
    return {method: (t[0], t[1]) for method, t in totals.items()}


def _timed(
    threads: int,
    first: int,
    per: int,
    op: Callable[[int, int], None],
    sync: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """Seconds for ``threads`` threads to call ``op(thread, i)`` for ``i`` in ``first..first+per``,
    and the CPU seconds of this process meanwhile. ``sync`` is called just before the clock
    starts (a barrier with other processes)."""
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        barrier.wait()
        try:
            for i in range(first, first + per):
                op(t, i)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    if sync is not None:
        sync()
    barrier.wait()
    cpu = time.process_time()
    started = time.perf_counter()
    for th in pool:
        th.join()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    if errors:
        raise errors[0]
    return elapsed, cpu


def measure(
    meta: str | Sequence[str],
    count: int = 2000,
    threads: int = 1,
    list_entries: int = 1000,
    metrics_url: str | Sequence[str] | None = None,
    *,
    list_threads: int = 1,
    list_path: str | None = None,
    list_calls: int | None = None,
    batch_sync: Callable[[], None] | None = None,
) -> dict:
    """Rates (per second) of ping, stat, create, rename and list against ``meta``.

    ``meta`` is one address (or a comma-separated list that one client fails
    over along), or a sequence of addresses: one client each, thread ``t``
    on the ``t % len(meta)``-th. With ``metrics_url`` (the metaserver's
    ``/metrics``, or each one's), also the metaserver's own microseconds per
    call of each (``handler_us``) and its call counts. ``list_threads``
    threads list ``list_path`` (default: the first thread's directory) in
    pages of ``list_entries``, ``list_calls`` times in all (default: about
    20000 entries' worth, 5 to 200 calls), each thread its share rounded up.
    ``batch_sync`` is called before every timed batch (the listing too); with
    it, only this call's own tree is removed at the end, since others may be
    measuring beside it.
    """
    from emberfs.client.meta import MetaClient

    addresses = [meta] if isinstance(meta, str) else list(meta)
    clients = [MetaClient(a, timeout=30.0, retry_timeout=30.0) for a in addresses]
    client = clients[0]
    root = f"/__meta_rate__/{uuid.uuid4().hex[:12]}"
    client.mkdir(root, parents=True)
    try:
        for t in range(threads):
            client.mkdir(f"{root}/t{t}", parents=False)
        for c in clients:
            c.ping()  # channels up before the first clock starts

        def ping(t: int, i: int) -> None:
            clients[t % len(clients)].ping()

        def create(t: int, i: int) -> None:
            clients[t % len(clients)].create(f"{root}/t{t}/f{i}", 0o644, exclusive=True)

        def stat(t: int, i: int) -> None:
            clients[t % len(clients)].stat(f"{root}/t{t}/f{i}")

        def rename(t: int, i: int) -> None:
            clients[t % len(clients)].rename(f"{root}/t{t}/f{i}", f"{root}/t{t}/r{i}")

        out: dict = {"threads": threads, "count": count}
        # Interleaved batches, so that a slow moment of a shared machine weighs
        # on Ping and on the operations alike instead of on one of them.
        rounds = max(1, min(ROUNDS, count // threads))
        per = max(1, count // (threads * rounds))
        ops = {"ping": ping, "create": create, "stat": stat, "rename": rename}
        batches: dict[str, list[float]] = {name: [] for name in ops}
        cpu = dict.fromkeys(ops, 0.0)
        before = handler_totals(metrics_url) if metrics_url else None
        for r in range(rounds):
            for name, op in ops.items():
                elapsed, used = _timed(threads, r * per, per, op, batch_sync)
                batches[name].append(elapsed)
                cpu[name] += used
        for name in ops:
            out[f"{name}_per_s"] = rounds * per * threads / sum(batches[name])
        out["calls"] = rounds * per * threads
        out["batch_seconds"] = batches
        out["client_cpu_per_s"] = {name: cpu[name] / sum(batches[name]) for name in ops}
        if before is not None:
            after = handler_totals(metrics_url)
            out["handler_us"], out["handler_calls"] = {}, {}
            for name, methods in METHODS.items():
                spent = sum(
                    after.get(m, (0.0, 0.0))[0] - before.get(m, (0.0, 0.0))[0] for m in methods
                )
                calls = sum(
                    after.get(m, (0.0, 0.0))[1] - before.get(m, (0.0, 0.0))[1] for m in methods
                )
                out["handler_calls"][name] = int(calls)
                if calls:
                    out["handler_us"][name] = 1e6 * spent / out["calls"]
        listing = list_path or f"{root}/t0"
        n_entries = sum(1 for _ in client.list(listing))
        if list_calls is None:
            list_calls = max(5, min(200, 20000 // max(1, n_entries)))
        calls = -(-list_calls // list_threads)  # per thread

        def list_once(t: int, i: int) -> None:
            for _ in clients[t % len(clients)].list(listing, page=list_entries):
                pass

        elapsed, used = _timed(list_threads, 0, calls, list_once, batch_sync)
        out["list_threads"] = list_threads
        out["list_entries"] = n_entries
        out["list_calls"] = calls * list_threads
        out["list_seconds"] = elapsed
        out["list_calls_per_s"] = calls * list_threads / elapsed
        out["list_entries_per_s"] = calls * list_threads * n_entries / elapsed
        out["client_cpu_per_s"]["list"] = used / elapsed
        return out
    finally:
        try:
            client.remove(root if batch_sync is not None else "/__meta_rate__", recursive=True)
        finally:
            for c in clients:
                c.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--meta", required=True, help="metaserver HOST:PORT")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--metrics", help="the metaserver's /metrics URL (adds its time per call)")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.meta, args.count, args.threads, metrics_url=args.metrics)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
