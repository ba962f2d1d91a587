"""The HTTP front: strict validation, fault injection, many concurrent clients."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from google.api_core import exceptions
from google.cloud import tpu_v2

from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.conftest import ZONE, fast_scenario


def test_injected_503_burst_then_recovery(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    parent = f"projects/{lc.project}/locations/{ZONE}"
    lc.admin.inject_fault(r"/nodes$", status=503, count=2, method="GET")
    for _ in range(2):
        r = requests.get(f"{lc.api_endpoint}/v2/{parent}/nodes", timeout=5)
        assert r.status_code == 503 and r.json()["error"]["status"] == "UNAVAILABLE"
    assert list(tpu.list_nodes(parent=parent)) == []
    lc.admin.inject_fault(r"/instances", status=429, count=1)
    r = requests.get(f"{lc.api_endpoint}/compute/v1/projects/{lc.project}/zones/{ZONE}/instances", timeout=5)
    assert r.status_code == 429 and r.json()["error"]["errors"][0]["reason"] == "rateLimitExceeded"
    assert [e for e in lc.admin.events() if e["event"] == "fault_injected"][-1]["status"] == 429


def test_injected_429_says_what_google_says(lc: RunningLocalCloud) -> None:
    """A rate limit names the per-minute request quota of the service and carries ErrorInfo
    RATE_LIMIT_EXCEEDED, as Google's 429 does (not a resource-quota 403, not a made-up text)."""
    lc.admin.inject_fault(r"/instances", status=429, count=1)
    r = requests.get(f"{lc.api_endpoint}/compute/v1/projects/{lc.project}/zones/{ZONE}/instances", timeout=5)
    err = r.json()["error"]
    assert err["message"].startswith(
        "Quota exceeded for quota metric 'Read requests' and limit 'Read requests "
        "per minute' of service 'compute.googleapis.com' for consumer 'project_number:"
    )
    assert err["errors"][0] == {"domain": "usageLimits", "reason": "rateLimitExceeded", "message": err["message"]}
    assert err["status"] == "RESOURCE_EXHAUSTED"
    assert err["details"][0]["reason"] == "RATE_LIMIT_EXCEEDED"
    lc.admin.inject_fault(r"/nodes", status=429, count=1, method="POST")
    r = requests.post(f"{lc.api_endpoint}/v2/projects/{lc.project}/locations/{ZONE}/nodes?nodeId=x", json={}, timeout=5)
    err = r.json()["error"]
    assert r.status_code == 429 and err["status"] == "RESOURCE_EXHAUSTED"
    assert "limit 'Write requests per minute' of service 'tpu.googleapis.com'" in err["message"]
    assert err["details"][0]["metadata"]["service"] == "tpu.googleapis.com"


def test_scenario_faults_apply_from_start() -> None:
    from interlude_localcloud.testing import running_localcloud

    sc = fast_scenario(faults=[{"path_regex": "/acceleratorTypes", "status": 503, "count": 1}])
    with running_localcloud(sc, gcs=False, strict=True) as lc:
        url = f"{lc.api_endpoint}/v2/projects/{lc.project}/locations/{ZONE}/acceleratorTypes"
        assert requests.get(url, timeout=5).status_code == 503
        assert requests.get(url, timeout=5).status_code == 200
        assert lc.violations == []


def test_fifty_concurrent_clients(lc: RunningLocalCloud) -> None:
    parent = f"projects/{lc.project}/locations/{ZONE}"

    def work(i: int) -> int:
        from google.auth.credentials import AnonymousCredentials

        c = tpu_v2.TpuClient(
            transport="rest", client_options={"api_endpoint": lc.api_endpoint}, credentials=AnonymousCredentials()
        )
        if i % 10 == 0:
            try:
                c.create_node(
                    parent=parent,
                    node_id=f"c{i}",
                    node=tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e"),
                )
            except exceptions.GoogleAPICallError:
                return -1
        list(c.list_nodes(parent=parent))
        return len(list(c.list_accelerator_types(parent=parent)))

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(work, range(50)))
    assert results == [2] * 50


