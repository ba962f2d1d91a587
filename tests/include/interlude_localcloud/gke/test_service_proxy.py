"""The API server's Service proxy forwards to the Service's loopback port, and its clients share one TLS context.

A real HTTP server stands for a pod behind a Service; the proxy (the local GKE API's route, on a FastAPI app of
its own) answers each request with the pod's answer. The CA bundle is parsed once for all of them
(``ssl.create_default_context`` counted), not once per request (~20 ms of CPU each, a third of a serving test's
local cloud before).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from interlude_localcloud.gke import service_proxy_api
from interlude_localcloud.gke.resources import find
from interlude_localcloud.gke.runtime import PORT_ANNOTATION
from interlude_localcloud.gke.store import Store
from interlude_localcloud.gke.validation import Admission
from tests.plugins.interlude.hooks.json_http import JsonHandler

NAMESPACES = find("", "v1", "namespaces")


class _Pod(JsonHandler):
    def do_GET(self) -> None:
        self._json(200, {"path": self.path})


@pytest.fixture
def pod_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pod)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_proxied_requests_reach_the_pod_and_parse_the_ca_bundle_once(
    pod_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(Admission("1.33"))
    store.create(NAMESPACES, "", {"metadata": {"name": "ns"}})
    store.create(
        service_proxy_api.SERVICES,
        "ns",
        {
            "metadata": {"name": "vllm", "annotations": {PORT_ANNOTATION: str(pod_port)}},
            "spec": {"selector": {"app": "vllm"}, "ports": [{"port": 8000}]},
        },
    )
    app = FastAPI()
    service_proxy_api.add_service_proxy(app, store)
    client = TestClient(app)  # its own context is made here, before the count starts

    service_proxy_api.client_ssl_context.cache_clear()
    made = []
    real = ssl.create_default_context

    def counting(*args: object, **kwargs: object) -> ssl.SSLContext:
        made.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    for i in range(5):
        answer = client.get(f"/api/v1/namespaces/ns/services/vllm:8000/proxy/v1/models?i={i}")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"path": f"/v1/models?i={i}"}
    assert len(made) == 1
