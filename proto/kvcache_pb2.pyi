from emberfs.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KvReserveState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_RESERVE_STATE_UNSPECIFIED: _ClassVar[KvReserveState]
    KV_RESERVED: _ClassVar[KvReserveState]
    KV_EXISTS: _ClassVar[KvReserveState]
    KV_BUSY: _ClassVar[KvReserveState]
    KV_FULL: _ClassVar[KvReserveState]
KV_RESERVE_STATE_UNSPECIFIED: KvReserveState
KV_RESERVED: KvReserveState
KV_EXISTS: KvReserveState
KV_BUSY: KvReserveState
KV_FULL: KvReserveState

class KvGeometry(_message.Message):
    __slots__ = ("block_size", "stride", "chunk_size", "slab_slots", "capacity_slots")
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    SLAB_SLOTS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_SLOTS_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    stride: int
    chunk_size: int
    slab_slots: int
    capacity_slots: int
    def __init__(self, block_size: _Optional[int] = ..., stride: _Optional[int] = ..., chunk_size: _Optional[int] = ..., slab_slots: _Optional[int] = ..., capacity_slots: _Optional[int] = ...) -> None: ...

class KvCacheRecord(_message.Message):
    __slots__ = ("cache_id", "geometry", "slabs", "created_ns", "path")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    SLABS_FIELD_NUMBER: _ClassVar[int]
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    geometry: KvGeometry
    slabs: _containers.RepeatedScalarFieldContainer[int]
    created_ns: int
    path: str
    def __init__(self, cache_id: _Optional[int] = ..., geometry: _Optional[_Union[KvGeometry, _Mapping]] = ..., slabs: _Optional[_Iterable[int]] = ..., created_ns: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class KvSlab(_message.Message):
    __slots__ = ("inode", "chains")
    INODE_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    inode: int
    chains: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, inode: _Optional[int] = ..., chains: _Optional[_Iterable[int]] = ...) -> None: ...

class KvCacheInfo(_message.Message):
    __slots__ = ("cache_id", "geometry", "slabs", "path")
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    SLABS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    cache_id: int
    geometry: KvGeometry
    slabs: _containers.RepeatedCompositeFieldContainer[KvSlab]
    path: str
    def __init__(self, cache_id: _Optional[int] = ..., geometry: _Optional[_Union[KvGeometry, _Mapping]] = ..., slabs: _Optional[_Iterable[_Union[KvSlab, _Mapping]]] = ..., path: _Optional[str] = ...) -> None: ...

class KvCreateRequest(_message.Message):
    __slots__ = ("ctx", "path", "geometry", "slabs")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    SLABS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    geometry: KvGeometry
    slabs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., geometry: _Optional[_Union[KvGeometry, _Mapping]] = ..., slabs: _Optional[_Iterable[int]] = ...) -> None: ...

class KvOpenRequest(_message.Message):
    __slots__ = ("ctx", "path")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ...) -> None: ...

class KvLookupRequest(_message.Message):
    __slots__ = ("ctx", "cache_id", "keys", "prefix", "touch")
    CTX_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    TOUCH_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    cache_id: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    prefix: bool
    touch: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., cache_id: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ..., prefix: _Optional[bool] = ..., touch: _Optional[bool] = ...) -> None: ...

class KvLocation(_message.Message):
    __slots__ = ("found", "slot", "generation", "crc", "length")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CRC_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    found: bool
    slot: int
    generation: int
    crc: int
    length: int
    def __init__(self, found: _Optional[bool] = ..., slot: _Optional[int] = ..., generation: _Optional[int] = ..., crc: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class KvLookupResponse(_message.Message):
    __slots__ = ("locations", "found", "capabilities")
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    locations: _containers.RepeatedCompositeFieldContainer[KvLocation]
    found: int
    capabilities: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, locations: _Optional[_Iterable[_Union[KvLocation, _Mapping]]] = ..., found: _Optional[int] = ..., capabilities: _Optional[_Iterable[bytes]] = ...) -> None: ...

