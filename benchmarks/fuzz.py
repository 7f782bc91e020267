"""Fuzzing of the live servers: the data port, every gRPC method and the admin REST API.

Run from the repository root::

    python -m benchmarks.fuzz                                     # 20,000 inputs per surface
    python -m benchmarks.fuzz --surface data --inputs 400000 --seed 7
    python -m benchmarks.fuzz --surface grpc,rest --inputs 300000 --json > fuzz.json

It starts a :class:`~emberfs.cli.localcluster.LocalCluster` (a metaserver and 3 storage
servers, authentication on) in a temporary directory, writes a check file, and then runs
``--inputs`` generated inputs against each surface from several threads:

* ``data``: frames sent to every storage server's data port: random bytes, valid frames
  with lying contents (ranges past a chunk's end, wrong chains, targets and chain
  versions, huge update versions, sync and replace flags, bad chunk sizes, truncation
  steps) and mutations of valid frames (bit flips, truncations, trailing bytes, lengths
  that lie with and without a matching signature, wrong header CRC, magic or version,
  unknown ops, the response bit), each without credentials, with a client capability
  (valid, expired, forged, for another inode) or a server credential (valid, off the
  clock, malformed); and frames that stop half-sent or trickle in, which the server must
  drop within its ``--frame-timeout``. Many inputs share a connection while the server
  keeps it open.
* ``grpc``: every method of MetaService, ClusterService and StorageService, with
  protobuf messages of random and boundary values (0, the largest u32/u64, negative ints,
  huge and non-ASCII strings, long repeated fields) and raw bytes (random, mutated
  encodings, invalid UTF-8, overlong varints, lengths past the end, deep groups), sent
  without credentials, with a wrong or malformed token, with the admin token and with a
  server credential.
* ``rest``: every route of the admin API's OpenAPI document (``GET /openapi.json``), with
  random and boundary path, query and body values (wrong types, missing and extra fields,
  bad JSON), with no token, a wrong one and the admin token; plus routes outside the
  document and malformed HTTP.

Credentials that could change state are kept away from it: server credentials write and
truncate only chunks of inodes from 2**40 up, remove only their chunks, acknowledge GC
only of ids from 2**40 up; RegisterNode, Heartbeat and SyncDone get no server credential;
the admin token changes the namespace only under ``/fuzz-scratch`` (a symlink made there
points inside it), takes offline or drains only target ids that no target has. An input
that would break these rules is replaced by another (counted as ``guarded``).

While a surface runs, a prober checks every second that every server answers within a
few seconds (an authenticated PING on every data port, gRPC Ping, GetRouting and
TargetStats, ``GET /healthz``) and that no server process has exited; each input's own
answer has a deadline too (an input that the server neither answers nor closes on in
time is a hang). After the last surface, the check file written before the first must
read back identical, with its replicas' versions and checksums unchanged.

The output is a JSON report (``--json``; else a summary): per surface the inputs, their
rate, the answers by status, the inputs by kind, crashes, hangs, server errors (an HTTP
5xx, a gRPC UNKNOWN or INTERNAL other than an undecodable request, a data INTERNAL or a
malformed answer) with up to 20 examples each that hold the input, and the resident
memory of every server process before and after. Exit code 0 when no server crashed or
hung and the check file is intact, 1 otherwise, 2 when the run could not be made.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import http.client
import json
import os
import random
import re
import select
import shutil
import socket
import string
import struct
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import grpc
from google.protobuf import descriptor as pbd
from google.protobuf import message_factory, text_format
from google.protobuf.message import DecodeError, Message

from emberfs.cli.localcluster import LocalCluster
from emberfs.cli.processes import Service
from emberfs.common import framing, grpcauth
from emberfs.common.auth import (
    CALL_KEY,
    CAPABILITY,
    MAC_SIZE,
    SERVER,
    SERVER_SECTION_SIZE,
    TOKEN_KEY,
    ClusterKeys,
    now_ms,
)
from emberfs.common.framing import Op, Status
from emberfs.proto import (
    cluster_pb2,
    cluster_pb2_grpc,
    common_pb2,
    data_pb2,
    meta_pb2,
    meta_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)

SURFACES = ("data", "grpc", "rest")
SCRATCH_INODE = 1 << 40  # chunks of inodes from here up are the fuzzer's to change
SCRATCH_DIR = "/fuzz-scratch"
CHECK_DIR = "/fuzz-check"
CHECK_PATH = CHECK_DIR + "/check.bin"
CHECK_SIZE = 6 * 1024 * 1024 + 12345
CHECK_CACHE = CHECK_DIR + "/kv"  # a KV cache with one block that must survive the run
CHECK_KEY = b"fuzz-check-block"
SCRATCH_CACHE = SCRATCH_DIR + "/kv"  # a KV cache the fuzzer may change
KV_BLOCK = 64 * 1024
MAX_EXAMPLES = 20
EXAMPLE_BYTES = 16 * 1024  # an example's input beyond this is cut (its length and hash kept)
ANSWER_TIMEOUT = 5.0  # an input's answer (or the server closing)
CALL_TIMEOUT = 10.0  # a gRPC call or an HTTP request
SLOW_TIMEOUT = 120.0  # fsck over HTTP
PROBE_TIMEOUT = 5.0
PROBE_INTERVAL = 1.0
FRAME_TIMEOUT = 3.0  # the storage servers' --frame-timeout in the fuzzed cluster
STALL_SLACK = 4.0  # how much later than its frame timeout a stalled frame may be dropped
THREADS = {"data": 6, "grpc": 6, "rest": 32}
MiB = 1 << 20
U16 = (1 << 16) - 1
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2
PAGE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class CouldNotRun(Exception):
    """The run could not be made (exit code 2)."""


# ============================================================================ bookkeeping


def hexcut(raw: bytes) -> dict:
    """An input's bytes for a report: hex, cut at :data:`EXAMPLE_BYTES` (length and hash kept)."""
    out: dict[str, Any] = {"hex": raw[:EXAMPLE_BYTES].hex(), "length": len(raw)}
    if len(raw) > EXAMPLE_BYTES:
        out["cut"] = True
        out["sha256"] = hashlib.sha256(raw).hexdigest()
    return out


class Tally:
    """What one surface's inputs met, shared by its threads.

    Parameters
    ----------
    surface : str
        The surface's name.
    """

    def __init__(self, surface: str) -> None:
        self.surface = surface
        self._lock = threading.Lock()
        self.inputs = 0
        self.kinds: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.guarded = 0
        self.crashes: list[dict] = []
        self.hangs = 0
        self.hang_examples: list[dict] = []
        self.errors = 0
        self.error_examples: list[dict] = []
        self.fuzzer_errors: list[str] = []
        self.time_by_group: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        self._recent: collections.deque[Callable[[], dict]] = collections.deque(maxlen=16)

    def record(
        self,
        kind: str,
        status: str,
        example: Callable[[], dict],
        *,
        hang: str | None = None,
        error: str | None = None,
        group: str = "",
        seconds: float = 0.0,
    ) -> None:
        """Count one input; ``example()`` describes it when it is shown.

        ``seconds`` it took are added up by ``group`` (a method or a route).
        """
        with self._lock:
            self.inputs += 1
            if group:
                spent = self.time_by_group[group]
                spent[0] += 1
                spent[1] += seconds
            self.kinds[kind] += 1
            self.statuses[status] += 1
            self._recent.append(example)
            if hang is not None:
                self.hangs += 1
                if len(self.hang_examples) < MAX_EXAMPLES:
                    self.hang_examples.append({"reason": hang, "kind": kind, **example()})
            if error is not None:
                self.errors += 1
                if len(self.error_examples) < MAX_EXAMPLES:
                    self.error_examples.append(
                        {"error": error, "kind": kind, "status": status, **example()}
                    )

    def guard(self, n: int = 1) -> None:
        """Count inputs replaced because they would have changed real state."""
        with self._lock:
            self.guarded += n

    def probe_hang(self, probe: str, reason: str) -> None:
        """A health probe did not answer in time: a hang, shown with the latest inputs."""
        with self._lock:
            self.hangs += 1
            if len(self.hang_examples) < MAX_EXAMPLES:
                recent = [make() for make in list(self._recent)[-4:]]
                self.hang_examples.append(
                    {"reason": f"probe {probe}: {reason}", "latest_inputs": recent}
                )

    def crash(self, name: str, code: int | None, log_tail: str) -> None:
        """A server process exited: kept with its log's tail and the latest inputs."""
        with self._lock:
            recent = [make() for make in list(self._recent)]
            self.crashes.append(
                {"process": name, "exit_code": code, "log_tail": log_tail, "latest_inputs": recent}
            )

    def fuzzer_error(self, text: str) -> None:
        with self._lock:
            self.fuzzer_errors.append(text[-4000:])


# ============================================================================ the cluster


@dataclass
class Proc:
    """One server process of the cluster under test."""

    name: str
    service: Service

    @property
    def pid(self) -> int:
        return self.service.proc.pid if self.service.proc is not None else 0

    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.service.proc.poll() if self.service.proc is not None else -1

    def cpu(self) -> float:
        """CPU seconds (user and system) so far, from ``/proc/PID/stat`` (0 when it is gone)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        except (OSError, ValueError, IndexError):
            return 0.0

    def rss(self) -> int:
        """Resident bytes, from ``/proc/PID/statm`` (0 when it is gone)."""
        try:
            return int(Path(f"/proc/{self.pid}/statm").read_text().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            return 0


@dataclass
class Env:
    """The cluster under test and what the fuzzers need to know of it."""

    cluster: LocalCluster
    keys: ClusterKeys
    token: str
    procs: list[Proc]
    routing: common_pb2.RoutingInfo
    check_inode: int
    check_chunks: int
    protected: frozenset[int]
    scratch_inodes: list[int] = field(default_factory=list)
    check_cache: int = 0  # the cache id (directory inode) of :data:`CHECK_CACHE`
    scratch_cache: int = 0

    @property
    def storage_count(self) -> int:
        return len(self.cluster.storage)

    def data_address(self, i: int) -> tuple[str, int]:
        host, port = self.cluster.storage_address(i).rsplit(":", 1)
        return host, int(port)

    def server_of_target(self, target_id: int) -> int | None:
        """The index of the storage server that holds ``target_id``."""
        for t in self.routing.targets:
            if t.target_id == target_id:
                for i in range(self.storage_count):
                    if t.data_address == self.cluster.storage_address(i):
                        return i
        return None

    def targets_of(self, i: int) -> list[int]:
        address = self.cluster.storage_address(i)
        return [t.target_id for t in self.routing.targets if t.data_address == address]

    def rss(self) -> dict[str, int]:
        return {p.name: p.rss() for p in self.procs}

    def cpu(self) -> dict[str, float]:
        """CPU seconds of every server process, and of this one (``fuzzer``)."""
        times = os.times()
        return {"fuzzer": times.user + times.system} | {p.name: p.cpu() for p in self.procs}


def meta_stub(cluster: LocalCluster, token: str) -> tuple[grpc.Channel, Any]:
    """A channel to the metaserver whose calls carry ``token``, and its MetaService stub."""
    channel = grpcauth.channel(cluster.meta_address, token=token)
    return channel, meta_pb2_grpc.MetaServiceStub(channel)


def write_check_file(cluster: LocalCluster, token: str, data: bytes) -> None:
    """Write :data:`CHECK_PATH` with ``data`` through the client."""
    from emberfs.client.fs import EmberFileSystem

    fs = EmberFileSystem(cluster.meta_address, token=token, skip_instance_cache=True)
    try:
        fs.mkdir(CHECK_DIR)
        with fs.open(CHECK_PATH, "wb") as f:
            f.write(data)
    finally:
        fs.close()


def read_check_file(cluster: LocalCluster, token: str) -> bytes:
    """Read :data:`CHECK_PATH` back through a fresh client."""
    from emberfs.client.fs import EmberFileSystem

    fs = EmberFileSystem(cluster.meta_address, token=token, skip_instance_cache=True)
    try:
        return fs.cat_file(CHECK_PATH)
    finally:
        fs.close()


def replica_snapshot(env: Env) -> list[tuple]:
    """Every replica of the check file's chunks: (target, index, version, length, checksum, ...)."""
    rows = []
    for i in range(env.storage_count):
        channel = grpcauth.channel(env.cluster.storage_grpc_address(i), keys=env.keys)
        with channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            for target in env.targets_of(i):
                req = storage_pb2.ListChunksRequest(target_id=target, inode=env.check_inode)
                for c in stub.ListChunks(req, timeout=CALL_TIMEOUT).chunks:
                    rows.append(
                        (
                            target,
                            c.index,
                            c.version,
                            c.pending_version,
                            c.length,
                            c.checksum,
                            c.damaged,
                        )
                    )
    return sorted(rows)


