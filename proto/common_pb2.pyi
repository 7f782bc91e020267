from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_TYPE_UNSPECIFIED: _ClassVar[FileType]
    FILE: _ClassVar[FileType]
    DIRECTORY: _ClassVar[FileType]
    SYMLINK: _ClassVar[FileType]

class TargetState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TARGET_STATE_UNSPECIFIED: _ClassVar[TargetState]
    SERVING: _ClassVar[TargetState]
    SYNCING: _ClassVar[TargetState]
    WAITING: _ClassVar[TargetState]
    LASTSRV: _ClassVar[TargetState]
    OFFLINE: _ClassVar[TargetState]
FILE_TYPE_UNSPECIFIED: FileType
FILE: FileType
DIRECTORY: FileType
SYMLINK: FileType
TARGET_STATE_UNSPECIFIED: TargetState
SERVING: TargetState
SYNCING: TargetState
WAITING: TargetState
LASTSRV: TargetState
OFFLINE: TargetState

class RequestContext(_message.Message):
    __slots__ = ("client_id", "request_id", "uid", "gid", "groups")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    request_id: int
    uid: int
    gid: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., request_id: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ...) -> None: ...

class Layout(_message.Message):
    __slots__ = ("chunk_size", "stripe", "seed", "chain_table", "chains")
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TABLE_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    chunk_size: int
    stripe: int
    seed: int
    chain_table: _containers.RepeatedScalarFieldContainer[int]
    chains: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, chunk_size: _Optional[int] = ..., stripe: _Optional[int] = ..., seed: _Optional[int] = ..., chain_table: _Optional[_Iterable[int]] = ..., chains: _Optional[_Iterable[int]] = ...) -> None: ...

class InodeAttr(_message.Message):
    __slots__ = ("inode", "type", "mode", "uid", "gid", "size", "mtime_ns", "ctime_ns", "crtime_ns", "nlink", "layout", "symlink_target", "holes", "data_version", "writers", "unversioned", "quota_realm", "has_quota", "quota_charged")
    INODE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CRTIME_NS_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    HOLES_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    WRITERS_FIELD_NUMBER: _ClassVar[int]
    UNVERSIONED_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REALM_FIELD_NUMBER: _ClassVar[int]
    HAS_QUOTA_FIELD_NUMBER: _ClassVar[int]
    QUOTA_CHARGED_FIELD_NUMBER: _ClassVar[int]
    inode: int
    type: FileType
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    ctime_ns: int
    crtime_ns: int
    nlink: int
    layout: Layout
    symlink_target: str
    holes: _containers.RepeatedCompositeFieldContainer[ByteRange]
    data_version: int
    writers: int
    unversioned: bool
    quota_realm: int
    has_quota: bool
    quota_charged: int
    def __init__(self, inode: _Optional[int] = ..., type: _Optional[_Union[FileType, str]] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., ctime_ns: _Optional[int] = ..., crtime_ns: _Optional[int] = ..., nlink: _Optional[int] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., symlink_target: _Optional[str] = ..., holes: _Optional[_Iterable[_Union[ByteRange, _Mapping]]] = ..., data_version: _Optional[int] = ..., writers: _Optional[int] = ..., unversioned: _Optional[bool] = ..., quota_realm: _Optional[int] = ..., has_quota: _Optional[bool] = ..., quota_charged: _Optional[int] = ...) -> None: ...

class ByteRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class TargetInfo(_message.Message):
    __slots__ = ("target_id", "node_id", "data_address", "grpc_address", "state", "capacity", "used", "chunks", "chain_id", "full")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    node_id: str
    data_address: str
    grpc_address: str
    state: TargetState
    capacity: int
    used: int
    chunks: int
    chain_id: int
    full: bool
    def __init__(self, target_id: _Optional[int] = ..., node_id: _Optional[str] = ..., data_address: _Optional[str] = ..., grpc_address: _Optional[str] = ..., state: _Optional[_Union[TargetState, str]] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., chunks: _Optional[int] = ..., chain_id: _Optional[int] = ..., full: _Optional[bool] = ...) -> None: ...

class ChainInfo(_message.Message):
    __slots__ = ("chain_id", "version", "targets")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    version: int
    targets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, chain_id: _Optional[int] = ..., version: _Optional[int] = ..., targets: _Optional[_Iterable[int]] = ...) -> None: ...

class RoutingInfo(_message.Message):
    __slots__ = ("version", "targets", "chains")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    version: int
    targets: _containers.RepeatedCompositeFieldContainer[TargetInfo]
    chains: _containers.RepeatedCompositeFieldContainer[ChainInfo]
    def __init__(self, version: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[TargetInfo, _Mapping]]] = ..., chains: _Optional[_Iterable[_Union[ChainInfo, _Mapping]]] = ...) -> None: ...
