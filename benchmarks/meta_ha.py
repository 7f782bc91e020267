"""Metadata on etcd beside RocksDB, two metaservers on one etcd, and the failover of their lead.

Run from the repository root::

    python -m benchmarks.meta_ha --json meta-ha.json      # the full run
    python -m benchmarks.meta_ha --quick                  # tiny counts, well under a minute
    python -m benchmarks.meta_ha --parts failover --failovers 5

What it measures, in one run on one machine (every cluster a
:class:`~emberfs.cli.localcluster.LocalCluster` with authentication, one
storage server with one target and R = 1: a create needs a chain, and the data
path is not what is measured here):

* **rates** (``--parts rates``): ping, create, stat, rename and list through the
  client's :class:`~emberfs.client.meta.MetaClient`, each measurement one
  :func:`benchmarks.meta_rate.measure` (``--count`` calls of each operation in
  interleaved batches, then listing a directory of ``--list-entries`` entries
  made for it, as many listing threads as client threads; list rates as calls
  and as entries per second), on three setups:

  - ``rocksdb``: one metaserver on RocksDB (its commit syncs the WAL);
  - ``etcd``: one metaserver on a local etcd of one member;
  - ``etcd2``: two metaservers on one such etcd, the client threads pinned half
    to each (thread ``t`` on metaserver ``t % 2``; one thread: on the first), an
    aggregate rate.

  Each with every client form: ``--threads`` threads of one process (1 and 8),
  and every thread count above 1 split over ``--processes`` processes too (8
  threads in 2 processes of 4), whose batches start together at a barrier
  shared by the processes, a batch lasting until the slowest process is done.
  Beside each form the client processes' CPU seconds per second: a single
  process near 1 with many threads is held by its own GIL, and the processes'
  rate against the one process's says whether that is what limits the figure.
  The three setups run side by side for the whole part and every round
  measures each of them in each form, the setups' order rotating and the forms'
  reversing from round to round, so a slow moment of the shared machine weighs
  on all of them alike; an idle setup costs the others a few heartbeats a
  second. After each measurement the run waits until its removed tree is gone
  (etcd deletes a large tree in slices, in the background) and the GC queue is
  empty, so no background work of one measurement runs into the next. Figures
  are medians over ``--rounds`` rounds, ratios medians of per-round ratios with
  their range. The no-op ``Ping`` of each setup is the ceiling of a call there.
  With one client process, the metaservers' own time per call of each operation
  (``handler_us``, from their ``/metrics``) comes with the rates.

* **failover** (``--parts failover``): two metaservers on etcd, a client
  creating files in a loop on the leading one (given both, the leader first)
  and another on the other one; then ``kill -9`` of the leader. Reported: (a)
  the time from the kill until the survivor's ``GET /api/v1/leader`` says it
  leads (it wins the leader key once the dead one's lease has run out: the
  metaserver's ``--leader-ttl``, 3 s by default), (b) the longest gap between two acknowledged creates of
  the client on the killed metaserver (it fails over to the survivor and
  retries with the same request id), and the same for the client on the
  survivor. The killed metaserver is then started again (it follows) and the
  next run kills whichever leads now; ``--failovers`` runs, each and the median.

* **etcd size** (``--parts size``): a fresh etcd and metaserver, then ``--files``
  empty files created through the client (8 threads, each filling directories
  of ``--files-per-dir``). The etcd member's database size (Maintenance Status
  ``dbSize``, the pages etcd has allocated, which its space quota counts, and
  ``dbSizeInUse``, without its free pages) before the creates, after them,
  after compaction to the current revision (the metaserver compacts its
  history every 5 minutes, keeping the last interval's), after
  defragmentation (``etcdctl defrag``), and after the retry records of the
  creates are gone too (deleted here; a metaserver prunes a record once it is 2
  minutes old as its client goes on, at 10 minutes at the latest) and the store
  is compacted and defragmented again: the steady state of files that exist. Each as bytes per file over the fresh
  state, and how many files etcd's default 2 GiB quota and its suggested 8 GiB
  maximum hold at that rate; beside it the keys and bytes (key and value) of
  each key prefix per file.

It prints tables at the end and writes the figures as JSON (``--json PATH``).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import multiprocessing
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import meta_rate  # noqa: E402
from benchmarks.figures import ratio_text, summary

SETUPS = {
    "rocksdb": ("RocksDB, 1 metaserver", "rocksdb", 1),
    "etcd": ("etcd, 1 metaserver", "etcd", 1),
    "etcd2": ("etcd, 2 metaservers", "etcd", 2),
}
OPS = ("ping", "create", "stat", "rename")
RATES = tuple(f"{op}_per_s" for op in OPS) + ("list_calls_per_s", "list_entries_per_s")
LIST_DIR = "/__meta_ha_list__"
GiB = 1 << 30
QUOTAS = {"2GiB": 2 * GiB, "8GiB": 8 * GiB}  # etcd's default space quota, its suggested maximum


_STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[meta_ha {time.monotonic() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Form:
    """How the client load is made: ``threads`` threads over ``processes`` processes."""

    threads: int
    processes: int = 1

    @property
    def key(self) -> str:
        return f"{self.threads}x{self.processes}"

    @property
    def label(self) -> str:
        text = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return text + (f" in {self.processes} processes" if self.processes > 1 else "")


def forms_of(threads: list[int], processes: int) -> list[Form]:
    """Every thread count in one process, and those above 1 also over ``processes`` processes."""
    forms = [Form(t) for t in threads]
    if processes > 1:
        forms += [Form(t, processes) for t in threads if t > 1 and t % processes == 0]
    return forms


def make_cluster(workdir: Path, name: str, kv: str, metaservers: int, token: str):
    from emberfs.cli.localcluster import LocalCluster

    return LocalCluster(
        workdir / name,
        storage_servers=1,
        replicas=1,
        targets_per_server=1,
        kv=kv,
        metaservers=metaservers,
        admin_token=token,
    )


def addresses(cluster) -> list[str]:
    """Each metaserver's own address, in order."""
    return [f"{cluster.host}:{port}" for port in cluster.meta_ports]


