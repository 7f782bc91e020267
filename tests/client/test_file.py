"""EmberFile: reading (readahead, readinto, streaming) and writing (chunks, append, xb)."""

from __future__ import annotations

import io
import os

import pytest

from emberfs.client.readahead import ReadaheadCache

MiB = 1024 * 1024


@pytest.fixture
def blob(fs, base):
    data = os.urandom(13 * MiB + 4321)
    path = f"{base}/blob"
    fs.pipe_file(path, data)
    return path, data


def test_open_costs_one_call_and_knows_the_size(fs, blob):
    path, data = blob
    calls = []
    meta = fs.client.meta
    original = meta.meta

    def counting(method, request, p=None):
        calls.append(method)
        return original(method, request, p)

    meta.meta = counting
    try:
        with fs.open(path, "rb") as f:
            assert f.size == len(data)
            assert f.read(10) == data[:10]
            assert f.info()["size"] == len(data)
    finally:
        meta.meta = original
    assert calls == ["Open"]


def test_sequential_read_seek_tell(fs, blob):
    path, data = blob
    with fs.open(path, "rb") as f:
        assert isinstance(f.cache, ReadaheadCache)
        out = bytearray()
        while chunk := f.read(300_000):
            out += chunk
        assert out == data and f.tell() == len(data)
        f.seek(-10, 2)
        assert f.read() == data[-10:]
        f.seek(5 * MiB - 3)
        assert f.read(6) == data[5 * MiB - 3 : 5 * MiB + 3]
        f.seek(100, 1)
        assert f.tell() == 5 * MiB + 103
        f.seek(0)
        assert f.read() == data
        assert f.read() == b""


def test_readinto_fills_callers_buffer(fs, blob):
    path, data = blob
    with fs.open(path, "rb") as f:
        buf = bytearray(6 * MiB)
        assert f.readinto(buf) == 6 * MiB and buf == data[: 6 * MiB]
        small = bytearray(1000)
        assert f.readinto(small) == 1000 and small == data[6 * MiB : 6 * MiB + 1000]
        rest = bytearray(len(data))
        n = f.readinto(memoryview(rest))
        assert n == len(data) - 6 * MiB - 1000
        assert rest[:n] == data[6 * MiB + 1000 :]
        assert f.readinto(bytearray(10)) == 0


def test_random_small_reads_do_not_read_ahead(fs, blob):
    path, data = blob
    with fs.open(path, "rb") as f:
        cache = f.cache
        for offset in (len(data) - 8, len(data) - 5000, 7 * MiB + 1, 123):
            f.seek(offset)
            assert f.read(8) == data[offset : offset + 8]
            assert not cache.held  # nothing fetched beyond what was asked
        assert cache.total_requested_bytes == 32
        # reading on from where the last read ended starts the pipeline
        f.seek(0)
        f.read(100)
        f.read(100)
        assert cache.held


def test_readline_and_iteration(fs, base):
    lines = [f"line {i} {'x' * (i % 97)}\n".encode() for i in range(100_000)]
    payload = b"".join(lines)
    fs.pipe_file(f"{base}/text", payload)
    with fs.open(f"{base}/text", "rb") as f:
        assert f.readline() == lines[0]
        assert f.readline() == lines[1]
        assert list(f) == lines[2:]
    with fs.open(f"{base}/text", "r") as f:
        assert f.read() == payload.decode()


def test_streaming_mode_block_size_zero(fs, blob):
    path, data = blob
    with fs.open(path, "rb", block_size=0) as f:
        assert not isinstance(f.cache, ReadaheadCache)
        assert f.read(10) == data[:10]
        buf = bytearray(5 * MiB)
        assert f.readinto(buf) == 5 * MiB and buf == data[10 : 10 + 5 * MiB]
        assert f.read() == data[10 + 5 * MiB :]


