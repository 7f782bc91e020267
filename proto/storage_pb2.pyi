from emberfs.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkCheck(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNK_CHECK_NONE: _ClassVar[ChunkCheck]
    CHUNK_CHECK_FILE: _ClassVar[ChunkCheck]
    CHUNK_CHECK_BLOCKS: _ClassVar[ChunkCheck]
CHUNK_CHECK_NONE: ChunkCheck
CHUNK_CHECK_FILE: ChunkCheck
CHUNK_CHECK_BLOCKS: ChunkCheck

class ChunkMeta(_message.Message):
    __slots__ = ("inode", "index", "version", "pending_version", "length", "checksum", "damaged", "problem")
    INODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PENDING_VERSION_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    inode: int
    index: int
    version: int
    pending_version: int
    length: int
    checksum: int
    damaged: bool
    problem: str
    def __init__(self, inode: _Optional[int] = ..., index: _Optional[int] = ..., version: _Optional[int] = ..., pending_version: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., damaged: _Optional[bool] = ..., problem: _Optional[str] = ...) -> None: ...

class ListChunksRequest(_message.Message):
    __slots__ = ("target_id", "inode", "after_inode", "after_index", "has_after", "limit", "check", "mark_damaged")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    AFTER_INODE_FIELD_NUMBER: _ClassVar[int]
    AFTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    HAS_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    MARK_DAMAGED_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    inode: int
    after_inode: int
    after_index: int
    has_after: bool
    limit: int
    check: ChunkCheck
    mark_damaged: bool
    def __init__(self, target_id: _Optional[int] = ..., inode: _Optional[int] = ..., after_inode: _Optional[int] = ..., after_index: _Optional[int] = ..., has_after: _Optional[bool] = ..., limit: _Optional[int] = ..., check: _Optional[_Union[ChunkCheck, str]] = ..., mark_damaged: _Optional[bool] = ...) -> None: ...

class ListChunksResponse(_message.Message):
    __slots__ = ("chunks", "more")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkMeta]
    more: bool
    def __init__(self, chunks: _Optional[_Iterable[_Union[ChunkMeta, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class RemoveChunksRequest(_message.Message):
    __slots__ = ("target_id", "inode", "indices", "versions")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    inode: int
    indices: _containers.RepeatedScalarFieldContainer[int]
    versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, target_id: _Optional[int] = ..., inode: _Optional[int] = ..., indices: _Optional[_Iterable[int]] = ..., versions: _Optional[_Iterable[int]] = ...) -> None: ...

class RemoveChunksResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class TargetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TargetStat(_message.Message):
    __slots__ = ("target_id", "chain_id", "capacity", "used", "chunks", "local_state")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STATE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    chain_id: int
    capacity: int
    used: int
    chunks: int
    local_state: _common_pb2.TargetState
    def __init__(self, target_id: _Optional[int] = ..., chain_id: _Optional[int] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., chunks: _Optional[int] = ..., local_state: _Optional[_Union[_common_pb2.TargetState, str]] = ...) -> None: ...

class TargetStatsResponse(_message.Message):
    __slots__ = ("node_id", "targets")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    targets: _containers.RepeatedCompositeFieldContainer[TargetStat]
    def __init__(self, node_id: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[TargetStat, _Mapping]]] = ...) -> None: ...
