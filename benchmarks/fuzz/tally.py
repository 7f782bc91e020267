"""What one surface's inputs met, and how an input is shown in the report."""

from __future__ import annotations

import collections
import hashlib
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

MAX_EXAMPLES = 20
EXAMPLE_BYTES = 16 * 1024  # an example's input beyond this is cut (its length and hash kept)


def hexcut(raw: bytes) -> dict:
    """An input's bytes for a report: hex, cut at :data:`EXAMPLE_BYTES` (length and hash kept)."""
    out: dict[str, Any] = {"hex": raw[:EXAMPLE_BYTES].hex(), "length": len(raw)}
    if len(raw) > EXAMPLE_BYTES:
        out["cut"] = True
        out["sha256"] = hashlib.sha256(raw).hexdigest()
    return out


class Tally:
    """What one surface's inputs met, shared by its threads.

    Parameters
    ----------
    surface : str
        The surface's name.
    """

    def __init__(self, surface: str) -> None:
        self.surface = surface
        self._lock = threading.Lock()
        self.inputs = 0
        self.kinds: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.guarded = 0
        self.crashes: list[dict] = []
        self.hangs = 0
        self.hang_examples: list[dict] = []
        self.errors = 0
        self.error_examples: list[dict] = []
        self.fuzzer_errors: list[str] = []
        self.time_by_group: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        self._recent: collections.deque[Callable[[], dict]] = collections.deque(maxlen=16)

    def record(
        self,
        kind: str,
        status: str,
        example: Callable[[], dict],
        *,
        hang: str | None = None,
        error: str | None = None,
        group: str = "",
        seconds: float = 0.0,
    ) -> None:
        """Count one input; ``example()`` describes it when it is shown.

        ``seconds`` it took are added up by ``group`` (a method or a route).
        """
        with self._lock:
            self.inputs += 1
            if group:
                spent = self.time_by_group[group]
                spent[0] += 1
                spent[1] += seconds
            self.kinds[kind] += 1
            self.statuses[status] += 1
            self._recent.append(example)
            if hang is not None:
                self.hangs += 1
                if len(self.hang_examples) < MAX_EXAMPLES:
                    self.hang_examples.append({"reason": hang, "kind": kind, **example()})
            if error is not None:
                self.errors += 1
                if len(self.error_examples) < MAX_EXAMPLES:
                    self.error_examples.append(
                        {"error": error, "kind": kind, "status": status, **example()}
                    )

    def guard(self, n: int = 1) -> None:
        """Count inputs replaced because they would have changed real state."""
        with self._lock:
            self.guarded += n

    def probe_hang(self, probe: str, reason: str) -> None:
        """A health probe did not answer in time: a hang, shown with the latest inputs."""
        with self._lock:
            self.hangs += 1
            if len(self.hang_examples) < MAX_EXAMPLES:
                recent = [make() for make in list(self._recent)[-4:]]
                self.hang_examples.append(
                    {"reason": f"probe {probe}: {reason}", "latest_inputs": recent}
                )

    def crash(self, name: str, code: int | None, log_tail: str) -> None:
        """A server process exited: kept with its log's tail and the latest inputs."""
        with self._lock:
            recent = [make() for make in list(self._recent)]
            self.crashes.append(
                {"process": name, "exit_code": code, "log_tail": log_tail, "latest_inputs": recent}
            )

    def fuzzer_error(self, text: str) -> None:
        with self._lock:
            self.fuzzer_errors.append(text[-4000:])
