"""Pass 2 of ``emberfs fsck``: the chunks checked against the files.

Every serving target lists its chunks in (inode, index) order (``ListChunks``, a page at a time,
with the chunk file checked, or with ``deep`` every block read against its CRC32C); the lists are
merged and joined with the files in inode order. For each chunk a file needs (below its length,
outside its holes), the serving replicas of its chain must hold it, undamaged, with no problem
found, at least as long as the file needs, and alike (version, length, checksum); no replica may
hold bytes past the file's length; and chunks of inodes that no file owns and no GC item covers
are orphans. A chunk found wrong is listed again and judged with the file as it is then.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Iterator

import grpc

from emberfs.common import extents, grpcauth
from emberfs.common.layout import chunk_chain
from emberfs.common.routing import RoutingView, TargetView
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.clustermgr.repair import list_chunk
from emberfs.metaserver.consistency.findings import Finding, FsckError, Inodes, unanswered
from emberfs.metaserver.fs import records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine
from emberfs.proto import common_pb2, storage_pb2, storage_pb2_grpc

LIST_PAGE = 1000  # chunks a ListChunks page holds when only metadata and files are checked
DEEP_PAGE = 32  # chunks a page holds when every block is read
LIST_TIMEOUT = 120.0  # seconds for one page
CONFIRM_LOOKS = 5  # looks at a chunk found wrong, until two in a row agree
CONFIRM_PAUSE = 0.05  # seconds between two looks


class ChunkCheck:
    """The chunk pass: routing from ``cluster``, the files from ``engine``.

    ``deep`` reads every block; ``mark`` (with repair) has the targets mark bad chunks
    damaged. :attr:`stats` counts files, chunks, replicas and bytes verified;
    :attr:`skipped` holds the targets not serving; :attr:`routing` is the routing the pass
    used (set when it starts).
    """

    def __init__(
        self, engine: KVEngine, cluster: ClusterManager, *, deep: bool, mark: bool
    ) -> None:
        self.engine = engine
        self.cluster = cluster
        self.deep = deep
        self.check = storage_pb2.CHUNK_CHECK_BLOCKS if deep else storage_pb2.CHUNK_CHECK_FILE
        self.mark = mark
        self.stats: Counter = Counter()
        self.skipped: set[int] = set()
        self.routing: RoutingView | None = None

    def _list(
        self, target: TargetView, check: int, mark: bool
    ) -> Iterator[tuple[int, int, int, storage_pb2.ChunkMeta]]:
        page = DEEP_PAGE if check == storage_pb2.CHUNK_CHECK_BLOCKS else LIST_PAGE
        after = None
        with grpcauth.channel(
            target.grpc_address, keys=self.cluster.keys, tls=self.cluster.tls
        ) as channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            while True:
                req = storage_pb2.ListChunksRequest(
                    target_id=target.target_id, limit=page, check=check, mark_damaged=mark
                )
                if after is not None:
                    req.has_after = True
                    req.after_inode, req.after_index = after
                try:
                    resp = stub.ListChunks(req, timeout=LIST_TIMEOUT)
                except grpc.RpcError as exc:
                    raise FsckError(
                        f"target {target.target_id} ({target.grpc_address}) did not list its "
                        f"chunks: {exc.code().name}: {exc.details()}"
                    ) from None
                for chunk in resp.chunks:
                    yield chunk.inode, chunk.index, target.target_id, chunk
                if not resp.more or not resp.chunks:
                    return
                after = (resp.chunks[-1].inode, resp.chunks[-1].index)

    def check_chunks(self, inodes: Inodes) -> Iterator[Finding]:
        """The findings on every chunk (and on files no target holds chunks of)."""
        deep, check, repair = self.deep, self.check, self.mark
        routing = RoutingView.from_proto(self.cluster.routing())
        self.routing = routing
        serving = [t for t in routing.targets.values() if t.serving]
        self.skipped = {t.target_id for t in routing.targets.values() if not t.serving}
        merged = heapq.merge(*(self._list(t, check, repair) for t in serving))
        groups = itertools.groupby(merged, key=lambda item: item[0])
        files = (
            inodes.ids[pos]
            for pos in range(len(inodes.ids))
            if inodes.types[pos] == common_pb2.FILE
        )
        next_file = next(files, None)
        for inode, items in itertools.chain(groups, [(None, iter(()))]):
            while next_file is not None and (inode is None or next_file < inode):
                yield from self._check_file(next_file, {})  # a file no target holds chunks of
                next_file = next(files, None)
            if inode is None:
                return
            chunks: dict[int, dict[int, storage_pb2.ChunkMeta]] = {}
            for _, index, target_id, meta in items:
                chunks.setdefault(index, {})[target_id] = meta
                self.stats["replicas"] += 1
                if deep and meta.version and not meta.problem:
                    self.stats["bytes_verified"] += meta.length
            self.stats["chunks"] += len(chunks)
            if next_file == inode:
                next_file = next(files, None)
                yield from self._check_file(inode, chunks)
            else:
                yield from self._check_orphan(inode, chunks)

    def _check_orphan(self, inode: int, chunks: dict) -> Iterator[Finding]:
        raw = self.engine.get(keys.inode_key(inode))
        if raw is not None and records.decode_inode(raw).type == common_pb2.FILE:
            yield from self._check_file(inode, chunks)  # created while this ran
            return
        if self.engine.get(keys.gc_key(inode)) is not None:
            return  # removed: its GC item is on the way
        # No GC item now: every replica that had to drop the chunks did before now. Those
        # still there are left over (a target's list may predate its collection).
        left = {}
        for t in sorted({t for replicas in chunks.values() for t in replicas}):
            target = self.routing.targets.get(t)
            if target is not None:
                n = sum(1 for m in self._list_inode(target, inode) if m.inode == inode)
                if n:
                    left[t] = n
        if left:
            yield Finding(
                "orphan_chunk",
                inode,
                targets=sorted(left),
                detail=f"{max(left.values())} chunk(s) of inode {inode}, which no file owns",
            )

    def _check_file(self, inode: int, chunks: dict) -> Iterator[Finding]:
        raw = self.engine.get(keys.inode_key(inode))
        if raw is None:
            if chunks:
                yield from self._check_orphan(inode, chunks)
            return
        attr = records.decode_inode(raw)
        if attr.type != common_pb2.FILE:
            return
        self.stats["files"] += 1
        layout, size = attr.layout, attr.size
        if not layout.chunk_size or not layout.chains:
            return
        data = extents.data_chunks(extents.holes_of(attr), size, layout.chunk_size)
        for index in sorted(set(data) | set(chunks)):
            chain = self.routing.chains.get(chunk_chain(list(layout.chains), index))
            if chain is None:
                continue
            found = self._judge(attr, index, chain.serving, chunks.get(index, {}))
            if found:  # the lists were taken at different times: look again
                found = self._confirm(inode, index, chain.serving)
            yield from found

    def _confirm(self, inode: int, index: int, serving) -> list[Finding]:
        """The findings on a chunk that hold in two looks in a row at the same replicas.

        One look lists the chunk on each replica in turn, so an update passing
        down the chain between two of them shows as a difference; a chunk that
        keeps changing is being written, not damaged, and is left alone.
        """
        before = None
        for _ in range(CONFIRM_LOOKS):
            raw = self.engine.get(keys.inode_key(inode))
            if raw is None:
                return []  # removed meanwhile: its GC item takes the chunks
            now = {t.target_id: m for t in serving if (m := self._list_one(t, inode, index))}
            found = self._judge(records.decode_inode(raw), index, serving, now)
            if not found:
                return []
            seen = {t: (m.version, m.pending_version, m.length, m.checksum) for t, m in now.items()}
            if seen == before:
                return found
            before = seen
            time.sleep(CONFIRM_PAUSE)
        return []

    def _judge(
        self, attr: common_pb2.InodeAttr, index: int, serving, replicas: dict
    ) -> list[Finding]:
        """The findings on chunk ``index`` of the file ``attr`` given what its replicas hold."""
        chunk_size, size = attr.layout.chunk_size, attr.size
        start = index * chunk_size
        need = max(
            0, extents.data_end(extents.holes_of(attr), size, start, start + chunk_size) - start
        )
        allowed = max(0, min(chunk_size, size - start))
        members = [t.target_id for t in serving]
        return list(self._check_chunk(attr.inode, index, need, allowed, members, replicas))

    def _past_end_expected(self, inode: int) -> bool:
        """Bytes past the length wait for their cut, or are a writer's not yet closed."""
        if self.engine.get(keys.cut_key(inode)) is not None:
            return True
        return any(
            keys.is_session_key(k) for k, _ in self.engine.scan_prefix(keys.session_prefix(inode))
        )

    def _list_inode(self, target: TargetView, inode: int) -> list:
        """The chunks of ``inode`` on ``target`` now (up to a page)."""
        req = storage_pb2.ListChunksRequest(
            target_id=target.target_id, inode=inode, limit=LIST_PAGE
        )
        try:
            with grpcauth.channel(
                target.grpc_address, keys=self.cluster.keys, tls=self.cluster.tls
            ) as channel:
                stub = storage_pb2_grpc.StorageServiceStub(channel)
                return list(stub.ListChunks(req, timeout=LIST_TIMEOUT).chunks)
        except grpc.RpcError as exc:
            raise unanswered(target, inode, exc) from None

    def _list_one(self, target: TargetView, inode: int, index: int):
        """Chunk ``index`` of ``inode`` on ``target`` now, checked as the pass checks (None: absent)."""
        try:
            return list_chunk(
                target,
                inode,
                index,
                check=self.check,
                mark_damaged=self.mark,
                timeout=LIST_TIMEOUT,
                keys=self.cluster.keys,
                tls=self.cluster.tls,
            )
        except grpc.RpcError as exc:
            raise unanswered(target, inode, exc) from None

    def _check_chunk(
        self,
        inode: int,
        index: int,
        need: int,
        allowed: int,
        members: list[int],
        replicas: dict[int, storage_pb2.ChunkMeta],
    ) -> Iterator[Finding]:
        if any(m.pending_version for m in replicas.values()):
            return  # an update is passing down the chain: not settled
        holders, lacking = [], []
        for t in members:
            m = replicas.get(t)
            if m is not None and m.version and not m.damaged and not m.problem and m.length >= need:
                holders.append(t)
            elif need:
                why = (
                    "no chunk"
                    if m is None or not m.version
                    else "damaged"
                    if m.damaged
                    else m.problem or f"{m.length} bytes, the file needs {need}"
                )
                lacking.append((t, why))
        if lacking and not holders:
            yield Finding(
                "lost_chunk",
                inode,
                index,
                [t for t, _ in lacking],
                "; ".join(f"target {t}: {why}" for t, why in lacking),
            )
            return
        for t, why in lacking:
            yield Finding("missing_replica", inode, index, [t], f"target {t}: {why}")
        alike = {(replicas[t].version, replicas[t].length, replicas[t].checksum) for t in holders}
        if len(alike) > 1:
            first = replicas[holders[0]]
            odd = [
                t
                for t in holders[1:]
                if (replicas[t].version, replicas[t].length, replicas[t].checksum)
                != (first.version, first.length, first.checksum)
            ]
            yield Finding(
                "replicas_disagree",
                inode,
                index,
                odd,
                ", ".join(
                    f"target {t}: v{replicas[t].version} {replicas[t].length} bytes "
                    f"crc {replicas[t].checksum:08x}"
                    for t in holders
                ),
            )
        long = [t for t in members if t in replicas and replicas[t].length > allowed]
        if long and not self._past_end_expected(inode):
            yield Finding(
                "chunk_past_end",
                inode,
                index,
                long,
                f"the file allows {allowed} bytes in this chunk; "
                + ", ".join(f"target {t} holds {replicas[t].length}" for t in long),
            )