def chunk_counts(env: Env) -> dict[str, int]:
    """Chunks (committed or pending) on each storage server, from TargetStats."""
    out = {}
    for i in range(env.storage_count):
        channel = grpcauth.channel(env.cluster.storage_grpc_address(i), keys=env.keys)
        with channel:
            stub = storage_pb2_grpc.StorageServiceStub(channel)
            stats = stub.TargetStats(storage_pb2.TargetStatsRequest(), timeout=CALL_TIMEOUT)
        out[f"storage-{i}"] = sum(t.chunks for t in stats.targets)
    return out


def make_scratch(stub: Any) -> list[int]:
    """``/fuzz-scratch`` with a few files, directories and a symlink; their inodes."""
    inodes = [
        stub.Mkdir(meta_pb2.MkdirRequest(path=SCRATCH_DIR, mode=0o777), timeout=30).attr.inode
    ]
    for name in ("a", "b", "c"):
        req = meta_pb2.CreateRequest(path=f"{SCRATCH_DIR}/{name}", mode=0o644)
        inodes.append(stub.Create(req, timeout=30).attr.inode)
    for name in ("d", "d/e"):
        req = meta_pb2.MkdirRequest(path=f"{SCRATCH_DIR}/{name}", mode=0o755)
        inodes.append(stub.Mkdir(req, timeout=30).attr.inode)
    req = meta_pb2.SymlinkRequest(path=f"{SCRATCH_DIR}/s", target="d")
    inodes.append(stub.Symlink(req, timeout=30).attr.inode)
    return inodes


def make_caches(cluster: LocalCluster, token: str, block: bytes) -> tuple[Any, Any]:
    """:data:`CHECK_CACHE` holding ``block`` under :data:`CHECK_KEY`, and :data:`SCRATCH_CACHE`."""
    from emberfs.client.fs import EmberFileSystem
    from emberfs.kvcache import KVCache

    fs = EmberFileSystem(cluster.meta_address, token=token, skip_instance_cache=True)
    try:
        made = []
        for path in (CHECK_CACHE, SCRATCH_CACHE):
            made.append(
                KVCache.create(path, block_size=KV_BLOCK, capacity=64 * KV_BLOCK, mode=0o777, fs=fs)
            )
        made[0].put(CHECK_KEY, block)
        made[1].batch_put([b"a", b"b", b"c"], [block[:100], block[:1], block])
        return made[0].info, made[1].info
    finally:
        fs.close()


def read_check_block(cluster: LocalCluster, token: str) -> bytes | None:
    """The block of :data:`CHECK_KEY` in :data:`CHECK_CACHE`, through a fresh client."""
    from emberfs.client.fs import EmberFileSystem
    from emberfs.kvcache import KVCache

    fs = EmberFileSystem(cluster.meta_address, token=token, skip_instance_cache=True)
    try:
        got = KVCache(CHECK_CACHE, fs=fs).get(CHECK_KEY)
        return None if got is None else bytes(got)
    finally:
        fs.close()


