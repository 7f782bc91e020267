"""The cluster manager's records: a storage node as registered (:class:`Node`), what one call
changed (:class:`Changes`, written as one batch), and the checks of what nodes send.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from emberfs.common import errors
from emberfs.common.addresses import split_address

U64 = struct.Struct(">Q")

MAX_NODE_ID = 255
MAX_TARGETS_PER_NODE = 1024


@dataclass
class Node:
    """A storage node as registered: its id and the addresses it serves on."""

    node_id: str
    data_address: str
    grpc_address: str

    def encode(self) -> bytes:
        return json.dumps(
            {
                "node_id": self.node_id,
                "data_address": self.data_address,
                "grpc_address": self.grpc_address,
            }
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Node:
        d = json.loads(raw)
        return cls(d["node_id"], d["data_address"], d["grpc_address"])


@dataclass
class Changes:
    """What a call changed, written as one batch before it returns."""

    nodes: set[str] = field(default_factory=set)
    targets: set[int] = field(default_factory=set)  # state, chain or new target: bumps routing
    usage: set[int] = field(default_factory=set)  # capacity/used/chunks/full only
    chains: set[int] = field(default_factory=set)
    admin: bool = False  # drains or fenced targets changed

    @property
    def bumps_routing(self) -> bool:
        return bool(self.nodes or self.targets or self.chains)


def validate_address(address: str, what: str) -> None:
    """Raise InvalidArgument unless ``address`` is ``host:port`` with a valid port."""
    try:
        _, port = split_address(address)
    except ValueError:
        port = 0
    if not port:
        raise errors.InvalidArgument(f"{what} {address!r} is not host:port")
    if len(address) > 300 or any(c.isspace() for c in address):
        raise errors.InvalidArgument(f"{what} {address!r} is not host:port")


def validate_node_id(node_id: str) -> None:
    if not node_id or len(node_id) > MAX_NODE_ID:
        raise errors.InvalidArgument("node id must have 1 to 255 characters")
    if not node_id.isprintable() or any(c.isspace() for c in node_id):
        raise errors.InvalidArgument(f"node id {node_id!r} has blank or control characters")