def store_of(cluster):
    """An :class:`~emberfs.metaserver.store.etcd.EtcdEngine` on the cluster's etcd (None: RocksDB)."""
    if cluster.etcd is None:
        return None
    from emberfs.metaserver.store.etcd import EtcdEngine

    return EtcdEngine(cluster.etcd.url("emberfs"))


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.load(answer)


def settle(cluster, store, timeout: float = 120.0) -> float:
    """Wait until no removed tree waits to be deleted and the GC queue is empty; seconds waited."""
    from emberfs.metaserver.store import keys

    started = time.monotonic()
    while True:
        try:
            quiet = not get_json(f"{cluster.admin_url}/api/v1/gc?limit=1")
            quiet = quiet and (store is None or store.count_prefix(keys.TRASH) == 0)
        except OSError:
            quiet = False
        if quiet:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            log(f"background work still pending after {timeout:.0f} s; going on")
            return time.monotonic() - started
        time.sleep(0.1)


def create_files(address: str, groups: list[list[str]], threads: int = 1) -> float:
    """Create the empty files of ``groups`` (parents existing) on ``threads`` threads of one
    client, thread ``t`` the groups ``t, t + threads, ...`` (so none shares a directory with
    another when a group is a directory's); seconds taken."""
    from emberfs.client.meta import MetaClient
    from emberfs.proto import meta_pb2

    client = MetaClient(address, timeout=30.0, retry_timeout=60.0)
    failed: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for group in groups[t::threads]:
                for path in group:
                    req = meta_pb2.CreateRequest(
                        ctx=client.context(), path=path, mode=0o644, exclusive=True
                    )
                    client.meta("Create", req)
        except BaseException as exc:
            failed.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    started = time.perf_counter()
    try:
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    finally:
        client.close()
    if failed:
        raise failed[0]
    return time.perf_counter() - started


def mkdir(address: str, path: str) -> None:
    from emberfs.client.meta import MetaClient

    client = MetaClient(address)
    try:
        client.mkdir(path, parents=True)
    finally:
        client.close()


# rates ---------------------------------------------------------------------------------------
def _measure_child(queue, barrier, index: int, kwargs: dict) -> None:
    """One client process of a form: its :func:`meta_rate.measure` report, or its error."""
    try:

        def sync() -> None:
            barrier.wait(300)

        queue.put((index, meta_rate.measure(**kwargs, batch_sync=sync), None))
    except BaseException:
        barrier.abort()  # the other processes stop waiting for this one
        queue.put((index, None, traceback.format_exc()))