def prepare(cluster: LocalCluster, seed: int) -> tuple[Env, bytes]:
    """The :class:`Env` of a started cluster, with the check file written; and its content."""
    token = cluster.admin_token or ""
    content = random.Random(seed).randbytes(CHECK_SIZE)
    write_check_file(cluster, token, content)
    channel, stub = meta_stub(cluster, token)
    with channel:
        root = stub.Stat(meta_pb2.StatRequest(path="/"), timeout=30).attr.inode
        folder = stub.Stat(meta_pb2.StatRequest(path=CHECK_DIR), timeout=30).attr.inode
        attr = stub.Stat(meta_pb2.StatRequest(path=CHECK_PATH), timeout=30).attr
        scratch = make_scratch(stub)
    check_cache, scratch_cache = make_caches(cluster, token, content[:KV_BLOCK])
    chunk = attr.layout.chunk_size or 4 * MiB
    procs = [Proc("metaserver", cluster.meta)]
    procs += [Proc(f"storage-{i}", s) for i, s in enumerate(cluster.storage)]
    env = Env(
        cluster=cluster,
        keys=cluster.keys,
        token=token,
        procs=procs,
        routing=cluster.routing(),
        check_inode=attr.inode,
        check_chunks=-(-attr.size // chunk),
        # the check cache's directory (its cache id) and slab files are left alone too
        protected=frozenset(
            {root, folder, attr.inode, check_cache.cache_id, *(s.inode for s in check_cache.slabs)}
        ),
        scratch_inodes=scratch + [scratch_cache.cache_id, *(s.inode for s in scratch_cache.slabs)],
        check_cache=check_cache.cache_id,
        scratch_cache=scratch_cache.cache_id,
    )
    return env, content


# ============================================================================ probes


class RawSection:
    """An auth section of given bytes (malformed credentials)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.length = len(raw)

    def section(self, body: bytes, meta: bytes, table: bytes) -> bytes:
        return self.raw


class Prober:
    """Asks every server a question it must answer within :data:`PROBE_TIMEOUT` seconds."""

    def __init__(self, env: Env) -> None:
        self.env = env
        cluster = env.cluster
        self._meta = grpcauth.channel(cluster.meta_address, token=env.token)
        self._storage = [
            grpcauth.channel(cluster.storage_grpc_address(i), keys=env.keys)
            for i in range(env.storage_count)
        ]

    def close(self) -> None:
        self._meta.close()
        for channel in self._storage:
            channel.close()

    def probes(self) -> list[tuple[str, str, Callable[[], None]]]:
        """(probe, process it asks, the question) for every server."""
        out: list[tuple[str, str, Callable[[], None]]] = []
        for i in range(self.env.storage_count):
            out.append((f"data PING storage-{i}", f"storage-{i}", lambda i=i: self._ping(i)))
            out.append(
                (f"TargetStats storage-{i}", f"storage-{i}", lambda i=i: self._target_stats(i))
            )
        out.append(("gRPC Ping", "metaserver", self._meta_ping))
        out.append(("GetRouting", "metaserver", self._routing))
        out.append(("GET /healthz", "metaserver", self._healthz))
        return out

    def _ping(self, i: int) -> None:
        frame = FrameParts(Op.PING, cred=self.env.keys.server_credential()).encode()
        deadline = time.monotonic() + PROBE_TIMEOUT
        with socket.create_connection(self.env.data_address(i), timeout=PROBE_TIMEOUT) as sock:
            sock.sendall(frame)
            header, _, _ = framing.recv_head(sock, deadline)
        if header.status != Status.OK:
            raise RuntimeError(f"PING answered {framing.status_name(header.status)}")

    def _target_stats(self, i: int) -> None:
        stub = storage_pb2_grpc.StorageServiceStub(self._storage[i])
        stub.TargetStats(storage_pb2.TargetStatsRequest(), timeout=PROBE_TIMEOUT)

    def _meta_ping(self) -> None:
        meta_pb2_grpc.MetaServiceStub(self._meta).Ping(
            meta_pb2.PingRequest(), timeout=PROBE_TIMEOUT
        )

    def _routing(self) -> None:
        cluster_pb2_grpc.ClusterServiceStub(self._meta).GetRouting(
            cluster_pb2.GetRoutingRequest(), timeout=PROBE_TIMEOUT
        )

    def _healthz(self) -> None:
        host, port = self.env.cluster.admin_address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=PROBE_TIMEOUT)
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"/healthz answered {resp.status}")
        finally:
            conn.close()


class Monitor:
    """While a surface runs: a crash (a server process exited) and a probe not answered in time.

    A crash stops the surface (``stop`` is set); a hang is counted and the run goes on.
    """

    def __init__(
        self,
        env: Env,
        prober: Prober,
        tally: Tally,
        stop: threading.Event,
        progress: float | None = None,
    ) -> None:
        self.env = env
        self.prober = prober
        self.tally = tally
        self.stop = stop
        self.progress = progress  # seconds between progress lines on stderr (None: none)
        self._started = time.monotonic()
        self._shown = self._started
        self._done = threading.Event()
        self._dead: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="fuzz-monitor", daemon=True)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def finish(self) -> None:
        """Stop watching, after one last round of every probe."""
        self._done.set()
        self._thread.join()
        self.check()

    def _loop(self) -> None:
        while not self._done.wait(PROBE_INTERVAL):
            self.check()
            now = time.monotonic()
            if self.progress is not None and now - self._shown >= self.progress:
                self._shown = now
                t = self.tally
                rate = t.inputs / (now - self._started)
                print(
                    f"fuzz: {t.surface}: {t.inputs} inputs ({rate:.0f}/s), {len(t.crashes)} "
                    f"crashes, {t.hangs} hangs, {t.errors} server errors",
                    file=sys.stderr,
                    flush=True,
                )

    def check(self) -> None:
        """One round: has a process exited, does every live server answer its probes in time."""
        for proc in self.env.procs:
            code = proc.exit_code()
            if code is not None and proc.name not in self._dead:
                self._dead.add(proc.name)
                self.tally.crash(proc.name, code, proc.service.tail(60))
                self.stop.set()
        for name, owner, probe in self.prober.probes():
            if owner in self._dead:
                continue
            started = time.monotonic()
            try:
                probe()
            except Exception as exc:  # noqa: BLE001 - any failure of a probe is reported
                took = time.monotonic() - started
                self.tally.probe_hang(name, f"{type(exc).__name__}: {exc} after {took:.1f} s")


# ============================================================================ data: frames

BODY = struct.Struct("<IBBHIIIHH")  # a header before its CRC
FIELDS = ("magic", "version", "op", "status", "meta_len", "data_len", "block_size", "auth_len")
FIELDS += ("reserved",)
WIDTH = dict(zip(FIELDS, (U32, 0xFF, 0xFF, U16, U32, U32, U32, U16, U16), strict=True))
LIMIT = {
    "meta_len": framing.MAX_META,
    "data_len": framing.MAX_DATA,
    "auth_len": framing.MAX_AUTH,
    "block_size": framing.MAX_DATA,
}
REQUESTS = {
    Op.READ: data_pb2.ChunkReadRequest,
    Op.WRITE: data_pb2.ChunkWriteRequest,
    Op.TRUNCATE: data_pb2.ChunkTruncateRequest,
    Op.WRITE_BATCH: data_pb2.ChunkWriteBatch,
}


@dataclass
class FrameParts:
    """What a request frame is made of; ``lies`` are header fields that say otherwise (signed)."""

    op: int
    meta: bytes = b""
    data: bytes = b""
    cred: Any = None
    block_size: int = framing.DEFAULT_BLOCK
    lies: dict[str, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The frame's bytes, its credential signing the header as it is (lies included)."""
        table = b""
        if self.data:
            crcs = framing.block_crcs(self.data, self.block_size)
            table = struct.pack(f"<{len(crcs)}I", *crcs)
        values = {
            "magic": framing.MAGIC,
            "version": framing.VERSION,
            "op": self.op,
            "status": 0,
            "meta_len": len(self.meta),
            "data_len": len(self.data),
            "block_size": self.block_size if self.data else 0,
            "auth_len": self.cred.length if self.cred is not None else 0,
            "reserved": 0,
        }
        values.update(self.lies)
        body = BODY.pack(*(values[f] & WIDTH[f] for f in FIELDS))
        auth = self.cred.section(body, self.meta, table) if self.cred is not None else b""
        return body + struct.pack("<I", crc32c.crc32c(body)) + auth + self.meta + table + self.data


def patch_header(frame: bytes, **fields: int) -> bytes:
    """``frame`` with header ``fields`` changed and its header CRC made right again."""
    values = dict(zip(FIELDS, BODY.unpack_from(frame), strict=True))
    values.update(fields)
    body = BODY.pack(*(values[f] & WIDTH[f] for f in FIELDS))
    return body + struct.pack("<I", crc32c.crc32c(body)) + frame[framing.HEADER_SIZE :]


def server_views(payload: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """(op, auth section, meta section) of each frame a server would read from ``payload``."""
    pos = 0
    while len(payload) - pos >= framing.HEADER_SIZE:
        try:
            h = framing.unpack_header(payload[pos : pos + framing.HEADER_SIZE])
        except framing.FrameError:
            return
        start = pos + framing.HEADER_SIZE
        if start + h.auth_len + h.meta_len > len(payload):
            return
        auth = payload[start : start + h.auth_len]
        meta = payload[start + h.auth_len : start + h.auth_len + h.meta_len]
        yield h.op, auth, meta
        pos = start + h.auth_len + h.meta_len + 4 * h.n_blocks + h.data_len


def changes_real_chunks(payload: bytes) -> bool:
    """Whether a frame of ``payload`` with a server credential writes or cuts a real chunk."""
    for op, auth, meta in server_views(payload):
        if auth[:1] != bytes([SERVER]) or op not in (Op.WRITE, Op.TRUNCATE, Op.WRITE_BATCH):
            continue
        try:
            req = REQUESTS[Op(op)].FromString(meta)
        except DecodeError:
            continue
        if op == Op.WRITE_BATCH:
            inodes = [w.chunk.inode for w in req.writes]
        else:
            inodes = [req.chunk.inode if op == Op.WRITE else req.inode]
        if any(inode < SCRATCH_INODE for inode in inodes):
            return True
    return False


@dataclass
class DataInput:
    """One input of the data surface: bytes for one storage server."""

    kind: str
    server: int
    payload: bytes
    ragged: bool  # not exactly whole frames: the sender half-closes, the server must close
    has_data: bool = False

    def example(self) -> dict:
        return {"server": f"storage-{self.server}", "ragged": self.ragged, **hexcut(self.payload)}

    @property
    def op(self) -> int | None:
        for op, _, _ in server_views(self.payload):
            return op
        return None


def pick(rng: random.Random, weighted: dict[Any, float]) -> Any:
    """One key of ``weighted``, drawn by its weight."""
    return rng.choices(list(weighted), weights=list(weighted.values()))[0]


def u32(rng: random.Random) -> int:
    """A boundary u32 mostly, else a random one of 8, 16 or 32 bits."""
    if rng.random() < 0.6:
        return rng.choice((0, 1, 2, 4095, 4096, 65535, 65536, (1 << 31) - 1, 1 << 31, U32 - 1, U32))
    return rng.getrandbits(rng.choice((8, 16, 32)))


def u64(rng: random.Random) -> int:
    """A boundary u64 mostly, else a random one of 8 to 64 bits."""
    if rng.random() < 0.6:
        return rng.choice((0, 1, 2, U32, U32 + 1, I64_MAX, 1 << 63, U64 - 1, U64))
    return rng.getrandbits(rng.choice((8, 20, 40, 64)))


def text(rng: random.Random, n: int | None = None) -> str:
    """A string of printable, non-ASCII and control characters (valid UTF-8)."""
    n = rng.choice((0, 1, 5, 16, 64, 255, 256, 1000)) if n is None else n
    pools = (
        string.ascii_letters + string.digits,
        string.printable,
        "é日本語😀\u202e\u200b\ufeff\u0301",
        "\x00\x01\x7f\n\r\t",
    )
    return "".join(rng.choices(rng.choice(pools), k=n))


VALID_CHUNK_SIZES = (64 * 1024, 1 * MiB, 4 * MiB, 64 * MiB)
BAD_CHUNK_SIZES = (0, 1, 4096, 65535, 3 * MiB, 128 * MiB, U32)
OFFSETS = (0, 0, 0, 1, 4095, 4096, 65535, 65536, MiB, 4 * MiB - 1, 4 * MiB, 64 * MiB, U32)
LENGTHS = (0, 1, 100, 4096, 4096, 65536, 65537, MiB, 4 * MiB, 64 * MiB, 64 * MiB + 1, U32)


class DataInputs:
    """Makes the data surface's inputs for one thread.

    Parameters
    ----------
    env : Env
    rng : random.Random
    tally : Tally
        Counts the inputs replaced because they would change real chunks.
    """

    def __init__(self, env: Env, rng: random.Random, tally: Tally) -> None:
        self.env = env
        self.rng = rng
        self.tally = tally
        self.chains = [(c.chain_id, c.version, list(c.targets)) for c in env.routing.chains]
        self.targets = [t.target_id for t in env.routing.targets]
        self.server_cred = env.keys.server_credential()

    # ---------------------------------------------------------------- the input

    def next(self) -> DataInput:
        """The next input (never one whose server credential writes a real chunk)."""
        while True:
            item = self._make()
            if not changes_real_chunks(item.payload):
                return item
            self.tally.guard()

    def _make(self) -> DataInput:
        rng = self.rng
        kind = pick(rng, {"random": 0.04, "random_header": 0.05, "valid": 0.46, "mutated": 0.45})
        if kind == "random":
            return DataInput("random", self._server(), rng.randbytes(rng.randrange(1, 200)), True)
        if kind == "random_header":
            return self._random_header()
        parts, server = self.frame()
        if kind == "valid":
            return DataInput(
                f"valid_{self._label(parts)}", server, parts.encode(), False, bool(parts.data)
            )
        payload, ragged, name = self._mutate(parts)
        return DataInput(f"mutated_{name}", server, payload, ragged, bool(parts.data))

    def _label(self, parts: FrameParts) -> str:
        try:
            return Op(parts.op).name.lower()
        except ValueError:
            return "unknown_op"

    def _server(self) -> int:
        return self.rng.randrange(self.env.storage_count)

    def _random_header(self) -> DataInput:
        rng = self.rng
        values = (
            [framing.MAGIC, framing.VERSION]
            + [rng.getrandbits(8)]
            + [
                rng.getrandbits(16),
                rng.choice((0, rng.getrandbits(8), rng.getrandbits(32))),
                rng.choice((0, rng.getrandbits(12), rng.getrandbits(32))),
                rng.choice((0, framing.MIN_BLOCK, rng.getrandbits(32))),
                rng.choice((0, 25, rng.getrandbits(16))),
                rng.getrandbits(16),
            ]
        )
        body = BODY.pack(*values)
        raw = body + struct.pack("<I", crc32c.crc32c(body)) + rng.randbytes(rng.randrange(0, 300))
        return DataInput("random_header", self._server(), raw, True)

    # ---------------------------------------------------------------- a frame

    def frame(self) -> tuple[FrameParts, int]:
        """A whole frame with lying contents, and the server it goes to."""
        rng = self.rng
        op = pick(
            rng,
            {
                Op.READ: 0.32,
                Op.WRITE: 0.26,
                Op.WRITE_BATCH: 0.08,
                Op.TRUNCATE: 0.12,
                Op.PING: 0.12,
                0: 0.1,
            },
        )
        if op == 0:
            op = rng.choice((0, 6, 7, 64, 127, 255, rng.randrange(8, 128)))
        credential = pick(rng, {"none": 0.12, "capability": 0.38, "server": 0.38, "bad": 0.12})
        server_cred = credential == "server"
        chain_id, version, members = rng.choice(self.chains)
        target = self._target(members)
        writes = op in (Op.WRITE, Op.WRITE_BATCH)
        data = self._data() if writes or rng.random() < 0.03 else b""
        if op == Op.WRITE_BATCH and rng.random() < 0.9:
            meta, inode = self._batch(chain_id, version, target, server_cred, len(data), credential)
        else:
            meta, inode = self._meta(op, chain_id, version, target, server_cred)
        cred = self._credential(credential, inode, op)
        block = pick(rng, {framing.DEFAULT_BLOCK: 0.7, framing.MIN_BLOCK: 0.2, MiB: 0.1})
        at = self.env.server_of_target(target)
        server = at if at is not None and rng.random() < 0.85 else self._server()
        return FrameParts(op, meta, data, cred, block), server

    def _batch(
        self,
        chain_id: int,
        version: int,
        target: int,
        server_cred: bool,
        data_len: int,
        credential: str,
    ) -> tuple[bytes, int]:
        """A write batch's meta (lengths mostly adding up to ``data_len``) and its first inode."""
        rng = self.rng
        n = pick(rng, {1: 0.2, rng.randrange(2, 5): 0.6, rng.randrange(5, 40): 0.15, 300: 0.05})
        chain_version = self._chain_version(version)
        batch = data_pb2.ChunkWriteBatch()
        for _ in range(n):
            inode = self._inode(server_cred, Op.WRITE)
            batch.writes.append(self._write(chain_id, chain_version, target, inode))
        cuts = sorted(rng.randrange(data_len + 1) for _ in range(n - 1))
        lengths = [b - a for a, b in zip([0, *cuts], [*cuts, data_len], strict=True)]
        if rng.random() < 0.1:
            lengths = [rng.choice((0, 1, data_len, U32)) for _ in range(rng.randrange(n + 2))]
        batch.lengths.extend(lengths)
        if credential == "capability":
            for write in batch.writes:
                inode = write.chunk.inode
                if rng.random() < 0.1:
                    inode ^= 1
                # only chunks of scratch inodes may be written with a capability
                write = inode >= SCRATCH_INODE
                batch.capabilities.append(
                    self.env.keys.sign_capability(inode, read=True, write=write, ttl=600.0)
                )
        return batch.SerializeToString(), batch.writes[0].chunk.inode

    def _target(self, members: list[int]) -> int:
        rng = self.rng
        r = rng.random()
        if r < 0.55:
            return members[0]
        if r < 0.8:
            return rng.choice(members)
        if r < 0.9:
            return rng.choice(self.targets)
        return u32(rng)

    def _chain_version(self, version: int) -> int:
        rng = self.rng
        return pick(
            rng,
            {version: 0.65, 0: 0.15, version + 1: 0.05, max(0, version - 1): 0.05, u64(rng): 0.1},
        )

    def _inode(self, server_cred: bool, op: int) -> int:
        rng = self.rng
        if server_cred and op in (Op.WRITE, Op.TRUNCATE, Op.WRITE_BATCH):
            return self._scratch_inode()
        r = rng.random()
        if r < 0.35:
            return self.env.check_inode
        if r < 0.75:
            return self._scratch_inode()
        return rng.choice((0, 1, 2, self.env.check_inode + 1, U64, 1 << 63, rng.getrandbits(64)))

    def _scratch_inode(self) -> int:
        rng = self.rng
        if rng.random() < 0.9:
            return SCRATCH_INODE + rng.randrange(64)
        return rng.choice((U64, 1 << 63, SCRATCH_INODE + rng.getrandbits(40)))

    def _index(self, inode: int) -> int:
        rng = self.rng
        if inode == self.env.check_inode and rng.random() < 0.7:
            return rng.randrange(self.env.check_chunks + 1)
        return rng.choice((0, 0, 0, 1, 2, 3, 1000, U32, rng.getrandbits(32)))

    def _meta(
        self, op: int, chain_id: int, version: int, target: int, server_cred: bool
    ) -> tuple[bytes, int]:
        """The meta section of ``op`` (sometimes another op's, or random bytes) and its inode."""
        rng = self.rng
        inode = self._inode(server_cred, op)
        if op == Op.PING or op not in REQUESTS:
            if rng.random() < 0.7:
                return b"", inode
            return rng.randbytes(rng.randrange(1, 64)), inode
        if rng.random() < 0.04:  # random bytes: most do not decode, some decode to anything
            return rng.randbytes(rng.randrange(1, 128)), inode
        if rng.random() < 0.02:
            return rng.randbytes(rng.choice((framing.MAX_META, framing.MAX_META - 1))), inode
        chain_id = chain_id if rng.random() < 0.85 else u32(rng)
        chain_version = self._chain_version(version)
        if op == Op.READ:
            msg = self._read(chain_id, chain_version, target, inode)
        elif op == Op.WRITE:
            msg = self._write(chain_id, chain_version, target, inode)
        else:
            msg = self._truncate(chain_id, chain_version, target, inode)
        return msg.SerializeToString(), inode

    def _read(self, chain_id: int, chain_version: int, target: int, inode: int) -> Message:
        rng = self.rng
        small = rng.random() < 0.8
        return data_pb2.ChunkReadRequest(
            chain_id=chain_id,
            target_id=target,
            chunk=data_pb2.ChunkId(inode=inode, index=self._index(inode)),
            offset=rng.choice(OFFSETS),
            length=rng.choice(LENGTHS[:6]) if small else rng.choice(LENGTHS),
            chain_version=chain_version,
        )

    def _write(self, chain_id: int, chain_version: int, target: int, inode: int) -> Message:
        rng = self.rng
        sync = rng.random() < 0.15
        return data_pb2.ChunkWriteRequest(
            chain_id=chain_id,
            chain_version=chain_version,
            target_id=target,
            chunk=data_pb2.ChunkId(inode=inode, index=self._index(inode)),
            offset=rng.choice(OFFSETS) if rng.random() < 0.5 else 0,
            chunk_size=rng.choice(VALID_CHUNK_SIZES if rng.random() < 0.8 else BAD_CHUNK_SIZES),
            client_id=self._client_id(),
            request_id=rng.getrandbits(rng.choice((8, 32, 64))),
            update_version=pick(rng, {0: 0.5, rng.randrange(1, 100): 0.2, u64(rng): 0.3}),
            full_chunk=rng.random() < 0.15,
            base_version=pick(rng, {0: 0.6, rng.randrange(1, 100): 0.2, u64(rng): 0.2}),
            sync=sync,
            replace=rng.random() < (0.5 if sync else 0.05),
        )

    def _truncate(self, chain_id: int, chain_version: int, target: int, inode: int) -> Message:
        rng = self.rng
        n = pick(rng, {0: 0.5, rng.randrange(1, 6): 0.45, rng.choice((500, 2000)): 0.05})
        steps = [
            data_pb2.TruncateStep(
                index=self._index(inode),
                length=rng.choice(OFFSETS),
                version=u64(rng),
                base_version=u64(rng),
            )
            for _ in range(n)
        ]
        return data_pb2.ChunkTruncateRequest(
            chain_id=chain_id,
            chain_version=chain_version,
            target_id=target,
            inode=inode,
            length=pick(rng, {0: 0.3, rng.randrange(1, 10 * MiB): 0.4, u64(rng): 0.3}),
            chunk_size=rng.choice(VALID_CHUNK_SIZES if rng.random() < 0.8 else BAD_CHUNK_SIZES),
            stripe=rng.choice((0, 1, 2, 4, 256, 257, U32)),
            stripe_position=rng.choice((0, 1, 2, 3, U32)),
            client_id=self._client_id(),
            request_id=rng.getrandbits(64),
            steps=steps,
        )

    def _client_id(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.2:
            return ""
        if r < 0.75:
            return f"fuzz-{rng.randrange(16)}"
        if r < 0.8:
            return "x" * rng.choice((1000, 20_000))
        return text(rng)

    def _data(self) -> bytes:
        rng = self.rng
        n = pick(
            rng,
            {
                0: 0.1,
                rng.randrange(1, 4097): 0.6,
                rng.randrange(4097, 65537): 0.25,
                rng.randrange(65537, MiB + 1): 0.05,
            },
        )
        return rng.randbytes(n)

    def _credential(self, kind: str, inode: int, op: int) -> Any:
        rng = self.rng
        keys = self.env.keys
        if kind == "none":
            return None
        if kind == "server":
            if rng.random() < 0.9:
                return self.server_cred
            return self.env.keys.server_credential(rng.choice((-(10**9), 10**9, -now_ms())))
        if kind == "capability":
            which = pick(rng, {"own": 0.7, "other": 0.1, "expired": 0.1, "forged": 0.1})
            cap_inode = inode if which != "other" else inode ^ rng.choice((1, 1 << 40))
            # only chunks of scratch inodes may be written with a capability
            write = cap_inode >= SCRATCH_INODE and rng.random() < 0.8
            ttl = -1.0 if which == "expired" else 600.0
            token = keys.sign_capability(cap_inode, read=rng.random() < 0.9, write=write, ttl=ttl)
            if which == "forged":
                token = token[:-MAC_SIZE] + rng.randbytes(MAC_SIZE)
            return RawSection(bytes([CAPABILITY]) + token)
        return RawSection(self._bad_section())

    def _bad_section(self) -> bytes:
        rng = self.rng
        return pick(
            rng,
            {
                b"": 0.1,
                bytes([SERVER]): 0.1,
                bytes([SERVER]) + rng.randbytes(SERVER_SECTION_SIZE - 1): 0.2,
                bytes([SERVER]) + rng.randbytes(rng.randrange(1, 60)): 0.1,
                bytes([CAPABILITY]) + rng.randbytes(rng.randrange(0, 40)): 0.2,
                bytes([rng.choice((0, 3, 255))]) + rng.randbytes(rng.randrange(0, 30)): 0.1,
                rng.randbytes(rng.choice((framing.MAX_AUTH, framing.MAX_AUTH + 1))): 0.1,
                rng.randbytes(rng.randrange(1, 100)): 0.1,
            },
        )

    # ---------------------------------------------------------------- mutations

    def _mutate(self, parts: FrameParts) -> tuple[bytes, bool, str]:
        """A mutation of ``parts``: (bytes, whether ragged, the mutation's name)."""
        rng = self.rng
        name = rng.choice(
            (
                "flip",
                "flip_body",
                "truncate",
                "extend",
                "double",
                "lie",
                "lie_signed",
                "header_crc",
                "version",
                "magic",
                "op",
                "response_op",
                "status",
                "reserved",
            )
        )
        frame = parts.encode()
        if name in ("flip", "flip_body"):
            start = 0 if name == "flip" else framing.HEADER_SIZE
            return self._flip(frame, start), False, name
        if name == "truncate":
            return frame[: rng.randrange(1, len(frame))], True, name
        if name == "extend":
            return frame + rng.randbytes(rng.randrange(1, 64)), True, name
        if name == "double":
            other, _ = self.frame()
            return frame + other.encode(), True, name
        if name in ("lie", "lie_signed"):
            lie = rng.choice(("meta_len", "data_len", "auth_len", "block_size"))
            value = self._lie(lie, BODY.unpack_from(frame)[FIELDS.index(lie)])
            if name == "lie":
                return patch_header(frame, **{lie: value}), True, f"{name}_{lie}"
            parts.lies = {lie: value}
            return parts.encode(), True, f"{name}_{lie}"
        if name == "header_crc":
            crc = bytes(b ^ rng.randrange(1, 256) for b in frame[24:28])
            return frame[:24] + crc + frame[28:], False, name
        fields = {
            "version": {"version": rng.choice((0, 1, 3, 255))},
            "magic": {"magic": rng.getrandbits(32) | 1},
            "op": {"op": rng.choice((0, 5, 9, 100, 127))},
            "response_op": {"op": parts.op | framing.RESPONSE},
            "status": {"status": rng.randrange(1, U16 + 1)},
            "reserved": {"reserved": rng.randrange(1, U16 + 1)},
        }[name]
        if rng.random() < 0.5:
            return patch_header(frame, **fields), False, name
        parts.lies = fields
        return parts.encode(), False, f"{name}_signed"

    def _flip(self, frame: bytes, start: int) -> bytes:
        rng = self.rng
        if len(frame) <= start:
            start = 0
        out = bytearray(frame)
        for _ in range(rng.randrange(1, 9)):
            pos = rng.randrange(start, len(out))
            out[pos] ^= 1 << rng.randrange(8)
        return bytes(out)

    def _lie(self, name: str, true: int) -> int:
        rng = self.rng
        if rng.random() < 0.6:
            return max(0, true + rng.choice((-16, -4, -1, 1, 2, 4, 16, 100))) & WIDTH[name]
        limit = LIMIT[name]
        return (
            rng.choice((0, 1, limit, limit + 1, 1 << 31, WIDTH[name], framing.MIN_BLOCK - 1))
            & (WIDTH[name])
        )


# ============================================================================ data: sending


class DataLinks:
    """One thread's connections to the data ports, kept while the servers keep them."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self._socks: dict[int, socket.socket] = {}

    def get(self, i: int) -> socket.socket:
        sock = self._socks.get(i)
        if sock is not None and not _still_open(sock):
            self.drop(i)
            sock = None
        if sock is None:
            sock = socket.create_connection(self.env.data_address(i), timeout=ANSWER_TIMEOUT)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks[i] = sock
        return sock

    def drop(self, i: int) -> None:
        sock = self._socks.pop(i, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for i in list(self._socks):
            self.drop(i)


def _still_open(sock: socket.socket) -> bool:
    """False when the peer has closed (or reset) an idle connection."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return True
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


@dataclass
class Outcome:
    """What an input met: its status label, and a hang or a server error when there was one."""

    status: str
    hang: str | None = None
    error: str | None = None


def read_answer(sock: socket.socket, deadline: float, op: int | None) -> tuple[Outcome, bool]:
    """The answer to one whole frame (or the server closing); whether the connection lives on."""
    try:
        header, meta, crcs = framing.recv_head(sock, deadline)
    except TimeoutError:
        return Outcome(
            "no answer", hang=f"neither answered nor closed in {ANSWER_TIMEOUT} s"
        ), False
    except framing.FrameError as exc:
        if "after 0 of" in str(exc):
            return Outcome("closed"), False
        return Outcome("bad answer", error=f"malformed answer: {exc}"), False
    except OSError:
        return Outcome("closed"), False
    status = framing.status_name(header.status)
    if op is not None and header.op != op | framing.RESPONSE:
        return Outcome(status, error=f"answer op {header.op:#x} to op {op}"), False
    try:
        if header.data_len:
            data = framing.recv_exact(sock, header.data_len, deadline)
            framing.verify(data, crcs, header.block_size)
        if header.status == Status.OK and op == Op.READ:
            data_pb2.ChunkReadResponse.FromString(meta)
        elif header.status != Status.OK:
            data_pb2.ErrorResponse.FromString(meta)
    except TimeoutError:
        return Outcome(status, hang="the answer's data did not arrive in time"), False
    except (framing.FrameError, DecodeError) as exc:
        return Outcome(status, error=f"malformed answer: {type(exc).__name__}: {exc}"), False
    except OSError:
        return Outcome(status), False
    error = "the server answered INTERNAL" if header.status == Status.INTERNAL else None
    return Outcome(status, error=error), header.status not in (Status.DENIED, Status.BUSY)


def drain(sock: socket.socket, deadline: float) -> Outcome:
    """Read until the server closes; the first answer's status (``closed`` when none)."""
    got = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return Outcome(_first_status(got), hang=f"did not close in {ANSWER_TIMEOUT} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        if len(got) < framing.HEADER_SIZE:
            got += chunk
    status = _first_status(got)
    return Outcome(status, error="the server answered INTERNAL" if status == "INTERNAL" else None)


def _first_status(got: bytes) -> str:
    if len(got) < framing.HEADER_SIZE:
        return "closed"
    try:
        return framing.status_name(framing.unpack_header(bytes(got[: framing.HEADER_SIZE])).status)
    except framing.FrameError as exc:
        return f"bad answer ({exc})"


def send_data_input(links: DataLinks, item: DataInput) -> Outcome:
    """Send one input and wait for its answer, or for the server to close."""
    try:
        sock = links.get(item.server)
    except OSError as exc:
        return Outcome("connect failed", hang=f"cannot connect: {exc}")
    deadline = time.monotonic() + ANSWER_TIMEOUT
    try:
        sock.settimeout(ANSWER_TIMEOUT)
        sock.sendall(item.payload)
        if item.ragged:
            sock.shutdown(socket.SHUT_WR)
    except TimeoutError:
        links.drop(item.server)
        return Outcome("send blocked", hang=f"the server took no bytes for {ANSWER_TIMEOUT} s")
    except OSError:
        links.drop(item.server)
        return Outcome("closed")
    if item.ragged:
        outcome = drain(sock, deadline)
        links.drop(item.server)
        return outcome
    outcome, keep = read_answer(sock, deadline, item.op)
    if not keep or (item.has_data and outcome.status != "OK"):
        links.drop(item.server)
    return outcome


def data_worker(
    env: Env, tally: Tally, rng: random.Random, count: int, stop: threading.Event
) -> None:
    gen = DataInputs(env, rng, tally)
    links = DataLinks(env)
    try:
        for _ in range(count):
            if stop.is_set():
                return
            item = gen.next()
            started = time.perf_counter()
            outcome = send_data_input(links, item)
            tally.record(
                item.kind,
                outcome.status,
                item.example,
                hang=outcome.hang,
                error=outcome.error,
                group=item.kind,
                seconds=time.perf_counter() - started,
            )
    finally:
        links.close()


# ---------------------------------------------------------------- data: stalls


@dataclass
class Stall:
    """A frame that stops half-sent (or trickles): the server must drop it in time."""

    kind: str
    server: int
    payload: bytes  # sent at once (a stall) or one byte a tick (a trickle)
    sock: socket.socket | None = None
    sent: int = 0
    started: float = 0.0
    closed_after: float | None = None

    def example(self) -> dict:
        out = {"server": f"storage-{self.server}", **hexcut(self.payload)}
        if self.closed_after is not None:
            out["closed_after_s"] = round(self.closed_after, 2)
        return out


def make_stall(gen: DataInputs, rng: random.Random) -> Stall:
    parts, server = gen.frame()
    kind = rng.choice(("stall_header", "stall_body", "trickle", "stall_data"))
    if kind == "stall_data":  # an admitted server write whose data stops half-way
        parts = FrameParts(
            Op.WRITE,
            data_pb2.ChunkWriteRequest(
                chain_id=gen.chains[0][0],
                target_id=gen.chains[0][2][0],
                chunk=data_pb2.ChunkId(inode=SCRATCH_INODE, index=0),
                chunk_size=4 * MiB,
                client_id="fuzz-stall",
            ).SerializeToString(),
            rng.randbytes(65536),
            gen.server_cred,
        )
        server = gen.env.server_of_target(gen.chains[0][2][0]) or 0
    frame = parts.encode()
    if len(frame) <= framing.HEADER_SIZE + 1:
        kind = "stall_header"  # nothing after the header to stop in
    if kind == "stall_header":
        payload = frame[: rng.randrange(1, framing.HEADER_SIZE)]
    elif kind in ("stall_body", "stall_data"):
        payload = frame[: rng.randrange(framing.HEADER_SIZE, len(frame))]
    else:
        payload = frame if len(frame) > framing.HEADER_SIZE else frame + bytes(64)
    return Stall(kind, server, payload)


def run_stalls(
    env: Env, tally: Tally, rng: random.Random, count: int, stop: threading.Event
) -> None:
    """``count`` stalled frames, 8 at a time; each must be dropped within the frame timeout."""
    gen = DataInputs(env, rng, tally)
    done = 0
    while done < count and not stop.is_set():
        batch = [make_stall(gen, rng) for _ in range(min(8, count - done))]
        _stall_batch(env, batch)
        for s in batch:
            limit = FRAME_TIMEOUT + STALL_SLACK
            if s.closed_after is None:
                tally.record(s.kind, "connect failed", s.example, hang="could not connect")
            elif s.closed_after > limit:
                hang = f"dropped after {s.closed_after:.1f} s, not within {limit:.0f} s"
                tally.record(s.kind, "dropped late", s.example, hang=hang)
            else:
                tally.record(s.kind, "dropped", s.example)
        done += len(batch)


def _stall_batch(env: Env, batch: list[Stall]) -> None:
    """Send each stall's bytes (a trickle one byte every 0.25 s) until its server closes."""
    for s in batch:
        try:
            s.sock = socket.create_connection(env.data_address(s.server), timeout=ANSWER_TIMEOUT)
        except OSError:
            continue
        s.started = time.monotonic()
        if s.kind != "trickle":
            try:
                s.sock.sendall(s.payload)
            except OSError:
                pass
            s.sent = len(s.payload)
    give_up = time.monotonic() + FRAME_TIMEOUT + 3 * STALL_SLACK
    live = [s for s in batch if s.sock is not None]
    while live and time.monotonic() < give_up:
        readable, _, _ = select.select([s.sock for s in live], [], [], 0.25)
        for s in list(live):
            if s.sock in readable and _closed_by_peer(s.sock):
                s.closed_after = time.monotonic() - s.started
            elif s.kind == "trickle" and s.sent < len(s.payload):
                try:
                    s.sock.send(s.payload[s.sent : s.sent + 1])
                    s.sent += 1
                except OSError:
                    s.closed_after = time.monotonic() - s.started
            if s.closed_after is not None:
                s.sock.close()
                live.remove(s)
    for s in live:
        s.closed_after = time.monotonic() - s.started
        s.sock.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Read what the peer sent (a refusal, say) without waiting; True once it has closed."""
    while True:
        try:
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                return True
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True


def run_data(env: Env, tally: Tally, inputs: int, seed: int, stop: threading.Event) -> int:
    """The data surface: ``inputs`` inputs from :data:`THREADS` threads; the threads used."""
    stalls = max(8, inputs // 2500)
    threads = THREADS["data"]
    jobs = [
        (data_worker, share, random.Random(f"{seed}/data/{i}"))
        for i, share in enumerate(shares(inputs - stalls, threads))
    ]
    jobs.append((run_stalls, stalls, random.Random(f"{seed}/stalls")))
    run_threads(env, tally, jobs, stop)
    return threads


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal counts."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def run_threads(env: Env, tally: Tally, jobs: list[tuple], stop: threading.Event) -> None:
    """Run ``fn(env, tally, rng, count, stop)`` for every ``(fn, count, rng)`` in threads."""

    def guarded(fn: Callable, count: int, rng: random.Random) -> None:
        try:
            fn(env, tally, rng, count, stop)
        except Exception:  # the fuzzer's own bug: reported, never taken for the server's
            tally.fuzzer_error(traceback.format_exc())

    threads = [
        threading.Thread(target=guarded, args=job, name=f"fuzz-{tally.surface}-{i}", daemon=True)
        for i, job in enumerate(jobs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ============================================================================ gRPC

SERVICES = (
    (meta_pb2, "MetaService"),
    (cluster_pb2, "ClusterService"),
    (storage_pb2, "StorageService"),
)
META_READ_ONLY = frozenset(
    {
        "Stat",
        "BatchStat",
        "BatchOpen",
        "List",
        "Readlink",
        "StatFs",
        "Ping",
        "Authorize",
        # KV caches: a lookup changes a cache's recency and counters, never its blocks
        "KvOpen",
        "KvLookup",
        "KvList",
        "KvStats",
    }
)
KV_CHANGES = frozenset({"KvReserve", "KvCommit", "KvDelete", "KvClear"})  # by cache id
NO_SERVER_CREDENTIAL = frozenset({"RegisterNode", "Heartbeat", "SyncDone"})
PATH_FIELDS = frozenset({"path", "paths", "src", "dst"})


@dataclass(frozen=True)
class Method:
    """One gRPC method."""

    path: str  # /emberfs.MetaService/Stat
    service: str
    name: str
    request: type
    response: type


def all_methods() -> list[Method]:
    """Every method of the three gRPC services."""
    out = []
    for module, service in SERVICES:
        sd = module.DESCRIPTOR.services_by_name[service]
        for m in sd.methods:
            out.append(
                Method(
                    f"/{sd.full_name}/{m.name}",
                    service,
                    m.name,
                    message_factory.GetMessageClass(m.input_type),
                    message_factory.GetMessageClass(m.output_type),
                )
            )
    return out


def scratch_path(path: str) -> bool:
    """Whether ``path`` names something strictly inside :data:`SCRATCH_DIR`."""
    parts = [p for p in path.split("/") if p]
    return len(parts) >= 2 and parts[0] == SCRATCH_DIR[1:]


def confined_target(target: str) -> bool:
    """Whether a symlink made in the scratch directory with ``target`` points inside it."""
    parts = target.split("/")
    if ".." in parts:
        return False
    if not target.startswith("/"):
        return True
    names = [p for p in parts if p and p != "."]
    return bool(names) and names[0] == SCRATCH_DIR[1:]


def grpc_safe(method: Method, msg: Message, protected: frozenset[int], credential: str) -> bool:
    """Whether ``msg``, sent with a credential that may change state, leaves real state alone.

    RegisterNode, Heartbeat and SyncDone are for no server credential at all (the admin
    token is refused them, as every token is).
    """
    name = method.name
    if method.service == "MetaService":
        if name in META_READ_ONLY or name == "RenewSessions":
            return True
        if name == "Open":
            return msg.flags == 0 or scratch_path(msg.path)
        if name in ("Sync", "Close"):
            return msg.inode not in protected
        if name == "BatchClose":
            return all(item.inode not in protected for item in msg.items)
        if name == "BatchCreate":
            return all(scratch_path(item.path) for item in msg.items)
        if name in KV_CHANGES:
            return msg.cache_id not in protected
        for fd in msg.DESCRIPTOR.fields:
            if fd.name in PATH_FIELDS:
                value = getattr(msg, fd.name)
                values = list(value) if fd.is_repeated else [value]
                if not all(scratch_path(v) for v in values):
                    return False
        return name != "Symlink" or confined_target(msg.target)
    if name in NO_SERVER_CREDENTIAL:
        return credential != "server"
    if name in ("RemoveChunks", "ReportLostChunk"):
        return msg.inode == 0 or msg.inode >= SCRATCH_INODE
    if name == "AckGC":
        return all(g >= SCRATCH_INODE for g in msg.gc_ids)
    return True


@dataclass
class GrpcInput:
    """One gRPC input: raw request bytes for a method at an address, with a credential."""

    kind: str
    method: Method
    address: str
    raw: bytes
    credential: str
    metadata: list[tuple[str, str]]
    shown: Message | None = None  # the message, when the input was built as one

    def example(self) -> dict:
        out = {
            "method": self.method.path,
            "address": self.address,
            "credential": self.credential,
            "request": hexcut(self.raw),
        }
        if self.shown is not None:
            out["message"] = text_format.MessageToString(self.shown, as_utf8=True)[:4000]
        return out


class MessageGen:
    """Protobuf messages of random and boundary values, from their descriptors."""

    def __init__(self, env: Env, rng: random.Random) -> None:
        self.env = env
        self.rng = rng
        self.targets = [t.target_id for t in env.routing.targets]
        self.chains = [c.chain_id for c in env.routing.chains]
        self.nodes = sorted({t.node_id for t in env.routing.targets})

    def message(self, desc: pbd.Descriptor, safe: bool, depth: int = 0) -> Message:
        msg = message_factory.GetMessageClass(desc)()
        for fd in desc.fields:
            if self.rng.random() < 0.3:
                continue
            if fd.is_repeated:
                getattr(msg, fd.name).extend(self._values(fd, safe, depth))
            elif fd.type == pbd.FieldDescriptor.TYPE_MESSAGE:
                getattr(msg, fd.name).CopyFrom(self.value(fd, safe, depth))
            else:
                setattr(msg, fd.name, self.value(fd, safe, depth))
        return msg

    def _values(self, fd: pbd.FieldDescriptor, safe: bool, depth: int) -> list:
        """The values of a repeated field; a long one repeats a few values over and over."""
        n = self._count(fd)
        distinct = [self.value(fd, safe, depth) for _ in range(min(n, 8))]
        return [distinct[i % len(distinct)] for i in range(n)] if n else []

    def _count(self, fd: pbd.FieldDescriptor) -> int:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            return 0
        if r < 0.95:
            return rng.randrange(1, 4)
        if r < 0.995 or fd.type == pbd.FieldDescriptor.TYPE_MESSAGE:
            return rng.choice((100, 1000, 5000))
        return rng.choice((20_000, 100_000))

    def value(self, fd: pbd.FieldDescriptor, safe: bool, depth: int) -> Any:
        special = self._by_name(fd, safe)
        if special is not None:
            return special
        rng = self.rng
        t = fd.type
        T = pbd.FieldDescriptor
        if t == T.TYPE_MESSAGE:
            return self.message(fd.message_type, safe, depth + 1)
        if t in (T.TYPE_UINT32, T.TYPE_FIXED32):
            return u32(rng)
        if t in (T.TYPE_UINT64, T.TYPE_FIXED64):
            return u64(rng)
        if t in (T.TYPE_INT32, T.TYPE_SINT32, T.TYPE_SFIXED32):
            return rng.choice((0, -1, 1, -(1 << 31), (1 << 31) - 1, rng.getrandbits(31)))
        if t in (T.TYPE_INT64, T.TYPE_SINT64, T.TYPE_SFIXED64):
            return rng.choice(
                (0, -1, 1, I64_MIN, I64_MAX, rng.getrandbits(63), -rng.getrandbits(63))
            )
        if t in (T.TYPE_DOUBLE, T.TYPE_FLOAT):
            return rng.choice((0.0, -0.0, 1.5, float("nan"), float("inf"), -float("inf"), 1e300))
        if t == T.TYPE_BOOL:
            return rng.random() < 0.5
        if t == T.TYPE_ENUM:
            valid = [v.number for v in fd.enum_type.values]
            return rng.choice(valid) if rng.random() < 0.8 else rng.choice((-1, 99, (1 << 31) - 1))
        if t == T.TYPE_STRING:
            return self._string()
        return rng.randbytes(rng.choice((0, 1, 16, 300)))

    def _string(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.002:
            return "s" * rng.choice((1 << 20, 5 << 20))  # past the server's 4 MiB message limit
        return text(rng)

    def _by_name(self, fd: pbd.FieldDescriptor, safe: bool) -> Any:
        rng = self.rng
        name = fd.name
        if name in PATH_FIELDS:
            return self.path(safe)
        if name == "target" and fd.containing_type.name == "SymlinkRequest":
            return self.symlink_target(safe)
        if name == "start_after":
            after = rng.choice(("", "a", "zzz", text(rng)))
            return after.encode() if fd.type == pbd.FieldDescriptor.TYPE_BYTES else after
        if name == "cache_id":
            r = rng.random()
            if r < 0.6:
                return self.env.scratch_cache
            if r < 0.8:
                return self.env.check_cache
            return rng.choice((0, 1, U64, rng.getrandbits(20)))
        if name == "inode":
            return self.inode(safe, fd.containing_type.full_name)
        if name in ("target_id", "target_ids") and rng.random() < 0.7 and self.targets:
            return rng.choice(self.targets)
        if name in ("chain_id", "chains", "chain_table") and rng.random() < 0.7 and self.chains:
            return rng.choice(self.chains)
        if name == "node_id" and rng.random() < 0.5 and self.nodes:
            return rng.choice(self.nodes)
        if name == "gc_ids" and safe:
            return SCRATCH_INODE + rng.getrandbits(20)
        if name == "flags":
            return rng.choice((0, 1, 2, 3, 7, 9, 11, 17, 31, 32, 255, U32))
        if name == "mode":
            return rng.choice((0, 0o644, 0o755, 0o7777, 0o170000, U32))
        if name == "limit":
            return rng.choice((0, 1, 2, 10, 1000, 10000, 10001, U32))
        return None

    def path(self, safe: bool) -> str:
        rng = self.rng
        tail = "/".join(self._name() for _ in range(rng.choice((1, 1, 2, 3))))
        r = 0.0 if safe else rng.random()
        if r < 0.7:
            return f"{SCRATCH_DIR}/{tail}"
        if r < 0.8:
            return rng.choice((CHECK_PATH, CHECK_DIR, "/", "", SCRATCH_DIR))
        if r < 0.9:
            return rng.choice(("relative/" + tail, "//" + tail, "/./x", "/../x", "/a\x00b"))
        return "/" + text(rng, rng.choice((10, 300, 5000)))

    NAMES = ("a", "b", "c", "d", "d/e", "s", ".", "..", "x" * 255, "x" * 256, "é", "😀", " ", "-")

    def _name(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.7:
            return rng.choice(self.NAMES)
        if r < 0.85:
            return f"f{rng.randrange(50)}"
        if r < 0.9:
            return "a\x00b"
        return text(rng, rng.choice((1, 8, 40))).replace("/", "_") or "n"

    def symlink_target(self, safe: bool) -> str:
        rng = self.rng
        options = ["a", "d", "d/e", f"{SCRATCH_DIR}/b", ".", "s", "x" * 5000, ""]
        if not safe:
            options += ["/", "..", "../..", CHECK_PATH, "/a\x00b"]
        return rng.choice(options)

    def inode(self, safe: bool, message: str) -> int:
        rng = self.rng
        if message.startswith("emberfs.") and message.split(".")[1] in (
            "RemoveChunksRequest",
            "ReportLostChunkRequest",
        ):
            if safe or rng.random() < 0.5:
                return SCRATCH_INODE + rng.randrange(64)
            return rng.choice((0, 1, self.env.check_inode, U64))
        if rng.random() < 0.6 and self.env.scratch_inodes:
            return rng.choice(self.env.scratch_inodes)
        value = rng.choice((0, 1, 2, U64, 1 << 63, rng.getrandbits(20), self.env.check_inode))
        return value + 10**6 if safe and value in self.env.protected else value


class RawGen:
    """Request bytes that no protobuf library would make."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def raw(self, encoded: bytes) -> tuple[str, bytes]:
        rng = self.rng
        kind = rng.choice(
            ("random", "flip", "truncate", "append", "utf8", "varint", "length", "groups", "wire")
        )
        if kind == "random":
            return kind, rng.randbytes(rng.choice((0, 1, 2, 8, 64, 512)))
        if kind == "flip" and encoded:
            out = bytearray(encoded)
            for _ in range(rng.randrange(1, 5)):
                out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
            return kind, bytes(out)
        if kind == "truncate" and encoded:
            return kind, encoded[: rng.randrange(len(encoded))]
        if kind == "utf8":  # a string field (2 is a path in most requests) that is not UTF-8
            bad = rng.choice((b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"/a\x80"))
            return kind, encoded + _tag(rng.choice((1, 2, 3)), 2) + _varint(len(bad)) + bad
        if kind == "varint":  # an overlong varint (11 bytes) for a low field
            return kind, encoded + _tag(rng.randrange(1, 6), 0) + b"\xff" * 10 + b"\x01"
        if kind == "length":  # a length past the end
            return kind, encoded + _tag(rng.randrange(1, 6), 2) + _varint(
                rng.choice((10, U32))
            ) + b"x"
        if kind == "groups":  # nested groups past any recursion limit
            depth = rng.choice((50, 101, 1000, 20_000))
            field = rng.randrange(1, 20)
            return kind, _tag(field, 3) * depth + _tag(field, 4) * depth
        if kind == "wire":  # wire types 6 and 7 do not exist
            return kind, encoded + _tag(rng.randrange(1, 100), rng.choice((6, 7))) + b"\x00"
        return "append", encoded + _tag(rng.choice((99, 536870911)), 0) + _varint(
            rng.getrandbits(64)
        )


def _varint(n: int) -> bytes:
    """``n`` as a protobuf varint."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field_number: int, wire: int) -> bytes:
    """A protobuf field key."""
    return _varint((field_number << 3) | wire)


class GrpcInputs:
    """Makes the gRPC surface's inputs for one thread."""

    def __init__(self, env: Env, rng: random.Random, tally: Tally, methods: list[Method]) -> None:
        self.env = env
        self.rng = rng
        self.tally = tally
        self.methods = methods
        self.messages = MessageGen(env, rng)
        self.raws = RawGen(rng)
        self.signer = env.keys.call_signer()
        cluster = env.cluster
        self.storage = [cluster.storage_grpc_address(i) for i in range(env.storage_count)]

    def next(self) -> GrpcInput:
        rng = self.rng
        method = rng.choice(self.methods)
        credential = self._credential(method)
        trusted = credential in ("admin", "server")
        kind = "message" if rng.random() < 0.75 else "raw"
        msg = self.messages.message(method.request.DESCRIPTOR, safe=trusted)
        if trusted and not grpc_safe(method, msg, self.env.protected, credential):
            self.tally.guard()
            credential, trusted = "wrong", False
        raw = msg.SerializeToString()
        shown: Message | None = msg
        if kind == "raw":
            sub, raw = self.raws.raw(raw)
            kind, shown = f"raw_{sub}", None
            if trusted and not self._raw_safe(method, raw, credential):
                self.tally.guard()
                credential = "wrong"
        return GrpcInput(
            f"{kind}",
            method,
            self._address(method),
            raw,
            credential,
            self._metadata(credential, method, raw),
            shown,
        )

    def _raw_safe(self, method: Method, raw: bytes, credential: str) -> bool:
        try:
            msg = method.request.FromString(raw)
        except DecodeError:
            return True  # the server cannot decode it either
        return grpc_safe(method, msg, self.env.protected, credential)

    def _credential(self, method: Method) -> str:
        weights = {
            "MetaService": {
                "none": 0.15,
                "wrong": 0.15,
                "malformed": 0.05,
                "server": 0.05,
                "admin": 0.6,
            },
            "ClusterService": {
                "none": 0.15,
                "wrong": 0.1,
                "malformed": 0.05,
                "admin": 0.25,
                "server": 0.45,
            },
            "StorageService": {
                "none": 0.15,
                "wrong": 0.1,
                "malformed": 0.05,
                "admin": 0.1,
                "server": 0.6,
            },
        }[method.service]
        credential = pick(self.rng, weights)
        if credential == "server" and method.name in NO_SERVER_CREDENTIAL:
            return "admin"
        return credential

    def _address(self, method: Method) -> str:
        rng = self.rng
        meta = self.env.cluster.meta_address
        if method.service == "StorageService":
            return rng.choice(self.storage) if rng.random() < 0.95 else meta
        return meta if rng.random() < 0.95 else rng.choice(self.storage)

    def _metadata(self, credential: str, method: Method, raw: bytes) -> list[tuple[str, str]]:
        rng = self.rng
        if credential == "admin":
            return [(TOKEN_KEY, f"Bearer {self.env.token}")]
        if credential == "wrong":
            return [(TOKEN_KEY, f"Bearer {os.urandom(rng.choice((1, 16, 64))).hex()}")]
        if credential == "server":
            try:  # the server checks the MAC over its own (deterministic) encoding
                canonical = method.request.FromString(raw).SerializeToString(deterministic=True)
            except DecodeError:
                canonical = raw
            return [self.signer.metadata(method.path, canonical)]
        if credential == "malformed":
            return [
                rng.choice(
                    (
                        (TOKEN_KEY, "Basic dXNlcjpwYXNz"),
                        (TOKEN_KEY, "Bearer "),
                        (TOKEN_KEY, "Bearer " + "x" * 8000),
                        (CALL_KEY, "garbage"),
                        (CALL_KEY, "1.2.3"),
                        (CALL_KEY, f"{now_ms()}.{os.urandom(12).hex()}.{'00' * 16}"),
                        (CALL_KEY, f"{now_ms() - 10**9}.n.{'zz' * 16}"),
                    )
                )
            ]
        return []


class GrpcLinks:
    """Channels to every server address, shared by the threads, and every method's callable.

    Inputs that may make a server drop the whole HTTP/2 connection (malformed or
    oversized metadata, messages past the size limit) go on channels of their own, so
    the other threads' calls do not wait for a reconnection.
    """

    OPTIONS = (
        ("grpc.max_receive_message_length", 256 * MiB),
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 500),
    )

    def __init__(self, env: Env, methods: list[Method]) -> None:
        cluster = env.cluster
        addresses = [cluster.meta_address] + [
            cluster.storage_grpc_address(i) for i in range(env.storage_count)
        ]
        self._channels = {
            (a, rough): grpc.insecure_channel(a, options=self.OPTIONS)
            for a in addresses
            for rough in (False, True)
        }
        self._callables = {
            (a, rough, m.path): ch.unary_unary(m.path)
            for (a, rough), ch in self._channels.items()
            for m in methods
        }

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def call(self, item: GrpcInput) -> Outcome:
        rough = item.credential == "malformed" or len(item.raw) > MiB
        fn = self._callables[(item.address, rough, item.method.path)]
        try:
            answer = fn(item.raw, timeout=CALL_TIMEOUT, metadata=item.metadata)
        except grpc.RpcError as exc:
            return grpc_outcome(exc)
        try:
            item.method.response.FromString(answer)
        except DecodeError as exc:
            return Outcome("OK", error=f"undecodable answer: {exc}")
        return Outcome("OK")


def grpc_outcome(exc: grpc.RpcError) -> Outcome:
    """The label of a failed call; a hang for a deadline, a server error for UNKNOWN/INTERNAL."""
    code = exc.code()
    details = exc.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Outcome(code.name, hang=f"no answer in {CALL_TIMEOUT} s")
    if code == grpc.StatusCode.INTERNAL and "deserializ" in details:
        return Outcome("INTERNAL (undecodable request)")
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS):
        return Outcome(code.name, error=details[:2000])
    return Outcome(code.name)


def grpc_worker(
    env: Env, tally: Tally, rng: random.Random, count: int, stop: threading.Event, links: GrpcLinks
) -> None:
    gen = GrpcInputs(env, rng, tally, all_methods())
    for _ in range(count):
        if stop.is_set():
            return
        item = gen.next()
        started = time.perf_counter()
        outcome = links.call(item)
        tally.record(
            item.kind,
            outcome.status,
            item.example,
            hang=outcome.hang,
            error=outcome.error,
            group=item.method.path,
            seconds=time.perf_counter() - started,
        )


def run_grpc(env: Env, tally: Tally, inputs: int, seed: int, stop: threading.Event) -> int:
    threads = THREADS["grpc"]
    links = GrpcLinks(env, all_methods())
    try:
        worker = _bind_last(grpc_worker, links)
        jobs = [
            (worker, share, random.Random(f"{seed}/grpc/{i}"))
            for i, share in enumerate(shares(inputs, threads))
        ]
        run_threads(env, tally, jobs, stop)
    finally:
        links.close()
    return threads


def _bind_last(fn: Callable, extra: Any) -> Callable:
    def bound(env: Env, tally: Tally, rng: random.Random, count: int, stop: threading.Event):
        return fn(env, tally, rng, count, stop, extra)

    return bound


# ============================================================================ REST

STEER_TARGET = re.compile(r"/targets/(.*)/(offline|drain)")


@dataclass(frozen=True)
class Route:
    """One operation of the OpenAPI document."""

    method: str
    template: str
    params: tuple[dict, ...]
    body: dict | None
    slow: bool


def routes_of(schema: dict) -> list[Route]:
    """The operations of an OpenAPI document."""
    out = []
    for template, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            body = (
                op.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema")
            )
            out.append(
                Route(
                    method.upper(),
                    template,
                    tuple(op.get("parameters", ())),
                    body,
                    "fsck" in template,
                )
            )
    return out


def harmless_target_id(segment: str) -> bool:
    """Whether a target id in a path can name no existing target, however it is parsed."""
    if not any(ch.isnumeric() for ch in segment):
        return True
    return re.fullmatch(r"-?[1-9][0-9]{6,30}", segment) is not None


def rest_safe(method: str, target: str, admin: bool) -> bool:
    """Whether a request with the admin token leaves the cluster working (see the module doc)."""
    if not admin:
        return True
    path, _, query = target.partition("?")
    decoded = urllib.parse.unquote(path)
    m = STEER_TARGET.search(decoded)
    if m is not None and not harmless_target_id(m.group(1)):
        return False
    if "layouts" in decoded and method not in ("GET", "HEAD", "OPTIONS"):
        values = [
            v for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True) if k == "path"
        ]
        names = [p for p in values[0].split("/") if p] if len(values) == 1 else []
        return bool(names) and names[0] == SCRATCH_DIR[1:]
    return True


@dataclass
class RestInput:
    """One HTTP request (or raw bytes on a fresh connection) to the admin API."""

    kind: str
    method: str
    target: str
    headers: dict[str, str]
    body: bytes | None
    credential: str
    slow: bool = False
    raw: bytes | None = None

    def example(self) -> dict:
        if self.raw is not None:
            return {"raw_http": hexcut(self.raw)}
        out: dict[str, Any] = {
            "method": self.method,
            "target": self.target,
            "headers": self.headers,
            "credential": self.credential,
        }
        if self.body is not None:
            try:
                out["body"] = self.body[:EXAMPLE_BYTES].decode()
            except UnicodeDecodeError:
                out["body_hex"] = self.body[:EXAMPLE_BYTES].hex()
        return out


class JsonGen:
    """JSON values for a JSON schema: valid, at and past its bounds, of the wrong type."""

    def __init__(self, rng: random.Random, root: dict) -> None:
        self.rng = rng
        self.root = root

    def resolve(self, schema: dict) -> dict:
        while "$ref" in schema:
            node: Any = self.root
            for part in schema["$ref"].lstrip("#/").split("/"):
                node = node[part]
            schema = node
        return schema

    def value(self, schema: dict, depth: int = 0) -> Any:
        rng = self.rng
        schema = self.resolve(schema)
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            return self.value(rng.choice(branches), depth)
        if rng.random() < 0.08 or depth > 4:
            return self.anything()
        kind = schema.get("type")
        if kind == "integer":
            return self.integer(schema)
        if kind == "number":
            return rng.choice((0, -1.5, 1e308, 5e-324, self.integer(schema)))
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "string":
            return self.string(schema)
        if kind == "array":
            return self.array(schema, depth)
        if kind == "object" or "properties" in schema:
            return self.object(schema, depth)
        if kind == "null":
            return None
        return self.anything()

    def integer(self, schema: dict) -> int:
        rng = self.rng
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -(10**6)))
        hi = schema.get("maximum", schema.get("exclusiveMaximum", 10**6))
        return rng.choice(
            (
                lo,
                hi,
                lo - 1,
                hi + 1,
                0,
                -1,
                rng.randint(int(lo), int(hi)),
                10**30,
                -(10**30),
                U64 + 1,
            )
        )

    def string(self, schema: dict) -> str:
        rng = self.rng
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 300)
        n = rng.choice((lo, hi, max(0, lo - 1), hi + 1, rng.randint(lo, hi)))
        return text(rng, min(n, 100_000))

    def array(self, schema: dict, depth: int) -> list:
        rng = self.rng
        hi = schema.get("maxItems", 10)
        n = rng.choice((0, 1, 3, min(hi, 1000), min(hi + 1, 100_000)))
        items = schema.get("items", {})
        return [self.value(items, depth + 1) for _ in range(n)]

    def object(self, schema: dict, depth: int) -> dict:
        rng = self.rng
        required = set(schema.get("required", ()))
        out = {}
        for name, sub in schema.get("properties", {}).items():
            keep = rng.random() < (0.93 if name in required else 0.6)
            if keep:
                out[name] = self.value(sub, depth + 1)
        if rng.random() < 0.1:
            out[text(rng, 8)] = self.anything()
        return out

    def anything(self) -> Any:
        rng = self.rng
        return rng.choice(
            (
                None,
                True,
                0,
                -1,
                10**40,
                1.5,
                "",
                text(rng),
                [],
                [1, "a", None],
                {},
                {"a": {"b": [1]}},
                [[[[[]]]]],
            )
        )