def test_other_fsspec_cache_types_work(fs, blob):
    path, data = blob
    for cache_type in ("bytes", "readahead", "none", "blockcache"):
        with fs.open(path, "rb", cache_type=cache_type) as f:
            f.seek(3 * MiB)
            assert f.read(2 * MiB) == data[3 * MiB : 5 * MiB]


def test_write_unaligned_pieces(fs, base):
    data = os.urandom(10 * MiB + 17)
    rng = io.BytesIO(data)
    with fs.open(f"{base}/w", "wb") as f:
        sizes = [1, 1000, 3 * MiB, 7, 4 * MiB + 5, MiB]
        i = 0
        while chunk := rng.read(sizes[i % len(sizes)]):
            # mix immutable bytes and mutable buffers that are reused afterwards
            if i % 2:
                buf = bytearray(chunk)
                f.write(buf)
                buf[:] = b"\0" * len(buf)
            else:
                f.write(chunk)
            i += 1
        assert f.tell() == len(data)
    assert fs.info(f"{base}/w")["size"] == len(data)
    assert fs.cat_file(f"{base}/w") == data


def test_write_empty_and_overwrite_shorter(fs, base):
    with fs.open(f"{base}/e", "wb"):
        pass
    assert fs.info(f"{base}/e")["size"] == 0
    fs.pipe_file(f"{base}/e", os.urandom(6 * MiB))
    fs.pipe_file(f"{base}/e", b"short")
    assert fs.cat_file(f"{base}/e") == b"short"


def test_append(fs, base):
    first = os.urandom(5 * MiB + 1)
    fs.pipe_file(f"{base}/a", first)
    more = os.urandom(4 * MiB + 9)
    with fs.open(f"{base}/a", "ab") as f:
        assert f.tell() == len(first)
        f.write(more[:100])
        f.write(more[100:])
    assert fs.cat_file(f"{base}/a") == first + more
    with fs.open(f"{base}/new-by-append", "ab") as f:
        f.write(b"fresh")
    assert fs.cat_file(f"{base}/new-by-append") == b"fresh"


def test_exclusive_create(fs, base):
    with fs.open(f"{base}/x", "xb") as f:
        f.write(b"once")
    with pytest.raises(FileExistsError):
        fs.open(f"{base}/x", "xb")
    assert fs.cat_file(f"{base}/x") == b"once"


def test_text_mode_and_bad_modes(fs, base):
    with fs.open(f"{base}/t.txt", "w") as f:
        f.write("héllo\nwörld\n")
    with fs.open(f"{base}/t.txt", "r") as f:
        assert f.readlines() == ["héllo\n", "wörld\n"]
    with pytest.raises(ValueError):
        fs.open(f"{base}/t.txt", "r+b")
    with fs.open(f"{base}/t.txt", "rb") as f, pytest.raises(ValueError):
        f.write(b"x")
    with fs.open(f"{base}/t2", "wb") as f, pytest.raises(OSError):
        f.seek(0)


def test_a_large_buffer_goes_out_from_itself_and_is_free_once_write_returns(fs, base, monkeypatch):
    from emberfs.client.writer import BORROW_MIN

    buf = bytearray(os.urandom(BORROW_MIN + 3 * MiB + 5))
    want = bytes(buf)
    borrowed = []
    real = fs.client.files.submit_write

    def tracking(h, offset, data):
        borrowed.append(isinstance(data, memoryview) and data.obj is buf)
        return real(h, offset, data)

    monkeypatch.setattr(fs.client.files, "submit_write", tracking)
    with fs.open(f"{base}/borrowed", "wb") as f:
        f.write(b"x" * 100)  # up to the chunk boundary the buffer's bytes are copied
        f.write(buf)
        buf[:] = bytes(len(buf))  # the caller reuses its buffer as soon as write returns
    assert fs.cat_file(f"{base}/borrowed") == b"x" * 100 + want
    assert sum(borrowed) == (len(want) + 100) // (4 * MiB) - 1  # the whole chunks after the first


