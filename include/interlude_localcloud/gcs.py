"""The GCS side of the local cloud: gcp-storage-emulator as a child process on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


class GcsEmulator:
    """Runs `gcp-storage-emulator start` in its own process group (stopped with the cloud)."""

    def __init__(self, port: int, data_dir: Path | None = None) -> None:
        self.port = port or free_port()
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "interlude_localcloud.gcs_emulator"]
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            cmd += ["--data-dir", str(self.data_dir)]
        cmd += ["start", "--host", "127.0.0.1", "--port", str(self.port), "--quiet"]
        if self.data_dir is None:
            cmd.append("--in-memory")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            wait_for_port(self.port)
        except TimeoutError:
            self.stop()
            raise

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
