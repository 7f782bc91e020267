"""Frames that stop half-sent or trickle in: the storage servers must drop them in time."""

from __future__ import annotations

import random
import select
import socket
import threading
import time
from dataclasses import dataclass

from emberfs.common import framing
from emberfs.common.framing import Op
from emberfs.proto import data_pb2

from . import timeouts
from .cluster import Env
from .datainputs import DataInputs
from .frames import FrameParts
from .scratch import SCRATCH_INODE
from .tally import Tally, hexcut
from .values import MiB


@dataclass
class Stall:
    """A frame that stops half-sent (or trickles): the server must drop it in time."""

    kind: str
    server: int
    payload: bytes  # sent at once (a stall) or one byte a tick (a trickle)
    sock: socket.socket | None = None
    sent: int = 0
    started: float = 0.0
    closed_after: float | None = None

    def example(self) -> dict:
        out = {"server": f"storage-{self.server}", **hexcut(self.payload)}
        if self.closed_after is not None:
            out["closed_after_s"] = round(self.closed_after, 2)
        return out


def make_stall(gen: DataInputs, rng: random.Random) -> Stall:
    parts, server = gen.frame()
    kind = rng.choice(("stall_header", "stall_body", "trickle", "stall_data"))
    if kind == "stall_data":  # an admitted server write whose data stops half-way
        parts = FrameParts(
            Op.WRITE,
            data_pb2.ChunkWriteRequest(
                chain_id=gen.chains[0][0],
                target_id=gen.chains[0][2][0],
                chunk=data_pb2.ChunkId(inode=SCRATCH_INODE, index=0),
                chunk_size=4 * MiB,
                client_id="fuzz-stall",
            ).SerializeToString(),
            rng.randbytes(65536),
            gen.server_cred,
        )
        server = gen.env.server_of_target(gen.chains[0][2][0]) or 0
    frame = parts.encode()
    if len(frame) <= framing.HEADER_SIZE + 1:
        kind = "stall_header"  # nothing after the header to stop in
    if kind == "stall_header":
        payload = frame[: rng.randrange(1, framing.HEADER_SIZE)]
    elif kind in ("stall_body", "stall_data"):
        payload = frame[: rng.randrange(framing.HEADER_SIZE, len(frame))]
    else:
        payload = frame if len(frame) > framing.HEADER_SIZE else frame + bytes(64)
    return Stall(kind, server, payload)


def run_stalls(
    env: Env, tally: Tally, rng: random.Random, count: int, stop: threading.Event
) -> None:
    """``count`` stalled frames, 8 at a time; each must be dropped within the frame timeout."""
    gen = DataInputs(env, rng, tally)
    done = 0
    while done < count and not stop.is_set():
        batch = [make_stall(gen, rng) for _ in range(min(8, count - done))]
        _stall_batch(env, batch)
        for s in batch:
            limit = timeouts.FRAME_TIMEOUT + timeouts.STALL_SLACK
            if s.closed_after is None:
                tally.record(s.kind, "connect failed", s.example, hang="could not connect")
            elif s.closed_after > limit:
                hang = f"dropped after {s.closed_after:.1f} s, not within {limit:.0f} s"
                tally.record(s.kind, "dropped late", s.example, hang=hang)
            else:
                tally.record(s.kind, "dropped", s.example)
        done += len(batch)


def _stall_batch(env: Env, batch: list[Stall]) -> None:
    """Send each stall's bytes (a trickle one byte every 0.25 s) until its server closes."""
    for s in batch:
        try:
            s.sock = socket.create_connection(
                env.data_address(s.server), timeout=timeouts.ANSWER_TIMEOUT
            )
        except OSError:
            continue
        s.started = time.monotonic()
        if s.kind != "trickle":
            try:
                s.sock.sendall(s.payload)
            except OSError:
                pass
            s.sent = len(s.payload)
    give_up = time.monotonic() + timeouts.FRAME_TIMEOUT + 3 * timeouts.STALL_SLACK
    live = [s for s in batch if s.sock is not None]
    while live and time.monotonic() < give_up:
        readable, _, _ = select.select([s.sock for s in live], [], [], 0.25)
        for s in list(live):
            if s.sock in readable and _closed_by_peer(s.sock):
                s.closed_after = time.monotonic() - s.started
            elif s.kind == "trickle" and s.sent < len(s.payload):
                try:
                    s.sock.send(s.payload[s.sent : s.sent + 1])
                    s.sent += 1
                except OSError:
                    s.closed_after = time.monotonic() - s.started
            if s.closed_after is not None:
                s.sock.close()
                live.remove(s)
    for s in live:
        s.closed_after = time.monotonic() - s.started
        s.sock.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Read what the peer sent (a refusal, say) without waiting; True once it has closed."""
    while True:
        try:
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                return True
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