def test_writes_in_flight_are_bounded(fs, base, monkeypatch):
    seen = []
    real = fs.client.files.submit_write

    def tracking(h, offset, data):
        fut = real(h, offset, data)
        seen.append(fut)
        pending = sum(not x.done() for x in seen)
        assert pending <= fs.write_depth
        return fut

    monkeypatch.setattr(fs.client.files, "submit_write", tracking)
    chunks = fs.write_depth + 2  # more chunks than may be in flight
    data = os.urandom(chunks * 4 * MiB)
    with fs.open(f"{base}/bounded", "wb") as f:
        for i in range(0, len(data), MiB):
            f.write(data[i : i + MiB])
    assert len(seen) == chunks
    assert fs.cat_file(f"{base}/bounded") == data


def _count_sent_reads(monkeypatch) -> dict:
    """Count reads sent ahead (``start_read``) and those received in place."""
    from emberfs.client import datapath, lanes

    stats = {"sent": 0, "received": 0}
    real_start = datapath.DataClient.start_read
    real_finish = lanes.PendingRead.finish_into

    def start(self, *args, **kwargs):
        pending = real_start(self, *args, **kwargs)
        stats["sent"] += pending is not None
        return pending

    def finish(self, out):
        ok = real_finish(self, out)
        stats["received"] += ok
        return ok

    monkeypatch.setattr(datapath.DataClient, "start_read", start)
    monkeypatch.setattr(lanes.PendingRead, "finish_into", finish)
    return stats


def _nothing_held(fs) -> bool:
    """No sent read outstanding and every open data connection idle in the pool."""
    data = fs.client.runtime().data
    pool = data.pool
    return pool.all_idle() and data.lanes.sent() == 0


def _wait_nothing_held(fs, seconds: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not _nothing_held(fs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_readinto_stream_receives_reads_sent_ahead_in_place(fs, blob, monkeypatch):
    path, data = blob
    stats = _count_sent_reads(monkeypatch)
    out = bytearray()
    with fs.open(path, "rb") as f:
        buf = bytearray(f.handle.chunk_size)
        while n := f.readinto(buf):
            out += buf[:n]
    assert out == data
    assert stats["sent"] >= 1 and stats["received"] >= 1
    assert _wait_nothing_held(fs)


def test_a_sent_read_that_fails_falls_back_to_a_fetch(fs, blob, monkeypatch):
    from emberfs.client import lanes

    path, data = blob
    failed = []

    def failing(self, out):
        out[:] = bytes(len(out))  # whatever it wrote must be overwritten
        self.cancel()
        failed.append(len(out))
        return False

    monkeypatch.setattr(lanes.PendingRead, "finish_into", failing)
    out = bytearray()
    with fs.open(path, "rb") as f:
        buf = bytearray(f.handle.chunk_size)
        while n := f.readinto(buf):
            out += buf[:n]
    assert out == data and failed
    assert _wait_nothing_held(fs)


def test_closing_early_gives_the_connections_of_sent_reads_back(fs, blob, monkeypatch):
    path, data = blob
    stats = _count_sent_reads(monkeypatch)
    with fs.open(path, "rb") as f:
        buf = bytearray(f.handle.chunk_size)
        assert f.readinto(buf) == len(buf) and buf == data[: len(buf)]
        assert f.readinto(buf) == len(buf)  # sequential now: the next block is sent ahead
        assert stats["sent"] >= 1 and fs.client.runtime().data.lanes.sent() > 0
    assert stats["received"] == 0
    assert _wait_nothing_held(fs)
    # a mixed read after that still sees the right bytes
    with fs.open(path, "rb") as f:
        buf = bytearray(f.handle.chunk_size)
        f.readinto(buf)
        f.readinto(buf)
        assert f.read(10) == data[2 * len(buf) : 2 * len(buf) + 10]
        f.seek(0)
        assert f.read() == data
