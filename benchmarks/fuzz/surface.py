"""A surface of the servers under fuzzing: what inputs it makes, how it sends one, how it judges
the answer; and the one worker that runs any surface's inputs.

A surface is run as :meth:`Surface.start`, then :meth:`Surface.jobs` in threads (each job
``fn(tally, rng, count, stop)``), then :meth:`Surface.finish`. Its usual job is
:meth:`Surface.work`: ``count`` inputs from :meth:`Surface.inputs`, each sent on a link from
:meth:`Surface.link`, its answer judged by :meth:`Surface.judge` and counted in the tally.
"""

from __future__ import annotations

import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .cluster import Env
from .tally import Tally


@dataclass
class Outcome:
    """What an input met: its status label, and a hang or a server error when there was one."""

    status: str
    hang: str | None = None
    error: str | None = None


class Input(Protocol):
    """One input of a surface."""

    kind: str

    @property
    def group(self) -> str:
        """What its time is added up by in the report's ``slowest`` (a method, a route, a kind)."""
        ...

    def example(self) -> dict:
        """The input as the report shows it."""
        ...


class Inputs(Protocol):
    """Makes one thread's inputs."""

    def next(self) -> Any: ...


class Link(Protocol):
    """One thread's way to the servers: sends an input, returns what came back."""

    def send(self, item: Any) -> Any: ...

    def close(self) -> None: ...


Job = tuple[Callable[[Tally, random.Random, int, threading.Event], None], int, random.Random]


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal counts."""
    return [total // parts + (i < total % parts) for i in range(parts)]


class Surface(ABC):
    """One surface of the servers under fuzzing.

    Parameters
    ----------
    env : Env
        The cluster under test.
    """

    name: str = ""
    threads: int = 1  # the threads that send its inputs

    def __init__(self, env: Env) -> None:
        self.env = env

    def start(self) -> None:  # noqa: B027 - a hook, nothing by default
        """Before its threads start (what they share is made here)."""

    def finish(self) -> None:  # noqa: B027 - a hook, nothing by default
        """After its threads end, even when they failed (what they shared is closed here)."""

    @abstractmethod
    def inputs(self, rng: random.Random, tally: Tally) -> Inputs:
        """What makes one thread's inputs (``tally`` counts the inputs it replaces)."""

    @abstractmethod
    def link(self) -> Link:
        """One thread's link to the servers."""

    @abstractmethod
    def judge(self, item: Any, answer: Any) -> Outcome:
        """What the answer that ``item`` met (from its link's ``send``) says of the server."""

    def jobs(self, inputs: int, seed: int) -> list[Job]:
        """What its threads run: :meth:`work` on a share of ``inputs`` each."""
        return [
            (self.work, share, random.Random(f"{seed}/{self.name}/{i}"))
            for i, share in enumerate(shares(inputs, self.threads))
        ]

    def work(self, tally: Tally, rng: random.Random, count: int, stop: threading.Event) -> None:
        """Send ``count`` inputs (until ``stop`` is set) and count what each met."""
        gen = self.inputs(rng, tally)
        link = self.link()
        try:
            for _ in range(count):
                if stop.is_set():
                    return
                item = gen.next()
                started = time.perf_counter()
                outcome = self.judge(item, link.send(item))
                tally.record(
                    item.kind,
                    outcome.status,
                    item.example,
                    hang=outcome.hang,
                    error=outcome.error,
                    group=item.group,
                    seconds=time.perf_counter() - started,
                )
        finally:
            link.close()
