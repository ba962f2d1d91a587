"""The per-machine metadata server: a guest that dies in the middle of a long-poll is not a server error.

A workload blocks on `?wait_for_change=true` and is SIGKILLed when its machine goes down; the server
must drop that request quietly (no "internal error", no strict-mode violation) and free its thread.
"""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import requests
from google.cloud import tpu_v2

from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.conftest import ZONE, metadata_gets_in_flight

POLL_SECONDS = 5  # the long-poll's own timeout; a dropped client must free its thread well before it
KEY = "instance/maintenance-event"


@pytest.fixture
def node_url(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> Iterator[str]:
    tpu.create_node(
        parent=f"projects/{lc.project}/locations/{ZONE}",
        node_id="poller",
        node=tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e"),
    ).result(timeout=10)
    yield f"{lc.api_endpoint}/_machines/tpu-{ZONE}-poller/computeMetadata/v1/{KEY}"


def _etag(url: str) -> str:
    r = requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=5)
    assert r.status_code == 200 and r.text == "NONE"
    return r.headers["ETag"]


def _assert_dropped_quietly(
    lc: RunningLocalCloud, started: float, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    deadline = started + POLL_SECONDS - 1
    while metadata_gets_in_flight() > 0:
        assert time.monotonic() < deadline, "the server kept waiting for a client that is gone"
        time.sleep(0.05)
    time.sleep(0.1)  # let any late write/log of the handler happen before we look
    assert lc.violations == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert "Exception occurred during processing" not in capfd.readouterr().err


def test_killed_long_poller_is_dropped_quietly(
    lc: RunningLocalCloud, node_url: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    etag = _etag(node_url)
    poller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            ("import requests, sys\nrequests.get(sys.argv[1], headers={'Metadata-Flavor': 'Google'}, timeout=60)\n"),
            f"{node_url}?wait_for_change=true&timeout_sec={POLL_SECONDS}&last_etag={etag}",
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while metadata_gets_in_flight() == 0:  # the long-poll has reached the server
            assert time.monotonic() < deadline and poller.poll() is None, "the long-poll never reached the server"
            time.sleep(0.02)
        started = time.monotonic()
        poller.kill()  # SIGKILL, as a machine going down does to its workload
        poller.wait(timeout=5)
    finally:
        if poller.poll() is None:
            poller.kill()
            poller.wait(timeout=5)
    _assert_dropped_quietly(lc, started, caplog, capfd)
    # The server still serves long-polls: one with a stale ETag answers at once.
    fresh = requests.get(
        f"{node_url}?wait_for_change=true&timeout_sec=5&last_etag=stale",
        headers={"Metadata-Flavor": "Google"},
        timeout=5,
    )
    assert fresh.status_code == 200 and fresh.text == "NONE"


def test_reset_connection_is_dropped_quietly(
    lc: RunningLocalCloud, node_url: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """A connection reset (RST, as from a crashed guest kernel) while the answer is pending."""
    etag = _etag(node_url)
    host, port = node_url.split("//", 1)[1].split("/", 1)[0].split(":")
    path = "/" + node_url.split("//", 1)[1].split("/", 1)[1]
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(
        (
            f"GET {path}?wait_for_change=true&timeout_sec={POLL_SECONDS}&last_etag={etag} HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\nMetadata-Flavor: Google\r\n\r\n"
        ).encode()
    )
    deadline = time.monotonic() + 10
    while metadata_gets_in_flight() == 0:
        assert time.monotonic() < deadline, "the long-poll never reached the server"
        time.sleep(0.02)
    time.sleep(0.2)  # the handler is inside the long-poll now
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    started = time.monotonic()
    sock.close()  # linger 0: the close sends RST, the server's next read/write sees ECONNRESET
    _assert_dropped_quietly(lc, started, caplog, capfd)


def test_clients_resetting_mid_request_are_not_violations(
    lc: RunningLocalCloud, node_url: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Clients that reset right after sending: the server meets the reset while reading or writing."""
    host, port = node_url.split("//", 1)[1].split("/", 1)[0].split(":")
    path = "/" + node_url.split("//", 1)[1].split("/", 1)[1]
    for i in range(40):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nMetadata-Flavor: Google\r\n\r\n"
        sock.sendall(request.encode()[: None if i % 2 else 20])  # half of them stop mid request line
        if i % 4 == 1:
            time.sleep(0.002)
        sock.close()
    _assert_dropped_quietly(lc, time.monotonic(), caplog, capfd)
    assert requests.get(node_url, headers={"Metadata-Flavor": "Google"}, timeout=5).text == "NONE"
