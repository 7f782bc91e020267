"""The chaos checker: a mixed workload under injected faults, checked for lost and stale data.

Run from the repository root::

    python -m benchmarks.chaos --faults 20 --seed 1          # a local cluster of 3 servers
    python -m benchmarks.chaos --duration 600 --clients 4 --storage-servers 4 --keep

It starts a cluster (a :class:`~emberfs.cli.localcluster.LocalCluster` by
default, R = 3, a short heartbeat timeout; ``--mode compose`` the docker
compose cluster of ``deploy/``), gives the directory ``/chaos`` a small chunk
size, and starts ``--clients`` client processes that each run a mixed workload
on files of their own (:mod:`benchmarks.chaos_workload`), checking every read
at once against their model of the file (:mod:`benchmarks.chaos_model`).
Meanwhile rounds of faults (:mod:`benchmarks.chaos_faults`) kill, freeze and
restart servers. After each round and a quiet period the clients pause, the
checker waits until every target serves (resyncs done) and checks:

- every chunk's replicas agree (version, length, checksum; no pending
  version), from ``StorageService.ListChunks`` on every storage server;
- every file reads back as its acknowledged writes made it (0 bytes lost), with
  the length they gave it, and each client's directory holds exactly its files;
- no server process died except by the checker's hand (checked all along).

Throughout the run a read that returned bytes older than a write acknowledged
before it began (``stale_read``) or bytes no write of the file put there
(``never_written``) is a violation too.

The output is one JSON summary on stdout: faults by kind, operations by kind
and outcome, bytes verified, violations by kind and, for each violation, the
history of the file and the faults around it. Exit code 0 without violations,
1 with violations, 2 when the run could not be made. The fault schedule and
each client's choices are drawn from ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import chaos_faults  # noqa: E402
from benchmarks.chaos_cluster import (  # noqa: E402
    LocalDriver,
    list_chunks,
    replica_differences,
    set_layout,
)
from benchmarks.chaos_workload import ClientConfig, client_main  # noqa: E402

ROOT_DIR = "/chaos"
KiB = 1024
EXIT_OK, EXIT_VIOLATIONS, EXIT_COULD_NOT_RUN = 0, 1, 2
HISTORY_SHOWN = 14  # operations of a file shown before a violation
DETAILS_SHOWN = 20  # violations shown in full
PAUSE_TIMEOUT = 180.0  # an operation still running after this hangs
HEAL_TIMEOUT = 120.0
REPLICA_SETTLE = 30.0  # garbage collection and the last resync writes may lag the states


class CouldNotRun(Exception):
    """The run could not be made (exit code 2)."""


def parse_size(text: str) -> int:
    units = {"k": KiB, "kib": KiB, "m": KiB * KiB, "mib": KiB * KiB}
    t = text.strip().lower()
    for suffix, mult in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos",
        description="Run a mixed workload under injected faults and check what it reads.",
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--faults", type=int, help="stop after the round that reaches N faults")
    budget.add_argument("--duration", type=float, help="stop after the round that ends past S s")
    p.add_argument("--clients", type=int, default=3, help="client processes (default 3)")
    p.add_argument("--seed", type=int, help="seed of the schedule and workload (default: random)")
    p.add_argument("--mode", choices=("local", "compose"), default="local")
    p.add_argument("--storage-servers", type=int, default=3, help="local mode (default 3)")
    p.add_argument("--targets-per-server", type=int, default=2, help="local mode (default 2)")
    p.add_argument("--replicas", type=int, default=3, help="local mode (default 3)")
    p.add_argument(
        "--heartbeat-timeout", type=float, default=2.0, help="local mode, seconds (default 2)"
    )
    p.add_argument(
        "--chunk-size", type=parse_size, default=256 * KiB, help="of /chaos (default 256KiB)"
    )
    p.add_argument(
        "--fault-kinds",
        help="comma-separated kinds (default: every kind of the mode but all_storage_kill); "
        f"known: {', '.join(chaos_faults.KINDS)}",
    )
    p.add_argument(
        "--op-timeout",
        type=float,
        default=20.0,
        help="seconds a client retries a metaserver call or a chunk read or write (default 20)",
    )
    p.add_argument("--data-dir", type=Path, help="where the cluster and histories go")
    p.add_argument("--keep", action="store_true", help="keep the data dir (histories, logs)")
    p.add_argument("--json-out", type=Path, help="also write the summary to this file")
    p.add_argument("--compose-project", help="compose mode: attach to this running project instead")
    args = p.parse_args(argv)
    if args.faults is None and args.duration is None:
        args.faults = 20
    if args.seed is None:
        args.seed = secrets.randbelow(1 << 31)
    default_kinds = chaos_faults.LOCAL_KINDS if args.mode == "local" else chaos_faults.COMPOSE_KINDS
    args.kinds = tuple(
        k.strip() for k in (args.fault_kinds or ",".join(default_kinds)).split(",") if k.strip()
    )
    unknown = [k for k in args.kinds if k not in chaos_faults.KINDS]
    if unknown:
        p.error(f"unknown fault kinds: {', '.join(unknown)}")
    if args.mode == "local" and any(k.startswith("partition_") for k in args.kinds):
        p.error("partition faults need --mode compose")
    if args.clients < 1:
        p.error("--clients must be at least 1")
    return args


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}{'-dirty' if dirty else ''}" if rev else "unknown"


class Client:
    """One client process and its pipe."""

    def __init__(self, ctx, cfg: ClientConfig) -> None:
        self.cfg = cfg
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=client_main, args=(cfg, child), name=f"chaos-client-{cfg.index}"
        )
        self.proc.start()
        child.close()
        self.crash: str | None = None

    def send(self, cmd: str, **kw) -> None:
        self.conn.send({"cmd": cmd, **kw})

    def receive(self, key: str, timeout: float):
        """The answer carrying ``key``; None when none came within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.conn.poll(0.5):
                try:
                    msg = self.conn.recv()
                except EOFError:
                    self.crash = self.crash or "the client process exited"
                    return None
                if "crashed" in msg:
                    self.crash = msg["crashed"]
                    return None
                if key in msg:
                    return msg[key]
            elif not self.proc.is_alive():
                self.crash = self.crash or f"the client process exited ({self.proc.exitcode})"
                return None
        return None


