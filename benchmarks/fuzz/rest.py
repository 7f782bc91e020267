"""The REST surface: requests to the admin API."""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import time

from . import timeouts
from .cluster import CouldNotRun, Env
from .restinputs import RestInput, RestInputs
from .surface import Outcome, Surface
from .tally import Tally


class RestLink:
    """One thread's keep-alive connection to the admin API."""

    def __init__(self, env: Env) -> None:
        host, port = env.cluster.admin_address.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def send(self, item: RestInput) -> Outcome:
        """What came of it: the HTTP status (a 5xx is judged by the surface), a hang, a break."""
        if item.raw is not None:
            return self._raw(item.raw)
        timeout = timeouts.SLOW_TIMEOUT if item.slow else timeouts.CALL_TIMEOUT
        for attempt in (0, 1):
            fresh = self._conn is None
            if fresh:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
                self._conn.connect()
                self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self._conn
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(item.method, item.target, body=item.body, headers=item.headers)
                resp = conn.getresponse()
                resp.read()
            except TimeoutError:
                self.close()
                return Outcome("no answer", hang=f"no answer in {timeout:.0f} s")
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if fresh or attempt:
                    return Outcome("closed", error=f"closed without answering: {exc}")
                continue  # a kept-alive connection the server had closed: once more
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                return Outcome("closed", error=f"{type(exc).__name__}: {exc}")
            if resp.will_close:
                self.close()
            return Outcome(str(resp.status))
        return Outcome("closed")

    def _raw(self, raw: bytes) -> Outcome:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeouts.ANSWER_TIMEOUT)
        except OSError as exc:
            return Outcome("connect failed", hang=f"cannot connect: {exc}")
        with sock:
            try:
                sock.sendall(raw)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            deadline = time.monotonic() + timeouts.ANSWER_TIMEOUT
            got = bytearray()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return Outcome(
                        _http_status(got), hang=f"did not close in {timeouts.ANSWER_TIMEOUT} s"
                    )
                sock.settimeout(left)
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                if len(got) < 64:
                    got += chunk
        return Outcome(_http_status(got))


def _http_status(got: bytes) -> str:
    """The status code of the first answer in ``got`` (``closed`` when nothing came)."""
    m = re.match(rb"HTTP/\d\.\d (\d{3})", bytes(got))
    return m.group(1).decode() if m else ("closed" if not got else "not HTTP")


def admin_request(env: Env, method: str, target: str) -> tuple[int, bytes]:
    """One request to the admin API with the admin token: (status, body)."""
    host, port = env.cluster.admin_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeouts.CALL_TIMEOUT)
    try:
        conn.request(method, target, headers={"Authorization": f"Bearer {env.token}"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class RestSurface(Surface):
    """Every route of the admin API's OpenAPI document, routes outside it and malformed HTTP."""

    name = "rest"
    threads = 32

    def start(self) -> None:
        """Read the OpenAPI document the inputs are made from."""
        status, raw = admin_request(self.env, "GET", "/openapi.json")
        if status != 200:
            raise CouldNotRun(f"GET /openapi.json answered {status}")
        self.schema = json.loads(raw)

    def finish(self) -> None:
        """A fuzzed pause of the scrubbers is undone."""
        status, raw = admin_request(self.env, "GET", "/api/v1/scrub")
        if status == 200 and json.loads(raw).get("paused"):
            admin_request(self.env, "POST", "/api/v1/scrub/start")

    def inputs(self, rng: random.Random, tally: Tally) -> RestInputs:
        return RestInputs(self.env, rng, tally, self.schema)

    def link(self) -> RestLink:
        return RestLink(self.env)

    def judge(self, item: RestInput, answer: Outcome) -> Outcome:
        """An answer that came in time with a 5xx status is a server error."""
        if answer.hang is not None or answer.error is not None:
            return answer
        status = answer.status
        if item.raw is not None:
            failed = status.startswith("5")
        else:
            failed = status.isdigit() and int(status) >= 500
        return Outcome(status, error=f"HTTP {status}") if failed else answer
