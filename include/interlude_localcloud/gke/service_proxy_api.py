"""The API server's Service proxy: `/api/v1/namespaces/{ns}/services/{name}[:port]/proxy/{path}` forwarded
to the Service, as `kubectl proxy`-style clients and the kubernetes client's
`connect_*_namespaced_service_proxy_with_path` use it from outside a cluster
(https://kubernetes.io/docs/tasks/access-application-cluster/access-cluster-services/#manually-constructing-apiserver-proxy-urls).

Here the Service is the runtime's loopback port (its annotation); a Service with no Ready endpoint answers
503 as the API server does. Only loopback is ever reached: the port comes from the cluster's own Service.
"""

from __future__ import annotations

import functools
import ssl

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from interlude_localcloud.gke.resources import find
from interlude_localcloud.gke.runtime import PORT_ANNOTATION
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store

SERVICES = find("", "v1", "services")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "content-length"}


@functools.cache
def client_ssl_context() -> ssl.SSLContext:
    """The one TLS context of every proxied request's client. The proxy speaks plain HTTP to loopback, but httpx
    builds a context for each new client all the same, parsing certifi's CA bundle (~20 ms of CPU): a serving
    test's load through the proxy spent a third of the local cloud's CPU there."""
    return httpx.create_ssl_context()


def _service_name(ref: str) -> str:
    """`name`, `name:port` or `scheme:name:port` -> name."""
    parts = ref.split(":")
    return parts[1] if len(parts) == 3 else parts[0]


def add_service_proxy(app: FastAPI, store: Store) -> None:
    assert SERVICES is not None

    @app.api_route("/api/v1/namespaces/{ns}/services/{ref}/proxy/{path:path}", methods=["GET", "POST", "PUT"])
    async def service_proxy(ns: str, ref: str, path: str, request: Request) -> Response:
        name = _service_name(ref)
        svc = store.get(SERVICES, ns, name)  # 404 NotFound as the API server says it
        port = (svc["metadata"].get("annotations") or {}).get(PORT_ANNOTATION)
        if not port or not port.isdigit():
            raise KubeError(503, "ServiceUnavailable", f'no endpoints available for service "{name}"', {})
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP | {"authorization"}}
        url = f"http://127.0.0.1:{int(port)}/{path}"
        try:
            async with httpx.AsyncClient(timeout=120, verify=client_ssl_context()) as client:
                answer = await client.request(
                    request.method, url, params=request.query_params, content=await request.body(), headers=headers
                )
        except httpx.HTTPError as e:
            raise KubeError(503, "ServiceUnavailable", f"error trying to reach service: {e}", {}) from e
        out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP | {"content-encoding"}}
        return Response(answer.content, status_code=answer.status_code, headers=out)
