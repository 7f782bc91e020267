"""The scrubbers' progress on each target, and the operator's control of them.

Storage servers report each target's scrub progress in their heartbeats
(``ScrubReport``, see :mod:`emberfs.storageserver.scrub`); the metaserver keeps
the latest report of each target in memory and answers every heartbeat with
the ``ScrubControl`` that the operator set (``emberfs admin scrub
start|pause``, ``POST /api/v1/scrub/start|pause``). The control is kept in the
metadata store (``CONF`` ``cluster.scrub``), so a pause outlives a restart.
"""

from __future__ import annotations

import json
import threading

from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine
from emberfs.proto import cluster_pb2


class ScrubBoard:
    """Scrub reports by target, and the control every heartbeat answer carries."""

    def __init__(self, engine: KVEngine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._reports: dict[int, cluster_pb2.ScrubReport] = {}
        self.load()

    def load(self) -> None:
        """Read the control from the store (a metaserver that starts to lead does)."""
        raw = self._engine.get(keys.config_key(keys.SCRUB))
        saved = json.loads(raw) if raw else {}
        with self._lock:
            self._control = cluster_pb2.ScrubControl(
                paused=bool(saved.get("paused", False)), start=int(saved.get("start", 0))
            )

    def reported(self, target_id: int, report: cluster_pb2.ScrubReport) -> None:
        with self._lock:
            self._reports[target_id] = report

    def reports(self) -> dict[int, cluster_pb2.ScrubReport]:
        """The last report of every target that sent one."""
        with self._lock:
            return dict(self._reports)

    def control(self) -> cluster_pb2.ScrubControl:
        with self._lock:
            return cluster_pb2.ScrubControl(paused=self._control.paused, start=self._control.start)

    def pause(self) -> cluster_pb2.ScrubControl:
        """Stop every scrubber between two chunks until :meth:`start`."""
        return self._set(paused=True, raise_start=False)

    def start(self) -> cluster_pb2.ScrubControl:
        """Let scrubbers run again, and have each begin a pass now where none runs."""
        return self._set(paused=False, raise_start=True)

    def _set(self, *, paused: bool, raise_start: bool) -> cluster_pb2.ScrubControl:
        with self._lock:
            control = cluster_pb2.ScrubControl(
                paused=paused, start=self._control.start + int(raise_start)
            )
            value = json.dumps({"paused": control.paused, "start": control.start}).encode()
            self._engine.write({keys.config_key(keys.SCRUB): value})
            self._control = control
            return cluster_pb2.ScrubControl(paused=control.paused, start=control.start)
