"""The readahead cache against a byte model: random seeks, reads and readintos.

A ``ReadaheadCache`` over an in-memory file (block sizes and file sizes at and
around each other, multiples of the block size and not) is driven the way
``EmberFile`` drives it: ``read(n)`` is ``_fetch(pos, pos + n)`` (the fsspec
cache call), ``readinto`` is ``readinto(pos, buffer)``, and ``seek`` moves the
position. Its reader (or none: every read synchronous) is in memory and
deterministic: block fetches (``submit_block``) finish at once or only when
their result is asked for, some fail once; ``submit_into`` fills the caller's
view; ``start_block`` sends no read, or returns stand-ins of sent reads, some of
which fail when finished.
Every call must give the file's bytes at the position, no fetcher may be asked
for a range outside the file, and once the cache is closed every read sent ahead
has been received or given up and every block fetch used or cancelled.
"""

from __future__ import annotations

import random
from concurrent.futures import Future

from hypothesis import example, given, note
from hypothesis import strategies as st

from emberfs.client.buffers import BlockPool
from emberfs.client.readahead import ReadaheadCache


class Lazy:
    """A block fetch that runs when its result is first asked for (cancellable until then)."""

    def __init__(self, fn) -> None:
        self._fn = fn
        self._done = False
        self._cancelled = False
        self._value = None
        self._error: BaseException | None = None

    def _run(self) -> None:
        if not self._done:
            assert not self._cancelled, "a cancelled fetch was used"
            self._done = True
            try:
                self._value = self._fn()
            except BaseException as exc:  # kept for result() and exception()
                self._error = exc

    def result(self):
        self._run()
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self):
        self._run()
        return self._error

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> bool:
        if self._done:
            return False
        self._cancelled = True
        return True


def finished(fn) -> Future:
    fut: Future = Future()
    try:
        fut.set_result(fn())
    except OSError as exc:
        fut.set_exception(exc)
    return fut


class SentRead:
    """A stand-in of a sent read: ``finish_into`` fills the view, or fails (False)."""

    def __init__(self, source: Source, start: int, end: int, ok: bool) -> None:
        self.source, self.start, self.end, self.ok = source, start, end, ok
        self.finished = self.cancelled = False

    def finish_into(self, view) -> bool:
        assert not (self.finished or self.cancelled), "a sent read is used once"
        self.finished = True
        assert len(view) == self.end - self.start
        if not self.ok:
            return False
        view[:] = self.source.data[self.start : self.end]
        return True

    def cancel(self) -> None:
        assert not self.finished, "a finished sent read was cancelled"
        self.cancelled = True


