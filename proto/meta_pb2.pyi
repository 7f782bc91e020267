from emberfs.proto import common_pb2 as _common_pb2
from emberfs.proto import kvcache_pb2 as _kvcache_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenFlags(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPEN_READ: _ClassVar[OpenFlags]
    OPEN_WRITE: _ClassVar[OpenFlags]
    OPEN_CREATE: _ClassVar[OpenFlags]
    OPEN_EXCLUSIVE: _ClassVar[OpenFlags]
    OPEN_TRUNCATE: _ClassVar[OpenFlags]
    OPEN_APPEND: _ClassVar[OpenFlags]

class XattrFlags(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    XATTR_ANY: _ClassVar[XattrFlags]
    XATTR_CREATE: _ClassVar[XattrFlags]
    XATTR_REPLACE: _ClassVar[XattrFlags]

class LockKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOCK_POSIX: _ClassVar[LockKind]
    LOCK_FLOCK: _ClassVar[LockKind]

class LockType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOCK_UNLOCK: _ClassVar[LockType]
    LOCK_READ: _ClassVar[LockType]
    LOCK_WRITE: _ClassVar[LockType]
OPEN_READ: OpenFlags
OPEN_WRITE: OpenFlags
OPEN_CREATE: OpenFlags
OPEN_EXCLUSIVE: OpenFlags
OPEN_TRUNCATE: OpenFlags
OPEN_APPEND: OpenFlags
XATTR_ANY: XattrFlags
XATTR_CREATE: XattrFlags
XATTR_REPLACE: XattrFlags
LOCK_POSIX: LockKind
LOCK_FLOCK: LockKind
LOCK_UNLOCK: LockType
LOCK_READ: LockType
LOCK_WRITE: LockType

class StatRequest(_message.Message):
    __slots__ = ("ctx", "path", "inode", "follow", "xattrs")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    XATTRS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    inode: int
    follow: bool
    xattrs: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., inode: _Optional[int] = ..., follow: _Optional[bool] = ..., xattrs: _Optional[bool] = ...) -> None: ...

class StatResponse(_message.Message):
    __slots__ = ("attr", "xattrs")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    XATTRS_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    xattrs: _containers.RepeatedCompositeFieldContainer[Xattr]
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ..., xattrs: _Optional[_Iterable[_Union[Xattr, _Mapping]]] = ...) -> None: ...

class BatchStatRequest(_message.Message):
    __slots__ = ("ctx", "paths", "follow")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    paths: _containers.RepeatedScalarFieldContainer[str]
    follow: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., paths: _Optional[_Iterable[str]] = ..., follow: _Optional[bool] = ...) -> None: ...

class BatchStatResult(_message.Message):
    __slots__ = ("attr", "errno", "capability")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    ERRNO_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    errno: int
    capability: bytes
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ..., errno: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class BatchStatResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchStatResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchStatResult, _Mapping]]] = ...) -> None: ...

class MkdirRequest(_message.Message):
    __slots__ = ("ctx", "path", "mode", "parents", "layout")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    mode: int
    parents: bool
    layout: _common_pb2.Layout
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ..., parents: _Optional[bool] = ..., layout: _Optional[_Union[_common_pb2.Layout, _Mapping]] = ...) -> None: ...

class MkdirResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("ctx", "path", "mode", "exclusive")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    mode: int
    exclusive: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ..., exclusive: _Optional[bool] = ...) -> None: ...

class CreateResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class BatchCreateRequest(_message.Message):
    __slots__ = ("ctx", "items")
    CTX_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    items: _containers.RepeatedCompositeFieldContainer[CreateRequest]
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., items: _Optional[_Iterable[_Union[CreateRequest, _Mapping]]] = ...) -> None: ...

class BatchCreateResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchStatResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchStatResult, _Mapping]]] = ...) -> None: ...

class OpenRequest(_message.Message):
    __slots__ = ("ctx", "path", "flags", "mode", "reserve")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    flags: int
    mode: int
    reserve: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., flags: _Optional[int] = ..., mode: _Optional[int] = ..., reserve: _Optional[int] = ...) -> None: ...

