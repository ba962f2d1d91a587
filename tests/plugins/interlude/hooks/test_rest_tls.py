"""Every httpx client of a process shares one TLS context, and that context still verifies certificates.

A real TLS server on 127.0.0.1 serves a certificate for "localhost" from a CA made here. The clients run in a
fresh interpreter whose ``SSL_CERT_FILE`` names that CA (httpx's own way to choose a CA bundle, which
``shared_ssl_context`` keeps): the async client in two event loops (as `airflow dags test` runs deferrals) and
the GCS client all reach it, ``ssl.create_default_context`` (the CA bundle parsed) runs once, and a server whose
certificate that CA did not sign is refused.
"""

from __future__ import annotations

import datetime
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CLIENTS = r"""
import asyncio, json, ssl, sys
calls = []
real = ssl.create_default_context
def counting(*args, **kwargs):
    calls.append(1)
    return real(*args, **kwargs)
ssl.create_default_context = counting

from google.auth.credentials import AnonymousCredentials
from interlude.hooks._retry import RetryPolicy
from interlude.hooks._rest import AsyncRestClient
from interlude.hooks.gcs_json import GcsJson

good, bad = sys.argv[1], sys.argv[2]
client = AsyncRestClient(AnonymousCredentials(), RetryPolicy(max_attempts=1))
answers = [asyncio.run(client.request("GET", good + "/a")), asyncio.run(client.request("GET", good + "/b"))]
answers.append(GcsJson(AnonymousCredentials(), good)._get(good + "/c", {}).json())
try:
    asyncio.run(client.request("GET", bad + "/d"))
    refused = ""
except Exception as exc:
    refused = repr(exc)
print(json.dumps({"answers": answers, "contexts_made": len(calls), "refused": refused}))
"""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        data = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )  # digital signature, cert sign, CRL sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem(key)


def _serve(tmp_path: Path, tag: str, cert_pem: bytes, key_pem: bytes) -> tuple[ThreadingHTTPServer, str]:
    (tmp_path / f"{tag}.crt").write_bytes(cert_pem)
    (tmp_path / f"{tag}.key").write_bytes(key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / f"{tag}.crt", tmp_path / f"{tag}.key")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, f"https://localhost:{httpd.server_address[1]}"


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """(the trusted CA's file, a server it signed, a server another CA signed)."""
    trusted, trusted_key = _ca("interlude test CA")
    stranger, stranger_key = _ca("someone else's CA")
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(trusted.public_bytes(serialization.Encoding.PEM))
    good, good_url = _serve(tmp_path, "good", *_leaf(trusted, trusted_key))
    bad, bad_url = _serve(tmp_path, "bad", *_leaf(stranger, stranger_key))
    yield ca_file, good_url, bad_url
    for httpd in (good, bad):
        httpd.shutdown()
        httpd.server_close()


def test_clients_in_two_loops_and_the_gcs_client_share_one_context_that_still_verifies(
    servers: tuple[Path, str, str],
) -> None:
    ca_file, good, bad = servers
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_DIR", "STORAGE_EMULATOR_HOST")}
    env["SSL_CERT_FILE"] = str(ca_file)
    run = subprocess.run(
        [sys.executable, "-c", CLIENTS, good, bad], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["answers"] == [{"path": "/a"}, {"path": "/b"}, {"path": "/c"}]
    assert result["contexts_made"] == 1, result
    assert "CERTIFICATE_VERIFY_FAILED" in result["refused"], result["refused"]
