"""The Deployment controller: pods from the template, and a rolling update that never exceeds
replicas + maxSurge pods nor drops below replicas - maxUnavailable ready pods. The test plays the
kubelet: it marks pods Ready through the pods' `/status` subresource."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from interlude.hooks.gke import GKEHook
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, LOCATION

NS = "rollout"


def until(pred: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if got := pred():
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def core_apps(gke_lc: RunningLocalCloud, gke_conn: str) -> Iterator[tuple[client.CoreV1Api, client.AppsV1Api]]:
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION).kubernetes_hook(CLUSTER, project_id=gke_lc.project)
    with hook.get_conn() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        yield core, client.AppsV1Api(api)


def _pods(core: client.CoreV1Api) -> list[client.V1Pod]:
    return core.list_namespaced_pod(NS, label_selector="app=roll").items


def _mark_ready(core: client.CoreV1Api) -> int:
    """What a kubelet does once the containers run: phase Running, condition Ready."""
    marked = 0
    for pod in _pods(core):
        if not any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
            try:
                core.patch_namespaced_pod_status(
                    pod.metadata.name,
                    NS,
                    {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                )
                marked += 1
            except client.ApiException as e:  # the controller deleted it meanwhile
                if e.status != 404:
                    raise
    return marked


def test_rolling_update_honours_max_surge_and_max_unavailable(
    core_apps: tuple[client.CoreV1Api, client.AppsV1Api],
) -> None:
    core, apps = core_apps
    dep = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="roll"),
        spec=client.V1DeploymentSpec(
            replicas=4,
            selector=client.V1LabelSelector(match_labels={"app": "roll"}),
            strategy=client.V1DeploymentStrategy(
                type="RollingUpdate", rolling_update=client.V1RollingUpdateDeployment(max_surge=1, max_unavailable=1)
            ),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "roll"}),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="example/app:1")]),
            ),
        ),
    )
    apps.create_namespaced_deployment(NS, dep)
    pods = until(lambda: (p := _pods(core)) and len(p) == 4 and p, "4 pods")
    owner = pods[0].metadata.owner_references[0]
    assert owner.kind == "Deployment" and owner.controller and pods[0].spec.containers[0].image == "example/app:1"
    _mark_ready(core)
    until(lambda: apps.read_namespaced_deployment_status("roll", NS).status.ready_replicas == 4, "4 ready")

    apps.patch_namespaced_deployment(
        "roll", NS, {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "example/app:2"}]}}}}
    )
    max_total, min_ready = 0, 4
    deadline = time.time() + 60
    while time.time() < deadline:
        pods = _pods(core)
        ready = sum(any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []) for p in pods)
        max_total, min_ready = max(max_total, len(pods)), min(min_ready, ready)
        images = {p.spec.containers[0].image for p in pods}
        if images == {"example/app:2"} and len(pods) == 4 and ready == 4:
            break
        _mark_ready(core)
        time.sleep(0.1)
    else:
        raise AssertionError(f"rollout did not finish: {[(p.metadata.name, p.spec.containers[0].image) for p in pods]}")
    assert max_total <= 4 + 1
    assert min_ready >= 4 - 1
    status = until(
        lambda: (s := apps.read_namespaced_deployment_status("roll", NS).status).updated_replicas == 4 and s,
        "status updated",
    )
    assert status.observed_generation == 2 and status.available_replicas == 4

    # The scale subresource (kubectl scale, HPA): the controller follows it.
    scaled = apps.patch_namespaced_deployment_scale("roll", NS, {"spec": {"replicas": 2}})
    assert scaled.spec.replicas == 2 and scaled.status.selector == "app=roll"
    until(lambda: len(_pods(core)) == 2, "scaled down to 2 pods")
    assert apps.read_namespaced_deployment_scale("roll", NS).spec.replicas == 2

    apps.delete_namespaced_deployment("roll", NS)
    until(lambda: _pods(core) == [], "pods garbage-collected")