class OpenResponse(_message.Message):
    __slots__ = ("attr", "session_id", "capability", "created")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    session_id: int
    capability: bytes
    created: bool
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ..., session_id: _Optional[int] = ..., capability: _Optional[bytes] = ..., created: _Optional[bool] = ...) -> None: ...

class BatchOpenRequest(_message.Message):
    __slots__ = ("ctx", "paths")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchOpenResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchStatResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchStatResult, _Mapping]]] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("ctx", "inode", "session_id", "length", "mtime_ns")
    CTX_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    inode: int
    session_id: int
    length: int
    mtime_ns: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., inode: _Optional[int] = ..., session_id: _Optional[int] = ..., length: _Optional[int] = ..., mtime_ns: _Optional[int] = ...) -> None: ...

class SyncResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("ctx", "inode", "session_id", "length", "wrote")
    CTX_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    WROTE_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    inode: int
    session_id: int
    length: int
    wrote: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., inode: _Optional[int] = ..., session_id: _Optional[int] = ..., length: _Optional[int] = ..., wrote: _Optional[bool] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class BatchWriteOpenRequest(_message.Message):
    __slots__ = ("ctx", "paths", "flags", "mode", "reserve")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    paths: _containers.RepeatedScalarFieldContainer[str]
    flags: int
    mode: int
    reserve: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., paths: _Optional[_Iterable[str]] = ..., flags: _Optional[int] = ..., mode: _Optional[int] = ..., reserve: _Optional[_Iterable[int]] = ...) -> None: ...

class BatchWriteOpenResult(_message.Message):
    __slots__ = ("opened", "errno")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    ERRNO_FIELD_NUMBER: _ClassVar[int]
    opened: OpenResponse
    errno: int
    def __init__(self, opened: _Optional[_Union[OpenResponse, _Mapping]] = ..., errno: _Optional[int] = ...) -> None: ...

class BatchWriteOpenResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchWriteOpenResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchWriteOpenResult, _Mapping]]] = ...) -> None: ...

class CloseItem(_message.Message):
    __slots__ = ("inode", "session_id", "length", "wrote")
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    WROTE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    session_id: int
    length: int
    wrote: bool
    def __init__(self, inode: _Optional[int] = ..., session_id: _Optional[int] = ..., length: _Optional[int] = ..., wrote: _Optional[bool] = ...) -> None: ...

class BatchCloseRequest(_message.Message):
    __slots__ = ("ctx", "items")
    CTX_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    items: _containers.RepeatedCompositeFieldContainer[CloseItem]
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., items: _Optional[_Iterable[_Union[CloseItem, _Mapping]]] = ...) -> None: ...

class BatchCloseResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchStatResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchStatResult, _Mapping]]] = ...) -> None: ...

class SessionRef(_message.Message):
    __slots__ = ("inode", "session_id")
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    inode: int
    session_id: int
    def __init__(self, inode: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class RenewSessionsRequest(_message.Message):
    __slots__ = ("ctx", "sessions")
    CTX_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    sessions: _containers.RepeatedCompositeFieldContainer[SessionRef]
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., sessions: _Optional[_Iterable[_Union[SessionRef, _Mapping]]] = ...) -> None: ...

class RenewSessionsResponse(_message.Message):
    __slots__ = ("expired",)
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    expired: _containers.RepeatedCompositeFieldContainer[SessionRef]
    def __init__(self, expired: _Optional[_Iterable[_Union[SessionRef, _Mapping]]] = ...) -> None: ...

class DirEntry(_message.Message):
    __slots__ = ("name", "attr")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    name: str
    attr: _common_pb2.InodeAttr
    def __init__(self, name: _Optional[str] = ..., attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("ctx", "path", "start_after", "limit")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    start_after: str
    limit: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., start_after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("entries", "more")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DirEntry]
    more: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[DirEntry, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("ctx", "path", "recursive", "directory", "inode", "skip_trash")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    SKIP_TRASH_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    recursive: bool
    directory: bool
    inode: int
    skip_trash: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ..., directory: _Optional[bool] = ..., inode: _Optional[int] = ..., skip_trash: _Optional[bool] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class BatchRemoveRequest(_message.Message):
    __slots__ = ("ctx", "paths", "recursive", "inodes", "skip_trash")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    SKIP_TRASH_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    paths: _containers.RepeatedScalarFieldContainer[str]
    recursive: bool
    inodes: _containers.RepeatedScalarFieldContainer[int]
    skip_trash: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., paths: _Optional[_Iterable[str]] = ..., recursive: _Optional[bool] = ..., inodes: _Optional[_Iterable[int]] = ..., skip_trash: _Optional[bool] = ...) -> None: ...

