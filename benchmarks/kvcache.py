"""The KV cache block store beside the client's own reads and writes, and beside a file per block.

Run from the repository root::

    python -m benchmarks.kvcache --json kvcache.json      # 5 rounds after a warm-up round
    python -m benchmarks.kvcache --quick                  # a smoke run, well under a minute

What it measures, in one run on one :class:`~emberfs.cli.localcluster.LocalCluster`
(3 storage servers with 2 targets each, R = 3, as ``emberfs up`` makes), for
two block sizes: the blocks of a model layout (``--layers``, ``--hidden``,
``--dtype``, ``--tokens-per-block``: by default the 70B layout, 80 layers of
hidden size 8192 in bf16, 2.5 MiB a token, scaled down to 8 layers, so 16
tokens make a 4 MiB block), ``--blocks`` (64) of them a batch; and small
blocks (``--small-block-size``, 64 KiB, ``--small-blocks``, 512, a batch),
where one file per block hurts most. Keys are random 32-byte hashes; every
block holds bytes of its own.

* **get** (every round, ``--passes`` times, the readers' order rotating from
  pass to pass so a slow moment of the machine weighs on all of them alike): a
  batch stored once before the rounds, read with :meth:`KVCache.batch_get` into
  preallocated ``bytearray`` blocks (reused across rounds), beside the
  client's own ``readinto``: the same bytes written before the rounds as one
  file with ``fs.pipe_file``, read with ``fs.open(path, "rb").readinto(buf)``
  into one preallocated buffer of their total size (the target: ``batch_get``
  at least 0.8x it); and beside one file per block (written with one
  ``fs.pipe`` of a dict), read with one ``fs.cat`` of the list of paths and
  with ``open``/``readinto`` of each file in turn into the same buffers.
* **put** (every round, new keys and new bytes): ``batch_put`` of a batch,
  beside ``fs.pipe_file`` of the same bytes as one new file (for scale) and
  ``fs.pipe`` of one new file per block (into a directory made beforehand).
  Around each, the cluster's inode count (``statfs``): the inodes a stored
  block costs (none in a slab: the slab files are made once, with the cache).
* **exists**: ``--exists-keys`` (1,000) keys, stored before the rounds as
  small blocks and as one file each: :meth:`KVCache.batch_exists` of all of
  them, and of a mix (the first half stored, then keys never stored), beside
  the same answer (the length of the stored prefix) from ``fs.exists`` of each
  key's file until the first miss, and from one ``fs.ls`` of the directory of
  those files; keys asked per second.

Every figure is taken every round (after ``--warmup`` unrecorded rounds) and
reported as the median over the rounds with their range; a ratio of two
figures is the median of the per-round ratios. Nothing measured may return
wrong bytes: every read buffer is overwritten before its read and compared
after it with what was written, every put batch is read back, every existence
answer checked, and any difference ends the run with an error. Before the
rounds every storage server's chunk files are read into the page cache (chunk
files are written with direct I/O; reads go to any replica), and each get
reports what the machine read from the disk meanwhile. Beside each figure: the
metaserver calls per batch and the metaserver's own time in them (from its
``/metrics``), and per round the CPU that other processes of the machine used.

It prints a progress line per round and a table at the end, and with ``--json
PATH`` writes every round's raw figures, the configuration and the machine.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import random
import resource
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import compare, meta_rate, mount  # noqa: E402
from benchmarks.figures import ratio_text, summary

KiB, MiB = 1 << 10, 1 << 20
GB = 1e9
ROOT_DIR = "/kvcache-bench"
TARGET = 0.8  # batch_get / readinto of one file
POISON = 0xA5  # what a read buffer holds before each read

# the readers and writers of one case, in the order they are reported
GETS = ("slab", "one_file", "files_cat", "files_readinto")
PUTS = ("slab", "one_file", "files")
EXISTS = ("slab", "files_exists", "files_ls")
QUERIES = ("mixed", "all")

_STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[kvcache {time.monotonic() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


class DataError(RuntimeError):
    """A read gave bytes other than those written, or missed a stored block."""


# data ---------------------------------------------------------------------------------------
def random_bytes(n: int, rng: random.Random) -> bytes:
    piece = 4 * MiB  # randbytes takes fewer than 2**31 bits a call
    return b"".join(rng.randbytes(min(piece, n - i)) for i in range(0, n, piece))


class Pool:
    """The bytes of a case's blocks: windows of one random pool.

    The stored batch is the pool's first ``blocks`` blocks; each round's new
    batch starts at a new offset within the first block (a multiple of 8, never
    0), so its blocks are bytes never written before without drawing new random
    bytes every round.
    """

    def __init__(self, block_size: int, blocks: int, rng: random.Random) -> None:
        self.block_size = block_size
        self.blocks = blocks
        self.total = block_size * blocks
        self.rng = rng
        self.data = random_bytes(self.total + block_size, rng)

    def batch(self, offset: int = 0) -> tuple[bytes, list[bytes]]:
        """The whole batch as one ``bytes`` and as one ``bytes`` per block."""
        whole = self.data[offset : offset + self.total]
        bs = self.block_size
        return whole, [whole[i * bs : (i + 1) * bs] for i in range(self.blocks)]

    def fresh(self) -> tuple[bytes, list[bytes]]:
        return self.batch(8 * self.rng.randrange(1, max(2, self.block_size // 8)))


def new_keys(n: int) -> list[bytes]:
    return [secrets.token_bytes(32) for _ in range(n)]


def poison(buffers) -> None:
    """Overwrite every byte of the writable buffers, so a read that fills nothing is seen."""
    for buf in buffers:
        n = len(buf)
        if n:
            view = (ctypes.c_char * n).from_buffer(buf)
            ctypes.memset(view, POISON, n)
            del view


def same(buf: bytearray, length: int, want: bytes) -> bool:
    if length != len(want):
        return False
    if length == len(buf):
        return buf == want  # one memcmp
    return bytes(memoryview(buf)[:length]) == want


def check_blocks(what: str, lengths: list, buffers: list, expected: list[bytes]) -> None:
    """DataError unless every buffer holds its expected block (``lengths``: what the read said)."""
    if len(lengths) != len(expected):
        raise DataError(f"{what}: {len(lengths)} answers for {len(expected)} blocks")
    for i, (n, buf, want) in enumerate(zip(lengths, buffers, expected, strict=True)):
        if n is None:
            raise DataError(f"{what}: block {i} of {len(expected)} missed (it is stored)")
        if not same(buf, n, want):
            raise DataError(f"{what}: wrong bytes in block {i} of {len(expected)} ({n} bytes)")


# measuring ----------------------------------------------------------------------------------
@dataclass
class Figure:
    """What one reader or writer did in one round: the sums over its batches."""

    batches: int = 0
    seconds: float = 0.0
    bytes: int = 0
    keys: int = 0
    disk_read_bytes: int = 0
    inodes: int = 0
    meta_calls: dict[str, float] = field(default_factory=dict)
    meta_seconds: dict[str, float] = field(default_factory=dict)

    def add(self, seconds: float, nbytes: int = 0, keys: int = 0) -> None:
        self.batches += 1
        self.seconds += seconds
        self.bytes += nbytes
        self.keys += keys

    def doc(self) -> dict:
        out = {
            "batches": self.batches,
            "seconds": self.seconds,
            "bytes": self.bytes,
            "keys": self.keys,
            "disk_read_bytes": self.disk_read_bytes,
            "inodes_created": self.inodes,
            "meta_calls": {k: v for k, v in self.meta_calls.items() if v},
            "meta_seconds": {k: v for k, v in self.meta_seconds.items() if v},
        }
        if self.bytes:
            out["bytes_per_s"] = self.bytes / self.seconds
        if self.keys:
            out["keys_per_s"] = self.keys / self.seconds
        return out


class Probe:
    """Around one timed call: the metaserver's calls, the disk's reads, the cluster's inodes."""

    def __init__(self, run: Run, figure: Figure, inodes: bool = False) -> None:
        self.run, self.figure, self.inodes = run, figure, inodes

    def __enter__(self) -> Probe:
        # the inodes outside the metaserver's calls counted: a StatFs is no call of the batch
        self.nodes = self.run.fs.statfs()["inodes"] if self.inodes else 0
        self.calls = meta_rate.handler_totals(self.run.metrics_url)
        self.disk = compare.disk_read_bytes()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            return
        disk = compare.disk_read_since(self.disk)
        if disk is not None:
            self.figure.disk_read_bytes += disk
        after = meta_rate.handler_totals(self.run.metrics_url)
        for method, (seconds, calls) in after.items():
            s0, c0 = self.calls.get(method, (0.0, 0.0))
            if calls > c0:
                f = self.figure
                f.meta_calls[method] = f.meta_calls.get(method, 0) + calls - c0
                f.meta_seconds[method] = f.meta_seconds.get(method, 0.0) + seconds - s0
        if self.inodes:
            self.figure.inodes += self.run.fs.statfs()["inodes"] - self.nodes