def test_strict_mode_turns_schema_drift_into_500(lc: RunningLocalCloud) -> None:
    from interlude_localcloud.server import Response

    # Break one handler the way a careless change would: an unknown field in a Node.
    router = lc._lc.server.router
    route = next(r for r in router.routes if r.pattern.pattern.endswith("/acceleratorTypes$") and r.doc == "tpu.v2")
    original = route.handler
    route.handler = lambda req: Response(
        {"acceleratorTypes": [{"name": "x", "type": "y", "color": "red"}]}, "ListAcceleratorTypesResponse"
    )
    try:
        r = requests.get(f"{lc.api_endpoint}/v2/projects/{lc.project}/locations/{ZONE}/acceleratorTypes", timeout=5)
        assert r.status_code == 500 and "unknown field 'color'" in r.json()["error"]["message"]
    finally:
        route.handler = original
        lc._lc.server.violations.clear()


@pytest.mark.parametrize("path", ["/v2/projects/test-proj/locations/us-central1-a/bogus", "/nothing"])
def test_unknown_paths_are_404(lc: RunningLocalCloud, path: str) -> None:
    r = requests.get(lc.api_endpoint + path, timeout=5)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_one_tpu_v2_rest_client_shared_by_32_threads(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    """32 threads x 10 rounds of get + list through ONE real tpu_v2 REST client (its session and
    connection pool shared, as an Airflow worker's hook cache shares it): no error, no torn answer."""
    parent = f"projects/{lc.project}/locations/{ZONE}"
    ops = [
        tpu.create_node(
            parent=parent,
            node_id=f"cc{i}",
            node=tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e", labels={"i": str(i)}),
        )
        for i in range(3)
    ]
    names = [op.result(timeout=10).name for op in ops]
    start = threading.Barrier(32)

    def work(t: int) -> list[str]:
        start.wait(timeout=30)  # all threads hit the server at once
        seen: list[str] = []
        for r in range(10):
            node = tpu.get_node(name=names[(t + r) % 3])
            assert node.state == tpu_v2.Node.State.READY and node.labels["i"] == node.name[-1]
            seen.append(node.name)
            assert sorted(n.name for n in tpu.list_nodes(parent=parent)) == names
        return seen

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(work, range(32)))
    assert sum(len(r) for r in results) == 320
    assert lc.violations == []


def test_admin_capacity_change_makes_the_next_create_a_stockout() -> None:
    """The failover tests' lever: capacity set to 0 turns the next create of that type into Google's stockout."""
    from google.api_core import exceptions as gexc
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2

    from interlude_localcloud.testing import running_localcloud

    with running_localcloud("default", gcs=False) as lc:
        lc.admin.set_capacity("us-central1-a", "tpu", "v6e-8", on_demand=0, spot=0)
        assert any(e["event"] == "capacity_set" for e in lc.admin.events())
        client = tpu_v2.TpuClient(
            credentials=AnonymousCredentials(), transport="rest", client_options={"api_endpoint": lc.api_endpoint}
        )
        node = tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e")
        op = client.create_node(parent=f"projects/{lc.project}/locations/us-central1-a", node_id="n1", node=node)
        with pytest.raises(gexc.GoogleAPICallError):
            op.result(timeout=60)


def test_the_request_log_holds_what_the_cloud_was_asked_and_not_the_admin_calls(
    lc: RunningLocalCloud, tpu: tpu_v2.TpuClient
) -> None:
    """Tests judge "what was the cloud asked" from this log (e.g. a plan-only run's calls), not from the caller."""
    since = lc.admin.requests()[-1]["t"] if lc.admin.requests() else 0.0
    lc.admin.inject_fault(r"/nodes$", status=503, count=1, method="GET")
    with pytest.raises(exceptions.ServiceUnavailable):
        tpu.list_nodes(parent=f"projects/{lc.project}/locations/{ZONE}", retry=None)
    list(tpu.list_nodes(parent=f"projects/{lc.project}/locations/{ZONE}"))
    asked = [(r["method"], r["path"]) for r in lc.admin.requests(since) if r["t"] > since]
    path = f"/v2/projects/{lc.project}/locations/{ZONE}/nodes"
    assert asked == [("GET", path), ("GET", path)], asked  # the refused request too; no /_localcloud call
    assert all(a["t"] <= b["t"] for a, b in zip(lc.admin.requests(), lc.admin.requests()[1:], strict=False))
