from emberfs.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TargetReport(_message.Message):
    __slots__ = ("target_id", "capacity", "used", "chunks", "bytes_read", "bytes_written", "full", "scrub")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    SCRUB_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    capacity: int
    used: int
    chunks: int
    bytes_read: int
    bytes_written: int
    full: bool
    scrub: ScrubReport
    def __init__(self, target_id: _Optional[int] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., chunks: _Optional[int] = ..., bytes_read: _Optional[int] = ..., bytes_written: _Optional[int] = ..., full: _Optional[bool] = ..., scrub: _Optional[_Union[ScrubReport, _Mapping]] = ...) -> None: ...

class ScrubReport(_message.Message):
    __slots__ = ("running", "paused", "pass_started_ns", "last_pass_ended_ns", "bytes_verified", "chunks_verified", "errors", "repairs", "passes")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PASS_STARTED_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_PASS_ENDED_NS_FIELD_NUMBER: _ClassVar[int]
    BYTES_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    REPAIRS_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    running: bool
    paused: bool
    pass_started_ns: int
    last_pass_ended_ns: int
    bytes_verified: int
    chunks_verified: int
    errors: int
    repairs: int
    passes: int
    def __init__(self, running: _Optional[bool] = ..., paused: _Optional[bool] = ..., pass_started_ns: _Optional[int] = ..., last_pass_ended_ns: _Optional[int] = ..., bytes_verified: _Optional[int] = ..., chunks_verified: _Optional[int] = ..., errors: _Optional[int] = ..., repairs: _Optional[int] = ..., passes: _Optional[int] = ...) -> None: ...

class ScrubControl(_message.Message):
    __slots__ = ("paused", "start")
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    start: int
    def __init__(self, paused: _Optional[bool] = ..., start: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "data_address", "grpc_address", "targets")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    data_address: str
    grpc_address: str
    targets: _containers.RepeatedCompositeFieldContainer[TargetReport]
    def __init__(self, node_id: _Optional[str] = ..., data_address: _Optional[str] = ..., grpc_address: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[TargetReport, _Mapping]]] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("target_ids", "routing", "cluster_address", "lease_seconds")
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    routing: _common_pb2.RoutingInfo
    cluster_address: str
    lease_seconds: float
    def __init__(self, target_ids: _Optional[_Iterable[int]] = ..., routing: _Optional[_Union[_common_pb2.RoutingInfo, _Mapping]] = ..., cluster_address: _Optional[str] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "targets", "routing_version")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    targets: _containers.RepeatedCompositeFieldContainer[TargetReport]
    routing_version: int
    def __init__(self, node_id: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[TargetReport, _Mapping]]] = ..., routing_version: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("routing_version", "reregister", "routing", "cluster_address", "lease_seconds", "scrub")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCRUB_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    reregister: bool
    routing: _common_pb2.RoutingInfo
    cluster_address: str
    lease_seconds: float
    scrub: ScrubControl
    def __init__(self, routing_version: _Optional[int] = ..., reregister: _Optional[bool] = ..., routing: _Optional[_Union[_common_pb2.RoutingInfo, _Mapping]] = ..., cluster_address: _Optional[str] = ..., lease_seconds: _Optional[float] = ..., scrub: _Optional[_Union[ScrubControl, _Mapping]] = ...) -> None: ...

class GetRoutingRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class GetRoutingResponse(_message.Message):
    __slots__ = ("routing",)
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    routing: _common_pb2.RoutingInfo
    def __init__(self, routing: _Optional[_Union[_common_pb2.RoutingInfo, _Mapping]] = ...) -> None: ...

class SyncDoneRequest(_message.Message):
    __slots__ = ("chain_id", "chain_version", "target_id")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    target_id: int
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., target_id: _Optional[int] = ...) -> None: ...

class SyncDoneResponse(_message.Message):
    __slots__ = ("routing",)
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    routing: _common_pb2.RoutingInfo
    def __init__(self, routing: _Optional[_Union[_common_pb2.RoutingInfo, _Mapping]] = ...) -> None: ...

class GCItem(_message.Message):
    __slots__ = ("gc_id", "inode", "chains")
    GC_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    gc_id: int
    inode: int
    chains: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, gc_id: _Optional[int] = ..., inode: _Optional[int] = ..., chains: _Optional[_Iterable[int]] = ...) -> None: ...

class FetchGCRequest(_message.Message):
    __slots__ = ("target_ids", "limit")
    TARGET_IDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    target_ids: _containers.RepeatedScalarFieldContainer[int]
    limit: int
    def __init__(self, target_ids: _Optional[_Iterable[int]] = ..., limit: _Optional[int] = ...) -> None: ...

class FetchGCResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[GCItem]
    def __init__(self, items: _Optional[_Iterable[_Union[GCItem, _Mapping]]] = ...) -> None: ...

class AckGCRequest(_message.Message):
    __slots__ = ("target_id", "gc_ids")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    GC_IDS_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    gc_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, target_id: _Optional[int] = ..., gc_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AckGCResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportLostChunkRequest(_message.Message):
    __slots__ = ("chain_id", "target_id", "inode", "index", "length")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    target_id: int
    inode: int
    index: int
    length: int
    def __init__(self, chain_id: _Optional[int] = ..., target_id: _Optional[int] = ..., inode: _Optional[int] = ..., index: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ReportLostChunkResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...
