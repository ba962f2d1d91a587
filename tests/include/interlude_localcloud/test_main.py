"""`python -m interlude_localcloud`: ready line, GCS emulator, clean stop on SIGTERM (machines too)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from interlude_localcloud.gcs import free_port
from interlude_localcloud.testing import Admin


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cli_serves_and_stops_cleanly(tmp_path: Path) -> None:
    port, gcs_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "interlude_localcloud",
            "--port",
            str(port),
            "--gcs-port",
            str(gcs_port),
            "--scenario",
            "tpu_capacity_one",
            "--state-dir",
            str(tmp_path),
            "--strict",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready == {
            "ready": True,
            "api_endpoint": f"http://127.0.0.1:{port}",
            "gcs_endpoint": f"http://127.0.0.1:{gcs_port}",
            "container_endpoint": f"http://127.0.0.1:{port}",
            "project": "interlude-local",
            "time_scale": 3600.0,
        }
        api = ready["api_endpoint"]
        base = f"{api}/v2/projects/interlude-local/locations/us-central2-b"
        body = {
            "acceleratorType": "v6e-8",
            "runtimeVersion": "v2-alpha-tpuv6e",
            "metadata": {"startup-script": "echo $STORAGE_EMULATOR_HOST > env.txt; sleep 300"},
        }
        op = requests.post(f"{base}/nodes?nodeId=n1", json=body, timeout=5).json()
        deadline = time.time() + 10
        while not requests.get(f"{api}/v2/{op['name']}", timeout=5).json().get("done"):
            assert time.time() < deadline, f"the create operation never finished: {op}"
            time.sleep(0.05)
        deadline = time.time() + 10
        while not (pid := requests.get(f"{api}/_localcloud/machines", timeout=5).json()["machines"][0]["pid"]):
            assert time.time() < deadline, "the node's startup script never started"
            time.sleep(0.05)
        env_file = tmp_path / "machines" / "tpu-us-central2-b-n1" / "env.txt"
        deadline = time.time() + 10
        while not env_file.exists() or not env_file.read_text().strip():
            assert time.time() < deadline, f"the startup script never wrote {env_file}"
            time.sleep(0.05)
        assert env_file.read_text().strip() == ready["gcs_endpoint"]
        client = storage.Client(
            project="interlude-local",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": ready["gcs_endpoint"]},
        )
        bucket = client.create_bucket("ckpt")
        bucket.blob("a.txt").upload_from_string(b"hello")
        assert client.bucket("ckpt").blob("a.txt").download_as_bytes() == b"hello"
        assert Admin(api).violations() == []  # --strict: every answer above matched the discovery docs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert not _alive(pid)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", gcs_port)) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
