"""A client load for failover tests: writers (with renames) and a reader, every write remembered.

:class:`WriteReadLoad` runs on one fsspec filesystem while a test kills servers. Each writer
writes files of 64 KiB to 448 KiB under ``prefix``, renaming every fifth; the reader reads back
the newest ones. A write counts once ``pipe_file`` (and the rename) returned; any error that
reaches the application is kept in :attr:`errors`, and :meth:`verify` reads every acknowledged
file back at the end.
"""

from __future__ import annotations

import threading
import time


def content(name: str, size: int) -> bytes:
    """The bytes a file named ``name`` is written with: its name over and over."""
    return (name.encode() * (size // len(name) + 1))[:size]


class WriteReadLoad:
    """``writers`` writer threads and one reader thread on ``fs`` under ``prefix``."""

    def __init__(self, fs, prefix: str, writers: int = 2) -> None:
        self.fs = fs
        self.prefix = prefix.rstrip("/")
        self.errors: list[BaseException] = []
        self.written: dict[str, tuple[str, int]] = {}  # path -> (name it was made of, size)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._write, args=(w,), daemon=True) for w in range(writers)
        ]
        self._threads.append(threading.Thread(target=self._read, daemon=True))

    def __len__(self) -> int:
        with self._lock:
            return len(self.written)

    def start(self) -> WriteReadLoad:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 120.0) -> None:
        """Stop the threads; AssertionError when one hangs."""
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)
        assert not any(t.is_alive() for t in self._threads), "a client hung"

    def _write(self, w: int) -> None:
        i = 0
        while not self._stop.is_set():
            name = path = f"{self.prefix}/w{w}/f{i}"
            size = 64 * 1024 * (1 + i % 7)
            try:
                self.fs.pipe_file(path, content(name, size))
                if i % 5 == 4:
                    self.fs.mv(path, path + ".moved")
                    path += ".moved"
            except BaseException as exc:  # reported by the test
                self.errors.append(exc)
                return
            with self._lock:
                self.written[path] = (name, size)
            i += 1

    def _read(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                items = list(self.written.items())[-20:]
            for path, (name, size) in items:
                try:
                    assert self.fs.cat_file(path) == content(name, size), path
                    assert self.fs.info(path)["size"] == size, path
                except BaseException as exc:
                    self.errors.append(exc)
                    return
            time.sleep(0.05)

    def verify(self) -> None:
        """No error reached the application, and every acknowledged write reads back."""
        assert not self.errors, (
            f"{len(self.errors)} errors reached the application: {self.errors[:3]!r}"
        )
        with self._lock:
            items = list(self.written.items())
        for path, (name, size) in items:
            assert self.fs.cat_file(path) == content(name, size), path
