"""Child processes of a local cluster: how to run ``emberfs``, and one started service."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def emberfs_command() -> list[str]:
    """How to run the ``emberfs`` command of this installation."""
    script = Path(sys.executable).parent / "emberfs"
    if script.exists():
        return [str(script)]
    found = shutil.which("emberfs")
    if found:
        return [found]
    return [sys.executable, "-m", "emberfs.cli.main"]


@dataclass
class Service:
    """One child process and where its output goes."""

    name: str
    argv: list[str]
    log: Path
    ready_prefix: str
    proc: subprocess.Popen | None = None
    ready_line: str = ""
    _log_offset: int = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, env: dict[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log.stat().st_size if self.log.exists() else 0
        out = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        finally:
            out.close()
        self.ready_line = ""

    def wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log, "rb") as f:
                f.seek(self._log_offset)
                for raw in f.read().decode(errors="replace").splitlines():
                    if raw.startswith(self.ready_prefix):
                        self.ready_line = raw.strip()
                        return self.ready_line
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}"
                )
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-n:])

    def signal(self, sig: int) -> None:
        if self.running:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