def raw_http(rng: random.Random, host: str) -> bytes:
    """A malformed (or odd) HTTP/1.1 request."""
    h = f"Host: {host}\r\n".encode()
    return rng.choice(
        (
            b"GET /healthz HTTP/1.1\r\n\r\n",
            b"GARBAGE\r\n\r\n",
            b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n" + h + b"\r\n",
            b"GET /healthz HTTP/1.1\r\n" + h + b"X-Big: " + b"b" * 100_000 + b"\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\n" + h + b"X: " * 2000 + b"\r\n\r\n",
            b"POST /api/v1/tokens HTTP/1.1\r\n" + h + b"Content-Length: 100\r\n\r\n{}",
            b"POST /api/v1/gc/run HTTP/1.1\r\n" + h + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"GET /healthz HTTP/1.1\r\n" + h + b"Content-Length: -1\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\n" + h + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"GET /healthz HTTP/1.1\r\n" + h + b"Bad Header\x00: x\r\n\r\n",
            b"GET /api/v1/targets/%zz HTTP/1.1\r\n" + h + b"\r\n",
            b"GET /\xff\xfe HTTP/1.1\r\n" + h + b"\r\n",
            b"GET /healthz HTTP/9.9\r\n" + h + b"\r\n",
            b"GET /healthz\r\n\r\n",
            b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + rng.randbytes(64),
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + rng.randbytes(32),
            (b"GET /healthz HTTP/1.1\r\n" + h + b"\r\n") * 50,
            b"GET /api/v1/cluster HTTP/1.1\r\n" + h + b"Authorization: Bearer\r\n\r\n",
            rng.randbytes(rng.randrange(1, 400)),
            b"GET /healthz HTTP/1.1\r\n" + h,  # never finished
        )
    )


