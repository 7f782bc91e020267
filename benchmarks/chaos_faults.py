"""The chaos checker's faults: a schedule drawn from the seed, and the loop that applies it.

A run is a sequence of rounds. Round ``k`` is drawn from ``Random(f"{seed}/round/{k}")``
alone, so the schedule of a seed is the same in every run (what happens when, relative
to the start of the round; how long a restart takes is up to the machine). A round has

- a *storage lane*: faults of storage servers one after the other, with a quiet gap
  before each, so that at most one storage server is down or frozen at a time and every
  chain keeps at least two of its three replicas (a quorum);
- a *metaserver lane*, run beside it from a delay of its own, so metaserver restarts
  land anywhere, also while a storage server is down;
- a quiet period after both lanes end, before the round's check.

Fault kinds (``KINDS``):

``storage_kill``
    kill -9 of one storage server, restarted after a while.
``storage_pause_short``, ``storage_pause_long``
    SIGSTOP, then SIGCONT, of one storage server: shorter than the heartbeat timeout
    (the cluster must not notice) and longer (its targets go offline, then resync).
``meta_kill``
    kill -9 of the metaserver, restarted after a while.
``all_storage_kill``
    kill -9 of every storage server at once (every replica of every chain), restarted
    together. Not in the default set: it is the one kind that stops a whole chain.
``partition_all``, ``partition_meta``, ``partition_peers``
    a storage server cut from everything, from the metaserver only, from its chain peers
    only (the compose cluster only; see :mod:`benchmarks.chaos_cluster`).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import asdict, dataclass, field

# kind -> (lane, weight, duration range in heartbeat timeouts)
KINDS: dict[str, tuple[str, int, tuple[float, float]]] = {
    "storage_kill": ("storage", 4, (0.2, 1.5)),
    "storage_pause_short": ("storage", 3, (0.15, 0.45)),
    "storage_pause_long": ("storage", 3, (1.2, 2.2)),
    "meta_kill": ("meta", 1, (0.1, 1.5)),
    "all_storage_kill": ("storage", 1, (0.5, 2.0)),
    "partition_all": ("storage", 3, (1.5, 3.0)),
    "partition_meta": ("storage", 3, (1.5, 3.0)),
    "partition_peers": ("storage", 3, (1.5, 3.0)),
}
LOCAL_KINDS = ("storage_kill", "storage_pause_short", "storage_pause_long", "meta_kill")
COMPOSE_KINDS = LOCAL_KINDS + ("partition_all", "partition_meta", "partition_peers")


@dataclass(frozen=True)
class Fault:
    """One planned fault."""

    kind: str
    victim: int | None  # storage server index (None: the metaserver, or every server)
    duration: float  # seconds down, frozen or cut off
    gap: float  # seconds of quiet before it
    wait_healed: bool  # wait until every target serves before the lane goes on


@dataclass(frozen=True)
class Round:
    index: int
    storage: list[Fault]
    meta: list[Fault]
    meta_delay: float
    quiet: float

    @property
    def faults(self) -> int:
        return len(self.storage) + len(self.meta)


def plan_round(
    seed: int, index: int, kinds: tuple[str, ...], servers: int, heartbeat_timeout: float
) -> Round:
    """Round ``index`` of the schedule of ``seed`` (a pure function of its arguments)."""
    rng = random.Random(f"{seed}/round/{index}")
    hb = heartbeat_timeout

    def draw(lane: str, n: int) -> list[Fault]:
        names = [k for k in kinds if KINDS[k][0] == lane]
        out = []
        for _ in range(n if names else 0):
            kind = rng.choices(names, weights=[KINDS[k][1] for k in names])[0]
            lo, hi = KINDS[kind][2]
            victim = None
            if lane == "storage" and kind != "all_storage_kill":
                victim = rng.randrange(servers)
            out.append(
                Fault(
                    kind=kind,
                    victim=victim,
                    duration=round(rng.uniform(lo, hi) * hb, 3),
                    gap=round(rng.uniform(0.2, 1.0), 3),
                    wait_healed=rng.random() < 0.6,
                )
            )
        return out

    storage = draw("storage", rng.randint(3, 5))
    meta = draw("meta", rng.choice((0, 1, 1, 2)))
    return Round(
        index=index,
        storage=storage,
        meta=meta,
        meta_delay=round(rng.uniform(0.0, 4.0), 3),
        quiet=round(rng.uniform(0.5, 2.0), 3),
    )


@dataclass
class FaultRecord:
    """One fault as it was applied (monotonic times)."""

    id: int
    round: int
    kind: str
    victim: int | None
    planned_duration: float
    start: float = 0.0
    healed: float | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class FaultRunner:
    """Applies rounds to a cluster driver and records what it did.

    Parameters
    ----------
    driver
        A cluster driver of :mod:`benchmarks.chaos_cluster`.
    on_violation : callable
        ``on_violation(kind, detail)`` for a fault that could not be healed.
    """

    def __init__(self, driver, on_violation) -> None:
        self.driver = driver
        self.on_violation = on_violation
        self.log: list[FaultRecord] = []
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._lanes: list[threading.Thread] = []

    def _record(self, rnd: Round, fault: Fault) -> FaultRecord:
        with self._lock:
            rec = FaultRecord(
                len(self.log) + 1, rnd.index, fault.kind, fault.victim, fault.duration
            )
            self.log.append(rec)
        return rec

    def _sleep(self, seconds: float) -> None:
        self.stopping.wait(seconds)

    def apply(self, rnd: Round, fault: Fault) -> FaultRecord:
        """Break, wait ``fault.duration``, heal."""
        d = self.driver
        rec = self._record(rnd, fault)
        rec.start = time.monotonic()
        kind, victim = fault.kind, fault.victim
        try:
            if kind == "storage_kill":
                d.kill_storage(victim)
                self._sleep(fault.duration)
                d.start_storage(victim)
            elif kind in ("storage_pause_short", "storage_pause_long"):
                d.pause_storage(victim)
                self._sleep(fault.duration)
                d.resume_storage(victim)
            elif kind == "meta_kill":
                d.kill_meta()
                self._sleep(fault.duration)
                d.start_meta()
            elif kind == "all_storage_kill":
                for i in range(d.servers):
                    d.kill_storage(i)
                self._sleep(fault.duration)
                for i in range(d.servers):
                    d.start_storage(i)
            elif kind.startswith("partition_"):
                d.partition(victim, kind.removeprefix("partition_"))
                self._sleep(fault.duration)
                d.heal_partition(victim)
            else:
                raise ValueError(f"unknown fault kind {kind}")
        except Exception as exc:
            rec.notes.append(f"healing failed: {type(exc).__name__}: {exc}"[:500])
            self.on_violation(
                "restart_failed", {"fault": rec.id, "kind": kind, "error": str(exc)[-2000:]}
            )
        rec.healed = time.monotonic()
        return rec

    def run_lane(self, rnd: Round, faults: list[Fault], delay: float = 0.0) -> None:
        self._sleep(delay)
        for fault in faults:
            if self.stopping.is_set():
                return
            self._sleep(fault.gap)
            rec = self.apply(rnd, fault)
            if fault.wait_healed and fault.kind not in ("meta_kill", "storage_pause_short"):
                if not self.driver.wait_serving(90):
                    rec.notes.append("targets not all serving 90 s after healing")

    def run_round(self, rnd: Round) -> None:
        """Both lanes of ``rnd``, side by side; returns when both ended."""
        meta = threading.Thread(
            target=self.run_lane, args=(rnd, rnd.meta, rnd.meta_delay), daemon=True
        )
        self._lanes.append(meta)
        meta.start()
        self.run_lane(rnd, rnd.storage)
        meta.join()

    def stop(self, timeout: float = 120.0) -> None:
        """Apply no more faults; wait for a fault being healed to be healed."""
        self.stopping.set()
        for lane in self._lanes:
            lane.join(timeout)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rec in self.log:
            out[rec.kind] = out.get(rec.kind, 0) + 1
        return out
