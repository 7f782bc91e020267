"""The client's one retry helper, and the request ids that make a retry safe.

:func:`retry` calls a function until it succeeds, an error it does not retry
occurs, or a total deadline passes; the sleep between attempts doubles (with
jitter) up to a cap. It retries the gRPC codes listed in
:data:`RETRYABLE_CODES` (the metaserver is unreachable or timed out) and
:class:`TransientError` (a data-path failure that fresh routing may cure).

A retried request must apply once: every mutating request carries the client
id and a request id of :class:`RequestIds`, and a retry sends the same pair,
so the metaserver or the chain answers it with the first attempt's result.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import grpc

from emberfs.common import errors

T = TypeVar("T")

# gRPC status codes worth retrying: the server is not reachable now, or timed out.
RETRYABLE_CODES: tuple[grpc.StatusCode, ...] = tuple(errors.RETRYABLE_CODES)


class TransientError(Exception):
    """A data-path failure that a retry (after a routing refresh) may cure."""


def is_retryable(exc: BaseException) -> bool:
    """Whether :func:`retry` retries ``exc``."""
    if isinstance(exc, TransientError):
        return True
    if not isinstance(exc, grpc.RpcError):
        return False
    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # the server's own overload answer (its request queue is full), not a full disk,
        # which carries an errno
        return not any(key == errors.ERRNO_KEY for key, _ in exc.trailing_metadata() or ())
    return exc.code() in RETRYABLE_CODES


def retry(
    fn: Callable[[], T],
    *,
    timeout: float,
    attempts: int | None = None,
    backoff: float = 0.05,
    max_backoff: float = 1.0,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Call ``fn`` until it succeeds, a non-retryable error occurs, or time runs out.

    Parameters
    ----------
    fn : callable
        Called with no argument. It must be idempotent (retried requests carry
        the same request id).
    timeout : float
        Total seconds after which the last retryable error is raised.
    attempts : int or None, default None
        Upper bound on calls; None means only ``timeout`` bounds them.
    backoff : float, default 0.05
        First sleep between attempts; doubled each time (with jitter).
    max_backoff : float, default 1.0
        Cap of the sleep.
    on_retry : callable or None
        Called with the error before each sleep (e.g. to refresh routing).

    Returns
    -------
    The result of ``fn``.
    """
    deadline = time.monotonic() + timeout
    delay = backoff
    n = 0
    while True:
        n += 1
        try:
            return fn()
        except Exception as exc:
            if not is_retryable(exc):
                raise
            left = deadline - time.monotonic()
            if left <= 0 or (attempts is not None and n >= attempts):
                raise
            if on_retry is not None:
                on_retry(exc)
            time.sleep(min(delay * (0.5 + random.random()), left, max_backoff))
            delay = min(delay * 2, max_backoff)


class RequestIds:
    """A client id (uuid4 hex) and increasing request ids, thread-safe."""

    def __init__(self) -> None:
        self.client_id = uuid.uuid4().hex
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def next(self, n: int = 1) -> int:
        """The first of ``n`` consecutive unused request ids."""
        with self._lock:
            first = next(self._counter)
            if n > 1:
                self._counter = itertools.count(first + n)
            return first
