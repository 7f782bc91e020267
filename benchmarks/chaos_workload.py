"""One client process of the chaos checker: a mixed workload on files it alone owns.

Each client is its own process with its own :class:`EmberFileSystem`, works
under ``ROOT/c<index>/`` and owns every file there, so each file's history is
sequential and its model (:mod:`benchmarks.chaos_model`) says exactly what a
read may return. The operations: create, write a whole file, overwrite a
range inside a chunk or across chunk boundaries, append, truncate (shrink and
grow), rename, remove, and reads of whole files and of ranges, each checked
at once. Every operation is one line of the client's history (JSON lines:
start and end on the monotonic clock, arguments, result or error); what it
found wrong is a ``violation`` line beside it.

EmberFile writes whole files and appends; a range overwrite uses the same
three calls its writes make: an ``Open`` for writing (no truncation), one
chunk write per chunk through ``FileIO.submit_write``, and the ``Close``
that records the length.

The coordinator steers the client through a pipe: ``pause`` (finish the
current operation, then wait), ``verify`` (read back every file and look at
the namespace, while paused), ``resume`` and ``stop``.
"""

from __future__ import annotations

import json
import random
import time
import traceback
from dataclasses import dataclass, field

from benchmarks.chaos_model import INF, FileModel, check_read, pattern_bytes

KiB = 1024

# operation kind -> weight of its choice
OPS = {
    "create": 6,
    "write_whole": 8,
    "overwrite_in_chunk": 12,
    "overwrite_across_chunks": 12,
    "append": 10,
    "truncate_shrink": 5,
    "truncate_grow": 5,
    "rename": 5,
    "remove": 4,
    "read_whole": 14,
    "read_range": 14,
}
MAX_VIOLATIONS_PER_FILE = 3


@dataclass
class ClientConfig:
    """What one client process needs to know (picklable)."""

    index: int
    seed: int
    meta: str
    root: str
    chunk_size: int
    history: str
    max_files: int = 6
    max_size: int = 2 * 1024 * KiB
    fs_options: dict = field(default_factory=dict)
    secret_file: str | None = None  # the cluster's key file: the checker lists chunks with it