class RestInputs:
    """Makes the REST surface's inputs for one thread."""

    def __init__(self, env: Env, rng: random.Random, tally: Tally, schema: dict) -> None:
        self.env = env
        self.rng = rng
        self.tally = tally
        self.routes = routes_of(schema)
        self.json = JsonGen(rng, schema)
        self.host = env.cluster.admin_address

    def next(self) -> RestInput:
        while True:
            item = self._make()
            if item.raw is not None or rest_safe(
                item.method, item.target, item.credential == "admin"
            ):
                return item
            self.tally.guard()

    def _make(self) -> RestInput:
        rng = self.rng
        r = rng.random()
        if r < 0.04:
            return RestInput("raw_http", "", "", {}, None, "none", raw=raw_http(rng, self.host))
        if r < 0.08:
            return self._off_schema()
        route = rng.choice(self.routes)
        if route.slow and rng.random() < 0.9:  # fsck scans everything: a few of them
            route = rng.choice([x for x in self.routes if not x.slow])
        method = (
            route.method
            if rng.random() < 0.92
            else rng.choice(("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"))
        )
        credential = pick(rng, {"none": 0.25, "wrong": 0.25, "admin": 0.45, "malformed": 0.05})
        target = self._target(route)
        body = self._body(route)
        headers = self._headers(credential, body)
        kind = f"{route.method} {route.template}"
        return RestInput(kind, method, target, headers, body, credential, route.slow)

    def _off_schema(self) -> RestInput:
        rng = self.rng
        target = rng.choice(
            (
                "/",
                "/metrics",
                "/docs",
                "/openapi.json",
                "/static/index.html",
                "/static/../../../../etc/passwd",
                "/static/%2e%2e/%2e%2e/etc/passwd",
                "/api/v2/cluster",
                "/api/v1/" + urllib.parse.quote(text(rng, 20), safe=""),
                "/" + "a/" * 500,
                "/healthz?" + "x=1&" * 2000,
            )
        )
        method = rng.choice(("GET", "GET", "POST", "DELETE", "HEAD", "OPTIONS", "TRACE"))
        credential = pick(rng, {"none": 0.5, "wrong": 0.3, "admin": 0.2})
        return RestInput(
            "off_schema", method, target, self._headers(credential, None), None, credential
        )

    def _target(self, route: Route) -> str:
        rng = self.rng
        path = route.template
        query: list[tuple[str, str]] = []
        for param in route.params:
            where, name = param.get("in"), param.get("name", "")
            if where == "path":
                value = self._param(param.get("schema", {}))
                safe = "/" if ":path" in path or rng.random() < 0.05 else ""
                path = re.sub(
                    r"\{" + re.escape(name) + r"(:[a-z]+)?\}",
                    urllib.parse.quote(value, safe=safe),
                    path,
                )
            elif where == "query" and (param.get("required") or rng.random() < 0.7):
                if param.get("required") and rng.random() < 0.05:
                    continue  # a required parameter missing
                query.append((name, self._query_value(name, param.get("schema", {}))))
                if rng.random() < 0.03:
                    query.append((name, self._param(param.get("schema", {}))))
        if rng.random() < 0.05:
            query.append((text(rng, 6), text(rng, 10)))
        encoded = urllib.parse.urlencode(query)
        if rng.random() < 0.02:
            encoded += "&%zz=%" + rng.choice(("", "0", "g0", "00"))
        return path + ("?" + encoded if encoded else "")

    def _query_value(self, name: str, schema: dict) -> str:
        rng = self.rng
        if name == "path" and rng.random() < 0.6:
            return rng.choice(
                (SCRATCH_DIR, SCRATCH_DIR + "/d", SCRATCH_DIR + "/x/y", CHECK_DIR, "/")
            )
        return self._param(schema)

    def _param(self, schema: dict) -> str:
        """A path or query value as text: of its type mostly, anything sometimes."""
        rng = self.rng
        value = self.json.value(schema)
        if rng.random() < 0.15:
            value = rng.choice(
                ("", "abc", "1.5", "-0", "1e3", "0x10", "٣", "%00", "null", "true", " 1", text(rng))
            )
        if isinstance(value, bool):
            return rng.choice(("true", "false", "1", "0", "yes", "on")) if value else "false"
        if isinstance(value, (dict, list)) or value is None:
            return json.dumps(value)
        return str(value)

    def _body(self, route: Route) -> bytes | None:
        rng = self.rng
        if route.body is None:
            return None if rng.random() < 0.95 else json.dumps(self.json.anything()).encode()
        r = rng.random()
        if r < 0.05:
            return None
        if r < 0.1:
            return rng.choice((b"", b"{", b"{'a': 1}", b"[1,", b"\xff\xfe", b"NaN", b"{" * 50_000))
        if r < 0.13:
            return b"[" * 10_000 + b"]" * 10_000
        return json.dumps(self.json.value(route.body), ensure_ascii=rng.random() < 0.5).encode(
            "utf-8", "surrogatepass"
        )

    def _headers(self, credential: str, body: bytes | None) -> dict[str, str]:
        rng = self.rng
        headers = {}
        if credential == "admin":
            headers["Authorization"] = f"Bearer {self.env.token}"
        elif credential == "wrong":
            headers["Authorization"] = f"Bearer {os.urandom(16).hex()}"
        elif credential == "malformed":
            headers["Authorization"] = rng.choice(
                ("Bearer", "Bearer ", "Basic Zm9vOmJhcg==", "bearer x", "Bearer " + "t" * 9000)
            )
        if body is not None:
            headers["Content-Type"] = pick(
                rng,
                {
                    "application/json": 0.85,
                    "text/plain": 0.05,
                    "multipart/form-data; boundary=x": 0.05,
                    "application/x-www-form-urlencoded": 0.05,
                },
            )
        return headers


