"""Calls of one kind from many threads, sent together as one batch call.

The metaserver client (:mod:`emberfs.client.meta`) sends concurrent write
opens, creates and closes of a client's threads through a :class:`Combiner`
each: while one call is in flight the others queue, then go as one batch call
(``BatchWriteOpen``, ``BatchCreate``, ``BatchClose``), each item with an
answer of its own. A call made alone is sent alone.
"""

from __future__ import annotations

import threading
import time


class _Slot:
    __slots__ = ("item", "result", "done", "batch", "leads")

    def __init__(self, item) -> None:
        self.item = item
        self.result: object = None
        self.done = threading.Event()
        self.batch: list[_Slot] | None = None  # the batch this caller sends
        self.leads: tuple[int, float] | None = None  # it gathers the next batch (Combiner._run)


class Combiner:
    """Calls of one kind from many threads, sent together.

    A caller finding no call of its kind in flight sends its own at once;
    callers that come while one is in flight queue, and when it ends the
    first of them sends everything queued by then in one ``send`` (then the
    next queue goes, and so on). When a call of several callers ends, the
    next one waits a little for them, since they often call again at once:
    until they all came back, or a quarter of that call's time (at most
    :attr:`MAX_LINGER`) has passed. Without it the threads of a busy client
    split into groups that take turns, a call carrying a part of them. A
    caller alone never waits. ``send(items)`` returns one result per item, an
    exception instance for an item that failed; an exception it raises fails
    every item of the batch.
    """

    MAX_LINGER = 0.002  # seconds

    def __init__(self, send) -> None:
        self._send = send
        self._cond = threading.Condition()
        self._queued: list[_Slot] = []
        self._busy = False  # a call is in flight, or the next one is being gathered
        self._arrived = 0  # callers queued since the last call ended
        self._lead: tuple[int, float] | None = None  # the next caller gathers (see _run)
        self._expected: int | None = None  # the callers a gathering caller waits for

    def queued(self) -> int:
        """Callers waiting for the next call."""
        with self._cond:
            return len(self._queued)

    def call(self, item):
        """``item``'s result (its exception raised)."""
        slot = _Slot(item)
        with self._cond:
            if not self._busy:
                self._busy = True
                slot.batch = [slot]
            else:
                self._queued.append(slot)
                self._arrived += 1
                if self._lead is not None:
                    slot.leads, self._lead = self._lead, None
                elif self._arrived == self._expected:
                    self._cond.notify()  # the gathering caller: everyone it waits for is here
        if slot.batch is None and slot.leads is None:
            slot.done.wait()
        if slot.leads is not None:
            slot.batch = self._gather(*slot.leads)
        if slot.batch is not None:
            self._run(slot.batch)
        if isinstance(slot.result, BaseException):
            raise slot.result
        return slot.result

    def _gather(self, expected: int, deadline: float) -> list[_Slot]:
        """The queue, once ``expected`` callers are in it or at ``deadline``."""
        with self._cond:
            self._expected = expected
            while self._arrived < expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._expected = None
            batch, self._queued = self._queued, []
        return batch

    def _run(self, batch: list[_Slot]) -> None:
        began = time.monotonic()
        try:
            results = self._send([s.item for s in batch])
        except BaseException as exc:
            results = [exc] * len(batch)
        now = time.monotonic()
        for s, result in zip(batch, results, strict=True):
            s.result = result
        deadline = now + min((now - began) / 4, self.MAX_LINGER)
        first = None
        with self._cond:
            # the next call waits for this one's callers besides those queued meanwhile
            lead = (len(self._queued) + len(batch), deadline)
            self._arrived = len(self._queued)
            if self._queued:
                first = self._queued[0]
                first.leads = lead
            elif len(batch) > 1:
                self._lead = lead  # whoever comes first gathers
            else:
                self._busy = False
        for s in batch[1:]:
            s.done.set()
        if first is not None:
            first.done.set()
