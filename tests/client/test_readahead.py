"""The readahead cache's access-pattern logic, over an in-memory byte source."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from emberfs.client.readahead import ReadaheadCache

BS = 1000


class Source:
    """Serves byte ranges of ``data`` as the cache's reader and records every request."""

    def __init__(self, data: bytes, pool: ThreadPoolExecutor) -> None:
        self.data = data
        self.pool = pool
        self.sync: list[tuple[int, int]] = []
        self.blocks: list[tuple[int, int]] = []
        self.into: list[tuple[int, int]] = []
        self.start = None  # start(lo, hi) -> a read sent ahead, or None

    def fetch(self, start, end):
        self.sync.append((start, end))
        return self.data[start:end]

    def submit_block(self, start, end):
        self.blocks.append((start, end))
        return self.pool.submit(lambda: bytearray(self.data[start:end]))

    def submit_into(self, start, view):
        self.into.append((start, start + len(view)))

        def fill():
            view[:] = self.data[start : start + len(view)]

        return [self.pool.submit(fill)]

    def start_block(self, start, end):
        return self.start(start, end) if self.start is not None else None

    def release(self, buf):
        pass


@pytest.fixture
def source():
    with ThreadPoolExecutor(4) as pool:
        yield Source(os.urandom(20 * BS + 123), pool)


def make(source, depth=4, start=None):
    source.start = start
    return ReadaheadCache(BS, source.fetch, len(source.data), reader=source, depth=depth)


def test_registered_as_fsspec_cache():
    from fsspec.caching import caches

    assert caches["emberfs"] is ReadaheadCache


def test_random_reads_fetch_exactly_what_is_asked(source):
    cache = make(source)
    d = source.data
    for start, end in [(20000, 20008), (19000, 19100), (5, 10), (7000, 7001)]:
        assert cache._fetch(start, end) == d[start:end]
    assert source.sync == [(20000, 20008), (19000, 19100), (5, 10), (7000, 7001)]
    assert source.blocks == []


def test_sequential_reads_grow_the_window_up_to_depth(source):
    cache = make(source, depth=4)
    d = source.data
    pos, out = 0, bytearray()
    sizes = []
    while pos < len(d):
        part = cache._fetch(pos, pos + 300)
        out += part
        pos += len(part)
        sizes.append(cache.held)
    assert out == d
    assert source.sync == [(0, 300)]  # only the first read was exact
    fetched = sorted(source.blocks)
    assert fetched == sorted(set(fetched))  # every block fetched once
    assert fetched[-1][1] == len(d)
    assert max(sizes) <= 4 + 2  # depth ahead of the (at most two) blocks being read


def test_readinto_direct_then_from_blocks(source):
    cache = make(source, depth=2)
    d = source.data
    buf = bytearray(2500)
    assert cache.readinto(0, memoryview(buf)) == 2500 and buf == d[:2500]
    assert source.into == [(0, 2500)]
    buf2 = bytearray(2500)
    assert cache.readinto(2500, memoryview(buf2)) == 2500 and buf2 == d[2500:5000]
    assert source.blocks  # sequential: readahead started
    tail = bytearray(100_000)
    n = cache.readinto(5000, memoryview(tail))
    assert n == len(d) - 5000 and tail[:n] == d[5000:]
    assert cache.readinto(len(d), memoryview(bytearray(10))) == 0


def test_failed_block_is_refetched(source):
    cache = make(source, depth=2)
    calls = {"n": 0}
    real = source.submit_block

    def flaky(start, end):
        calls["n"] += 1
        if calls["n"] == 2:
            fut = source.pool.submit(lambda: (_ for _ in ()).throw(OSError(5, "boom")))
            return fut
        return real(start, end)

    source.submit_block = flaky
    d = source.data
    cache._fetch(0, 10)
    out = []
    pos = 10
    with pytest.raises(OSError):
        while pos < len(d):
            part = cache._fetch(pos, pos + 500)
            out.append(part)
            pos += len(part)
    # the reader retries the same range and gets the right bytes
    assert cache._fetch(pos, pos + 500) == d[pos : pos + 500]


def test_without_submitters_it_is_a_plain_cache(source):
    cache = ReadaheadCache(BS, source.fetch, len(source.data))
    assert cache._fetch(0, 10) == source.data[:10]
    assert cache._fetch(10, 20) == source.data[10:20]
    buf = bytearray(50)
    assert cache.readinto(20, memoryview(buf)) == 50 and buf == source.data[20:70]


