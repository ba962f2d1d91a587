"""The `pods/{name}/eviction` subresource and PodDisruptionBudgets, through the real `kubernetes` client: an
eviction deletes the pod unless the one budget selecting it would be violated (429, as the API server answers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from interlude.hooks.gke import GKEHook
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, LOCATION

NS = "evictions"


@pytest.fixture(scope="module")
def api(gke_lc: RunningLocalCloud, gke_conn: str) -> Iterator[client.ApiClient]:
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION)
    with hook.kubernetes_hook(CLUSTER).get_conn() as api_client:
        client.CoreV1Api(api_client).create_namespace({"metadata": {"name": NS}})
        yield api_client


def _pod(core: client.CoreV1Api, name: str, app: str, *, ready: bool = True, phase: str = "Running") -> None:
    core.create_namespaced_pod(
        NS,
        {
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        },
    )
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    core.patch_namespaced_pod_status(name, NS, {"status": {"phase": phase, "conditions": conditions}})


def _evict(core: client.CoreV1Api, name: str) -> Any:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=NS))
    return core.create_namespaced_pod_eviction(name, NS, body)


def _names(core: client.CoreV1Api, app: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=f"app={app}").items}


def _pdb(policy: client.PolicyV1Api, name: str, app: str, **spec: Any) -> None:
    body = {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": {"app": app}}, **spec}}
    policy.create_namespaced_pod_disruption_budget(NS, body)


def test_eviction_without_a_budget_deletes_the_pod(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    _pod(core, "free-0", "free")
    _evict(core, "free-0")
    assert _names(core, "free") == set()
    with pytest.raises(client.ApiException) as missing:
        _evict(core, "free-0")
    assert missing.value.status == 404


def test_a_budget_allows_evictions_down_to_min_available_then_answers_429(api: client.ApiClient) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    for i in range(3):
        _pod(core, f"web-{i}", "web")
    _pdb(policy, "web", "web", minAvailable=2)
    _evict(core, "web-0")
    assert _names(core, "web") == {"web-1", "web-2"}
    with pytest.raises(client.ApiException) as refused:
        _evict(core, "web-1")
    assert refused.value.status == 429
    status = json.loads(refused.value.body)
    assert status["reason"] == "TooManyRequests"
    assert status["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert "needs 2 healthy pods and has 2 currently" in status["details"]["causes"][0]["message"]
    assert _names(core, "web") == {"web-1", "web-2"}  # nothing deleted
    budget = policy.read_namespaced_pod_disruption_budget("web", NS).status
    assert (budget.current_healthy, budget.desired_healthy, budget.disruptions_allowed) == (2, 2, 0)
    _pod(core, "web-3", "web")  # a replacement is Ready: one disruption to spare again
    _evict(core, "web-1")
    assert _names(core, "web") == {"web-2", "web-3"}


def test_max_unavailable_zero_blocks_ready_pods_but_not_pending_ones(api: client.ApiClient) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    _pod(core, "db-0", "db")
    _pod(core, "db-1", "db", ready=False, phase="Pending")
    _pdb(policy, "db", "db", maxUnavailable=0)
    with pytest.raises(client.ApiException) as refused:
        _evict(core, "db-0")
    assert refused.value.status == 429
    _evict(core, "db-1")  # not Running: budgets do not protect it
    assert _names(core, "db") == {"db-0"}


def test_an_unhealthy_pod_is_evictable_only_while_the_budget_holds_unless_always_allow(api: client.ApiClient) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    _pod(core, "q-0", "q")
    _pod(core, "q-1", "q", ready=False)
    _pdb(policy, "q", "q", minAvailable=2)
    with pytest.raises(client.ApiException) as refused:
        _evict(core, "q-1")  # 1 healthy < 2 desired: the unhealthy pod is protected too (IfHealthyBudget)
    assert refused.value.status == 429
    policy.patch_namespaced_pod_disruption_budget("q", NS, {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}})
    _evict(core, "q-1")
    assert _names(core, "q") == {"q-0"}


def test_a_pod_under_two_budgets_is_refused_with_500(api: client.ApiClient) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    _pod(core, "two-0", "two")
    _pdb(policy, "two-a", "two", minAvailable=0)
    _pdb(policy, "two-b", "two", maxUnavailable="100%")
    with pytest.raises(client.ApiException) as refused:
        _evict(core, "two-0")
    assert refused.value.status == 500
    assert "more than one PodDisruptionBudget" in json.loads(refused.value.body)["message"]


def test_discovery_lists_the_eviction_subresource_and_budgets(api: client.ApiClient) -> None:
    core_resources = {r.name: r for r in client.CoreV1Api(api).get_api_resources().resources}
    assert core_resources["pods/eviction"].kind == "Eviction"
    assert core_resources["pods/eviction"].group == "policy"
    assert core_resources["pods/eviction"].verbs == ["create"]
    policy_resources = {r.name for r in client.PolicyV1Api(api).get_api_resources().resources}
    assert "poddisruptionbudgets" in policy_resources
