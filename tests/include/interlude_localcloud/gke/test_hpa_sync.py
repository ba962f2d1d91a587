"""The local HPA controller syncs as kube-controller-manager's does: once per 15 s sync period of scenario time,
scraping each pod's metrics over one kept connection, not on every tick of the cluster's loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from interlude_localcloud.gke.deployments import DEPLOYMENTS, PODS
from interlude_localcloud.gke.hpa_controller import HPAS, SYNC_PERIOD_SECONDS, HpaController
from interlude_localcloud.gke.resources import find
from interlude_localcloud.gke.store import Store
from interlude_localcloud.gke.validation import Admission

NAMESPACES = find("", "v1", "namespaces")
LABELS = {"app": "vllm"}


class _Metrics(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a vLLM server speaks
    scrapes = 0
    connections: set[int] = set()

    def do_GET(self) -> None:
        type(self).scrapes += 1
        type(self).connections.add(self.client_address[1])
        body = b"vllm:num_requests_waiting 30\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def pod_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _cluster() -> Store:
    store = Store(Admission("1.33"))
    store.create(NAMESPACES, "", {"metadata": {"name": "ns"}})
    template = {"metadata": {"labels": LABELS}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    store.create(
        DEPLOYMENTS,
        "ns",
        {
            "metadata": {"name": "vllm"},
            "spec": {"replicas": 1, "selector": {"matchLabels": LABELS}, "template": template},
        },
    )
    store.create(PODS, "ns", {"metadata": {"name": "vllm-0", "labels": LABELS}, "spec": template["spec"]})
    store.update(PODS, "ns", "vllm-0", lambda pod: {**pod, "status": {"phase": "Running"}}, subresource="status")
    metric = {"metric": {"name": "vllm:num_requests_waiting"}, "target": {"type": "AverageValue", "averageValue": "10"}}
    store.create(
        HPAS,
        "ns",
        {
            "metadata": {"name": "vllm"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm"},
                "minReplicas": 1,
                "maxReplicas": 4,
                "metrics": [{"type": "Pods", "pods": metric}],
            },
        },
    )
    return store


def test_one_sync_per_period_of_scenario_time_over_one_connection(pod_port: int) -> None:
    store = _cluster()
    controller = HpaController(store, lambda uid: pod_port)
    _Metrics.scrapes, _Metrics.connections = 0, set()
    # Ticks a quarter of a scenario second apart for a minute: syncs at 0, 15, 30 and 45 s.
    ticks = [1000.0 + 0.25 * i for i in range(int(60 / 0.25))]
    for now in ticks:
        controller.reconcile(now)
    assert _Metrics.scrapes == 4 == int(60 // SYNC_PERIOD_SECONDS)
    assert len(_Metrics.connections) == 1, "each scrape opened a connection of its own"
    # ...and the syncs decided: 30 waiting requests on one pod against a target of 10 per pod scale it out.
    assert store.get(DEPLOYMENTS, "ns", "vllm")["spec"]["replicas"] > 1
