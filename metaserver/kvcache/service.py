"""The KV cache calls of MetaService (``Kv*``): requests in, :class:`~.index.KVIndex` calls, answers out.

The index checks the caller's permissions on the cache directory; these
calls add the chunk capabilities of the slabs an answer points into, so a
client reads the hits of a lookup, or writes the slots of a reservation,
without another round trip: read capabilities for a lookup that reads,
write capabilities (and read) for a reservation. Writing a cache means
write permission on its directory, which the index checked.
"""

from __future__ import annotations

from emberfs.common.auth import ClusterKeys
from emberfs.common.errors import InvalidArgument
from emberfs.metaserver.fs.namespace import Namespace
from emberfs.metaserver.fs.opcontext import Credentials
from emberfs.metaserver.kvcache.index import KVIndex
from emberfs.proto import kvcache_pb2, meta_pb2


class KVCacheCalls:
    """The ``Kv*`` methods of MetaService.

    Parameters
    ----------
    namespace : Namespace
        Resolves cache paths (with the caller's permissions) and holds the index.
    keys : ClusterKeys or None
        Signs the slabs' capabilities (None: the cluster runs without them).
    capability_ttl : float
    """

    def __init__(
        self, namespace: Namespace, keys: ClusterKeys | None, capability_ttl: float
    ) -> None:
        self.namespace = namespace
        self.index: KVIndex = namespace.kvcaches
        self.keys = keys
        self.ttl = capability_ttl

    def _directory(self, req):
        if not req.path:
            raise InvalidArgument("no cache path")
        stat = meta_pb2.StatRequest(ctx=req.ctx, path=req.path, follow=True)
        return self.namespace.stat(stat).attr

    def _capabilities(self, cache: int, slots, write: bool) -> list[bytes]:
        if self.keys is None:
            return []
        inodes = sorted({self.index.slab_of(cache, s) for s in slots})
        return [
            self.keys.sign_capability(inode, read=True, write=write, ttl=self.ttl)
            for inode in inodes
        ]

    def create(self, req: kvcache_pb2.KvCreateRequest) -> kvcache_pb2.KvCacheInfo:
        creds = Credentials.from_request(req.ctx)
        directory = self._directory(req)
        self.index.create(creds, directory, req.geometry, list(req.slabs), req.path)
        return self.index.open(creds, directory, req.path)

    def open(self, req: kvcache_pb2.KvOpenRequest) -> kvcache_pb2.KvCacheInfo:
        return self.index.open(Credentials.from_request(req.ctx), self._directory(req), req.path)

    def lookup(self, req: kvcache_pb2.KvLookupRequest) -> kvcache_pb2.KvLookupResponse:
        found = self.index.lookup(
            Credentials.from_request(req.ctx),
            req.cache_id,
            list(req.keys),
            prefix=req.prefix,
            touch=req.touch,
        )
        out = kvcache_pb2.KvLookupResponse()
        hits = []
        for e in found:
            loc = out.locations.add()
            if e is not None:
                loc.found = True
                loc.slot, loc.generation, loc.crc, loc.length = (
                    e.slot,
                    e.generation,
                    e.crc,
                    e.length,
                )
                hits.append(e.slot)
        out.found = len(hits)
        if req.touch:
            out.capabilities.extend(self._capabilities(req.cache_id, hits, write=False))
        return out

    def reserve(self, req: kvcache_pb2.KvReserveRequest) -> kvcache_pb2.KvReserveResponse:
        got = self.index.reserve(
            Credentials.from_request(req.ctx),
            req.ctx.client_id,
            req.ctx.request_id,
            req.cache_id,
            list(req.keys),
            list(req.lengths),
        )
        out = kvcache_pb2.KvReserveResponse()
        slots = []
        for r in got:
            out.reservations.add(state=r.state, slot=r.slot, generation=r.generation)
            if r.state == kvcache_pb2.KV_RESERVED:
                slots.append(r.slot)
        out.capabilities.extend(self._capabilities(req.cache_id, slots, write=True))
        return out

    def commit(self, req: kvcache_pb2.KvCommitRequest) -> kvcache_pb2.KvCommitResponse:
        done = self.index.commit(
            Credentials.from_request(req.ctx), req.ctx.client_id, req.cache_id, list(req.items)
        )
        return kvcache_pb2.KvCommitResponse(committed=done)

    def delete(self, req: kvcache_pb2.KvDeleteRequest) -> kvcache_pb2.KvDeleteResponse:
        n = self.index.delete(
            Credentials.from_request(req.ctx),
            req.cache_id,
            list(req.keys),
            list(req.generations),
        )
        return kvcache_pb2.KvDeleteResponse(deleted=n)

    def list(self, req: kvcache_pb2.KvListRequest) -> kvcache_pb2.KvListResponse:
        got, more = self.index.list(
            Credentials.from_request(req.ctx), req.cache_id, req.start_after, req.limit
        )
        return kvcache_pb2.KvListResponse(keys=got, more=more)

    def stats(self, req: kvcache_pb2.KvStatsRequest) -> kvcache_pb2.KvStatsResponse:
        creds = Credentials.from_request(req.ctx)
        counters, slabs_used = self.index.stats(creds, req.cache_id)
        info = self.index.info(req.cache_id)
        stats = kvcache_pb2.KvStats(
            used_blocks=max(0, counters.blocks),
            used_bytes=max(0, counters.bytes),
            hits=counters.hits,
            misses=counters.misses,
            hit_bytes=counters.hit_bytes,
            puts=counters.puts,
            put_bytes=counters.put_bytes,
            evictions=counters.evictions,
            slabs_used=slabs_used,
        )
        return kvcache_pb2.KvStatsResponse(info=info, stats=stats)

    def clear(self, req: kvcache_pb2.KvClearRequest) -> kvcache_pb2.KvClearResponse:
        n = self.index.clear(Credentials.from_request(req.ctx), req.cache_id)
        return kvcache_pb2.KvClearResponse(deleted=n)