def combine(reports: list[dict]) -> dict:
    """The aggregate rates of processes that measured together, batch by batch.

    A batch of all of them lasted as long as its slowest process's, so a rate is
    every process's calls over the sum of those slowest batch times.
    """
    out: dict = {"client_cpu_per_s": {}}
    cpu_total = seconds_total = 0.0
    for op in OPS:
        batches = zip(*(r["batch_seconds"][op] for r in reports), strict=True)
        seconds = sum(max(b) for b in batches)
        cpu = sum(r["client_cpu_per_s"][op] * sum(r["batch_seconds"][op]) for r in reports)
        out[f"{op}_per_s"] = sum(r["calls"] for r in reports) / seconds
        out["client_cpu_per_s"][op] = cpu / seconds
        cpu_total += cpu
        seconds_total += seconds
    list_seconds = max(r["list_seconds"] for r in reports)
    list_calls = sum(r["list_calls"] for r in reports)
    out["list_entries"] = reports[0]["list_entries"]
    out["list_calls_per_s"] = list_calls / list_seconds
    out["list_entries_per_s"] = list_calls * out["list_entries"] / list_seconds
    out["client_cpu_per_s"]["list"] = (
        sum(r["client_cpu_per_s"]["list"] * r["list_seconds"] for r in reports) / list_seconds
    )
    out["client_cpu_per_s"]["all"] = cpu_total / seconds_total
    return out


