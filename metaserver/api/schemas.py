"""Pydantic schemas of every admin API request and response.

``*Public`` models are what the API returns; ``*In`` models are request
bodies. Target states are the lower-case names of 3FS's public states
(``serving``, ``syncing``, ``waiting``, ``lastsrv``, ``offline``); chain
health is ``healthy`` (every member serving), ``degraded`` (some) or
``unavailable`` (none).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

TargetState = Literal["serving", "syncing", "waiting", "lastsrv", "offline"]
ChainHealth = Literal["healthy", "degraded", "unavailable"]

U32 = Annotated[int, Field(ge=0, le=2**32 - 1)]


class ErrorPublic(BaseModel):
    """Every error response: a status code and one readable sentence."""

    detail: str


class Health(BaseModel):
    """Liveness: the process answers."""

    status: Literal["ok"]


class ReadyPublic(BaseModel):
    """Readiness: ``ready`` or ``unavailable`` with the reason."""

    status: Literal["ready", "unavailable"]
    reason: str | None = None


class TargetPublic(BaseModel):
    """A storage target as the admin API shows it (``chain`` 0: in no chain)."""

    id: int
    node: str
    address: str
    grpc_address: str
    state: TargetState
    capacity: int
    used: int
    chunks: int
    chain: int
    full: bool = Field(
        description="its file system has no room for writes: its chain answers them NO_SPACE "
        "(the client raises ENOSPC) until it has; reads go on"
    )


class ChainMemberPublic(BaseModel):
    """One member of a chain and its state."""

    id: int
    state: TargetState


class ChainPublic(BaseModel):
    """A replication chain: its version and its targets, head first."""

    id: int
    version: int
    targets: list[ChainMemberPublic]


class NodePublic(BaseModel):
    """A storage node: its addresses, targets and liveness."""

    id: str
    address: str
    grpc_address: str
    targets: list[int]
    up: bool = Field(description="false when every target of the node is offline")
    last_heartbeat_seconds: float | None = Field(
        description="seconds of silence the heartbeat timeout judges: since the node's last "
        "heartbeat, counted from the metaserver's start or its last stall at the earliest"
    )


class TargetCounts(BaseModel):
    """Number of targets in each state."""

    total: int
    serving: int
    syncing: int
    waiting: int
    lastsrv: int
    offline: int
    full: int = Field(description="targets (in any state) whose file system is full")


class ChainCounts(BaseModel):
    """Number of chains by health."""

    total: int
    healthy: int
    degraded: int
    unavailable: int


class NamespaceCounts(BaseModel):
    """Inodes by type, open write sessions, and chunk cuts storage may not hold yet."""

    inodes: int
    files: int
    directories: int
    symlinks: int
    sessions: int
    pending_cuts: int


class DrainPublic(BaseModel):
    """A drain under way: ``target`` leaves ``chain`` once ``replacement`` serves."""

    target: int
    chain: int
    replacement: int
    replacement_state: TargetState


class LeaderPublic(BaseModel):
    """A metaserver as the leader key names it."""

    id: str
    address: str = Field(description="its gRPC address (MetaService, ClusterService)")
    cluster_address: str = Field(description="its ClusterService address for storage nodes")
    admin_url: str = Field(description="its admin API")


class LeadershipPublic(BaseModel):
    """Who runs the cluster manager, as the metaserver that answers sees it."""

    id: str = Field(description="the answering metaserver's id (new at every start)")
    leading: bool = Field(description="the answering metaserver runs the cluster manager")
    frozen: bool = Field(
        description="it leads but cannot reach the metadata store: it changes nothing and keeps "
        "storage servers serving for the outage grace"
    )
    term: int = Field(description="how many times the answering metaserver has taken the lead")
    store: str = Field(description="the metadata store: rocksdb, or the etcd URL")
    leader: LeaderPublic | None = Field(description="the leader (null: none known yet)")


class ClusterPublic(BaseModel):
    """Summary of the whole cluster."""

    version: str = Field(description="emberfs version of the metaserver")
    routing_version: int
    health: ChainHealth = Field(
        description="healthy when every chain is, unavailable when any chain is, else degraded"
    )
    nodes: int
    targets: TargetCounts
    chains: ChainCounts
    capacity: int = Field(description="bytes, summed over every target")
    used: int = Field(description="bytes, summed over every target")
    bytes_read: int = Field(description="bytes read from targets, summed node counters")
    bytes_written: int = Field(description="bytes written to targets, summed node counters")
    namespace: NamespaceCounts | None
    gc_pending: int
    drains: list[DrainPublic]
    store: str = Field(description="the metadata store: rocksdb, or the etcd URL")
    leader: str = Field(
        description="the gRPC address of the metaserver that leads the cluster manager "
        "(the one answering, unless this one was passed on to it)"
    )


class SessionPublic(BaseModel):
    """An open write session (a file open for writing)."""

    inode: int
    session_id: int
    client_id: str
    since: int = Field(description="opening time, nanoseconds since the epoch")
    renewed: int = Field(description="last lease renewal, nanoseconds since the epoch")
    expires: int = Field(
        description="when the session ends unless renewed, nanoseconds since the epoch: a "
        "session timeout after the last renewal this metaserver process saw (or after its "
        "start or last stall, when later)"
    )


class GCItemPublic(BaseModel):
    """A removed file whose chunks the targets of its chains still have to drop."""

    gc_id: int
    inode: int
    chains: list[int]
    acked: list[int] = Field(description="targets that dropped the chunks")
    waiting: list[int] = Field(description="targets still to drop them")


class GCRunPublic(BaseModel):
    """Result of a GC pass on the metaserver."""

    removed: int = Field(description="items every required target had acknowledged")
    pending: int = Field(description="items still waiting for a target")


class ScrubTargetPublic(BaseModel):
    """The scrubber's progress on one target, as its storage server last reported it."""

    id: int
    node: str
    running: bool = Field(description="a pass is walking this target now")
    paused: bool
    pass_started: int = Field(
        description="start of the pass under way or the last one, nanoseconds since the epoch"
    )
    last_full_pass: int = Field(
        description="end of the last pass that walked the whole target, nanoseconds since the "
        "epoch (0: none since its server started)"
    )
    bytes_verified: int = Field(description="by the pass under way, or the last one")
    chunks_verified: int
    errors: int = Field(description="damaged chunks found since its server started")
    repairs: int = Field(description="damaged chunks made whole by a resync since then")
    passes: int = Field(description="full passes since its server started")