class BatchRemoveResult(_message.Message):
    __slots__ = ("removed", "errno")
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    ERRNO_FIELD_NUMBER: _ClassVar[int]
    removed: int
    errno: int
    def __init__(self, removed: _Optional[int] = ..., errno: _Optional[int] = ...) -> None: ...

class BatchRemoveResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchRemoveResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchRemoveResult, _Mapping]]] = ...) -> None: ...

class RenameRequest(_message.Message):
    __slots__ = ("ctx", "src", "dst", "no_replace", "exchange", "skip_trash")
    CTX_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    NO_REPLACE_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    SKIP_TRASH_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    src: str
    dst: str
    no_replace: bool
    exchange: bool
    skip_trash: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., no_replace: _Optional[bool] = ..., exchange: _Optional[bool] = ..., skip_trash: _Optional[bool] = ...) -> None: ...

class RenameResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class SymlinkRequest(_message.Message):
    __slots__ = ("ctx", "path", "target")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    target: str
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class SymlinkResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class ReadlinkRequest(_message.Message):
    __slots__ = ("ctx", "path")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ...) -> None: ...

class ReadlinkResponse(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: str
    def __init__(self, target: _Optional[str] = ...) -> None: ...

class HardlinkRequest(_message.Message):
    __slots__ = ("ctx", "src", "dst")
    CTX_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    src: str
    dst: str
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ...) -> None: ...

class HardlinkResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class TruncateRequest(_message.Message):
    __slots__ = ("ctx", "path", "length", "inode")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    length: int
    inode: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., length: _Optional[int] = ..., inode: _Optional[int] = ...) -> None: ...

class TruncateResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class SetAttrRequest(_message.Message):
    __slots__ = ("ctx", "path", "mode", "uid", "gid", "mtime_ns", "no_follow")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    NO_FOLLOW_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    no_follow: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., no_follow: _Optional[bool] = ...) -> None: ...

class SetAttrResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class Xattr(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class GetXattrRequest(_message.Message):
    __slots__ = ("ctx", "path", "name", "follow")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    name: str
    follow: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., name: _Optional[str] = ..., follow: _Optional[bool] = ...) -> None: ...

class GetXattrResponse(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    def __init__(self, value: _Optional[bytes] = ...) -> None: ...

class ListXattrRequest(_message.Message):
    __slots__ = ("ctx", "path", "follow")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    follow: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., follow: _Optional[bool] = ...) -> None: ...

class ListXattrResponse(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class SetXattrRequest(_message.Message):
    __slots__ = ("ctx", "path", "name", "value", "flags", "follow")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    name: str
    value: bytes
    flags: int
    follow: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[bytes] = ..., flags: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class SetXattrResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class RemoveXattrRequest(_message.Message):
    __slots__ = ("ctx", "path", "name", "follow")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    name: str
    follow: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., name: _Optional[str] = ..., follow: _Optional[bool] = ...) -> None: ...

class RemoveXattrResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class StatFsRequest(_message.Message):
    __slots__ = ("ctx", "path")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ...) -> None: ...

class StatFsResponse(_message.Message):
    __slots__ = ("capacity", "used", "free", "inodes", "files", "directories", "inode_limit", "quota_path")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    DIRECTORIES_FIELD_NUMBER: _ClassVar[int]
    INODE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_PATH_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    used: int
    free: int
    inodes: int
    files: int
    directories: int
    inode_limit: int
    quota_path: str
    def __init__(self, capacity: _Optional[int] = ..., used: _Optional[int] = ..., free: _Optional[int] = ..., inodes: _Optional[int] = ..., files: _Optional[int] = ..., directories: _Optional[int] = ..., inode_limit: _Optional[int] = ..., quota_path: _Optional[str] = ...) -> None: ...

