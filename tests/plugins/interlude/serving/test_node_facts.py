"""The init container's program, run for real: Python reads a node from a TLS API server with a bearer
token, writes TPU facts, and a POSIX shell sources them the way the TPU container does."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from interlude.serving import node_facts
from interlude.serving.tables import load_table

TOKEN = "test-token-123"


def _tls(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-api")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "ca.crt", tmp / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


class _Api(http.server.BaseHTTPRequestHandler):
    nodes: dict[str, dict[str, str]] = {}

    def do_GET(self) -> None:
        name = self.path.removeprefix("/api/v1/nodes/")
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_response(401)
            self.end_headers()
            return
        if name not in self.nodes:
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"kind": "Node", "metadata": {"name": name, "labels": self.nodes[name]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    cert, key = _tls(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    token_dir = tmp_path / "kube-api"
    token_dir.mkdir()
    (token_dir / "token").write_text(TOKEN + "\n")
    (token_dir / "ca.crt").write_bytes(cert.read_bytes())
    try:
        yield server.server_address[1], token_dir
    finally:
        server.shutdown()
        server.server_close()


def _run(api: tuple[int, Path], node: str, labels: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    port, token_dir = api
    _Api.nodes = {node: labels}
    out = token_dir.parent / "tpu.env"
    program = token_dir.parent / "node_facts.py"
    program.write_text(node_facts.script(load_table(), token_dir=str(token_dir), out=str(out)))
    env = {
        "PATH": os.environ["PATH"],
        "NODE_NAME": node,
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(port),
    }
    done = subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=60)
    return done, out


def _sourced(out: Path) -> dict[str, str]:
    """What the TPU container's `sh -c` sees after sourcing the file (the same script as in the manifest)."""
    script = node_facts.SOURCE_AND_EXEC.replace(node_facts.ENV_FILE, str(out))
    done = subprocess.run(
        ["/bin/sh", "-c", script, "tpu-env", "env"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"]},
        check=True,
    )
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if line.startswith("TPU_"))


@pytest.mark.parametrize(
    ("accelerator", "topology", "tpu_type", "bounds"),
    [
        ("tpu-v6e-slice", "2x4", "v6e-8", "2,4,1"),
        ("tpu-v6e-slice", "1x1", "v6e-1", "1,1,1"),
        ("tpu-v5-lite-podslice", "2x2", "v5litepod-4", "2,2,1"),
        ("tpu-v5p-slice", "2x2x1", "v5p-8", "2,2,1"),
    ],
)
def test_a_tpu_node_yields_its_type_and_topology(
    api: tuple[int, Path], accelerator: str, topology: str, tpu_type: str, bounds: str
) -> None:
    labels = {"cloud.google.com/gke-tpu-accelerator": accelerator, "cloud.google.com/gke-tpu-topology": topology}
    done, out = _run(api, "gke-tpu-node-1", labels)
    assert done.returncode == 0, done.stderr
    facts = _sourced(out)
    assert facts["TPU_ACCELERATOR_TYPE"] == tpu_type and facts["TPU_TOPOLOGY"] == topology
    assert facts["TPU_CHIPS_PER_HOST_BOUNDS"] == bounds and facts["TPU_WORKER_ID"] == "0"


def test_a_gpu_node_yields_empty_tpu_facts(api: tuple[int, Path]) -> None:
    done, out = _run(api, "gke-l4-node-1", {"cloud.google.com/gke-accelerator": "nvidia-l4"})
    assert done.returncode == 0, done.stderr
    facts = _sourced(out)
    assert facts["TPU_ACCELERATOR_TYPE"] == "" and facts["TPU_TOPOLOGY"] == ""


def test_an_unknown_tpu_shape_fails_the_pod_start_loudly(api: tuple[int, Path]) -> None:
    labels = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "4x4"}
    done, out = _run(api, "gke-tpu-node-2", labels)
    assert done.returncode != 0 and "not a single-host shape" in done.stderr and not out.exists()


def test_a_bad_node_name_is_refused_before_any_request(api: tuple[int, Path]) -> None:
    done, out = _run(api, "../../secrets", {})
    assert done.returncode != 0 and "is not a node name" in done.stderr and not out.exists()
