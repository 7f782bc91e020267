"""Free ports for local servers, picked where outgoing connections do not take them."""

from __future__ import annotations

import random
import socket
from collections.abc import Set
from pathlib import Path

EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICKED_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out as the source ports of outgoing connections."""
    try:
        low, high = (int(n) for n in EPHEMERAL_PORTS.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


_HANDED_OUT: set[int] = set()  # ports this process picked: never picked twice


def free_port(host: str = "127.0.0.1", count: int = 1, avoid: Set[int] = frozenset()) -> int:
    """The first of ``count`` consecutive ports that are free now, none of them in ``avoid``.

    The ports are picked at random outside the kernel's ephemeral range, so
    that no outgoing connection (a client's, or a server's to its peers) takes
    one as its source port between this pick and the bind of the server it is
    for. Where the range leaves no room for that, the kernel picks (bind to 0).
    A port is handed out once per process, so that clusters made one after
    another before any of them binds (two side by side) never share one.
    """
    low, high = _ephemeral_range()
    spans = [
        (lo, hi) for lo, hi in ((LOWEST_PICKED_PORT, low), (high + 1, 65536)) if hi - lo > count
    ]
    pick = random.SystemRandom()
    for _ in range(500):
        if spans:
            lo, hi = pick.choice(spans)
            first = pick.randrange(lo, hi - count + 1)
        else:
            with socket.socket() as s:
                s.bind((host, 0))
                first = s.getsockname()[1]
        ports = range(first, first + count)
        if ports[-1] <= 65535 and avoid.isdisjoint(ports) and _HANDED_OUT.isdisjoint(ports):
            if all(_bindable(host, port) for port in ports):
                _HANDED_OUT.update(ports)
                return first
    raise RuntimeError(f"no {count} consecutive free ports on {host}")