def timed(call: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    got = call()
    return time.perf_counter() - started, got


def rotated(items: tuple, k: int) -> tuple:
    k %= len(items)
    return items[k:] + items[:k]


# one block size ------------------------------------------------------------------------------
class Case:
    """One block size: its cache, its stored batch (in the cache, one file, a file per block)."""

    def __init__(self, run: Run, name: str, block_size: int, blocks: int, extra: int = 0) -> None:
        self.run, self.name = run, name
        self.block_size, self.blocks = block_size, blocks
        self.dir = f"{ROOT_DIR}/{name}"
        self.pool = Pool(block_size, blocks, run.rng)
        self.whole, self.expected = self.pool.batch()
        self.keys = new_keys(blocks)
        self.one_file = f"{self.dir}/one-file"
        self.files_dir = f"{self.dir}/files"
        self.paths = [f"{self.files_dir}/{k.hex()}" for k in self.keys]
        self.buffers = [bytearray(block_size) for _ in range(blocks)]
        self.big = bytearray(self.pool.total)
        # the stored batch, every batch put (warm-up rounds too), and ``extra`` blocks more
        self.capacity_blocks = blocks * (1 + run.args.warmup + run.args.rounds) + extra
        self.cache = None
        self.slab_chunk_size = self.file_chunk_size = 0
        self.puts = 0
        self.rounds: list[dict] = []

    def setup(self) -> None:
        from emberfs.kvcache import KVCache, PutStatus

        fs = self.run.fs
        log(f"{self.name}: a cache of {self.capacity_blocks} blocks of {self.block_size} bytes")
        self.cache = KVCache.create(
            f"{self.dir}/slabs",
            block_size=self.block_size,
            capacity=self.capacity_blocks * self.block_size,
            fs=fs,
        )
        if self.cache.capacity < self.capacity_blocks:
            raise RuntimeError(f"the cache holds {self.cache.capacity} blocks, not enough")
        log(f"{self.name}: storing {self.blocks} blocks: in the cache, as one file, one file each")
        statuses = self.cache.batch_put(self.keys, self.expected)
        if statuses != [PutStatus.STORED] * self.blocks:
            raise DataError(f"{self.name}: the stored batch was not stored: {set(statuses)}")
        fs.pipe_file(self.one_file, self.whole)
        fs.mkdir(self.files_dir)
        fs.pipe(dict(zip(self.paths, self.expected, strict=True)))
        self.slab_chunk_size = self.cache.geometry.chunk_size
        self.file_chunk_size = fs.info(self.one_file)["chunk_size"]

    # get --------------------------------------------------------------------------------------
    def _get_slab(self) -> float:
        poison(self.buffers)
        seconds, lengths = timed(lambda: self.cache.batch_get(self.keys, into=self.buffers))
        check_blocks(f"{self.name} batch_get", lengths, self.buffers, self.expected)
        return seconds

    def _get_one_file(self) -> float:
        poison([self.big])

        def read() -> int:
            with self.run.fs.open(self.one_file, "rb") as f:
                return f.readinto(self.big)

        seconds, n = timed(read)
        if n != len(self.whole) or self.big != self.whole:
            raise DataError(f"{self.name} readinto of one file: wrong bytes ({n} read)")
        return seconds

    def _get_files_cat(self) -> float:
        seconds, got = timed(lambda: self.run.fs.cat(self.paths))
        for i, p in enumerate(self.paths):
            if got.get(p) != self.expected[i]:
                raise DataError(f"{self.name} cat of one file per block: wrong bytes in {p}")
        return seconds

    def _get_files_readinto(self) -> float:
        poison(self.buffers)
        fs = self.run.fs

        def read() -> list[int]:
            lengths = []
            for p, buf in zip(self.paths, self.buffers, strict=True):
                with fs.open(p, "rb") as f:
                    lengths.append(f.readinto(buf))
            return lengths

        seconds, lengths = timed(read)
        check_blocks(f"{self.name} readinto of each file", lengths, self.buffers, self.expected)
        return seconds

    def gets(self, rnd: int, out: dict[str, Figure]) -> None:
        readers = {
            "slab": self._get_slab,
            "one_file": self._get_one_file,
            "files_cat": self._get_files_cat,
            "files_readinto": self._get_files_readinto,
        }
        passes = self.run.args.passes
        for p in range(passes):
            for name in rotated(GETS, rnd * passes + p):
                fig = out[f"get_{name}"]
                with Probe(self.run, fig):
                    seconds = readers[name]()
                fig.add(seconds, self.pool.total)
                self.run.verified(self.name, f"get_{name}", self.blocks)

    # put --------------------------------------------------------------------------------------
    def puts_round(self, rnd: int, out: dict[str, Figure]) -> None:
        from emberfs.kvcache import PutStatus

        fs = self.run.fs
        whole, blocks = self.pool.fresh()
        keys = new_keys(self.blocks)
        self.puts += 1
        base = f"{self.dir}/put-{self.puts:03d}"
        files = dict(zip((f"{base}-files/{k.hex()}" for k in keys), blocks, strict=True))
        fs.mkdir(f"{base}-files")  # made beforehand: each put makes only its blocks' files
        writers = {
            "slab": lambda: self.cache.batch_put(keys, blocks),
            "one_file": lambda: fs.pipe_file(f"{base}-one-file", whole),
            "files": lambda: fs.pipe(files),
        }
        for what in rotated(PUTS, rnd):
            fig = out[f"put_{what}"]
            with Probe(self.run, fig, inodes=True):
                seconds, got = timed(writers[what])
            fig.add(seconds, self.pool.total)
            if what == "slab":
                if got != [PutStatus.STORED] * self.blocks:
                    raise DataError(f"{self.name} batch_put: not all stored: {set(got)}")
                poison(self.buffers)  # read back: the batch must be there, byte for byte
                lengths = self.cache.batch_get(keys, into=self.buffers)
                check_blocks(
                    f"{self.name} batch_get after batch_put", lengths, self.buffers, blocks
                )
                self.run.verified(self.name, "put_slab", self.blocks)

    def round(self, rnd: int) -> dict[str, Figure]:
        out = {f"get_{g}": Figure() for g in GETS} | {f"put_{p}": Figure() for p in PUTS}
        self.gets(rnd, out)
        self.puts_round(rnd, out)
        return out


# existence ---------------------------------------------------------------------------------
class Existence:
    """``--exists-keys`` keys stored as blocks of the small cache and as one file each."""

    def __init__(self, run: Run, case: Case, n: int) -> None:
        self.run, self.case, self.n = run, case, n
        self.keys = new_keys(n)
        self.dir = f"{ROOT_DIR}/exists-files"
        self.half = n // 2
        self.queries = {
            "mixed": self.keys[: self.half] + new_keys(n - self.half),
            "all": self.keys,
        }
        self.answers = {"mixed": self.half, "all": n}

    def path(self, key: bytes) -> str:
        return f"{self.dir}/{key.hex()}"

    def setup(self) -> None:
        from emberfs.kvcache import PutStatus

        data, bs = self.case.pool.data, self.case.block_size
        # windows at unaligned offsets: bytes of their own, none a block of the stored batch
        starts = [8 * (1 + i % max(1, bs // 8 - 1)) for i in range(self.n)]
        blocks = [data[s : s + bs] for s in starts]
        log(f"exists: storing {self.n} blocks in the {self.case.name} cache and as files")
        if self.case.cache.batch_put(self.keys, blocks) != [PutStatus.STORED] * self.n:
            raise DataError("the blocks for batch_exists were not all stored")
        self.run.fs.mkdir(self.dir)
        self.run.fs.pipe({self.path(k): b for k, b in zip(self.keys, blocks, strict=True)})

    def _slab(self, query: list[bytes]) -> int:
        return self.case.cache.batch_exists(query)

    def _files_exists(self, query: list[bytes]) -> int:
        n = 0
        for key in query:
            if not self.run.fs.exists(self.path(key)):
                break
            n += 1
        return n

    def _files_ls(self, query: list[bytes]) -> int:
        names = {p.rsplit("/", 1)[-1] for p in self.run.fs.ls(self.dir, detail=False)}
        n = 0
        for key in query:
            if key.hex() not in names:
                break
            n += 1
        return n

    def round(self, rnd: int) -> dict[str, Figure]:
        ways = {"slab": self._slab, "files_exists": self._files_exists, "files_ls": self._files_ls}
        out = {f"exists_{w}_{q}": Figure() for q in QUERIES for w in EXISTS}
        passes = self.run.args.passes
        for p in range(passes):
            for q in rotated(QUERIES, p):
                query = self.queries[q]
                for way in rotated(EXISTS, rnd * passes + p):
                    fig = out[f"exists_{way}_{q}"]
                    with Probe(self.run, fig):
                        seconds, found = timed(lambda way=way, query=query: ways[way](query))
                    if found != self.answers[q]:
                        raise DataError(
                            f"exists ({way}, {q}): {found} leading keys stored, "
                            f"not {self.answers[q]}"
                        )
                    fig.add(seconds, keys=len(query))
        return out


# the run ------------------------------------------------------------------------------------
class Run:
    """The cluster, its client, the cases, and what has been measured."""

    def __init__(self, args, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.rng = random.Random(args.seed)
        self.cluster = None
        self.fs = None
        self.metrics_url = ""
        self.pids: list[int] = []
        self.checked: dict[str, dict[str, int]] = {}

    def verified(self, case: str, what: str, blocks: int) -> None:
        per = self.checked.setdefault(case, {})
        per[what] = per.get(what, 0) + blocks

    def start(self) -> None:
        from emberfs.client.fs import EmberFileSystem

        self.cluster = mount.start_cluster(self.workdir)  # this process is the admin
        self.fs = EmberFileSystem(meta=self.cluster.meta_address, skip_instance_cache=True)
        self.metrics_url = f"{self.cluster.admin_url}/metrics"
        self.pids = [s.proc.pid for s in self.cluster.metas + self.cluster.storage]

    def stop(self) -> None:
        if self.fs is not None:
            self.fs.close()
        if self.cluster is not None:
            self.cluster.stop()

    def cpu(self) -> tuple[float | None, float]:
        """(the machine's busy CPU seconds, those of this process and the servers) so far."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        return mount.machine_busy_seconds(), own.ru_utime + own.ru_stime + mount.cpu_seconds(
            self.pids
        )


RATE_KEYS = ("bytes_per_s", "keys_per_s")


def rate(fig: dict) -> float:
    return next(fig[k] for k in RATE_KEYS if k in fig)


# pairs reported side by side: (key, the slab figure, the other figure, what the other is)
CASE_PAIRS = (
    ("get_vs_readinto", "get_slab", "get_one_file", "readinto of one file"),
    ("get_vs_files_cat", "get_slab", "get_files_cat", "cat of a file per block"),
    ("get_vs_files_readinto", "get_slab", "get_files_readinto", "readinto of each file"),
    ("put_vs_pipe_file", "put_slab", "put_one_file", "pipe_file of one file"),
    ("put_vs_files_pipe", "put_slab", "put_files", "pipe of a file per block"),
)
EXISTS_PAIRS = tuple(
    (f"exists_{q}_vs_{w}", f"exists_slab_{q}", f"exists_{w}_{q}", what)
    for q in QUERIES
    for w, what in (("files_exists", "fs.exists of each file"), ("files_ls", "one fs.ls"))
)


def summarise(rounds: list[dict[str, dict]], pairs) -> dict:
    """Medians and ranges of every figure, and of the per-round ratios of the pairs."""
    figures = {k: summary([rate(r[k]) for r in rounds]) for k in rounds[0]}
    ratios = {key: summary([rate(r[a]) / rate(r[b]) for r in rounds]) for key, a, b, _ in pairs}
    return {"figures": figures, "ratios": ratios}


def per_block(figs: list[dict], blocks: int) -> float:
    """Inodes created per block stored, over the rounds."""
    return sum(f["inodes_created"] for f in figs) / (blocks * sum(f["batches"] for f in figs))


def main(argv: list[str] | None = None) -> int:
    from emberfs.common.units import format_size, parse_size
    from emberfs.kvcache.layout import DTYPE_BYTES, KVLayout

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="recorded rounds (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first (default 1)")
    p.add_argument("--passes", type=int, default=3, help="reads of each kind a round (default 3)")
    p.add_argument("--layers", type=int, default=8, help="model layers (default 8: 80 scaled)")
    p.add_argument("--hidden", type=int, default=8192, help="hidden size (default 8192)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    p.add_argument("--tokens-per-block", type=int, default=16, help="tokens a block (default 16)")
    p.add_argument("--blocks", type=int, default=64, help="blocks a batch (default 64)")
    p.add_argument("--small-block-size", type=parse_size, default=64 * KiB, help="default 64KiB")
    p.add_argument("--small-blocks", type=int, default=512, help="small blocks a batch")
    p.add_argument("--exists-keys", type=int, default=1000, help="keys of batch_exists")
    p.add_argument("--seed", type=int, default=None, help="of the block bytes (default random)")
    p.add_argument("--quick", action="store_true", help="small batches, one round (a smoke run)")
    p.add_argument("--json", metavar="PATH", help="write every figure here")
    p.add_argument("--workdir", default=None, help="where the cluster lives (a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.passes = 1, 0, 1
        args.blocks, args.small_blocks, args.exists_keys = 16, 128, 200
    for name in ("rounds", "passes", "blocks", "small_blocks", "small_block_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.warmup < 0 or args.exists_keys < 2:
        p.error("--warmup must not be negative, --exists-keys at least 2")
    try:
        layout = KVLayout.from_hidden(
            args.layers, args.hidden, tokens_per_block=args.tokens_per_block, dtype=args.dtype
        )
    except ValueError as exc:
        p.error(str(exc))
    reference = KVLayout.from_hidden(80, 8192, dtype="bfloat16")
    layout_text = (
        f"{args.layers} layers, hidden {args.hidden}, {args.dtype}, "
        f"{args.tokens_per_block} tokens a block: {format_size(layout.bytes_per_token)} a token, "
        f"{format_size(layout.block_size)} a block (the 70B layout, 80 layers: "
        f"{format_size(reference.bytes_per_token)} a token)"
    )

    def on_sigterm(signum, frame):
        raise SystemExit(143)  # unwinds through the finally blocks that stop the servers

    signal.signal(signal.SIGTERM, on_sigterm)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="emberfs-kvcache-", dir=args.workdir))
    runs = 1 + args.warmup + args.rounds
    batch_bytes = layout.block_size * args.blocks + args.small_block_size * args.small_blocks
    # R = 3 of: the stored batches (three ways), each round's puts (three ways), the exists keys
    need = 3 * (3 * batch_bytes * runs + 2 * args.exists_keys * args.small_block_size) + 512 * MiB
    compare.check_disk(workdir, need)
    doc: dict = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": mount.machine(),
        "command": " ".join(
            ["python -m benchmarks.kvcache", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    log(f"layout: {layout_text}")
    run = Run(args, workdir)
    started = time.monotonic()
    cases: list[Case] = []
    exist_rounds: list[dict] = []
    others: list[dict] = []
    try:
        run.start()
        large = Case(run, "large", layout.block_size, args.blocks)
        small = Case(run, "small", args.small_block_size, args.small_blocks, args.exists_keys)
        cases = [large, small]
        existence = Existence(run, small, args.exists_keys)
        for case in cases:
            case.setup()
        existence.setup()
        log("reading every chunk file into the page cache")
        warmed = compare.warm_tree(run.cluster.data_dir)
        for rnd in range(args.warmup + args.rounds):
            recorded = rnd >= args.warmup
            label = (
                f"round {rnd - args.warmup + 1}/{args.rounds}"
                if recorded
                else f"warm-up {rnd + 1}/{args.warmup}"
            )
            busy0, own0 = run.cpu()
            wall0 = time.monotonic()
            for case in cases if rnd % 2 == 0 else cases[::-1]:
                figs = {k: f.doc() for k, f in case.round(rnd).items()}
                if recorded:
                    case.rounds.append(figs)
                g, s = figs["get_slab"], figs["put_slab"]
                log(
                    f"{label}: {case.name} ({format_size(case.block_size)} x {case.blocks}): "
                    f"batch_get {g['bytes_per_s'] / GB:.2f} GB/s, readinto "
                    f"{figs['get_one_file']['bytes_per_s'] / GB:.2f} "
                    f"({g['bytes_per_s'] / figs['get_one_file']['bytes_per_s']:.2f}x), "
                    f"cat {figs['get_files_cat']['bytes_per_s'] / GB:.2f}, "
                    f"readinto each {figs['get_files_readinto']['bytes_per_s'] / GB:.2f}; "
                    f"batch_put {s['bytes_per_s'] / GB:.2f} GB/s, pipe_file "
                    f"{figs['put_one_file']['bytes_per_s'] / GB:.2f}, "
                    f"pipe {figs['put_files']['bytes_per_s'] / GB:.2f}"
                )
            figs = {k: f.doc() for k, f in existence.round(rnd).items()}
            if recorded:
                exist_rounds.append(figs)
            busy1, own1 = run.cpu()
            wall = time.monotonic() - wall0
            load = None
            if busy0 is not None and busy1 is not None:
                load = max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
            if recorded:
                others.append({"seconds": wall, "others_cpu_per_s": load})
            q = {k: rate(v) for k, v in figs.items()}
            log(
                f"{label}: exists ({args.exists_keys} keys, keys/s): batch_exists "
                f"{q['exists_slab_mixed']:.0f} mixed, {q['exists_slab_all']:.0f} all; fs.exists "
                f"{q['exists_files_exists_mixed']:.0f} / {q['exists_files_exists_all']:.0f}; "
                f"fs.ls {q['exists_files_ls_mixed']:.0f} / {q['exists_files_ls_all']:.0f}"
                + ("" if load is None else f"; other processes used {load:.2f} CPUs")
            )
        doc["cache_stats"] = {c.name: vars(c.cache.stats()) for c in cases}
        doc["slab_files"] = {c.name: len(c.cache.slabs) for c in cases}
    finally:
        run.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    doc["seconds"] = round(time.monotonic() - started, 1)
    doc["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    doc["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    doc["config"] = {
        "layout": {
            "layers": args.layers,
            "hidden": args.hidden,
            "dtype": args.dtype,
            "tokens_per_block": args.tokens_per_block,
            "bytes_per_token": layout.bytes_per_token,
            "block_size": layout.block_size,
            "text": layout_text,
        },
        "blocks": args.blocks,
        "small_block_size": args.small_block_size,
        "small_blocks": args.small_blocks,
        "exists_keys": args.exists_keys,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "passes": args.passes,
        "seed": args.seed,
        "quick": args.quick,
        "storage_servers": 3,
        "replicas": 3,
        "targets_per_server": 2,
    }
    doc["page_cache_warmed_bytes"] = warmed
    doc["cases"] = {}
    for case in cases:
        res = summarise(case.rounds, CASE_PAIRS)
        doc["cases"][case.name] = {
            "block_size": case.block_size,
            "blocks": case.blocks,
            "batch_bytes": case.pool.total,
            "capacity_blocks": case.capacity_blocks,
            "slab_files": doc["slab_files"][case.name],
            "slab_chunk_size": case.slab_chunk_size,
            "file_chunk_size": case.file_chunk_size,
            "inodes_per_block": {
                "slab": per_block([r["put_slab"] for r in case.rounds], case.blocks),
                "files": per_block([r["put_files"] for r in case.rounds], case.blocks),
                "one_file": per_block([r["put_one_file"] for r in case.rounds], case.blocks),
            },
            **res,
            "rounds": case.rounds,
        }
    doc["exists"] = {
        "keys": args.exists_keys,
        "stored_prefix_of_mixed": existence.half,
        **summarise(exist_rounds, EXISTS_PAIRS),
        "rounds": exist_rounds,
    }
    doc["verified_blocks"] = run.checked
    doc["other_processes"] = others
    ratio = doc["cases"]["large"]["ratios"]["get_vs_readinto"]
    doc["target"] = {
        "what": "batch_get / readinto of one file, layout blocks",
        "target": TARGET,
        "ratio": ratio["median"],
        "met": ratio["median"] >= TARGET,
        "rounds_met": sum(
            1
            for r in large.rounds
            if r["get_slab"]["bytes_per_s"] / r["get_one_file"]["bytes_per_s"] >= TARGET
        ),
        "rounds": args.rounds,
    }
    print_report(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
        print(f"\nresults: {args.json}")
    return 0


# report --------------------------------------------------------------------------------------
def _gb(s: dict) -> str:
    spread = f" ({s['min'] / GB:.2f}-{s['max'] / GB:.2f})" if s["rounds"] > 1 else ""
    return f"{s['median'] / GB:.2f}{spread}"


def _count(v: float) -> str:
    return f"{v / 1e3:.0f}k" if v >= 1e4 else f"{v:.0f}"


def _per_s(s: dict) -> str:
    spread = f" ({_count(s['min'])}-{_count(s['max'])})" if s["rounds"] > 1 else ""
    return f"{_count(s['median'])}{spread}"


OPS = {
    "get_slab": "batch_get",
    "get_one_file": "readinto of one file",
    "get_files_cat": "cat of a file per block",
    "get_files_readinto": "open/readinto of each file",
    "put_slab": "batch_put",
    "put_one_file": "pipe_file of one file",
    "put_files": "pipe of a file per block",
    "exists_slab_mixed": "batch_exists, mixed",
    "exists_files_exists_mixed": "fs.exists of each file, mixed",
    "exists_files_ls_mixed": "one fs.ls, mixed",
    "exists_slab_all": "batch_exists, all stored",
    "exists_files_exists_all": "fs.exists of each file, all stored",
    "exists_files_ls_all": "one fs.ls, all stored",
}


def meta_per_batch(fig: dict) -> str:
    """The metaserver calls of one batch and the metaserver's own time in them."""
    n = fig["batches"]
    calls = ", ".join(
        f"{m} {c / n:.4g}" for m, c in sorted(fig["meta_calls"].items(), key=lambda x: -x[1])
    )
    own = sum(fig["meta_seconds"].values()) / n
    return f"{calls or '-'} ({own * 1e3:.2f} ms)"


def print_report(doc: dict, stream=sys.stdout) -> None:
    from emberfs.common.units import format_size

    cfg = doc["config"]
    rounds = cfg["rounds"]
    of = f"median of {rounds} rounds (range)" if rounds > 1 else "one round"
    print(f"\nKV cache block store, {of}; layout: {cfg['layout']['text']}", file=stream)
    w = (58, 22, 24)
    print(
        f"  {'figure':<{w[0]}}{'slab store':<{w[1]}}"
        f"{'one file per block / readinto':<{w[2] + 8}}ratio",
        file=stream,
    )
    for name, case in doc["cases"].items():
        what = "layout" if name == "large" else "small"
        print(
            f"  {format_size(case['block_size'])} blocks ({what}) x {case['blocks']} a batch, GB/s",
            file=stream,
        )
        figs, ratios = case["figures"], case["ratios"]
        for key, a, b, other in CASE_PAIRS:
            op = "batch_get" if a == "get_slab" else "batch_put"
            line = (
                f"    {op + ' / ' + other:<{w[0] - 2}}{_gb(figs[a]):<{w[1]}}"
                f"{_gb(figs[b]):<{w[2] + 8}}{ratio_text(ratios[key])}"
            )
            if name == "large" and key == "get_vs_readinto":
                t = doc["target"]
                met = "met" if t["met"] else "NOT MET"
                line += f"  target >= {t['target']}x: {met} ({t['rounds_met']} of {t['rounds']})"
            print(line, file=stream)
        per = case["inodes_per_block"]
        print(
            f"    {'inodes made per block stored':<{w[0] - 2}}{per['slab']:<{w[1]}.2f}"
            f"{per['files']:<{w[2] + 8}.2f}"
            f"(the cache's slab files, {case['slab_files']} for {case['capacity_blocks']} "
            "blocks, were made with it)",
            file=stream,
        )
    e = doc["exists"]
    print(
        f"  exists, {e['keys']} keys (mixed: the first {e['stored_prefix_of_mixed']} stored, "
        "then misses), keys asked per second",
        file=stream,
    )
    for key, a, b, other in EXISTS_PAIRS:
        q = "all stored" if key.startswith("exists_all") else "mixed"
        print(
            f"    {'batch_exists (' + q + ') / ' + other:<{w[0] - 2}}"
            f"{_per_s(e['figures'][a]):<{w[1]}}{_per_s(e['figures'][b]):<{w[2] + 8}}"
            f"{ratio_text(e['ratios'][key])}",
            file=stream,
        )

    print("\nmetaserver calls per batch (its own time per batch), last round", file=stream)
    for case in doc["cases"].values():
        last = case["rounds"][-1]
        print(f"  {format_size(case['block_size'])} blocks x {case['blocks']}", file=stream)
        for key in (*(f"get_{g}" for g in GETS), *(f"put_{p}" for p in PUTS)):
            print(f"    {OPS[key]:<32}{meta_per_batch(last[key])}", file=stream)
    last = e["rounds"][-1]
    print(f"  exists, {e['keys']} keys", file=stream)
    for key in (f"exists_{w}_{q}" for q in QUERIES for w in EXISTS):
        print(f"    {OPS[key]:<36}{meta_per_batch(last[key])}", file=stream)

    disk: dict[str, list[str]] = {}
    for case in doc["cases"].values():
        for i, r in enumerate(case["rounds"], 1):
            for key in (f"get_{g}" for g in GETS):
                if r[key]["disk_read_bytes"] >= MiB:
                    what = f"{format_size(case['block_size'])} blocks, {OPS[key]}"
                    disk.setdefault(what, []).append(
                        f"{r[key]['disk_read_bytes'] / MiB:.0f} (round {i})"
                    )
    if disk:
        print("\nthe machine read from the disk while these gets ran, MiB", file=stream)
        for what, values in disk.items():
            print(f"  {what:<44}{', '.join(values)}", file=stream)
    loads = [
        o["others_cpu_per_s"] for o in doc["other_processes"] if o["others_cpu_per_s"] is not None
    ]
    m = doc["machine"]
    if loads:
        print(
            f"\nother processes used {statistics.median(loads):.2f} CPUs "
            f"({min(loads):.2f}-{max(loads):.2f}) of {m['nproc']} while the rounds ran "
            f"(load average {m['loadavg_at_start'][0]:.2f} at the start, "
            f"{m['loadavg_at_end'][0]:.2f} at the end)",
            file=stream,
        )
    print(
        f"{doc['seconds']:.0f} s; {m['nproc']} CPUs ({m['cpu'] or 'unknown'}), "
        f"{(m['memory_bytes'] or 0) / (1 << 30):.1f} GiB, kernel {m['kernel']}",
        file=stream,
    )


if __name__ == "__main__":
    sys.exit(main())
