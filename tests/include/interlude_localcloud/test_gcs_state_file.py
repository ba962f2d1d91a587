"""The local GCS keeps what was written across a restart on the same data dir, though it writes its state file at
most every FLUSH_SECONDS: on SIGTERM (how the local cloud stops it) it writes it before exiting, and while it runs
a burst of writes is on disk within a flush interval. Checked with the real client against real emulator
processes started on one directory, the way the demo's serving part reads what `make demo` left."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from interlude_localcloud.gcs import GcsEmulator
from interlude_localcloud.gcs_emulator import FLUSH_SECONDS


def _client(endpoint: str) -> storage.Client:
    return storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint})


def _contents(endpoint: str, bucket: str) -> dict[str, bytes]:
    client = _client(endpoint)
    # By name, not the listed blob's mediaLink: the emulator keeps the link with the port it was written through.
    return {b.name: client.bucket(bucket).blob(b.name).download_as_bytes() for b in client.list_blobs(bucket)}


def test_a_burst_of_writes_survives_a_sigterm_and_a_restart(tmp_path: Path) -> None:
    first = GcsEmulator(0, tmp_path / "gcs")
    first.start()
    try:
        bucket = _client(first.endpoint).create_bucket("state")
        written = {f"o/{i:03d}": f"v{i}".encode() for i in range(60)}
        for name, data in written.items():  # faster than one flush interval apart
            bucket.blob(name).upload_from_string(data)
        bucket.blob("o/000").upload_from_string(b"rewritten")
        bucket.blob("o/001").delete()
    finally:
        first.stop()  # SIGTERM, as the local cloud stops it
    assert first.proc is None
    expected = {**written, "o/000": b"rewritten"}
    del expected["o/001"]

    second = GcsEmulator(0, tmp_path / "gcs")
    second.start()
    try:
        assert _contents(second.endpoint, "state") == expected
    finally:
        second.stop()


def test_writes_reach_the_state_file_within_a_flush_interval_even_if_killed(tmp_path: Path) -> None:
    first = GcsEmulator(0, tmp_path / "gcs")
    first.start()
    assert first.proc is not None
    try:
        bucket = _client(first.endpoint).create_bucket("state")
        bucket.blob("kept").upload_from_string(b"on disk")
        time.sleep(FLUSH_SECONDS * 4)
        os.killpg(first.proc.pid, signal.SIGKILL)  # no chance to write anything at exit
        first.proc.wait()
    finally:
        first.stop()
    second = GcsEmulator(0, tmp_path / "gcs")
    second.start()
    try:
        assert _contents(second.endpoint, "state") == {"kept": b"on disk"}
    finally:
        second.stop()