class KvReserveRequest(_message.Message):
    __slots__ = ("ctx", "cache_id", "keys", "lengths")
    CTX_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    cache_id: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    lengths: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., cache_id: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ..., lengths: _Optional[_Iterable[int]] = ...) -> None: ...

class KvReservation(_message.Message):
    __slots__ = ("state", "slot", "generation")
    STATE_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    state: KvReserveState
    slot: int
    generation: int
    def __init__(self, state: _Optional[_Union[KvReserveState, str]] = ..., slot: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class KvReserveResponse(_message.Message):
    __slots__ = ("reservations", "capabilities")
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    reservations: _containers.RepeatedCompositeFieldContainer[KvReservation]
    capabilities: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, reservations: _Optional[_Iterable[_Union[KvReservation, _Mapping]]] = ..., capabilities: _Optional[_Iterable[bytes]] = ...) -> None: ...

class KvCommitItem(_message.Message):
    __slots__ = ("key", "generation", "crc", "written")
    KEY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CRC_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    generation: int
    crc: int
    written: bool
    def __init__(self, key: _Optional[bytes] = ..., generation: _Optional[int] = ..., crc: _Optional[int] = ..., written: _Optional[bool] = ...) -> None: ...

class KvCommitRequest(_message.Message):
    __slots__ = ("ctx", "cache_id", "items")
    CTX_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    cache_id: int
    items: _containers.RepeatedCompositeFieldContainer[KvCommitItem]
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., cache_id: _Optional[int] = ..., items: _Optional[_Iterable[_Union[KvCommitItem, _Mapping]]] = ...) -> None: ...

class KvCommitResponse(_message.Message):
    __slots__ = ("committed",)
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    committed: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, committed: _Optional[_Iterable[bool]] = ...) -> None: ...

class KvDeleteRequest(_message.Message):
    __slots__ = ("ctx", "cache_id", "keys", "generations")
    CTX_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    cache_id: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    generations: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., cache_id: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ..., generations: _Optional[_Iterable[int]] = ...) -> None: ...

class KvDeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class KvListRequest(_message.Message):
    __slots__ = ("ctx", "cache_id", "start_after", "limit")
    CTX_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    cache_id: int
    start_after: bytes
    limit: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., cache_id: _Optional[int] = ..., start_after: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class KvListResponse(_message.Message):
    __slots__ = ("keys", "more")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    more: bool
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., more: _Optional[bool] = ...) -> None: ...

class KvStatsRequest(_message.Message):
    __slots__ = ("ctx", "cache_id")
    CTX_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    cache_id: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., cache_id: _Optional[int] = ...) -> None: ...

class KvStats(_message.Message):
    __slots__ = ("used_blocks", "used_bytes", "hits", "misses", "hit_bytes", "puts", "put_bytes", "evictions", "slabs_used")
    USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    HIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    PUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    SLABS_USED_FIELD_NUMBER: _ClassVar[int]
    used_blocks: int
    used_bytes: int
    hits: int
    misses: int
    hit_bytes: int
    puts: int
    put_bytes: int
    evictions: int
    slabs_used: int
    def __init__(self, used_blocks: _Optional[int] = ..., used_bytes: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., hit_bytes: _Optional[int] = ..., puts: _Optional[int] = ..., put_bytes: _Optional[int] = ..., evictions: _Optional[int] = ..., slabs_used: _Optional[int] = ...) -> None: ...

class KvStatsResponse(_message.Message):
    __slots__ = ("info", "stats")
    INFO_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    info: KvCacheInfo
    stats: KvStats
    def __init__(self, info: _Optional[_Union[KvCacheInfo, _Mapping]] = ..., stats: _Optional[_Union[KvStats, _Mapping]] = ...) -> None: ...

class KvClearRequest(_message.Message):
    __slots__ = ("ctx", "cache_id")
    CTX_FIELD_NUMBER: _ClassVar[int]
    CACHE_ID_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    cache_id: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., cache_id: _Optional[int] = ...) -> None: ...

class KvClearResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...
