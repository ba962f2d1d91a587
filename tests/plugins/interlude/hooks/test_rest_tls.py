"""Every httpx client of a process shares one TLS context, and that context still verifies certificates.

A real TLS server on 127.0.0.1 serves a certificate for "localhost" from a CA made here (by the local cloud's
issuer). The clients run in a fresh interpreter whose ``SSL_CERT_FILE`` names that CA (httpx's own way to choose a
CA bundle, which ``shared_ssl_context`` keeps): the async client in two event loops (as `airflow dags test` runs
deferrals) and the GCS client all reach it, ``ssl.create_default_context`` (the CA bundle parsed) runs once, and a
server whose certificate that CA did not sign is refused.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from interlude_localcloud.gke import pki
from tests.plugins.interlude.hooks.json_http import JsonHandler

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


class _Handler(JsonHandler):
    def do_GET(self) -> None:
        self._json(200, {"path": self.path})


def _serve(tls: pki.ServerTls) -> tuple[ThreadingHTTPServer, str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, f"https://localhost:{httpd.server_address[1]}"


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """(the trusted CA's file, a server it signed, a server another CA signed): the local cloud's own issuer of
    a CA and a 127.0.0.1/localhost serving certificate (a GKE cluster's, interlude_localcloud.gke.pki)."""
    trusted = pki.issue(tmp_path / "trusted", "trusted")
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(trusted.ca_pem)
    good, good_url = _serve(trusted)
    bad, bad_url = _serve(pki.issue(tmp_path / "stranger", "stranger"))
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
