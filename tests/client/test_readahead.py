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
        sizes.append(len(cache._blocks))
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