def list_calls(entries: int) -> int:
    """Listings per measurement, all threads together (as :func:`meta_rate.measure` does)."""
    return max(5, min(200, 20000 // entries))


def measure_form(cluster, form: Form, count: int, list_entries: int) -> dict:
    """One measurement of ``form`` on ``cluster``: rates, client CPU (and handler times)."""
    metas = addresses(cluster)
    common = {
        "count": count,
        "list_entries": list_entries,
        "list_path": LIST_DIR,
        "list_calls": list_calls(list_entries),
    }
    if form.processes == 1:
        metrics = [f"{cluster.admin_url_of(i)}/metrics" for i in range(len(metas))]
        r = meta_rate.measure(
            metas,
            threads=form.threads,
            list_threads=form.threads,
            metrics_url=metrics,
            **common,
        )
        out = combine([r])
        out["handler_us"] = r.get("handler_us", {})
        return out
    per = form.threads // form.processes
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    barrier = ctx.Barrier(form.processes)
    procs = []
    for p in range(form.processes):
        # global thread p * per + t goes to metaserver (p * per + t) % n, as in one process
        shift = (p * per) % len(metas)
        kwargs = {
            **common,
            "meta": metas[shift:] + metas[:shift],
            "count": count // form.processes,
            "list_calls": -(-common["list_calls"] // form.processes),
            "threads": per,
            "list_threads": per,
        }
        procs.append(ctx.Process(target=_measure_child, args=(queue, barrier, p, kwargs)))
    try:
        for proc in procs:
            proc.start()
        reports: list[dict | None] = [None] * form.processes
        for _ in procs:
            index, report, error = queue.get(timeout=900)
            if error is not None:
                raise RuntimeError(f"client process {index} failed:\n{error}")
            reports[index] = report
        for proc in procs:
            proc.join(30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
    return combine(reports)


def per_round_ratios(a: list[dict], b: list[dict], key: str) -> list[float]:
    return [x[key] / y[key] for x, y in zip(a, b, strict=True)]


def rates(args, workdir: Path, token: str) -> dict:
    forms = forms_of(args.threads, args.processes)
    clusters = {
        name: make_cluster(workdir, name, kv, n, token) for name, (_, kv, n) in SETUPS.items()
    }
    stores: dict = {}
    doc: dict = {"forms": {f.key: f.label for f in forms}, "setups": {}}
    samples: dict[str, dict[str, list[dict]]] = {
        name: {f.key: [] for f in forms} for name in clusters
    }
    try:
        for name, cluster in clusters.items():
            log(f"starting {SETUPS[name][0]}")
            cluster.start()
            stores[name] = store_of(cluster)
            leader = cluster.leader()
            log(f"{name}: a directory of {args.list_entries} entries to list")
            mkdir(cluster.meta_address, LIST_DIR)
            # one thread: threads creating in one directory would conflict on its guard
            create_files(
                cluster.meta_address, [[f"{LIST_DIR}/e{i:06d}" for i in range(args.list_entries)]]
            )
            doc["setups"][name] = {
                "label": SETUPS[name][0],
                "kv": SETUPS[name][1],
                "metaservers": SETUPS[name][2],
                "leader": leader,
            }
        setups = list(clusters)
        settled: list[float] = []
        for rnd in range(args.rounds):
            order = setups[rnd % len(setups) :] + setups[: rnd % len(setups)]
            for form in forms if rnd % 2 == 0 else forms[::-1]:
                for name in order:
                    log(f"round {rnd + 1}/{args.rounds}: {name}, {form.label}")
                    r = measure_form(clusters[name], form, args.count, args.list_entries)
                    samples[name][form.key].append(r)
                    settled.append(settle(clusters[name], stores[name]))
        doc["settle_seconds"] = summary(settled)
    finally:
        for store in stores.values():
            if store is not None:
                store.close()
        for cluster in clusters.values():
            cluster.stop()
    doc["results"] = {
        name: {
            key: {
                "median": {k: statistics.median(r[k] for r in runs) for k in RATES},
                "client_cpu_per_s": statistics.median(r["client_cpu_per_s"]["all"] for r in runs),
                "list_entries": runs[0]["list_entries"],
                "rounds": runs,
            }
            for key, runs in by_form.items()
        }
        for name, by_form in samples.items()
    }
    # ratios of figures measured in the same round: the median of the per-round ratios
    pairs = {"etcd_vs_rocksdb": ("etcd", "rocksdb"), "etcd2_vs_etcd": ("etcd2", "etcd")}
    doc["ratios"] = {
        what: {
            f.key: {
                k: summary(per_round_ratios(samples[a][f.key], samples[b][f.key], k)) for k in RATES
            }
            for f in forms
        }
        for what, (a, b) in pairs.items()
    }
    doc["processes_vs_one"] = {
        name: {
            f.key: {
                k: summary(
                    per_round_ratios(samples[name][f.key], samples[name][Form(f.threads).key], k)
                )
                for k in RATES
            }
            for f in forms
            if f.processes > 1
        }
        for name in samples
    }
    return doc


# failover ------------------------------------------------------------------------------------
class CreateLoop:
    """A thread creating files one after another; the time of every acknowledged create."""

    def __init__(self, address: str, directory: str) -> None:
        from emberfs.client.meta import MetaClient

        self.client = MetaClient(address, timeout=10.0, retry_timeout=120.0)
        self.directory = directory
        self.acks: list[float] = []
        self.errors: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self.client.mkdir(directory, parents=True)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from emberfs.proto import meta_pb2

        i = 0
        while not self.stop.is_set():
            req = meta_pb2.CreateRequest(
                ctx=self.client.context(),
                path=f"{self.directory}/f{i}",
                mode=0o644,
                exclusive=True,
            )
            i += 1
            try:
                self.client.meta("Create", req)
            except Exception as exc:  # reported; the loop goes on
                self.errors.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                time.sleep(0.05)
                continue
            self.acks.append(time.monotonic())

    def acked_since(self, when: float) -> int:
        return sum(1 for t in self.acks[-1000:] if t > when)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(150)
        self.client.close()

    def gaps(self, killed_at: float) -> dict:
        """The longest gap between two acknowledged creates, and where it began (after the kill)."""
        acks = self.acks
        out: dict = {
            "creates": len(acks),
            "creates_after_kill": sum(1 for t in acks if t > killed_at),
            "errors": len(self.errors),
            "error_samples": [e for _, e in self.errors[:3]],
        }
        before = [b - a for a, b in itertools.pairwise(acks) if b <= killed_at]
        out["longest_gap_before_kill_s"] = max(before, default=None)
        if not out["creates_after_kill"]:
            out["longest_gap_s"] = out["gap_began_s"] = None
            return out
        gap, began = max((b - a, a) for a, b in itertools.pairwise(acks))
        out["longest_gap_s"] = gap
        out["gap_began_s"] = began - killed_at  # negative: the last create before the kill
        return out


def leading(cluster, i: int) -> bool:
    try:
        return bool(get_json(cluster.admin_url_of(i) + "/api/v1/leader", timeout=1.0)["leading"])
    except (OSError, ValueError, KeyError):
        return False


def one_failover(cluster, n: int, warmup: float, after: float, limit: float = 60.0) -> dict:
    """Kill -9 the leading metaserver while two clients create files; what they saw."""
    killed = cluster.leader()
    survivor = 1 - killed
    metas = addresses(cluster)
    loops = {
        "on_killed": CreateLoop(f"{metas[killed]},{metas[survivor]}", f"/__meta_ha__/f{n}/a"),
        "on_survivor": CreateLoop(f"{metas[survivor]},{metas[killed]}", f"/__meta_ha__/f{n}/b"),
    }
    try:
        time.sleep(warmup)
        killed_at = time.monotonic()
        cluster.kill_meta(killed)
        leads_at = None
        deadline = killed_at + limit
        while time.monotonic() < deadline:
            if leading(cluster, survivor):
                leads_at = time.monotonic()
                break
            time.sleep(0.02)
        # the clients go on a while on the survivor, so the gap is closed and seen whole
        while time.monotonic() < deadline:
            if leads_at is not None and time.monotonic() > leads_at + after:
                if all(loop.acked_since(killed_at) for loop in loops.values()):
                    break
            time.sleep(0.05)
    finally:
        for loop in loops.values():
            loop.close()
    run = {
        "killed": killed,
        "survivor": survivor,
        "leads_after_s": None if leads_at is None else leads_at - killed_at,
    }
    run["leader_after"] = cluster.leader(timeout=5) if leads_at is not None else None
    for name, loop in loops.items():
        run[f"client_{name}"] = loop.gaps(killed_at)
    return run


def failover(args, workdir: Path, token: str) -> dict:
    from emberfs.metaserver.clustermgr.leadership import DEFAULT_TTL

    cluster = make_cluster(workdir, "failover", "etcd", 2, token)
    runs = []
    try:
        log("failover: starting two metaservers on etcd")
        cluster.start()
        for n in range(args.failovers):
            log(f"failover {n + 1}/{args.failovers}: kill -9 of the leading metaserver")
            run = one_failover(cluster, n, args.failover_warmup, args.failover_after)
            runs.append(run)
            log(
                f"failover {n + 1}: metaserver {run['survivor']} leads after "
                f"{_s(run['leads_after_s'])}; longest gap of the client on the killed one "
                f"{_s(run['client_on_killed']['longest_gap_s'])}"
            )
            cluster.start_meta(i=run["killed"])  # back, as a follower
            time.sleep(args.failover_warmup)
    finally:
        cluster.stop()

    def median(get: Callable[[dict], float | None]) -> float | None:
        values = [v for v in map(get, runs) if v is not None]
        return statistics.median(values) if values else None

    return {
        "leader_ttl_s": DEFAULT_TTL,
        "runs": runs,
        "median": {
            "leads_after_s": median(lambda r: r["leads_after_s"]),
            "longest_gap_s": median(lambda r: r["client_on_killed"]["longest_gap_s"]),
            "longest_gap_on_survivor_s": median(lambda r: r["client_on_survivor"]["longest_gap_s"]),
        },
    }


# etcd size -----------------------------------------------------------------------------------
def member_size(store) -> dict:
    """The etcd member's ``dbSize`` (:meth:`EtcdEngine.status`) and ``dbSizeInUse``."""
    from aetcd.rpc import rpc_pb2

    time.sleep(0.5)  # the backend commits its batch every 100 ms; the sizes follow it
    (status,) = store.status()
    if "error" in status:
        raise RuntimeError(f"etcd status: {status['error']}")
    in_use = store.call("Maintenance", "Status", rpc_pb2.StatusRequest()).dbSizeInUse
    return {"db_size": status["db_size"], "db_size_in_use": in_use}


def compact(store) -> int:
    """Compact the whole history up to the current revision (physically); that revision."""
    from aetcd.rpc import rpc_pb2

    from emberfs.metaserver.store.kv import Conflict

    revision = store.read(b"")[2]
    try:
        store.call(
            "KV",
            "Compact",
            rpc_pb2.CompactionRequest(revision=revision, physical=True),
            timeout=120,
        )
    except Conflict:
        pass  # compacted to it already
    return revision


def defragment(store) -> None:
    from aetcd.rpc import rpc_pb2

    store.call("Maintenance", "Defragment", rpc_pb2.DefragmentRequest(), timeout=300)


def key_census(store) -> dict[str, dict[str, int]]:
    """Keys and bytes (etcd key with the prefix, and value) of each key prefix in the store."""
    census: dict[str, dict[str, int]] = {}
    for key, value in store.scan(b"", None):
        c = census.setdefault(key[:4].decode(errors="replace"), {"keys": 0, "bytes": 0})
        c["keys"] += 1
        c["bytes"] += len(store.prefix) + len(key) + len(value)
    return census


def etcd_size(args, workdir: Path, token: str) -> dict:
    from aetcd.rpc import rpc_pb2

    from emberfs.metaserver.store import keys
    from emberfs.metaserver.store.kv import prefix_end

    n, per_dir = args.files, args.files_per_dir
    cluster = make_cluster(workdir, "size", "etcd", 1, token)
    store = None
    stages: dict[str, dict] = {}
    try:
        log("etcd size: a fresh etcd and metaserver")
        cluster.start()
        store = store_of(cluster)
        compact(store)
        defragment(store)
        stages["fresh"] = member_size(store)
        paths = [f"/__meta_ha_size__/d{i // per_dir:04d}/f{i:07d}" for i in range(n)]
        groups = [paths[i : i + per_dir] for i in range(0, n, per_dir)]
        for d in range(len(groups)):
            mkdir(cluster.meta_address, f"/__meta_ha_size__/d{d:04d}")
        threads = min(8, len(groups))  # each directory filled by one thread
        log(f"etcd size: creating {n} files in {len(groups)} directories, {threads} threads")
        seconds = create_files(cluster.meta_address, groups, threads)
        stages["created"] = member_size(store)
        compact(store)
        stages["compacted"] = member_size(store)
        defragment(store)
        stages["defragmented"] = member_size(store)
        census = key_census(store)
        # what the files cost once their creates' retry records have been pruned
        store.call(
            "KV",
            "DeleteRange",
            rpc_pb2.DeleteRangeRequest(
                key=store.full_key(keys.IDEMPOTENT),
                range_end=store.full_key(prefix_end(keys.IDEMPOTENT)),
            ),
        )
        compact(store)
        defragment(store)
        stages["without_retry_records"] = member_size(store)
    finally:
        if store is not None:
            store.close()
        cluster.stop()
    fresh = stages["fresh"]
    per_file = {
        stage: {k: (v - fresh[k]) / n for k, v in sizes.items()}
        for stage, sizes in stages.items()
        if stage != "fresh"
    }
    files_in = {
        stage: {
            q: int(size / per["db_size"]) if per["db_size"] > 0 else None
            for q, size in QUOTAS.items()
        }
        for stage, per in per_file.items()
    }
    return {
        "files": n,
        "files_per_dir": per_dir,
        "create_threads": threads,
        "creates_per_s": n / seconds,
        "stages": stages,
        "bytes_per_file": per_file,
        "files_in_quota": files_in,
        "keys": census,
        "keys_per_file": {
            p: c["keys"] / n for p, c in census.items() if p in ("INOD", "DENT", "IDEM")
        },
    }


# report --------------------------------------------------------------------------------------
def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def _rate(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def _bytes(n: float) -> str:
    for unit, div in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def print_report(doc: dict, stream=sys.stdout) -> None:
    columns = [
        ("ping", "ping_per_s"),
        ("create", "create_per_s"),
        ("stat", "stat_per_s"),
        ("rename", "rename_per_s"),
        ("list calls", "list_calls_per_s"),
        ("list entries", "list_entries_per_s"),
    ]
    r = doc.get("rates")
    if r:
        rounds = doc["config"]["rounds"]
        of = f"median of {rounds} rounds" if rounds > 1 else "one round"
        print(f"\nmetadata rates per second ({of})", file=stream)
        head = "".join(f"{name:>13}" for name, _ in columns)
        print(f"  {'':<28}{head}{'client CPU':>12}", file=stream)
        for name, setup in r["setups"].items():
            print(f"  {setup['label']}", file=stream)
            for key, label in r["forms"].items():
                res = r["results"][name][key]
                cells = "".join(f"{_rate(res['median'][k]):>13}" for _, k in columns)
                cpu = f"{res['client_cpu_per_s']:.2f} s/s"
                print(f"    {label:<26}{cells}{cpu:>12}", file=stream)
        any_result = next(iter(next(iter(r["results"].values())).values()))
        print(
            f"  (list: directories of {any_result['list_entries']} entries; 2 metaservers: "
            "threads pinned half to each; client CPU: CPU seconds per second of the client "
            "processes)",
            file=stream,
        )
        titles = {
            "etcd_vs_rocksdb": "etcd / RocksDB, 1 metaserver each",
            "etcd2_vs_etcd": "2 metaservers / 1, on etcd",
        }
        for what, title in titles.items():
            of = " (median of per-round ratios, range)" if rounds > 1 else ""
            print(f"\n{title}{of}", file=stream)
            for key, label in r["forms"].items():
                s = r["ratios"][what][key]
                cells = "  ".join(f"{name} {ratio_text(s[k])}" for name, k in columns[:5])
                print(f"  {label:<26}{cells}", file=stream)
        multi = {n: v for n, v in r["processes_vs_one"].items() if v}
        if multi:
            print(
                "\nclient processes: the same threads over several processes / in one", file=stream
            )
            for name, by_form in multi.items():
                for key, s in by_form.items():
                    one = r["results"][name][key.split("x")[0] + "x1"]["client_cpu_per_s"]
                    cells = "  ".join(f"{n} {ratio_text(s[k])}" for n, k in columns[:5])
                    print(
                        f"  {r['setups'][name]['label']:<22} {r['forms'][key]}: {cells}"
                        f"  (one process used {one:.2f} CPU s/s)",
                        file=stream,
                    )
        handler = {
            name: r["results"][name][next(iter(r["forms"]))]["rounds"][-1].get("handler_us")
            for name in r["setups"]
        }
        if any(handler.values()):
            first = next(iter(r["forms"].values()))
            print(f"\nthe metaservers' own time per call ({first}, last round)", file=stream)
            for name, h in handler.items():
                if h:
                    cells = "  ".join(f"{op} {us:.0f} us" for op, us in h.items())
                    print(f"  {r['setups'][name]['label']:<24}{cells}", file=stream)
    f = doc.get("failover")
    if f:
        print(
            f"\nfailover: kill -9 of the leading metaserver (lease {f['leader_ttl_s']:g} s), "
            "clients creating files in a loop",
            file=stream,
        )
        print(
            f"  {'run':<6}{'killed':>7}{'leads now':>10}{'after':>9}"
            f"{'longest gap, client on the killed':>36}{'on the survivor':>17}{'errors':>8}",
            file=stream,
        )
        for i, run in enumerate(f["runs"], 1):
            a, b = run["client_on_killed"], run["client_on_survivor"]
            print(
                f"  {i:<6}{run['killed']:>7}{str(run['leader_after']):>10}"
                f"{_s(run['leads_after_s']):>9}{_s(a['longest_gap_s']):>36}"
                f"{_s(b['longest_gap_s']):>17}{a['errors'] + b['errors']:>8}",
                file=stream,
            )
        m = f["median"]
        print(
            f"  {'median':<23}{_s(m['leads_after_s']):>9}{_s(m['longest_gap_s']):>36}"
            f"{_s(m['longest_gap_on_survivor_s']):>17}",
            file=stream,
        )
    z = doc.get("etcd_size")
    if z:
        print(
            f"\netcd database, {z['files']} empty files in directories of {z['files_per_dir']} "
            f"({z['creates_per_s']:.0f} creates/s with {z['create_threads']} threads)",
            file=stream,
        )
        print(
            f"  {'stage':<26}{'dbSize':>11}{'in use':>11}{'per file':>10}{'in use':>8}"
            f"{'files in 2 GiB':>16}{'8 GiB':>14}",
            file=stream,
        )
        names = {
            "fresh": "fresh",
            "created": "after the creates",
            "compacted": "compacted",
            "defragmented": "defragmented",
            "without_retry_records": "retry records pruned",
        }
        for stage, sizes in z["stages"].items():
            per = z["bytes_per_file"].get(stage)
            fits = z["files_in_quota"].get(stage, {})
            extra = ""
            if per is not None:
                extra = (
                    f"{per['db_size']:>8.0f} B{per['db_size_in_use']:>6.0f} B"
                    f"{fits.get('2GiB') or '-':>16,}{fits.get('8GiB') or '-':>14,}"
                )
            print(
                f"  {names.get(stage, stage):<26}{_bytes(sizes['db_size']):>11}"
                f"{_bytes(sizes['db_size_in_use']):>11}{extra}",
                file=stream,
            )
        cells = "  ".join(
            f"{p} {k:.2f} ({z['keys'][p]['bytes'] / z['files']:.0f} B)"
            for p, k in z["keys_per_file"].items()
        )
        print(f"  keys per file (key and value bytes): {cells}", file=stream)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="rates,failover,size", help="what to run (default all)")
    p.add_argument(
        "--count", type=int, default=2000, help="calls of each operation per measurement"
    )
    p.add_argument("--threads", default="1,8", help="client thread counts (default 1,8)")
    p.add_argument(
        "--processes",
        type=int,
        default=2,
        help="also split each thread count above 1 over this many processes (1: never)",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of rate measurements")
    p.add_argument("--list-entries", type=int, default=1000, help="entries of the listed directory")
    p.add_argument("--failovers", type=int, default=3, help="kills of the leading metaserver")
    p.add_argument(
        "--failover-warmup", type=float, default=2.0, help="seconds of creates before a kill"
    )
    p.add_argument(
        "--failover-after",
        type=float,
        default=2.0,
        help="seconds the clients go on after the survivor leads",
    )
    p.add_argument("--files", type=int, default=20000, help="files created for the etcd size")
    p.add_argument("--files-per-dir", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="tiny counts, one round (a smoke run)")
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    p.add_argument("--workdir", default=None, help="where the clusters live (a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args(argv)
    if args.quick:
        args.count, args.rounds, args.list_entries = 80, 1, 50
        args.failovers, args.failover_warmup, args.failover_after = 1, 0.5, 0.5
        args.files, args.files_per_dir = 400, 100
    parts = {s.strip() for s in args.parts.split(",") if s.strip()}
    if not parts or parts - {"rates", "failover", "size"}:
        p.error("--parts takes rates, failover and size")
    try:
        args.threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        p.error("--threads takes thread counts, comma-separated")
    if min(args.threads) < 1 or args.rounds < 1 or args.count < 1 or args.processes < 1:
        p.error("--threads, --rounds, --count and --processes must be positive")
    if args.failovers < 1 or args.files < 1 or args.files_per_dir < 1 or args.list_entries < 1:
        p.error("--failovers, --files, --files-per-dir and --list-entries must be positive")

    def on_sigterm(signum, frame):
        raise SystemExit(143)  # unwinds through the finally blocks that stop the servers

    signal.signal(signal.SIGTERM, on_sigterm)
    from emberfs.cli.localetcd import etcd_binary

    etcd_binary()  # a clear error now when etcd is not installed
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="emberfs-meta-ha-", dir=args.workdir))
    # one admin token for every cluster of the run, which its clients present
    token = os.environ.get("EMBERFS_ADMIN_TOKEN") or secrets.token_urlsafe(32)
    os.environ["EMBERFS_TOKEN"] = token
    doc: dict = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "config": {
            k: getattr(args, k)
            for k in (
                "count",
                "threads",
                "processes",
                "rounds",
                "list_entries",
                "failovers",
                "files",
                "files_per_dir",
                "quick",
            )
        },
        "command": " ".join(
            ["python -m benchmarks.meta_ha", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    started = time.monotonic()
    try:
        if "rates" in parts:
            doc["rates"] = rates(args, workdir, token)
        if "failover" in parts:
            doc["failover"] = failover(args, workdir, token)
        if "size" in parts:
            doc["etcd_size"] = etcd_size(args, workdir, token)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    doc["seconds"] = round(time.monotonic() - started, 1)
    doc["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    print_report(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
        print(f"\nresults: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