def pwrite(fs, path: str, offset: int, data: bytes) -> tuple[int, int]:
    """Write ``data`` at ``offset`` of the existing file ``path``; ``(inode, size before)``.

    The file's length becomes ``max(size, offset + len(data))``. As EmberFile
    does on a failed write, the session is closed without a length when a
    chunk write fails.
    """
    from emberfs.client.chunkio import wait_all
    from emberfs.common.layout import chunk_spans
    from emberfs.proto import meta_pb2

    h = fs.client.open(path, meta_pb2.OPEN_WRITE)
    view = memoryview(data)
    try:
        wait_all(
            fs.client.files.submit_write(
                h, s.file_offset, view[s.file_offset - offset : s.file_offset - offset + s.length]
            )
            for s in chunk_spans(offset, len(data), h.chunk_size)
        )
    except BaseException:
        try:
            fs.client.sessions.close(h, h.size, wrote=False, path=path)
        except Exception:
            pass
        raise
    fs.client.sessions.close(h, max(h.size, offset + len(data)), wrote=True, path=path)
    return h.inode, h.size


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class Workload:
    """The files, model and history of one client."""

    def __init__(self, cfg: ClientConfig) -> None:
        from emberfs.client.fs import EmberFileSystem

        self.cfg = cfg
        self.rng = random.Random(f"{cfg.seed}/client/{cfg.index}")
        self.fs = EmberFileSystem(cfg.meta, skip_instance_cache=True, **cfg.fs_options)
        self.dir = f"{cfg.root}/c{cfg.index}"
        self.files: dict[int, FileModel] = {}
        self.last_path: dict[int, str] = {}  # file -> the last path it had
        self.renames: dict[int, int] = {}
        self.force_rewrite: set[int] = set()
        # files a read found wrong: left alone until the next check reads them after the heal
        self.held: set[int] = set()
        self.verifying = False
        self.bad_reports: dict[int, int] = {}
        self.created = 0
        self.op_id = 0
        self.counts: dict[str, dict[str, int]] = {}
        self.errors: dict[str, int] = {}
        self.bytes_read_checked = 0
        self.out = open(cfg.history, "a", buffering=1)

    # history -------------------------------------------------------------------------------
    def emit(self, record: dict) -> None:
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")

    def violation(self, kind: str, fm: FileModel | None, op: int | None, detail: dict) -> dict:
        v = {
            "type": "violation",
            "kind": kind,
            "client": self.cfg.index,
            "file": fm.file_id if fm else None,
            "path": (fm.path or self.last_path.get(fm.file_id)) if fm else None,
            "op": op,
            "t": time.monotonic(),
            "detail": detail,
        }
        self.emit(v)
        if fm is not None:
            self.force_rewrite.add(fm.file_id)
            if not self.verifying:
                self.held.add(fm.file_id)
        return v

    def run_op(self, kind: str, fm: FileModel | None, path: str | None, args: dict, fn):
        """Run ``fn(op_id)``; record it; ``(ok, result or exception)``."""
        self.op_id += 1
        op = self.op_id
        t0 = time.monotonic()
        try:
            result = fn(op)
            ok, err = True, None
        except Exception as exc:  # every failure is an outcome to record
            result, ok, err = exc, False, exc
        t1 = time.monotonic()
        rec = {
            "type": "op",
            "op": op,
            "client": self.cfg.index,
            "file": fm.file_id if fm else None,
            "kind": kind,
            "path": path,
            "args": args,
            "t0": t0,
            "t1": t1,
            "ok": ok,
        }
        if ok:
            if isinstance(result, dict):
                rec["result"] = result
        else:
            rec["error"] = _error(err)
            name = type(err).__name__
            self.errors[name] = self.errors.get(name, 0) + 1
            if not isinstance(err, OSError):
                rec["traceback"] = traceback.format_exception(err)[-3:]
        self.emit(rec)
        c = self.counts.setdefault(kind, {"ok": 0, "error": 0})
        c["ok" if ok else "error"] += 1
        return op, ok, result

    # choosing ----------------------------------------------------------------------------
    def live(self) -> list[FileModel]:
        return [f for f in self.files.values() if not f.removed and f.file_id not in self.held]

    def step(self) -> None:
        """One operation, chosen by the client's generator."""
        rng = self.rng
        live = self.live()
        kinds = list(OPS)
        kind = rng.choices(kinds, weights=[OPS[k] for k in kinds])[0]
        if not live or (len(live) < 2 and kind != "create" and rng.random() < 0.5):
            kind = "create"
        if kind == "create" and len(live) >= self.cfg.max_files:
            kind = "remove"
        if kind == "create":
            self.create()
            return
        fm = rng.choice(live)
        if fm.path is None:
            self.resolve(fm)
            return
        if fm.file_id in self.force_rewrite:
            kind = "write_whole"
        getattr(self, kind)(fm)

    def size_of(self, fm: FileModel) -> int:
        return max(fm.lengths)

    def new_size(self) -> int:
        cs = self.cfg.chunk_size
        r = self.rng.random()
        if r < 0.1:
            return 0
        if r < 0.4:
            return self.rng.randrange(1, cs)
        hi = min(self.cfg.max_size, 4 * cs + cs // 2)
        return self.rng.randrange(cs, hi) if hi > cs else self.rng.randrange(1, self.cfg.max_size)

    # writes --------------------------------------------------------------------------------
    def _write_file(self, path: str, mode: str, data: bytes, result: dict) -> None:
        rng = self.rng
        with self.fs.open(path, mode) as f:
            result["inode"] = f.handle.inode
            pos = 0
            while pos < len(data):  # uneven pieces: buffered partial chunks and whole ones
                n = rng.choice((len(data) - pos, rng.randrange(1, 96 * KiB)))
                f.write(data[pos : pos + n])
                pos += n

    def create(self) -> None:
        self.created += 1
        fid = self.cfg.index * 1_000_000 + self.created
        path = f"{self.dir}/f{fid}"
        fm = FileModel(fid, {path})
        self.files[fid] = fm
        self.last_path[fid] = path
        size = self.new_size()
        # the write is known before the op runs: its id goes into the op's arguments
        wid = fm.new_write(self.op_id + 1, 0, size)
        data = pattern_bytes(fid, wid, 0, size)
        result: dict = {}
        op, ok, _ = self.run_op(
            "create",
            fm,
            path,
            {"write": wid, "start": 0, "end": size},
            lambda op: self._write_file(path, "xb", data, result) or result,
        )
        if "inode" in result:
            fm.inodes.add(result["inode"])
        fm.write_whole(wid, ok, op)
        if not ok:
            fm.paths = {path, None}
            return
        self.read_back(fm, 0, size)

    def write_whole(self, fm: FileModel) -> None:
        path = fm.path
        size = self.new_size()
        wid = fm.new_write(self.op_id + 1, 0, size)
        data = pattern_bytes(fm.file_id, wid, 0, size)
        result: dict = {}
        op, ok, _ = self.run_op(
            "write_whole",
            fm,
            path,
            {"write": wid, "start": 0, "end": size},
            lambda op: self._write_file(path, "wb", data, result) or result,
        )
        self._check_inode(fm, op, result.get("inode"))
        fm.write_whole(wid, ok, op)
        if ok:
            self.force_rewrite.discard(fm.file_id)
            self.read_back(fm, 0, size)

    def _check_inode(self, fm: FileModel, op: int, inode: int | None) -> None:
        """An open for writing that found another inode: the file was lost and made again."""
        if inode is None:
            return
        if fm.inodes and inode not in fm.inodes:
            self.violation(
                "lost_file",
                fm,
                op,
                {"why": "an open for writing created a new inode", "inodes": sorted(fm.inodes)},
            )
        fm.inodes.add(inode)

    def overwrite(self, fm: FileModel, kind: str, start: int, end: int) -> None:
        path = fm.path
        wid = fm.new_write(self.op_id + 1, start, end)
        data = pattern_bytes(fm.file_id, wid, start, end)
        seen: dict = {}

        def run(op):
            seen["inode"], seen["size"] = pwrite(self.fs, path, start, data)
            return dict(seen)

        op, ok, _ = self.run_op(kind, fm, path, {"write": wid, "start": start, "end": end}, run)
        self._check_inode(fm, op, seen.get("inode"))
        if "size" in seen:
            self._observe(fm, op, seen["size"])
        fm.write_at(wid, ok, op)
        if ok and self.rng.random() < 0.5:
            self.read_back(fm, max(0, start - 100), end + 100)

    def _observe(self, fm: FileModel, op: int, size: int) -> None:
        allowed = sorted(fm.lengths)
        if not fm.observe_length(size):
            self.violation("wrong_length", fm, op, {"found": size, "allowed": allowed})

    def overwrite_in_chunk(self, fm: FileModel) -> None:
        cs = self.cfg.chunk_size
        size = self.size_of(fm)
        index = self.rng.randrange(0, size // cs + 1)
        start = index * cs + self.rng.randrange(0, cs - 1)
        end = min((index + 1) * cs, start + self.rng.randrange(1, 64 * KiB))
        self.overwrite(fm, "overwrite_in_chunk", start, end)

    def overwrite_across_chunks(self, fm: FileModel) -> None:
        cs = self.cfg.chunk_size
        size = self.size_of(fm)
        boundary = cs * self.rng.randrange(1, size // cs + 2)
        start = boundary - self.rng.randrange(1, 48 * KiB)
        end = boundary + self.rng.randrange(1, 48 * KiB)
        if self.rng.random() < 0.3:
            end += cs  # over a whole chunk too
        end = min(end, self.cfg.max_size)
        self.overwrite(fm, "overwrite_across_chunks", start, max(end, boundary + 1))

    def append(self, fm: FileModel) -> None:
        path = fm.path
        n = self.rng.randrange(1, 300 * KiB)
        if self.size_of(fm) + n > self.cfg.max_size:
            self.truncate_shrink(fm)
            return
        rng = self.rng
        state: dict = {}

        def run(op):
            with self.fs.open(path, "ab") as f:
                state["inode"] = f.handle.inode
                state["size"] = start = f.loc
                state["write"] = wid = fm.new_write(op, start, start + n)
                data = pattern_bytes(fm.file_id, wid, start, start + n)
                pos = 0
                while pos < n:
                    k = rng.choice((n - pos, rng.randrange(1, 64 * KiB)))
                    f.write(data[pos : pos + k])
                    pos += k
            return {"inode": state["inode"], "start": start, "end": start + n, "write": wid}

        op, ok, _ = self.run_op("append", fm, path, {"bytes": n}, run)
        self._check_inode(fm, op, state.get("inode"))
        if "size" in state:
            self._observe(fm, op, state["size"])
        if "write" in state:
            fm.write_at(state["write"], ok, op)
            if ok and rng.random() < 0.5:
                self.read_back(fm, max(0, state["size"] - 1000), None)

    def _truncate(self, fm: FileModel, kind: str, length: int) -> None:
        path = fm.path
        op, ok, _ = self.run_op(
            kind, fm, path, {"length": length}, lambda op: self.fs.truncate(path, length)
        )
        fm.truncate(length, ok, op)
        if ok and self.rng.random() < 0.5:
            self.read_back(fm, max(0, length - 1000), None)

    def truncate_shrink(self, fm: FileModel) -> None:
        size = self.size_of(fm)
        self._truncate(fm, "truncate_shrink", self.rng.randrange(0, size) if size else 0)

    def truncate_grow(self, fm: FileModel) -> None:
        size = self.size_of(fm)
        length = min(self.cfg.max_size, size + self.rng.randrange(1, 300 * KiB))
        self._truncate(fm, "truncate_grow", length)

    def rename(self, fm: FileModel) -> None:
        old = fm.path
        self.renames[fm.file_id] = self.renames.get(fm.file_id, 0) + 1
        new = f"{self.dir}/f{fm.file_id}.{self.renames[fm.file_id]}"
        op, ok, _ = self.run_op("rename", fm, old, {"to": new}, lambda op: self.fs.mv(old, new))
        fm.moved(old, new, ok, op)
        if ok:
            self.last_path[fm.file_id] = new

    def remove(self, fm: FileModel | None = None) -> None:
        if fm is None:
            fm = self.rng.choice(self.live())
            if fm.path is None:
                self.resolve(fm)
                return
        path = fm.path
        op, ok, _ = self.run_op("remove", fm, path, {}, lambda op: self.fs.rm(path))
        fm.unlinked(ok, op)
        if ok:
            self.force_rewrite.discard(fm.file_id)

    def resolve(self, fm: FileModel, op_kind: str = "lookup") -> bool:
        """Find where a file whose rename or removal failed is now; True once known."""
        candidates = sorted(p for p in fm.paths if p is not None)
        found: dict[str, int] = {}

        def run(op):
            for p in candidates:
                try:
                    found[p] = self.fs.info(p)["ino"]
                except FileNotFoundError:
                    pass
            return {"found": found}

        op, ok, _ = self.run_op(op_kind, fm, None, {"paths": candidates}, run)
        if not ok:
            return False
        ours = [p for p, ino in found.items() if not fm.inodes or ino in fm.inodes]
        if len(ours) == 1:
            fm.resolved(ours[0])
            self.last_path[fm.file_id] = ours[0]
            return True
        if not ours and None in fm.paths:
            fm.resolved(None)
            return True
        kind = "lost_file" if not ours else "namespace_mismatch"
        self.violation(kind, fm, op, {"candidates": candidates, "found": found})
        if ours:
            fm.resolved(ours[-1])
            self.last_path[fm.file_id] = ours[-1]
            return True
        fm.resolved(None)
        return True

    # reads -------------------------------------------------------------------------------
    def read_whole(self, fm: FileModel) -> None:
        self.read_back(fm, 0, None, kind="read_whole")

    def read_range(self, fm: FileModel) -> None:
        size = self.size_of(fm)
        start = self.rng.randrange(0, size + 1000)
        end = start + self.rng.randrange(1, 300 * KiB)
        self.read_back(fm, start, end, kind="read_range")

    def _read(self, path: str, start: int, end: int | None, how: str) -> bytes:
        if how == "cat_file":
            return self.fs.cat_file(path, start, end)
        with self.fs.open(path, "rb") as f:
            f.seek(start)
            if how == "readinto":
                n = max(0, (f.size if end is None else min(end, f.size)) - start)
                buf = bytearray(n)
                got = 0
                while got < n:
                    k = f.readinto(memoryview(buf)[got:])
                    if not k:
                        break
                    got += k
                return bytes(buf[:got])
            return f.read(-1 if end is None else end - start)

    def read_back(
        self,
        fm: FileModel,
        start: int,
        end: int | None,
        kind: str = "read_after_write",
        violation_kind: str = "stale_read",
    ) -> bool:
        """Read [start, end) of the file and check it against the model; False on an error."""
        path = fm.path
        how = self.rng.choice(("cat_file", "open_read", "readinto"))

        op, ok, got = self.run_op(
            kind,
            fm,
            path,
            {"start": start, "end": end, "how": how},
            lambda op: self._read(path, start, end, how),
        )
        if not ok:
            return False
        self.check(fm, op, start, end, got, violation_kind)
        return True

    def check(
        self, fm: FileModel, op: int, start: int, end: int | None, got: bytes, stale_kind: str
    ) -> int:
        """Check a read; the number of bytes the model knew exactly."""
        self.bytes_read_checked += len(got)
        lengths = fm.read_lengths(start, end)
        if len(got) not in lengths:
            self.report(
                "wrong_length",
                fm,
                op,
                {"start": start, "end": end, "got": len(got), "allowed": sorted(lengths)},
            )
        runs = check_read(fm, start, got)
        stale = [r.as_dict() for r in runs if r.stale]
        never = [r.as_dict() for r in runs if not r.stale]
        if runs and (
            self.verifying or self.bad_reports.get(fm.file_id, 0) < MAX_VIOLATIONS_PER_FILE
        ):
            seen = self.diagnose(fm, start, end, runs)
            if stale:
                self.report(stale_kind, fm, op, {"read_start": start, "runs": stale[:8], **seen})
            if never:
                self.report(
                    "never_written", fm, op, {"read_start": start, "runs": never[:8], **seen}
                )
        elif runs:
            self.report(stale_kind if stale else "never_written", fm, op, {})
        return sum(
            b - a for a, b, ids in fm.content.pieces(start, start + len(got)) if len(ids) == 1
        )

    def diagnose(self, fm: FileModel, start: int, end: int | None, runs) -> dict:
        """What the cluster holds right after a wrong read: the routing the client had, each
        replica of the chunks concerned (``ListChunks``) and two more reads of the range."""
        from benchmarks.chaos_cluster import list_chunks
        from emberfs.common.auth import ClusterKeys

        keys = ClusterKeys.from_file(self.cfg.secret_file) if self.cfg.secret_file else None
        from emberfs.proto import meta_pb2

        out: dict = {}
        try:
            cached = self.fs.client.runtime().routing.get()
            h = self.fs.client.open(fm.path, meta_pb2.OPEN_READ)
            fresh = self.fs.client.meta.routing()
            chunks = sorted(
                {
                    i
                    for r in runs
                    for i in range(r.start // h.chunk_size, (r.end - 1) // h.chunk_size + 1)
                }
            )
            states = {t.target_id: t for t in fresh.targets}
            replicas = []
            for index in chunks[:3]:
                chain_id = h.chains[index % len(h.chains)]
                chain = next(c for c in fresh.chains if c.chain_id == chain_id)
                seen_chain = cached.chains.get(chain_id)
                item = {
                    "chunk": index,
                    "chain": chain_id,
                    "chain_version": chain.version,
                    "client_chain_version": seen_chain.version if seen_chain else None,
                    "client_chain": [
                        [t.target_id, t.state] for t in (seen_chain.targets if seen_chain else ())
                    ],
                    "targets": {},
                }
                for tid in chain.targets:
                    t = states[tid]
                    try:
                        got = list_chunks(t.grpc_address, tid, 5.0, h.inode, keys=keys).get(
                            (h.inode, index)
                        )
                    except Exception as exc:
                        got = f"{type(exc).__name__}"
                    item["targets"][str(tid)] = {
                        "address": t.data_address,
                        "state": t.state,
                        "chunk": got,
                    }
                replicas.append(item)
            out["replicas_after"] = replicas
        except Exception as exc:
            out["replicas_after"] = f"{type(exc).__name__}: {exc}"[:300]
        rereads = []
        for _ in range(2):
            try:
                again = self.fs.cat_file(fm.path, start, end)
                bad = check_read(fm, start, again)
                rereads.append(
                    "same bytes"
                    if bad == runs
                    else ("right" if not bad else f"{len(bad)} other wrong runs")
                )
            except Exception as exc:
                rereads.append(f"{type(exc).__name__}: {exc}"[:200])
        out["rereads"] = rereads
        return out

    def report(self, kind: str, fm: FileModel, op: int, detail: dict) -> None:
        n = self.bad_reports.get(fm.file_id, 0) + 1
        self.bad_reports[fm.file_id] = n
        if n <= MAX_VIOLATIONS_PER_FILE or self.verifying:
            self.violation(kind, fm, op, detail)
        else:
            self.force_rewrite.add(fm.file_id)

    # verification --------------------------------------------------------------------------
    def verify(self, check_id: int) -> dict:
        """Read every file back and compare the directory with the model (cluster healed).

        Files a read found wrong since the last check were left alone meanwhile, so this
        tells whether their acknowledged bytes are lost (``lost_write``) or were only read
        wrong; they are written whole again afterwards.
        """
        self.verifying = True
        try:
            return self._verify(check_id)
        finally:
            self.verifying = False
            self.force_rewrite |= self.held
            self.held.clear()

    def _verify(self, check_id: int) -> dict:
        exact = loose = files = 0
        for fm in list(self.files.values()):
            if fm.path is None and not fm.removed:
                if not self.resolve(fm, "verify_lookup"):
                    self.violation("unreadable_after_heal", fm, None, {"what": "lookup"})
                    continue
            if fm.removed:
                continue
            files += 1
            path = fm.path
            op, ok, info = self.run_op(
                "verify_stat",
                fm,
                path,
                {"check": check_id},
                lambda op, path=path: self.fs.info(path),
            )
            if not ok:
                kind = (
                    "lost_file" if isinstance(info, FileNotFoundError) else "unreadable_after_heal"
                )
                self.violation(kind, fm, op, {"error": _error(info)})
                continue
            if info["size"] not in fm.lengths:
                self.violation(
                    "wrong_length", fm, op, {"found": info["size"], "allowed": sorted(fm.lengths)}
                )
            op, ok, got = self.run_op(
                "verify_read",
                fm,
                path,
                {"check": check_id},
                lambda op, path=path: self.fs.cat_file(path),
            )
            if not ok:
                self.violation("unreadable_after_heal", fm, op, {"error": _error(got)})
                continue
            n = self.check(fm, op, 0, None, got, "lost_write")
            exact += n
            loose += len(got) - n
        # the directory holds exactly the files that exist
        op, ok, names = self.run_op(
            "verify_list",
            None,
            self.dir,
            {"check": check_id},
            lambda op: self.fs.ls(self.dir, detail=False) if self.fs.exists(self.dir) else [],
        )
        if ok:
            expected = {fm.path for fm in self.files.values() if fm.path}
            extra = sorted(set(names) - expected)
            missing = sorted(expected - set(names))
            if extra or missing:
                self.violation(
                    "namespace_mismatch", None, op, {"unexpected": extra, "missing": missing}
                )
        else:
            self.violation("unreadable_after_heal", None, op, {"error": _error(names)})
        return {
            "files": files,
            "bytes_exact": exact,
            "bytes_loose": loose,
            "uncertain_files": sum(1 for f in self.files.values() if not f.certain),
            "inodes": {
                str(i): [self.cfg.index, f.file_id, self.last_path.get(f.file_id)]
                for f in self.files.values()
                for i in f.inodes
            },
        }

    def stats(self) -> dict:
        return {
            "ops": self.counts,
            "errors": self.errors,
            "bytes_read_checked": self.bytes_read_checked,
            "files_created": self.created,
        }

    def close(self) -> None:
        self.out.close()
        self.fs.close()


def client_main(cfg: ClientConfig, conn) -> None:
    """The body of a client process: run operations until told to stop."""
    w = Workload(cfg)
    w.fs.makedirs(w.dir, exist_ok=True)
    try:
        running = True
        while True:
            if conn.poll(0 if running else None):
                cmd = conn.recv()
                what = cmd["cmd"]
                if what == "pause":
                    running = False
                    conn.send({"paused": w.op_id})
                elif what == "resume":
                    running = True
                elif what == "verify":
                    conn.send({"verified": w.verify(cmd["check"])})
                elif what == "stop":
                    conn.send({"stats": w.stats()})
                    return
                continue
            w.step()
    except BaseException:
        conn.send({"crashed": traceback.format_exc()})
        raise
    finally:
        w.close()


__all__ = ["INF", "ClientConfig", "Workload", "client_main", "pwrite"]