class RestLink:
    """One thread's keep-alive connection to the admin API."""

    def __init__(self, env: Env) -> None:
        host, port = env.cluster.admin_address.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def send(self, item: RestInput) -> Outcome:
        if item.raw is not None:
            return self._raw(item.raw)
        timeout = SLOW_TIMEOUT if item.slow else CALL_TIMEOUT
        for attempt in (0, 1):
            fresh = self._conn is None
            if fresh:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
                self._conn.connect()
                self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self._conn
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(item.method, item.target, body=item.body, headers=item.headers)
                resp = conn.getresponse()
                resp.read()
            except TimeoutError:
                self.close()
                return Outcome("no answer", hang=f"no answer in {timeout:.0f} s")
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if fresh or attempt:
                    return Outcome("closed", error=f"closed without answering: {exc}")
                continue  # a kept-alive connection the server had closed: once more
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                return Outcome("closed", error=f"{type(exc).__name__}: {exc}")
            if resp.will_close:
                self.close()
            status = str(resp.status)
            return Outcome(status, error=f"HTTP {status}" if resp.status >= 500 else None)
        return Outcome("closed")

    def _raw(self, raw: bytes) -> Outcome:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=ANSWER_TIMEOUT)
        except OSError as exc:
            return Outcome("connect failed", hang=f"cannot connect: {exc}")
        with sock:
            try:
                sock.sendall(raw)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            deadline = time.monotonic() + ANSWER_TIMEOUT
            got = bytearray()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return Outcome(_http_status(got), hang=f"did not close in {ANSWER_TIMEOUT} s")
                sock.settimeout(left)
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                if len(got) < 64:
                    got += chunk
        status = _http_status(got)
        return Outcome(status, error=f"HTTP {status}" if status.startswith("5") else None)