class ScrubPublic(BaseModel):
    """The operator's scrub control and every target's progress (targets not reported: absent)."""

    paused: bool
    starts: int = Field(description="how many times a pass was started by hand")
    targets: list[ScrubTargetPublic]


class LayoutIn(BaseModel):
    """A directory layout. ``chunk_size`` 0 clears it (the directory inherits again)."""

    chunk_size: U32 = Field(description="bytes, a power of two from 64 KiB to 64 MiB, or 0")
    stripe: U32 = Field(0, description="chains per file, 1..256 (0 only with chunk_size 0)")
    chain_table: list[U32] = Field(
        default_factory=list, max_length=65536, description="chain ids (empty: every chain)"
    )


class LayoutPublic(BaseModel):
    """The layout stored on a directory (``chunk_size`` 0: inherited from its parent)."""

    path: str
    inode: int
    chunk_size: int
    stripe: int
    chain_table: list[int]


class TokenIn(BaseModel):
    """A client token to create: the identity it stands for, and a name to find it by."""

    uid: U32
    gid: U32 = Field(description="primary group")
    groups: list[U32] = Field(
        default_factory=list, max_length=64, description="supplementary groups"
    )
    name: str = Field(
        "",
        max_length=128,
        description="printable, unique among live tokens, not in the form of a token id "
        "(empty: unnamed)",
    )


class TokenPublic(BaseModel):
    """A client token: the identity it stands for (never its secret)."""

    id: str = Field(description="12 hex digits, the middle part of the token string")
    name: str
    uid: int
    gid: int
    groups: list[int]
    created: int = Field(description="nanoseconds since the epoch")


class TokenCreatedPublic(TokenPublic):
    """A token just created, with its string: the only time the API shows it."""

    token: str = Field(description="``emb1.<id>.<secret>``, the bearer token of the client")


class TokenListPublic(BaseModel):
    """Every live client token, oldest first."""

    tokens: list[TokenPublic]


U63 = Annotated[int, Field(ge=0, le=2**63 - 1)]


class QuotaIn(BaseModel):
    """The limits to set on a directory's quota; a limit left out is kept, 0 is no limit."""

    max_bytes: U63 | None = Field(None, description="bytes below the directory (0: no limit)")
    max_inodes: U63 | None = Field(
        None, description="files, directories and symlinks below it (0: no limit)"
    )


class QuotaPublic(BaseModel):
    """A directory quota: its limits (0: none) and what is counted below it now.

    Bytes are the lengths of the files plus the room their open writers reserved;
    entries in the trash count until they are purged.
    """

    path: str
    inode: int
    max_bytes: int
    max_inodes: int
    used_bytes: int
    used_inodes: int


class QuotaSetPublic(QuotaPublic):
    """A quota just set or changed."""

    over: bool = Field(
        description="usage is above a limit: applied all the same, every growth is refused "
        "(EDQUOT) until usage drops below it"
    )


class QuotaListPublic(BaseModel):
    """Every quota, by path."""

    quotas: list[QuotaPublic]


ERROR_RESPONSES: dict[int | str, dict] = {
    code: {"model": ErrorPublic, "description": text}
    for code, text in (
        (400, "Bad request"),
        (404, "Not found"),
        (422, "Invalid parameters"),
        (503, "Unavailable"),
    )
}
"""Error responses every ``/api/v1`` route may give."""

STEERING_RESPONSES: dict[int | str, dict] = {
    code: {"model": ErrorPublic, "description": text}
    for code, text in (
        (401, "No bearer token"),
        (403, "Wrong token, or no admin token configured"),
        (409, "Conflicts with the cluster's state"),
    )
}
"""The extra error responses of steering routes."""
