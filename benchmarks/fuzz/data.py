"""The data surface: sending frames to the storage servers' data ports, reading their answers."""

from __future__ import annotations

import random
import select
import socket
import threading
import time

from google.protobuf.message import DecodeError

from emberfs.common import framing
from emberfs.common.framing import Op, Status
from emberfs.proto import data_pb2

from . import timeouts
from .cluster import Env
from .datainputs import DataInput, DataInputs
from .stalls import run_stalls
from .surface import Job, Outcome, Surface
from .tally import Tally


class DataLinks:
    """One thread's connections to the data ports, kept while the servers keep them."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self._socks: dict[int, socket.socket] = {}

    def get(self, i: int) -> socket.socket:
        sock = self._socks.get(i)
        if sock is not None and not _still_open(sock):
            self.drop(i)
            sock = None
        if sock is None:
            sock = socket.create_connection(
                self.env.data_address(i), timeout=timeouts.ANSWER_TIMEOUT
            )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks[i] = sock
        return sock

    def drop(self, i: int) -> None:
        sock = self._socks.pop(i, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for i in list(self._socks):
            self.drop(i)

    def send(self, item: DataInput) -> Outcome:
        """Send one input and wait for its answer, or for the server to close."""
        try:
            sock = self.get(item.server)
        except OSError as exc:
            return Outcome("connect failed", hang=f"cannot connect: {exc}")
        deadline = time.monotonic() + timeouts.ANSWER_TIMEOUT
        try:
            sock.settimeout(timeouts.ANSWER_TIMEOUT)
            sock.sendall(item.payload)
            if item.ragged:
                sock.shutdown(socket.SHUT_WR)
        except TimeoutError:
            self.drop(item.server)
            return Outcome(
                "send blocked", hang=f"the server took no bytes for {timeouts.ANSWER_TIMEOUT} s"
            )
        except OSError:
            self.drop(item.server)
            return Outcome("closed")
        if item.ragged:
            outcome = drain(sock, deadline)
            self.drop(item.server)
            return outcome
        outcome, keep = read_answer(sock, deadline, item.op)
        if not keep or (item.has_data and outcome.status != "OK"):
            self.drop(item.server)
        return outcome


def _still_open(sock: socket.socket) -> bool:
    """False when the peer has closed (or reset) an idle connection."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return True
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


def read_answer(sock: socket.socket, deadline: float, op: int | None) -> tuple[Outcome, bool]:
    """The answer to one whole frame (or the server closing); whether the connection lives on."""
    try:
        header, meta, crcs = framing.recv_head(sock, deadline)
    except TimeoutError:
        return Outcome(
            "no answer", hang=f"neither answered nor closed in {timeouts.ANSWER_TIMEOUT} s"
        ), False
    except framing.FrameError as exc:
        if "after 0 of" in str(exc):
            return Outcome("closed"), False
        return Outcome("bad answer", error=f"malformed answer: {exc}"), False
    except OSError:
        return Outcome("closed"), False
    status = framing.status_name(header.status)
    if op is not None and header.op != op | framing.RESPONSE:
        return Outcome(status, error=f"answer op {header.op:#x} to op {op}"), False
    try:
        if header.data_len:
            data = framing.recv_exact(sock, header.data_len, deadline)
            framing.verify(data, crcs, header.block_size)
        if header.status == Status.OK and op == Op.READ:
            data_pb2.ChunkReadResponse.FromString(meta)
        elif header.status != Status.OK:
            data_pb2.ErrorResponse.FromString(meta)
    except TimeoutError:
        return Outcome(status, hang="the answer's data did not arrive in time"), False
    except (framing.FrameError, DecodeError) as exc:
        return Outcome(status, error=f"malformed answer: {type(exc).__name__}: {exc}"), False
    except OSError:
        return Outcome(status), False
    error = "the server answered INTERNAL" if header.status == Status.INTERNAL else None
    return Outcome(status, error=error), header.status not in (Status.DENIED, Status.BUSY)


def drain(sock: socket.socket, deadline: float) -> Outcome:
    """Read until the server closes; the first answer's status (``closed`` when none)."""
    got = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return Outcome(_first_status(got), hang=f"did not close in {timeouts.ANSWER_TIMEOUT} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        if len(got) < framing.HEADER_SIZE:
            got += chunk
    status = _first_status(got)
    return Outcome(status, error="the server answered INTERNAL" if status == "INTERNAL" else None)


def _first_status(got: bytes) -> str:
    if len(got) < framing.HEADER_SIZE:
        return "closed"
    try:
        return framing.status_name(framing.unpack_header(bytes(got[: framing.HEADER_SIZE])).status)
    except framing.FrameError as exc:
        return f"bad answer ({exc})"


class DataSurface(Surface):
    """Frames to every storage server's data port, and frames that stall (see :mod:`.stalls`)."""

    name = "data"
    threads = 6

    def inputs(self, rng: random.Random, tally: Tally) -> DataInputs:
        return DataInputs(self.env, rng, tally)

    def link(self) -> DataLinks:
        return DataLinks(self.env)

    def judge(self, item: DataInput, answer: Outcome) -> Outcome:
        """The link's outcome as it is: an answer is judged as it is read (its header says
        how much more to read: see :func:`read_answer` and :func:`drain`)."""
        return answer

    def jobs(self, inputs: int, seed: int) -> list[Job]:
        """The inputs from :attr:`threads` threads, and one more thread's stalled frames."""
        stalls = max(8, inputs // 2500)
        jobs = super().jobs(inputs - stalls, seed)
        jobs.append((self.stalls, stalls, random.Random(f"{seed}/stalls")))
        return jobs

    def stalls(self, tally: Tally, rng: random.Random, count: int, stop: threading.Event) -> None:
        run_stalls(self.env, tally, rng, count, stop)