class SetLayoutRequest(_message.Message):
    __slots__ = ("ctx", "path", "layout")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    layout: _common_pb2.Layout
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., layout: _Optional[_Union[_common_pb2.Layout, _Mapping]] = ...) -> None: ...

class SetLayoutResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AuthorizeRequest(_message.Message):
    __slots__ = ("ctx", "inode", "session_id")
    CTX_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    inode: int
    session_id: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., inode: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class AuthorizeResponse(_message.Message):
    __slots__ = ("capability",)
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    capability: bytes
    def __init__(self, capability: _Optional[bytes] = ...) -> None: ...

class TrashEntry(_message.Message):
    __slots__ = ("entry", "path", "uid", "removed_ns", "type", "entries")
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    REMOVED_NS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entry: int
    path: str
    uid: int
    removed_ns: int
    type: _common_pb2.FileType
    entries: int
    def __init__(self, entry: _Optional[int] = ..., path: _Optional[str] = ..., uid: _Optional[int] = ..., removed_ns: _Optional[int] = ..., type: _Optional[_Union[_common_pb2.FileType, str]] = ..., entries: _Optional[int] = ...) -> None: ...

class TrashListRequest(_message.Message):
    __slots__ = ("ctx", "user", "all_users")
    CTX_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ALL_USERS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    user: int
    all_users: bool
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., user: _Optional[int] = ..., all_users: _Optional[bool] = ...) -> None: ...

class TrashListResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[TrashEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[TrashEntry, _Mapping]]] = ...) -> None: ...

class TrashRestoreRequest(_message.Message):
    __slots__ = ("ctx", "entries", "all", "to")
    CTX_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    entries: _containers.RepeatedScalarFieldContainer[int]
    all: bool
    to: str
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., entries: _Optional[_Iterable[int]] = ..., all: _Optional[bool] = ..., to: _Optional[str] = ...) -> None: ...

class TrashRestoreResponse(_message.Message):
    __slots__ = ("restored",)
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    restored: _containers.RepeatedCompositeFieldContainer[TrashEntry]
    def __init__(self, restored: _Optional[_Iterable[_Union[TrashEntry, _Mapping]]] = ...) -> None: ...

class TrashPurgeRequest(_message.Message):
    __slots__ = ("ctx", "entries", "all", "before_ns")
    CTX_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    BEFORE_NS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    entries: _containers.RepeatedScalarFieldContainer[int]
    all: bool
    before_ns: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., entries: _Optional[_Iterable[int]] = ..., all: _Optional[bool] = ..., before_ns: _Optional[int] = ...) -> None: ...

class TrashPurgeResponse(_message.Message):
    __slots__ = ("purged", "more")
    PURGED_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    purged: int
    more: bool
    def __init__(self, purged: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class QuotaInfo(_message.Message):
    __slots__ = ("path", "inode", "max_bytes", "max_inodes", "used_bytes", "used_inodes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_INODES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_INODES_FIELD_NUMBER: _ClassVar[int]
    path: str
    inode: int
    max_bytes: int
    max_inodes: int
    used_bytes: int
    used_inodes: int
    def __init__(self, path: _Optional[str] = ..., inode: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_inodes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., used_inodes: _Optional[int] = ...) -> None: ...

class QuotaSetRequest(_message.Message):
    __slots__ = ("ctx", "path", "max_bytes", "max_inodes")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_INODES_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    max_bytes: int
    max_inodes: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ..., max_bytes: _Optional[int] = ..., max_inodes: _Optional[int] = ...) -> None: ...

class QuotaSetResponse(_message.Message):
    __slots__ = ("quota", "over")
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    OVER_FIELD_NUMBER: _ClassVar[int]
    quota: QuotaInfo
    over: bool
    def __init__(self, quota: _Optional[_Union[QuotaInfo, _Mapping]] = ..., over: _Optional[bool] = ...) -> None: ...

class QuotaGetRequest(_message.Message):
    __slots__ = ("ctx", "path")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ...) -> None: ...

class QuotaListRequest(_message.Message):
    __slots__ = ("ctx",)
    CTX_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ...) -> None: ...

class QuotaListResponse(_message.Message):
    __slots__ = ("quotas",)
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    quotas: _containers.RepeatedCompositeFieldContainer[QuotaInfo]
    def __init__(self, quotas: _Optional[_Iterable[_Union[QuotaInfo, _Mapping]]] = ...) -> None: ...