def _http_status(got: bytes) -> str:
    """The status code of the first answer in ``got`` (``closed`` when nothing came)."""
    m = re.match(rb"HTTP/\d\.\d (\d{3})", bytes(got))
    return m.group(1).decode() if m else ("closed" if not got else "not HTTP")


def rest_worker(
    env: Env, tally: Tally, rng: random.Random, count: int, stop: threading.Event, schema: dict
) -> None:
    gen = RestInputs(env, rng, tally, schema)
    link = RestLink(env)
    try:
        for _ in range(count):
            if stop.is_set():
                return
            item = gen.next()
            started = time.perf_counter()
            outcome = link.send(item)
            tally.record(
                item.kind,
                outcome.status,
                item.example,
                hang=outcome.hang,
                error=outcome.error,
                group=item.kind,
                seconds=time.perf_counter() - started,
            )
    finally:
        link.close()


def admin_request(env: Env, method: str, target: str) -> tuple[int, bytes]:
    """One request to the admin API with the admin token: (status, body)."""
    host, port = env.cluster.admin_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=CALL_TIMEOUT)
    try:
        conn.request(method, target, headers={"Authorization": f"Bearer {env.token}"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def run_rest(env: Env, tally: Tally, inputs: int, seed: int, stop: threading.Event) -> int:
    status, raw = admin_request(env, "GET", "/openapi.json")
    if status != 200:
        raise CouldNotRun(f"GET /openapi.json answered {status}")
    schema = json.loads(raw)
    threads = THREADS["rest"]
    worker = _bind_last(rest_worker, schema)
    jobs = [
        (worker, share, random.Random(f"{seed}/rest/{i}"))
        for i, share in enumerate(shares(inputs, threads))
    ]
    try:
        run_threads(env, tally, jobs, stop)
    finally:  # a fuzzed pause of the scrubbers is undone
        status, raw = admin_request(env, "GET", "/api/v1/scrub")
        if status == 200 and json.loads(raw).get("paused"):
            admin_request(env, "POST", "/api/v1/scrub/start")
    return threads


# ============================================================================ the run

RUNNERS: dict[str, Callable[[Env, Tally, int, int, threading.Event], int]] = {
    "data": run_data,
    "grpc": run_grpc,
    "rest": run_rest,
}


def mib(n: int) -> float:
    """Bytes in MiB, to a tenth."""
    return round(n / MiB, 1)


def run_surface(
    env: Env, prober: Prober, surface: str, inputs: int, seed: int, progress: float | None = None
) -> dict:
    """Run one surface under the monitor; its part of the report."""
    tally = Tally(surface)
    stop = threading.Event()
    before, cpu_before = env.rss(), env.cpu()
    monitor = Monitor(env, prober, tally, stop, progress).start()
    started = time.perf_counter()
    try:
        threads = RUNNERS[surface](env, tally, inputs, seed, stop)
    finally:
        seconds = time.perf_counter() - started
        monitor.finish()
    after, cpu_after = env.rss(), env.cpu()
    return {
        "inputs": tally.inputs,
        "threads": threads,
        "seconds": round(seconds, 1),
        "inputs_per_second": round(tally.inputs / seconds, 1) if seconds else 0.0,
        "guarded": tally.guarded,
        "crashes": tally.crashes,
        "hangs": tally.hangs,
        "hang_examples": tally.hang_examples,
        "server_errors": tally.errors,
        "server_error_examples": tally.error_examples,
        "statuses": dict(tally.statuses.most_common()),
        "kinds": dict(sorted(tally.kinds.items())),
        "rss_before_mib": {k: mib(v) for k, v in before.items()},
        "rss_after_mib": {k: mib(v) for k, v in after.items()},
        "rss_growth_mib": {k: mib(after[k] - before[k]) for k in before},
        "cpu_seconds": {k: round(cpu_after[k] - cpu_before[k], 1) for k in cpu_before},
        "slowest": slowest(tally),
        "fuzzer_errors": tally.fuzzer_errors,
    }


def slowest(tally: Tally, shown: int = 8) -> dict[str, dict]:
    """The groups (methods, routes, input kinds) that took the most time in all."""
    groups = sorted(tally.time_by_group.items(), key=lambda kv: -kv[1][1])[:shown]
    return {
        name: {"inputs": n, "seconds": round(total, 2), "mean_ms": round(1000 * total / n, 2)}
        for name, (n, total) in groups
    }


def check_state(env: Env, content: bytes, replicas: list[tuple]) -> dict:
    """Whether the check file reads back identical, its replicas unchanged, every target serving."""
    out: dict[str, Any] = {"path": CHECK_PATH, "size": len(content), "inode": env.check_inode}
    try:
        routing = env.cluster.wait_serving(timeout=60)
        out["targets_serving"] = True
        out["routing_version"] = [env.routing.version, routing.version]
    except TimeoutError as exc:
        out["targets_serving"] = False
        out["routing_error"] = str(exc)[:2000]
    try:
        got = read_check_file(env.cluster, env.token)
        out["intact"] = got == content
        if not out["intact"]:
            out["read_sha256"] = hashlib.sha256(got).hexdigest()
            out["read_size"] = len(got)
    except Exception as exc:  # noqa: BLE001 - an unreadable file is damage
        out["intact"] = False
        out["read_error"] = f"{type(exc).__name__}: {exc}"
    try:
        block = read_check_block(env.cluster, env.token)
        out["kv_intact"] = block == content[:KV_BLOCK]
    except Exception as exc:  # noqa: BLE001 - an unreadable block is damage
        out["kv_intact"] = False
        out["kv_error"] = f"{type(exc).__name__}: {exc}"
    try:
        now = replica_snapshot(env)
        out["replicas_unchanged"] = now == replicas
        if now != replicas:
            out["replicas_before"] = replicas
            out["replicas_after"] = now
    except grpc.RpcError as exc:
        out["replicas_unchanged"] = False
        out["replicas_error"] = str(exc)[:2000]
    out["sha256"] = hashlib.sha256(content).hexdigest()
    return out


def log_tracebacks(cluster: LocalCluster, shown: int = 10) -> dict:
    """The tracebacks the servers logged, by process and by their last line (what was raised).

    gRPC's own "Exception deserializing message!" (a request that is not protobuf, which
    the fuzzer sends on purpose) is only counted. For every other kind the first
    traceback is kept whole.
    """
    out = {}
    for log in sorted((cluster.data_dir / "logs").glob("*.log")):
        body = log.read_text(errors="replace")
        blocks = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", body)
        undecodable = 0
        kinds: dict[str, dict] = {}
        for block in blocks:
            if "Traceback (most recent call last)" not in block:
                continue
            if "Exception deserializing message" in block:
                undecodable += 1
                continue
            raised = block.strip().splitlines()[-1][:300]
            entry = kinds.setdefault(raised, {"count": 0, "first": block.strip()[-6000:]})
            entry["count"] += 1
        if undecodable or kinds:
            top = sorted(kinds.items(), key=lambda kv: -kv[1]["count"])[:shown]
            out[log.stem] = {"undecodable_requests": undecodable, "tracebacks": dict(top)}
    return out


@dataclass
class Options:
    """What to run: surfaces, inputs per surface, seed and where the cluster's data goes."""

    surfaces: tuple[str, ...] = SURFACES
    inputs: int = 20_000
    seed: int = 1
    data_dir: Path | None = None
    keep: bool = False
    progress: float | None = None  # seconds between progress lines on stderr


def start_cluster(data_dir: Path) -> LocalCluster:
    """A started LocalCluster of 3 storage servers (``--frame-timeout`` :data:`FRAME_TIMEOUT`)."""
    cluster = LocalCluster(
        data_dir,
        storage_servers=3,
        heartbeat_timeout=10.0,
        extra_storage_args=["--frame-timeout", str(FRAME_TIMEOUT)],
    )
    try:
        cluster.start(timeout=120)
    except (RuntimeError, TimeoutError) as exc:
        raise CouldNotRun(f"the cluster did not start: {exc}") from exc
    return cluster


def run(options: Options) -> dict:
    """Start a cluster, fuzz its surfaces, check its state; the report."""
    started = time.perf_counter()
    parent = options.data_dir
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="emberfs-fuzz-", dir=parent))
    cluster = start_cluster(workdir / "cluster")
    report: dict[str, Any] = {
        "seed": options.seed,
        "inputs_per_surface": options.inputs,
        "data_dir": str(workdir),
    }
    try:
        env, content = prepare(cluster, options.seed)
        replicas = replica_snapshot(env)
        prober = Prober(env)
        try:
            report["rss_start_mib"] = {k: mib(v) for k, v in env.rss().items()}
            report["chunks_start"] = chunk_counts(env)
            report["surfaces"] = {
                s: run_surface(env, prober, s, options.inputs, options.seed, options.progress)
                for s in options.surfaces
            }
        finally:
            prober.close()
        report["check"] = check_state(env, content, replicas)
        report["rss_end_mib"] = {k: mib(v) for k, v in env.rss().items()}
        report["chunks_end"] = chunk_counts(env)  # scratch chunks the inputs made
        report["log_tracebacks"] = log_tracebacks(cluster)
    finally:
        cluster.stop()
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    report["failures"] = failures(report)
    report["result"] = "failed" if report["failures"] else "ok"
    return report


