"""The async client refreshes real (expiring) credentials without importing requests into the trigger runner.

A local OAuth 2.0 token endpoint (the JWT-bearer grant a service account key uses,
https://developers.google.com/identity/protocols/oauth2/service-account#httprest) issues the token; a local
API checks that it arrives as the bearer token. Both run in this process; the client in a fresh interpreter,
whose loaded modules are the fact under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.plugins.interlude.hooks.json_http import JsonHandler

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"


class _Handler(JsonHandler):
    grants: list[str] = []

    def do_POST(self) -> None:  # the token endpoint
        form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        self.grants.append(form.get("grant_type", [""])[0])
        ok = form.get("grant_type") == [JWT_BEARER] and bool(form.get("assertion"))
        self._json(200 if ok else 400, {"access_token": "tok-1", "expires_in": 3600} if ok else {"error": "bad"})

    def do_GET(self) -> None:  # the API
        self._json(200, {"authorization": self.headers.get("Authorization")})


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_expiring_credentials_are_refreshed_without_requests(server: str) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    info = {
        "type": "service_account",
        "project_id": "p",
        "private_key_id": "0123",
        "private_key": key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
        "client_email": "watcher@p.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": f"{server}/token",
    }
    script = f"""
import asyncio, json, sys
from google.oauth2 import service_account
from interlude.hooks._rest import AsyncRestClient
from interlude.hooks._retry import RetryPolicy

creds = service_account.Credentials.from_service_account_info(
    json.loads({json.dumps(info)!r}), scopes=["https://www.googleapis.com/auth/cloud-platform"]
)
assert not creds.valid
body = asyncio.run(AsyncRestClient(creds, RetryPolicy(max_attempts=1)).request("GET", {server + "/api"!r}))
print(json.dumps({{"body": body, "requests": sorted(m for m in sys.modules if m.split(".")[0] == "requests")}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["body"] == {"authorization": "Bearer tok-1"}
    assert _Handler.grants == [JWT_BEARER]  # one refresh, the service account's grant
    assert result["requests"] == []