class QuotaRemoveRequest(_message.Message):
    __slots__ = ("ctx", "path")
    CTX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    path: str
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., path: _Optional[str] = ...) -> None: ...

class QuotaRemoveResponse(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: QuotaInfo
    def __init__(self, quota: _Optional[_Union[QuotaInfo, _Mapping]] = ...) -> None: ...

class QuotaReserveRequest(_message.Message):
    __slots__ = ("ctx", "inode", "session_id", "end")
    CTX_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    inode: int
    session_id: int
    end: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., inode: _Optional[int] = ..., session_id: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class QuotaReserveResponse(_message.Message):
    __slots__ = ("attr",)
    ATTR_FIELD_NUMBER: _ClassVar[int]
    attr: _common_pb2.InodeAttr
    def __init__(self, attr: _Optional[_Union[_common_pb2.InodeAttr, _Mapping]] = ...) -> None: ...

class FileLock(_message.Message):
    __slots__ = ("kind", "type", "start", "end", "lease_id", "owner", "pid", "client_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    kind: LockKind
    type: LockType
    start: int
    end: int
    lease_id: int
    owner: int
    pid: int
    client_id: str
    def __init__(self, kind: _Optional[_Union[LockKind, str]] = ..., type: _Optional[_Union[LockType, str]] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., lease_id: _Optional[int] = ..., owner: _Optional[int] = ..., pid: _Optional[int] = ..., client_id: _Optional[str] = ...) -> None: ...

class FileLocks(_message.Message):
    __slots__ = ("locks",)
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    locks: _containers.RepeatedCompositeFieldContainer[FileLock]
    def __init__(self, locks: _Optional[_Iterable[_Union[FileLock, _Mapping]]] = ...) -> None: ...

class OpenLockLeaseRequest(_message.Message):
    __slots__ = ("ctx",)
    CTX_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ...) -> None: ...

class OpenLockLeaseResponse(_message.Message):
    __slots__ = ("lease_id", "timeout")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    timeout: float
    def __init__(self, lease_id: _Optional[int] = ..., timeout: _Optional[float] = ...) -> None: ...

class RenewLockLeaseRequest(_message.Message):
    __slots__ = ("ctx", "lease_id")
    CTX_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    lease_id: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., lease_id: _Optional[int] = ...) -> None: ...

class RenewLockLeaseResponse(_message.Message):
    __slots__ = ("gone",)
    GONE_FIELD_NUMBER: _ClassVar[int]
    gone: bool
    def __init__(self, gone: _Optional[bool] = ...) -> None: ...

class CloseLockLeaseRequest(_message.Message):
    __slots__ = ("ctx", "lease_id")
    CTX_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    lease_id: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., lease_id: _Optional[int] = ...) -> None: ...

class CloseLockLeaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class SetLockRequest(_message.Message):
    __slots__ = ("ctx", "inode", "lock", "wait_ms")
    CTX_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    inode: int
    lock: FileLock
    wait_ms: int
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., inode: _Optional[int] = ..., lock: _Optional[_Union[FileLock, _Mapping]] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class SetLockResponse(_message.Message):
    __slots__ = ("granted", "conflict", "lease_gone")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    LEASE_GONE_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    conflict: FileLock
    lease_gone: bool
    def __init__(self, granted: _Optional[bool] = ..., conflict: _Optional[_Union[FileLock, _Mapping]] = ..., lease_gone: _Optional[bool] = ...) -> None: ...

class GetLockRequest(_message.Message):
    __slots__ = ("ctx", "inode", "lock")
    CTX_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    ctx: _common_pb2.RequestContext
    inode: int
    lock: FileLock
    def __init__(self, ctx: _Optional[_Union[_common_pb2.RequestContext, _Mapping]] = ..., inode: _Optional[int] = ..., lock: _Optional[_Union[FileLock, _Mapping]] = ...) -> None: ...

class GetLockResponse(_message.Message):
    __slots__ = ("conflict",)
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    conflict: FileLock
    def __init__(self, conflict: _Optional[_Union[FileLock, _Mapping]] = ...) -> None: ...