class Run:
    """One run of the checker."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.violations: list[dict] = []
        self.checks: list[dict] = []
        self.inodes: dict[str, list] = {}
        self._lock = threading.Lock()
        self.stop_monitor = threading.Event()
        self.t_start = time.monotonic()
        self.aborted: str | None = None

    # violations found by the coordinator ----------------------------------------------------
    def violation(self, kind: str, detail: dict, **where) -> None:
        with self._lock:
            self.violations.append(
                {
                    "type": "violation",
                    "kind": kind,
                    "t": time.monotonic(),
                    "detail": detail,
                    **where,
                }
            )

    def monitor(self) -> None:
        """Report server processes that die on their own, and start them again."""
        while not self.stop_monitor.wait(self.driver.monitor_interval):
            for death in self.driver.unexpected_deaths():
                self.violation("process_died", death)
                try:
                    self.driver.revive(death["process"])
                except Exception as exc:
                    self.violation(
                        "restart_failed", {"process": death["process"], "error": str(exc)[-2000:]}
                    )

    # the run ------------------------------------------------------------------------------
    def execute(self) -> int:
        a = self.args
        keep = a.keep
        made_dir = a.data_dir is None
        self.data_dir = Path(a.data_dir or tempfile.mkdtemp(prefix="emberfs-chaos-"))
        if (self.data_dir / "clients").exists():
            raise CouldNotRun(f"{self.data_dir} holds an earlier run; give an empty directory")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "clients").mkdir()
        token = secrets.token_hex(16)
        if a.mode == "local":
            self.driver = LocalDriver(
                self.data_dir / "cluster",
                a.storage_servers,
                a.targets_per_server,
                a.replicas,
                a.heartbeat_timeout,
                token,
            )
        else:
            from benchmarks.chaos_compose import ComposeDriver

            self.driver = ComposeDriver(self.data_dir, token, project=a.compose_project)
        self.clients: list[Client] = []
        self.runner: chaos_faults.FaultRunner | None = None
        monitor = threading.Thread(target=self.monitor, daemon=True)
        try:
            try:
                self.driver.start()
                self.prepare()
            except Exception as exc:
                raise CouldNotRun(f"the cluster did not start: {exc}") from exc
            self.start_clients()
            monitor.start()
            self.rounds()
            stats = self.stop_clients()
            self.stop_monitor.set()
            monitor.join()
            summary = self.summary(stats)
        finally:
            self.stop_monitor.set()
            if self.runner is not None:
                self.runner.stop()
            for c in self.clients:
                if c.proc.is_alive():
                    c.proc.terminate()
                    c.proc.join(10)
            self.driver.stop()
        text = json.dumps(summary, indent=2)
        print(text)
        if a.json_out:
            a.json_out.write_text(text + "\n")
        (self.data_dir / "summary.json").write_text(text + "\n")
        self.print_violations(summary)
        if not keep and made_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        else:
            print(f"histories and logs kept in {self.data_dir}", file=sys.stderr)
        return EXIT_VIOLATIONS if summary["violations"]["total"] else EXIT_OK

    def prepare(self) -> None:
        from emberfs.client.fs import EmberFileSystem
        from emberfs.proto import common_pb2, meta_pb2

        stripe = max(1, len(self.driver.routing().chains))
        fs = EmberFileSystem(
            self.driver.meta_address, token=self.driver.client_token, skip_instance_cache=True
        )
        try:
            fs.makedirs(ROOT_DIR, exist_ok=True)
            if self.driver.token is None:  # no admin token: the namespace call itself
                layout = common_pb2.Layout(chunk_size=self.args.chunk_size, stripe=stripe)
                req = meta_pb2.SetLayoutRequest(
                    ctx=fs.client.meta.context(), path=ROOT_DIR, layout=layout
                )
                fs.client.meta.meta("SetLayout", req, ROOT_DIR)
            else:
                set_layout(
                    self.driver.admin_url, self.driver.token, ROOT_DIR, self.args.chunk_size, stripe
                )
        finally:
            fs.close()

    def start_clients(self) -> None:
        a = self.args
        ctx = multiprocessing.get_context("spawn")
        fs_options = {
            "rpc_timeout": min(5.0, a.op_timeout),
            "retry_timeout": a.op_timeout,
            "read_timeout": a.op_timeout,
            "write_timeout": a.op_timeout,
            "io_timeout": 10.0,
            "connect_timeout": 2.0,
            "token": self.driver.client_token,
        }
        for i in range(a.clients):
            cfg = ClientConfig(
                index=i,
                seed=a.seed,
                meta=self.driver.meta_address,
                root=ROOT_DIR,
                chunk_size=a.chunk_size,
                history=str(self.data_dir / "clients" / f"client-{i}.jsonl"),
                max_size=max(2 << 20, 6 * a.chunk_size),  # files of several chunks
                fs_options=fs_options,
                secret_file=self.driver.secret_file,
            )
            self.clients.append(Client(ctx, cfg))

    def rounds(self) -> None:
        a = self.args
        self.runner = chaos_faults.FaultRunner(
            self.driver, lambda kind, detail: self.violation(kind, detail)
        )
        k = 0
        while self.aborted is None:
            rnd = chaos_faults.plan_round(
                a.seed, k, a.kinds, self.driver.servers, self.driver.heartbeat_timeout
            )
            self.runner.run_round(rnd)
            time.sleep(rnd.quiet)
            self.check(rnd)
            k += 1
            done = len(self.runner.log)
            if a.faults is not None and done >= a.faults:
                break
            if a.duration is not None and time.monotonic() - self.t_start >= a.duration:
                break

    # checks ----------------------------------------------------------------------------------
    def ask_all(self, cmd: str, key: str, timeout: float, **kw) -> dict[int, object]:
        for c in self.clients:
            if c.crash is None:
                c.send(cmd, **kw)
        out = {}
        for c in self.clients:
            if c.crash is not None:
                continue
            got = c.receive(key, timeout)
            if got is None:
                if c.crash is not None:
                    raise CouldNotRun(f"client {c.cfg.index} crashed:\n{c.crash}")
                self.violation(
                    "hung_operation",
                    {"what": f"client {c.cfg.index} did not answer '{cmd}' in {timeout:.0f} s"},
                    client=c.cfg.index,
                )
                self.aborted = f"client {c.cfg.index} hangs"
                continue
            out[c.cfg.index] = got
        return out

    def check(self, rnd) -> None:
        t0 = time.monotonic()
        record: dict = {"round": rnd.index, "t": round(t0 - self.t_start, 3)}
        self.ask_all("pause", "paused", PAUSE_TIMEOUT)
        if self.aborted:
            return
        if not self.driver.wait_serving(HEAL_TIMEOUT):
            states = {
                str(t.target_id): t.state for t in self.driver.routing().targets
            }  # best effort
            self.violation(
                "not_healed",
                {
                    "round": rnd.index,
                    "what": f"targets not all serving {HEAL_TIMEOUT:.0f} s after "
                    "the faults were healed",
                    "states": states,
                },
            )
            self.aborted = "the cluster did not heal"
        record["heal_s"] = round(time.monotonic() - t0, 3)
        t1 = time.monotonic()
        diffs = []
        while True:
            try:
                diffs = replica_differences(
                    self.driver.routing(),
                    lister=partial(list_chunks, keys=self.driver.keys),
                    name_of=self.driver.server_name,
                )
            except Exception as exc:  # a server that does not answer: try again
                diffs = [{"error": f"{type(exc).__name__}: {exc}"[:300]}]
            if not diffs or time.monotonic() - t1 > REPLICA_SETTLE:
                break
            time.sleep(1.0)
        record["replicas_settle_s"] = round(time.monotonic() - t1, 3)
        for d in diffs:
            self.violation("replica_divergence", {"round": rnd.index, **d})
        record["replica_differences"] = len(diffs)
        verified = self.ask_all("verify", "verified", PAUSE_TIMEOUT, check=rnd.index)
        for res in verified.values():
            self.inodes.update(res.pop("inodes"))
        record["clients"] = verified
        record["check_s"] = round(time.monotonic() - t0, 3)
        self.checks.append(record)
        if not self.aborted:
            for c in self.clients:
                if c.crash is None:
                    c.send("resume")
        print(
            f"round {rnd.index}: {rnd.faults} faults, check {record['check_s']:.1f} s, "
            f"{len(self.violations)} coordinator violations so far",
            file=sys.stderr,
        )

    def stop_clients(self) -> dict[int, dict]:
        stats = self.ask_all("stop", "stats", PAUSE_TIMEOUT)
        for c in self.clients:
            c.proc.join(30)
        return stats

    # summary ---------------------------------------------------------------------------------
    def histories(self) -> tuple[list[dict], list[dict]]:
        ops, violations = [], []
        for path in sorted((self.data_dir / "clients").glob("client-*.jsonl")):
            with open(path) as f:
                for line in f:
                    rec = json.loads(line)
                    (ops if rec["type"] == "op" else violations).append(rec)
        return ops, violations

    def rel(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.t_start, 3)

    def excerpt(self, v: dict, by_file: dict, faults: list[dict]) -> dict:
        """A violation with the operations of its file before it and the faults around them."""
        out = dict(v)
        out.pop("type", None)
        out["t"] = self.rel(v.get("t"))
        key = (v.get("client"), v.get("file"))
        if key[1] is None and "inode" in v.get("detail", {}):
            found = self.inodes.get(str(v["detail"]["inode"]))
            if found:
                key = (found[0], found[1])
                out["client"], out["file"], out["path"] = found
        history = by_file.get(key, [])
        if v.get("op") is not None:
            history = [r for r in history if r["op"] <= v["op"]]
        history = history[-HISTORY_SHOWN:]
        out["history"] = [
            {
                k: (self.rel(r[k]) if k in ("t0", "t1") else r[k])
                for k in ("op", "t0", "t1", "kind", "path", "args", "ok", "result", "error")
                if k in r
            }
            for r in history
        ]
        lo = (history[0]["t0"] if history else v["t"]) - 3.0
        hi = v["t"] + 1.0
        out["faults_around"] = [
            {**f, "start": self.rel(f["start"]), "healed": self.rel(f["healed"])}
            for f in faults
            if f["start"] <= hi and (f["healed"] or hi) >= lo
        ]
        return out

    def summary(self, stats: dict[int, dict]) -> dict:
        ops, client_violations = self.histories()
        faults = [r.as_dict() for r in self.runner.log]
        by_file: dict = {}
        for r in ops:
            by_file.setdefault((r["client"], r["file"]), []).append(r)
        by_kind: dict[str, dict[str, int]] = {}
        errors: dict[str, int] = {}
        for s in stats.values():
            for kind, c in s["ops"].items():
                agg = by_kind.setdefault(kind, {"ok": 0, "error": 0})
                agg["ok"] += c["ok"]
                agg["error"] += c["error"]
            for name, n in s["errors"].items():
                errors[name] = errors.get(name, 0) + n
        violations = sorted(client_violations + self.violations, key=lambda v: v["t"])
        v_kinds: dict[str, int] = {}
        for v in violations:
            v_kinds[v["kind"]] = v_kinds.get(v["kind"], 0) + 1
        exact = sum(
            c["bytes_exact"] for chk in self.checks for c in chk.get("clients", {}).values()
        )
        loose = sum(
            c["bytes_loose"] for chk in self.checks for c in chk.get("clients", {}).values()
        )
        (self.data_dir / "faults.json").write_text(json.dumps(faults, indent=1) + "\n")
        return {
            "result": "violations" if violations else "ok",
            "seed": self.args.seed,
            "commit": git_commit(),
            "command": "python -m benchmarks.chaos " + " ".join(sys.argv[1:]),
            "cluster": self.driver.describe(),
            "chunk_size": self.args.chunk_size,
            "clients": self.args.clients,
            "duration_s": round(time.monotonic() - self.t_start, 1),
            "rounds": len(self.checks),
            "aborted": self.aborted,
            "faults": {"total": len(faults), "by_kind": self.runner.counts()},
            "ops": {
                "total": sum(c["ok"] + c["error"] for c in by_kind.values()),
                "by_kind": dict(sorted(by_kind.items())),
                "errors_by_type": errors,
            },
            "bytes_verified": {
                "exact_after_heal": exact,
                "loose_after_heal": loose,
                "read_and_checked": sum(s["bytes_read_checked"] for s in stats.values()),
            },
            "checks": [
                {k: v for k, v in chk.items() if k != "clients"}
                | {
                    "files": sum(c["files"] for c in chk.get("clients", {}).values()),
                    "uncertain_files": sum(
                        c["uncertain_files"] for c in chk.get("clients", {}).values()
                    ),
                }
                for chk in self.checks
            ],
            "violations": {"total": len(violations), "by_kind": v_kinds},
            "violation_details": [
                self.excerpt(v, by_file, faults) for v in violations[:DETAILS_SHOWN]
            ],
        }

    def print_violations(self, summary: dict) -> None:
        """The violations and the history of their files, for a reader of the log (stderr)."""
        for v in summary["violation_details"]:
            print(
                f"\nVIOLATION {v['kind']} at {v['t']} s: client {v.get('client')} "
                f"file {v.get('file')} {v.get('path')} op {v.get('op')}",
                file=sys.stderr,
            )
            print(f"  detail: {json.dumps(v['detail'])[:1500]}", file=sys.stderr)
            for r in v["history"]:
                outcome = "ok" if r["ok"] else f"ERROR {r.get('error', '')[:120]}"
                print(
                    f"  op {r['op']:>5} {r['t0']:>8.3f}-{r['t1']:<8.3f} {r['kind']:<24} "
                    f"{json.dumps(r.get('args'))} {outcome}",
                    file=sys.stderr,
                )
            for f in v["faults_around"]:
                print(
                    f"  fault {f['id']} {f['kind']} victim {f['victim']} "
                    f"{f['start']}-{f['healed']} {' '.join(f['notes'])}",
                    file=sys.stderr,
                )


def _exit_on_sigterm(signum, frame) -> None:
    """SIGTERM unwinds like an exception: the cluster and the clients are stopped."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    print(f"chaos: seed {args.seed}", file=sys.stderr)
    try:
        return Run(args).execute()
    except CouldNotRun as exc:
        print(json.dumps({"result": "could not run", "seed": args.seed, "error": str(exc)}))
        print(f"chaos: could not run: {exc}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN


if __name__ == "__main__":
    sys.exit(main())
