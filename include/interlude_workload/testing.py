"""A real GCS emulator process for tests and demos (``gcp-storage-emulator`` on a free 127.0.0.1 port).

Tests of the checkpoint contract must exercise a real GCS JSON API through the real client, not a mock
of it; this starts one and stops it (its whole process group) afterwards.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.cloud import storage

from interlude_workload.gcs import EMULATOR_ENV, storage_client

if TYPE_CHECKING:
    from interlude_workload.checkpoints import CheckpointStore


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class GcsEmulator:
    endpoint: str
    process: subprocess.Popen[bytes]

    def client(self) -> storage.Client:
        """A client bound to this emulator (independent of the current environment)."""
        previous = os.environ.get(EMULATOR_ENV)
        os.environ[EMULATOR_ENV] = self.endpoint
        try:
            return storage_client()
        finally:
            if previous is None:
                os.environ.pop(EMULATOR_ENV, None)
            else:
                os.environ[EMULATOR_ENV] = previous

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(name)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


@contextmanager
def running_gcs_emulator(startup_timeout: float = 30.0) -> Iterator[GcsEmulator]:
    """Start ``gcp-storage-emulator`` (in memory) and yield it once it answers HTTP."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "interlude_localcloud.gcs_emulator",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--in-memory",
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    emulator = GcsEmulator(endpoint=endpoint, process=process)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"gcp-storage-emulator exited with {process.returncode}")
            try:
                urllib.request.urlopen(f"{endpoint}/storage/v1/b?project=p", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("gcp-storage-emulator did not start") from None
                time.sleep(0.1)
        yield emulator
    finally:
        emulator.stop()


def clone_step(source: CheckpointStore, step: int, target: CheckpointStore) -> int:
    """Copy every object of one Orbax step (saved for real, by Orbax) to the same step of another stage, markers
    last as Orbax writes them; returns the objects copied.

    For tests and benchmarks that need many stages with a committed step: one real save, then plain copies, where a
    save per stage costs Orbax's ~0.1-0.3 s and is not thread-safe across endpoints (Orbax takes its endpoint from
    the process environment). A copy restores like the original: OCDBT names its data files relative to the item.
    """
    from interlude_workload import orbax_layout

    status = source.scan_step(step)
    if status is None or not status.committed:
        raise ValueError(f"{source.uri(step)} is not a finalised step")
    names = list(reversed(orbax_layout.deletion_order(status.objects)))  # the markers last
    for name in names:
        data = status.objects[name].download_as_bytes()
        target.bucket.blob(target.step_prefix(step) + name).upload_from_string(data)
    return len(names)