class SentRead:
    """A read sent ahead: ``finish_into`` fills the caller's view, or fails once asked to."""

    def __init__(self, source, start, end, ok=True):
        self.source, self.start, self.end, self.ok = source, start, end, ok
        self.cancelled = False

    def finish_into(self, view):
        if not self.ok:
            return False
        view[:] = self.source.data[self.start : self.end]
        self.source.received.append((self.start, self.end))
        return True

    def cancel(self):
        self.cancelled = True


def test_readinto_stream_receives_sent_blocks_in_place(source):
    source.received = []
    sent = []

    def start(lo, hi):
        read = SentRead(source, lo, hi, ok=(lo // BS) % 3 != 2)  # every third one fails
        sent.append(read)
        return read

    cache = make(source, start=start)
    d = source.data
    out = bytearray()
    buf = bytearray(BS)
    pos = 0
    while n := cache.readinto(pos, memoryview(buf)):
        out += buf[:n]
        pos += n
    assert out == d
    assert source.received  # blocks came straight from the sent reads
    assert not source.blocks  # and none went through a block buffer
    failed = {r.start for r in sent if not r.ok}
    assert failed and {s for s, _ in source.into} >= failed  # failures were fetched again
    cache.close()
    unused = [r for r in sent if (r.start, r.end) not in source.received and r.ok]
    assert all(r.cancelled for r in unused)


# SharedReadahead: the reads of one sequential reader as a FUSE kernel sends them ---------------


def _kernel_reads(size: int, request: int, window: int, seed: int) -> list[tuple[int, int]]:
    """Requests of ``request`` bytes covering the file, shuffled within each ``window``."""
    import random

    rng = random.Random(seed)
    out = []
    for w in range(0, size, window):
        part = [(o, min(request, size - o)) for o in range(w, min(size, w + window), request)]
        rng.shuffle(part)
        out.extend(part)
    return out


@pytest.mark.parametrize("threads", [1, 6])
def test_shared_readahead_fetches_each_block_once_from_reordered_concurrent_reads(threads):
    from emberfs.client.readahead import SharedReadahead

    size = 64 * BS + 321
    with ThreadPoolExecutor(4) as pool:
        src = Source(os.urandom(size), pool)
        ra = SharedReadahead(src, 4 * BS, size, depth=4, window=16 * BS)
        reads = _kernel_reads(size, BS, 16 * BS, seed=threads)

        def read(req):
            start, n = req
            buf = bytearray(n)
            assert ra.readinto(start, memoryview(buf)) == n
            return start, bytes(buf)

        # as the kernel sends them: a window's reads at once, the next window's while the
        # last one is in flight (never more than two windows outstanding)
        per_window = 16
        with ThreadPoolExecutor(threads) as callers:
            windows = [reads[i : i + per_window] for i in range(0, len(reads), per_window)]
            previous: list = []
            for window in windows:
                current = [callers.submit(read, req) for req in window]
                for fut in previous:
                    start, got = fut.result()
                    assert got == src.data[start : start + len(got)]
                previous = current
            for fut in previous:
                start, got = fut.result()
                assert got == src.data[start : start + len(got)]
        fetched = sum(hi - lo for lo, hi in src.blocks) + sum(hi - lo for lo, hi in src.into)
        assert fetched <= size + 4 * BS, (fetched, size)  # each block once (and one spare)
        assert all(served < length for served, length in ra.held())
        ra.close()


def test_shared_readahead_seek_reads_only_what_is_asked():
    from emberfs.client.readahead import SharedReadahead

    size = 64 * BS
    with ThreadPoolExecutor(4) as pool:
        src = Source(os.urandom(size), pool)
        ra = SharedReadahead(src, 4 * BS, size, depth=4, window=8 * BS)
        for start in (50 * BS, 3 * BS, 30 * BS + 7):
            buf = bytearray(100)
            assert ra.readinto(start, memoryview(buf)) == 100
            assert bytes(buf) == src.data[start : start + 100]
        assert src.blocks == [] and len(src.into) == 3
        ra.resize(10)
        assert ra.readinto(5, memoryview(bytearray(100))) == 5