def failures(report: dict) -> list[str]:
    """What makes the run fail: a crash, a hang, damage (and a bug of the fuzzer itself)."""
    out = []
    for name, s in report.get("surfaces", {}).items():
        if s["crashes"]:
            out.append(f"{name}: {len(s['crashes'])} server process(es) exited")
        if s["hangs"]:
            out.append(f"{name}: {s['hangs']} hang(s)")
        if s["fuzzer_errors"]:
            out.append(f"{name}: the fuzzer failed ({len(s['fuzzer_errors'])} thread(s))")
    check = report.get("check", {})
    if not check.get("intact"):
        out.append("the check file does not read back identical")
    if not check.get("replicas_unchanged"):
        out.append("the check file's replicas changed")
    if not check.get("kv_intact"):
        out.append("the check KV cache's block does not read back identical")
    return out


def summary(report: dict) -> str:
    """A few lines that say what a report found."""
    lines = [f"fuzz: seed {report['seed']}, {report['total_seconds']} s, {report['result']}"]
    for name, s in report.get("surfaces", {}).items():
        growth = max(s["rss_growth_mib"].values(), default=0.0)
        top = ", ".join(f"{k} {v}" for k, v in list(s["statuses"].items())[:6])
        lines.append(
            f"  {name}: {s['inputs']} inputs in {s['seconds']} s ({s['inputs_per_second']}/s), "
            f"{len(s['crashes'])} crashes, {s['hangs']} hangs, {s['server_errors']} server errors, "
            f"max RSS growth {growth} MiB; {top}"
        )
    check = report.get("check", {})
    lines.append(
        f"  check file: intact {check.get('intact')}, replicas unchanged "
        f"{check.get('replicas_unchanged')}, targets serving {check.get('targets_serving')}, "
        f"KV cache block intact {check.get('kv_intact')}"
    )
    lines += [f"  FAILED: {f}" for f in report.get("failures", [])]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fuzz", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--surface",
        default=",".join(SURFACES),
        help="comma-separated surfaces to fuzz: data, grpc, rest (default: all, in that order)",
    )
    p.add_argument("--inputs", type=int, default=20_000, help="inputs per surface (default 20000)")
    p.add_argument("--seed", type=int, default=1, help="seed of every generator (default 1)")
    p.add_argument("--json", action="store_true", help="print the JSON report (else a summary)")
    p.add_argument("--report", type=Path, help="also write the JSON report to this file")
    p.add_argument("--data-dir", type=Path, help="where the cluster's temporary directory goes")
    p.add_argument("--keep", action="store_true", help="keep the cluster's directory (and logs)")
    args = p.parse_args(argv)
    surfaces = tuple(s.strip() for s in args.surface.split(",") if s.strip())
    unknown = [s for s in surfaces if s not in SURFACES]
    if unknown or not surfaces:
        p.error(f"--surface: choose from {', '.join(SURFACES)}")
    if args.inputs < 1:
        p.error("--inputs must be at least 1")
    args.surfaces = surfaces
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer from the command line; the exit code."""
    args = parse_args(argv)
    options = Options(args.surfaces, args.inputs, args.seed, args.data_dir, args.keep, 30.0)
    print(f"fuzz: seed {args.seed}, {args.inputs} inputs per surface", file=sys.stderr)
    try:
        report = run(options)
    except CouldNotRun as exc:
        print(json.dumps({"result": "could not run", "seed": args.seed, "error": str(exc)}))
        return EXIT_COULD_NOT_RUN
    text_report = json.dumps(report, indent=2, default=str)
    if args.report is not None:
        args.report.write_text(text_report + "\n")
    print(text_report if args.json else summary(report))
    return EXIT_FAILED if report["failures"] else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
