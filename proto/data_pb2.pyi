from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkId(_message.Message):
    __slots__ = ("inode", "index")
    INODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    inode: int
    index: int
    def __init__(self, inode: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class ChunkReadRequest(_message.Message):
    __slots__ = ("chain_id", "target_id", "chunk", "offset", "length", "chain_version")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    target_id: int
    chunk: ChunkId
    offset: int
    length: int
    chain_version: int
    def __init__(self, chain_id: _Optional[int] = ..., target_id: _Optional[int] = ..., chunk: _Optional[_Union[ChunkId, _Mapping]] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., chain_version: _Optional[int] = ...) -> None: ...

class ChunkReadResponse(_message.Message):
    __slots__ = ("version", "chunk_length", "data_offset", "skip", "chunk")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SKIP_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    version: int
    chunk_length: int
    data_offset: int
    skip: int
    chunk: ChunkId
    def __init__(self, version: _Optional[int] = ..., chunk_length: _Optional[int] = ..., data_offset: _Optional[int] = ..., skip: _Optional[int] = ..., chunk: _Optional[_Union[ChunkId, _Mapping]] = ...) -> None: ...

class ChunkWriteRequest(_message.Message):
    __slots__ = ("chain_id", "chain_version", "target_id", "chunk", "offset", "chunk_size", "client_id", "request_id", "update_version", "full_chunk", "base_version", "sync", "replace")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    FULL_CHUNK_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    target_id: int
    chunk: ChunkId
    offset: int
    chunk_size: int
    client_id: str
    request_id: int
    update_version: int
    full_chunk: bool
    base_version: int
    sync: bool
    replace: bool
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., target_id: _Optional[int] = ..., chunk: _Optional[_Union[ChunkId, _Mapping]] = ..., offset: _Optional[int] = ..., chunk_size: _Optional[int] = ..., client_id: _Optional[str] = ..., request_id: _Optional[int] = ..., update_version: _Optional[int] = ..., full_chunk: _Optional[bool] = ..., base_version: _Optional[int] = ..., sync: _Optional[bool] = ..., replace: _Optional[bool] = ...) -> None: ...

class ChunkWriteResponse(_message.Message):
    __slots__ = ("version", "chunk_length")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_LENGTH_FIELD_NUMBER: _ClassVar[int]
    version: int
    chunk_length: int
    def __init__(self, version: _Optional[int] = ..., chunk_length: _Optional[int] = ...) -> None: ...

class ChunkWriteBatch(_message.Message):
    __slots__ = ("writes", "lengths", "capabilities")
    WRITES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    writes: _containers.RepeatedCompositeFieldContainer[ChunkWriteRequest]
    lengths: _containers.RepeatedScalarFieldContainer[int]
    capabilities: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, writes: _Optional[_Iterable[_Union[ChunkWriteRequest, _Mapping]]] = ..., lengths: _Optional[_Iterable[int]] = ..., capabilities: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ChunkWriteResult(_message.Message):
    __slots__ = ("status", "message", "written")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    status: int
    message: str
    written: ChunkWriteResponse
    def __init__(self, status: _Optional[int] = ..., message: _Optional[str] = ..., written: _Optional[_Union[ChunkWriteResponse, _Mapping]] = ...) -> None: ...

class ChunkWriteBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ChunkWriteResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ChunkWriteResult, _Mapping]]] = ...) -> None: ...

class TruncateStep(_message.Message):
    __slots__ = ("index", "length", "version", "base_version")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    index: int
    length: int
    version: int
    base_version: int
    def __init__(self, index: _Optional[int] = ..., length: _Optional[int] = ..., version: _Optional[int] = ..., base_version: _Optional[int] = ...) -> None: ...

class ChunkTruncateRequest(_message.Message):
    __slots__ = ("chain_id", "chain_version", "target_id", "inode", "length", "chunk_size", "stripe", "stripe_position", "client_id", "request_id", "steps")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_POSITION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    chain_version: int
    target_id: int
    inode: int
    length: int
    chunk_size: int
    stripe: int
    stripe_position: int
    client_id: str
    request_id: int
    steps: _containers.RepeatedCompositeFieldContainer[TruncateStep]
    def __init__(self, chain_id: _Optional[int] = ..., chain_version: _Optional[int] = ..., target_id: _Optional[int] = ..., inode: _Optional[int] = ..., length: _Optional[int] = ..., chunk_size: _Optional[int] = ..., stripe: _Optional[int] = ..., stripe_position: _Optional[int] = ..., client_id: _Optional[str] = ..., request_id: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[TruncateStep, _Mapping]]] = ...) -> None: ...

class ChunkTruncateResponse(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    def __init__(self, chunks: _Optional[int] = ...) -> None: ...

class ErrorResponse(_message.Message):
    __slots__ = ("code", "message", "routing_version")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    routing_version: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., routing_version: _Optional[int] = ...) -> None: ...

class Capability(_message.Message):
    __slots__ = ("inode", "read", "write", "expires_ms")
    INODE_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    inode: int
    read: bool
    write: bool
    expires_ms: int
    def __init__(self, inode: _Optional[int] = ..., read: _Optional[bool] = ..., write: _Optional[bool] = ..., expires_ms: _Optional[int] = ...) -> None: ...
