"""``host:port`` addresses, parsed and written one way everywhere."""

from __future__ import annotations


def split_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (or ``[v6]:port``) into ``(host, port)``.

    Raises
    ------
    ValueError
        When ``address`` has no host, no port, or a port outside 0..65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"invalid address {address!r}: expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    p = int(port)
    if not 0 <= p <= 65535:
        raise ValueError(f"invalid port in {address!r}")
    return host, p


def join_address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_addresses(text: str) -> list[str]:
    """The ``host:port`` addresses of a comma-separated list (``h1:p1,h2:p2``), in order.

    Raises
    ------
    ValueError
        When the list is empty or an address is not ``HOST:PORT``.
    """
    out = [a.strip() for a in text.split(",") if a.strip()]
    if not out:
        raise ValueError(f"invalid address list {text!r}: expected HOST:PORT[,HOST:PORT...]")
    for address in out:
        _, port = split_address(address)
        if not port:
            raise ValueError(f"invalid address {address!r}: port 0")
    return out