class Source:
    """The file's bytes and a block reader over them; records every range asked for."""

    def __init__(
        self,
        data: bytes,
        *,
        lazy: bool,
        failing: set[int],
        blocksize: int,
        start: str = "none",
        failing_sent: int = 0,
    ) -> None:
        self.data = data
        self.start_mode = start  # "sent": reads sent ahead; "none": never
        self.failing_sent = failing_sent  # every k-th sent block fails (0: none)
        self.lazy = lazy
        self.failing = set(failing)  # block indexes whose first fetch fails
        self.blocksize = blocksize
        self.asked: list[tuple[str, int, int]] = []
        self.sent: list[SentRead] = []
        self.fetches: list = []
        self.pool = BlockPool(8 * blocksize)

    def _ask(self, what: str, start: int, end: int) -> None:
        self.asked.append((what, start, end))

    def fetch(self, start: int, end: int) -> bytes:
        self._ask("fetch", start, end)
        return self.data[start:end]

    def submit_block(self, start: int, end: int):
        self._ask("submit", start, end)
        block = start // self.blocksize

        def fill() -> bytearray:
            if block in self.failing:
                self.failing.discard(block)
                raise OSError(5, f"block {block} failed once")
            buf = self.pool.get(end - start)
            buf[:] = self.data[start:end]
            return buf

        fut = Lazy(fill) if self.lazy else finished(fill)
        self.fetches.append(fut)
        return fut

    def submit_into(self, start: int, view) -> list[Future]:
        self._ask("submit_into", start, start + len(view))
        view[:] = self.data[start : start + len(view)]
        return [finished(lambda: None)]

    def start_block(self, lo: int, hi: int) -> SentRead | None:
        if self.start_mode == "none":
            return None
        self._ask("start", lo, hi)
        k = self.failing_sent
        read = SentRead(self, lo, hi, ok=k == 0 or (lo // self.blocksize) % k != 0)
        self.sent.append(read)
        return read

    def release(self, buf) -> None:
        self.pool.put(buf)


def positions(blocksize: int, limit: int) -> st.SearchStrategy[int]:
    near = sorted(
        {p + d for p in range(0, limit + 1, blocksize) for d in (-1, 0, 1) if 0 <= p + d <= limit}
    )
    return st.one_of(st.sampled_from(near), st.integers(0, limit))


def lengths(blocksize: int) -> st.SearchStrategy[int]:
    near = [n for k in (1, 2, 3) for n in (k * blocksize - 1, k * blocksize, k * blocksize + 1)]
    return st.one_of(st.sampled_from(near), st.integers(1, 16), st.integers(1, 3 * blocksize))


@st.composite
def scenarios(draw, streaming: bool = False):
    """A file and its cache's configuration, and the calls made on it.

    ``streaming``: a reader, reads ahead sent where they can be, and long runs
    of calls of a block or so each (the readahead's pipeline).
    """
    blocksize = draw(st.sampled_from([512, 1000, 4096]))
    blocks = draw(st.integers(1, 3) | st.integers(0, 6))
    # a multiple of the block size, one byte off, or anything
    off = draw(st.just(0) | st.sampled_from([-1, 1]) | st.integers(-blocksize, blocksize))
    size = max(0, blocks * blocksize + off)
    config = {
        "blocksize": blocksize,
        "size": size,
        "depth": draw(st.integers(1 if streaming else 0, 4)),
        "reader": streaming or draw(st.booleans() | st.just(True)),
        "start": "sent" if streaming else draw(st.sampled_from(["sent", "none"])),
        "failing_sent": draw(st.sampled_from([0, 2, 3])),  # every k-th sent block fails (0: none)
        "lazy": draw(st.booleans()),
        "failing": draw(st.sets(st.integers(0, blocks), max_size=2)),
    }
    times = st.integers(1, 8) if streaming else st.integers(1, 2) | st.integers(1, 8)
    seeks = [
        st.tuples(st.just("seek"), positions(blocksize, size + blocksize)),
        st.tuples(st.just("seek"), st.integers(max(0, size - 2 * blocksize), size)),  # the tail
    ]
    reads = [
        st.tuples(st.just("read"), lengths(blocksize), times),
        st.tuples(st.just("readinto"), lengths(blocksize), times),
    ]
    if streaming:
        reads.append(st.tuples(st.just("readinto"), st.integers(blocksize, 2 * blocksize), times))
    ops = st.one_of(*seeks, *reads)
    return config, draw(st.lists(ops, min_size=2, max_size=20))


SMALL_READS_AT_THE_END = (
    {
        "blocksize": 512,
        "size": 1024,  # a multiple of the block size
        "depth": 2,
        "reader": True,
        "start": "none",
        "failing_sent": 0,
        "lazy": False,
        "failing": set(),
    },
    [("seek", 1000), ("read", 8, 4)],
)


@given(scenarios())
@example(SMALL_READS_AT_THE_END)
def test_reads_give_the_files_bytes(scenario):
    check(*scenario)


@given(scenarios(streaming=True))
def test_streams_read_ahead_give_the_files_bytes(scenario):
    check(*scenario)


def check(config: dict, ops: list) -> None:
    note(f"{config}; ops: {ops!r}")
    bs, size = config["blocksize"], config["size"]
    data = random.Random(size).randbytes(size)
    source = Source(
        data,
        lazy=config["lazy"],
        failing=config["failing"],
        blocksize=bs,
        start=config["start"],
        failing_sent=config["failing_sent"],
    )
    reader = source if config["reader"] else None
    cache = ReadaheadCache(bs, source.fetch, size, reader=reader, depth=config["depth"])
    pos = 0
    calls = []
    for op, *args in ops:
        calls += [(op, args[0])] if op == "seek" else [(op, args[0])] * args[1]
    for op, arg in calls:
        if op == "seek":
            pos = arg
            continue
        # a read whose block fetch failed raises; read again, it gets the bytes (each of the
        # failing blocks fails once)
        for attempt in range(len(config["failing"]) + 1):
            try:
                if op == "read":
                    got = cache._fetch(pos, pos + arg)
                else:
                    buf = bytearray(b"\xee" * arg)
                    n = cache.readinto(pos, memoryview(buf))
                    assert n == len(data[pos : pos + arg]), (op, pos, arg, n)
                    got = bytes(buf[:n])
                break
            except OSError:
                if attempt == len(config["failing"]):
                    raise
        assert got == data[pos : pos + arg], (op, pos, arg)
        pos += len(got)
        outside = [(what, lo, hi) for what, lo, hi in source.asked if not 0 <= lo < hi <= size]
        assert not outside, f"asked for ranges outside the {size}-byte file: {outside}"
    cache.close()
    # every read sent ahead was received or given up: none is left holding its connection;
    # every block fetch was used or cancelled: none runs on for nobody
    assert all(r.finished or r.cancelled for r in source.sent)
    assert all(f.done() or f.cancelled() for f in source.fetches)
