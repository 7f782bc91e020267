"""The MetaService gRPC adapter: requests in, namespace calls, responses out.

Typed errors become a gRPC status plus the ``emberfs-errno`` trailer in one
place (:func:`emberfs.common.errors.to_grpc`); anything unexpected is logged
with its traceback and answered with INTERNAL.

With the cluster's keys, every open of a file (``Open``, ``BatchOpen``,
``BatchWriteOpen``) and every ``Authorize`` comes back with a signed chunk
capability (:meth:`~emberfs.common.auth.ClusterKeys.sign_capability`) for
the access the open gave: read for a read open, write (and read where the
caller may read) for a write open. Storage servers check it on every chunk
read and write. Capabilities are made here, after the namespace call, so a
retried open whose answer was recorded still gets a fresh one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from emberfs.common import errors
from emberfs.common.auth import ClusterKeys
from emberfs.metaserver.fs import access
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.fs.opcontext import Credentials
from emberfs.metaserver.kvcache.service import KVCacheCalls
from emberfs.proto import common_pb2, meta_pb2, meta_pb2_grpc

log = logging.getLogger(__name__)


class MetaServicer(meta_pb2_grpc.MetaServiceServicer):
    """Serves MetaService from a :class:`~emberfs.metaserver.fs.namespace.Namespace`.

    Parameters
    ----------
    namespace : Namespace
        The namespace every call goes to.
    keys : ClusterKeys or None
        The cluster's keys, to sign chunk capabilities (None: none are given).
    capability_ttl : float, default 300
        Seconds a capability is valid; clients renew theirs before then.
    """

    def __init__(
        self, namespace: Namespace, keys: ClusterKeys | None = None, capability_ttl: float = 300.0
    ):
        self.namespace = namespace
        self.keys = keys
        self.capability_ttl = capability_ttl
        self.kv = KVCacheCalls(namespace, keys, capability_ttl)

    def _capability(
        self, ctx: common_pb2.RequestContext, attr: common_pb2.InodeAttr, write: bool
    ) -> bytes:
        """The signed capability of an opened file (empty without keys, or for a directory)."""
        if self.keys is None or attr.type != common_pb2.FILE:
            return b""
        read = not write or access.allowed(attr, Credentials.from_request(ctx), access.READ)
        return self.keys.sign_capability(
            attr.inode, read=read, write=write, ttl=self.capability_ttl
        )

    def _call(self, fn: Callable[[Any], Any], request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(request)
        except errors.EmberError as exc:
            errors.to_grpc(context, exc)
        except Exception:
            log.exception("MetaService call %s failed", getattr(fn, "__name__", fn))
            context.set_trailing_metadata(((errors.ERRNO_KEY, str(errors.Internal.errno)),))
            context.abort(grpc.StatusCode.INTERNAL, "internal error in the metaserver")

    def Stat(self, request, context):
        return self._call(self.namespace.stat, request, context)

    def BatchStat(self, request, context):
        return self._call(self.namespace.batch_stat, request, context)

    def Mkdir(self, request, context):
        return self._call(self.namespace.mkdir, request, context)

    def Create(self, request, context):
        return self._call(self.namespace.create, request, context)

    def BatchCreate(self, request, context):
        return self._call(self.namespace.batch_create, request, context)

    def Open(self, request, context):
        resp = self._call(self.namespace.open, request, context)
        resp.capability = self._capability(request.ctx, resp.attr, resp.session_id != 0)
        return resp

    def BatchOpen(self, request, context):
        resp = self._call(self.namespace.batch_open, request, context)
        for result in resp.results:
            if not result.errno:
                result.capability = self._capability(request.ctx, result.attr, False)
        return resp

    def Sync(self, request, context):
        return self._call(self.namespace.sync, request, context)

    def Close(self, request, context):
        return self._call(self.namespace.close, request, context)

    def BatchWriteOpen(self, request, context):
        resp = self._call(self.namespace.batch_write_open, request, context)
        for result in resp.results:
            if not result.errno:
                opened = result.opened
                opened.capability = self._capability(request.ctx, opened.attr, True)
        return resp

    def BatchClose(self, request, context):
        return self._call(self.namespace.batch_close, request, context)

    def BatchRemove(self, request, context):
        return self._call(self.namespace.batch_remove, request, context)

    def List(self, request, context):
        return self._call(self.namespace.list, request, context)

    def Remove(self, request, context):
        return self._call(self.namespace.remove, request, context)

    def Rename(self, request, context):
        return self._call(self.namespace.rename, request, context)

    def Symlink(self, request, context):
        return self._call(self.namespace.symlink, request, context)

    def Readlink(self, request, context):
        return self._call(self.namespace.readlink, request, context)

    def Hardlink(self, request, context):
        return self._call(self.namespace.hardlink, request, context)

    def Truncate(self, request, context):
        return self._call(self.namespace.truncate, request, context)

    def SetAttr(self, request, context):
        return self._call(self.namespace.setattr, request, context)

    def GetXattr(self, request, context):
        return self._call(self.namespace.get_xattr, request, context)

    def ListXattr(self, request, context):
        return self._call(self.namespace.list_xattr, request, context)

    def SetXattr(self, request, context):
        return self._call(self.namespace.set_xattr, request, context)

    def RemoveXattr(self, request, context):
        return self._call(self.namespace.remove_xattr, request, context)

    def StatFs(self, request, context):
        return self._call(self.namespace.statfs, request, context)

    def SetLayout(self, request, context):
        return self._call(self.namespace.set_layout, request, context)

    def TrashList(self, request, context):
        return self._call(self.namespace.trash_list, request, context)

    def TrashRestore(self, request, context):
        return self._call(self.namespace.trash_restore, request, context)

    def TrashPurge(self, request, context):
        return self._call(self.namespace.trash_purge, request, context)

    def QuotaSet(self, request, context):
        return self._call(self.namespace.quota_set, request, context)

    def QuotaGet(self, request, context):
        return self._call(self.namespace.quota_get, request, context)

    def QuotaList(self, request, context):
        return self._call(self.namespace.quota_list, request, context)

    def QuotaRemove(self, request, context):
        return self._call(self.namespace.quota_remove, request, context)

    def QuotaReserve(self, request, context):
        return self._call(self.namespace.quota_reserve, request, context)

    def RenewSessions(self, request, context):
        return self._call(self.namespace.renew_sessions, request, context)

    def Authorize(self, request, context):
        attr = self._call(self.namespace.authorize, request, context)
        return meta_pb2.AuthorizeResponse(
            capability=self._capability(request.ctx, attr, request.session_id != 0)
        )

    def Ping(self, request, context):
        return meta_pb2.PingResponse()

    # the KV cache block store's index
    def KvCreate(self, request, context):
        return self._call(self.kv.create, request, context)

    def KvOpen(self, request, context):
        return self._call(self.kv.open, request, context)

    def KvLookup(self, request, context):
        return self._call(self.kv.lookup, request, context)

    def KvReserve(self, request, context):
        return self._call(self.kv.reserve, request, context)

    def KvCommit(self, request, context):
        return self._call(self.kv.commit, request, context)

    def KvDelete(self, request, context):
        return self._call(self.kv.delete, request, context)

    def KvList(self, request, context):
        return self._call(self.kv.list, request, context)

    def KvStats(self, request, context):
        return self._call(self.kv.stats, request, context)

    def KvClear(self, request, context):
        return self._call(self.kv.clear, request, context)

    # POSIX locks
    def OpenLockLease(self, request, context):
        return self._call(self.namespace.locks.open_lease, request, context)

    def RenewLockLease(self, request, context):
        return self._call(self.namespace.locks.renew_lease, request, context)

    def CloseLockLease(self, request, context):
        return self._call(self.namespace.locks.close_lease, request, context)

    def SetLock(self, request, context):
        return self._call(self.namespace.locks.set_lock, request, context)

    def GetLock(self, request, context):
        return self._call(self.namespace.locks.get_lock, request, context)


def add_to_server(servicer: MetaServicer, server: grpc.Server) -> None:
    """Register ``servicer`` as the MetaService of ``server``."""
    meta_pb2_grpc.add_MetaServiceServicer_to_server(servicer, server)
