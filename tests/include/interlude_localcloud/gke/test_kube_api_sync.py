"""The Kubernetes API of a local GKE cluster through the Google provider's hooks and the real
`kubernetes` client: only the local cloud's endpoints are in the Airflow connection."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client, watch

from interlude.hooks.gke import GKEHook
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, K8S_VERSION, LOCATION

NS = "serving"
CC = {"group": "cloud.google.com", "version": "v1", "plural": "computeclasses"}


def compute_class(name: str, **extra_priority: Any) -> dict[str, Any]:
    """A ComputeClass like the TPU/GPU interoperability guide's: TPU pools first, L4 pools second."""
    return {
        "apiVersion": "cloud.google.com/v1",
        "kind": "ComputeClass",
        "metadata": {"name": name},
        "spec": {
            "priorities": [
                {"tpu": {"type": "tpu-v6e-slice", "count": 4, "topology": "2x2"}, **extra_priority},
                {"gpu": {"type": "nvidia-l4", "count": 1, "driverVersion": "latest"}},
            ],
            "whenUnsatisfiable": "DoNotScaleUp",
            "nodePoolAutoCreation": {"enabled": True},
            "activeMigration": {"optimizeRulePriority": True},
        },
    }


def deployment(
    name: str, image: str = "vllm/vllm-tpu:v0.11.1", labels: dict[str, str] | None = None, replicas: int = 2
) -> client.V1Deployment:
    labels = labels or {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, labels={"tier": "serving", **labels}),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    node_selector={"cloud.google.com/compute-class": "vllm"},
                    containers=[
                        client.V1Container(
                            name="vllm-tpu", image=image, ports=[client.V1ContainerPort(container_port=8000)]
                        )
                    ],
                ),
            ),
        ),
    )


@pytest.fixture(scope="module")
def api(gke_lc: RunningLocalCloud, gke_conn: str) -> Iterator[client.ApiClient]:
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION)
    kube_hook = hook.kubernetes_hook(CLUSTER, project_id=gke_lc.project)
    with kube_hook.get_conn() as api_client:
        client.CoreV1Api(api_client).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        yield api_client


def test_the_hook_reaches_the_cluster_the_container_api_names(
    gke_lc: RunningLocalCloud, gke_conn: str, api: client.ApiClient
) -> None:
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION)
    assert hook.container_endpoint == gke_lc.container_endpoint
    cluster = hook.get_cluster(name=CLUSTER, project_id=gke_lc.project)
    assert api.configuration.host == f"https://{cluster.endpoint}"
    assert client.VersionApi(api).get_code().git_version == f"v{K8S_VERSION}"
    # Node objects for the pools' current sizes (1 TPU node, 2 spot L4 nodes) with GKE's labels and taints.
    nodes = client.CoreV1Api(api).list_node(label_selector="cloud.google.com/gke-nodepool=l4-spot").items
    assert len(nodes) == 2
    assert nodes[0].metadata.labels["cloud.google.com/gke-accelerator"] == "nvidia-l4"
    assert nodes[0].metadata.labels["cloud.google.com/gke-spot"] == "true"
    assert nodes[0].metadata.labels["cloud.google.com/compute-class"] == "vllm"
    assert {(t.key, t.value, t.effect) for t in nodes[0].spec.taints} == {
        ("nvidia.com/gpu", "present", "NoSchedule"),
        ("cloud.google.com/compute-class", "vllm", "NoSchedule"),
    }
    tpu = client.CoreV1Api(api).list_node(label_selector="cloud.google.com/gke-tpu-topology=2x2").items
    assert [n.metadata.labels["cloud.google.com/gke-tpu-accelerator"] for n in tpu] == ["tpu-v6e-slice"]
    assert {(t.key, t.effect) for t in tpu[0].spec.taints} == {("google.com/tpu", "NoSchedule")}


def test_create_get_list_delete_computeclass_deployment_service(api: client.ApiClient) -> None:
    custom, apps, core = client.CustomObjectsApi(api), client.AppsV1Api(api), client.CoreV1Api(api)
    cc = custom.create_cluster_custom_object(body=compute_class("vllm"), **CC)
    assert cc["metadata"]["generation"] == 1 and cc["metadata"]["uid"]
    assert custom.get_cluster_custom_object(name="vllm", **CC)["spec"]["whenUnsatisfiable"] == "DoNotScaleUp"
    created = apps.create_namespaced_deployment(NS, deployment("vllm"))
    assert created.spec.strategy.rolling_update.max_surge == "25%"  # API server defaults
    assert created.spec.template.spec.containers[0].image_pull_policy == "IfNotPresent"
    svc = core.create_namespaced_service(
        NS,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="vllm", labels={"tier": "serving"}),
            spec=client.V1ServiceSpec(selector={"app": "vllm"}, ports=[client.V1ServicePort(port=8000)]),
        ),
    )
    assert svc.spec.type == "ClusterIP" and svc.spec.ports[0].target_port == 8000 and svc.spec.cluster_ip
    apps.create_namespaced_deployment(NS, deployment("other", labels={"app": "other"}))
    listed = apps.list_namespaced_deployment(NS, label_selector="app in (vllm),tier=serving")
    assert [d.metadata.name for d in listed.items] == ["vllm"]
    assert [d.metadata.name for d in apps.list_namespaced_deployment(NS, label_selector="app!=vllm").items] == ["other"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    with pytest.raises(client.ApiException) as dup:
        apps.create_namespaced_deployment(NS, deployment("vllm"))
    assert dup.value.status == 409
    apps.delete_namespaced_deployment("other", NS)
    with pytest.raises(client.ApiException) as gone:
        apps.read_namespaced_deployment("other", NS)
    status = gone.value.body and __import__("json").loads(gone.value.body)
    assert gone.value.status == 404
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'deployments.apps "other" not found',
        "reason": "NotFound",
        "details": {"name": "other", "group": "apps", "kind": "deployments"},
        "code": 404,
    }


def test_watch_patch_and_server_side_apply(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    start = apps.create_namespaced_deployment(NS, deployment("watched", replicas=1))
    seen: list[tuple[str, str, int]] = []

    def follow() -> None:
        for ev in watch.Watch().stream(
            apps.list_namespaced_deployment,
            NS,
            label_selector="app=watched",
            resource_version=start.metadata.resource_version,
            timeout_seconds=5,
        ):
            seen.append((ev["type"], ev["object"].metadata.resource_version, ev["object"].spec.replicas))
            if ev["type"] == "DELETED":
                return

    t = threading.Thread(target=follow)
    t.start()
    # Strategic merge patch: containers merge by name (the image changes, the port stays).
    patched = apps.patch_namespaced_deployment(
        "watched",
        NS,
        {
            "spec": {
                "replicas": 2,
                "template": {"spec": {"containers": [{"name": "vllm-tpu", "image": "vllm/vllm-tpu:v0.12.0"}]}},
            }
        },
    )
    container = patched.spec.template.spec.containers[0]
    assert container.image.endswith("v0.12.0") and container.ports[0].container_port == 8000
    assert patched.metadata.generation == 2
    # Server-side apply: replicas is owned by the patcher, so a non-forced apply conflicts ...
    applied = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "watched"}, "spec": {"replicas": 3}}
    with pytest.raises(client.ApiException) as conflict:
        apps.patch_namespaced_deployment(
            "watched", NS, applied, field_manager="interlude", _content_type="application/apply-patch+yaml"
        )
    assert conflict.value.status == 409 and "spec.replicas" in conflict.value.body
    # ... and a forced one takes ownership.
    forced = apps.patch_namespaced_deployment(
        "watched", NS, applied, field_manager="interlude", force=True, _content_type="application/apply-patch+yaml"
    )
    owners = {m.manager: m.operation for m in forced.metadata.managed_fields}
    assert forced.spec.replicas == 3 and owners["interlude"] == "Apply"
    with pytest.raises(client.ApiException) as no_manager:
        apps.patch_namespaced_deployment("watched", NS, applied, _content_type="application/apply-patch+yaml")
    assert no_manager.value.status == 400
    # Merge patch (null removes a label).
    merged = apps.patch_namespaced_deployment(
        "watched", NS, {"metadata": {"labels": {"tier": None}}}, _content_type="application/merge-patch+json"
    )
    assert "tier" not in merged.metadata.labels
    # JSON patch (a list body), with a failing `test` op leaving the object untouched.
    add_label = [{"op": "add", "path": "/metadata/labels/stage", "value": "b"}]
    jp = apps.patch_namespaced_deployment("watched", NS, add_label)
    assert jp.metadata.labels["stage"] == "b"
    with pytest.raises(client.ApiException):
        apps.patch_namespaced_deployment(
            "watched",
            NS,
            [
                {"op": "test", "path": "/spec/replicas", "value": 9},
                {"op": "replace", "path": "/spec/replicas", "value": 9},
            ],
        )
    assert apps.read_namespaced_deployment("watched", NS).spec.replicas == 3
    apps.delete_namespaced_deployment("watched", NS)
    t.join(timeout=30)
    kinds = [k for k, _, _ in seen]
    assert kinds[0] == "MODIFIED" and kinds[-1] == "DELETED", seen
    versions = [int(rv) for _, rv, _ in seen]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    # The controller's status writes are MODIFIED events too; the spec went 1 -> 2 -> 3 in order.
    replicas = [r for k, _, r in seen if k == "MODIFIED"]
    assert [r for i, r in enumerate(replicas) if i == 0 or replicas[i - 1] != r] in ([2, 3], [1, 2, 3]), seen


def test_server_side_apply_creates_and_removes_fields_it_no_longer_applies(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    body = compute_class("applied")
    # Apply creates (201, which this generated client method does not deserialize: read it back).
    custom.patch_cluster_custom_object(
        name="applied", body=body, field_manager="interlude", _content_type="application/apply-patch+yaml", **CC
    )
    created = custom.get_cluster_custom_object(name="applied", **CC)
    assert created["spec"]["activeMigration"] == {"optimizeRulePriority": True}
    assert [m["manager"] for m in created["metadata"]["managedFields"]] == ["interlude"]
    del body["spec"]["activeMigration"]
    again = custom.patch_cluster_custom_object(
        name="applied", body=body, field_manager="interlude", _content_type="application/apply-patch+yaml", **CC
    )
    assert "activeMigration" not in again["spec"] and again["metadata"]["generation"] == 2
    custom.delete_cluster_custom_object(name="applied", **CC)


def test_invalid_objects_get_422_like_the_api_server(api: client.ApiClient) -> None:
    apps, custom = client.AppsV1Api(api), client.CustomObjectsApi(api)
    bad = deployment("bad")
    bad.spec.template.metadata.labels = {"app": "something-else"}
    with pytest.raises(client.ApiException) as e:
        apps.create_namespaced_deployment(NS, bad)
    status = __import__("json").loads(e.value.body)
    assert e.value.status == 422 and status["reason"] == "Invalid" and status["kind"] == "Status"
    assert status["details"]["kind"] == "Deployment" and status["details"]["group"] == "apps"
    assert [c["field"] for c in status["details"]["causes"]] == ["spec.template.metadata.labels"]
    with pytest.raises(client.ApiException) as e:
        custom.create_cluster_custom_object(body=compute_class("typo", preference="tpu"), **CC)
    status = __import__("json").loads(e.value.body)
    assert e.value.status == 422 and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.priorities[0].preference"
    with pytest.raises(client.ApiException) as e:
        custom.get_cluster_custom_object(name="typo", **CC)
    assert e.value.status == 404


def test_every_stored_object_passes_kubernetes_validate(gke_lc: RunningLocalCloud, api: client.ApiClient) -> None:
    """Independent check: kubernetes-validate (strict) on every object the core API lists back."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    seen = 0
    for items in (
        core.list_namespace().items,
        core.list_node().items,
        core.list_service_for_all_namespaces().items,
        apps.list_deployment_for_all_namespaces().items,
    ):
        for obj in items:
            data = api.sanitize_for_serialization(obj)
            data.setdefault("apiVersion", "apps/v1" if isinstance(obj, client.V1Deployment) else "v1")
            data.setdefault("kind", type(obj).__name__.removeprefix("V1"))
            kubernetes_validate.validate(data, "1.33", strict=True)
            seen += 1
    assert seen >= 7


def test_the_api_server_keeps_a_request_log(gke_lc: RunningLocalCloud, api: client.ApiClient) -> None:
    """Every request the cluster's API server got, at arrival, in order (admin `.../requests`): the cloud's own
    record of a client's looks and writes, on the clock of the cluster events' `at`."""
    import time

    since = time.time()
    core = client.CoreV1Api(api)
    core.list_namespaced_event(NS)
    core.list_namespaced_pod(NS, label_selector="app=logged")
    got = [(r["method"], r["path"], r["query"]) for r in gke_lc.admin.gke_requests(CLUSTER, since=since)]
    assert got[:2] == [
        ("GET", f"/api/v1/namespaces/{NS}/events", ""),
        ("GET", f"/api/v1/namespaces/{NS}/pods", "labelSelector=app%3Dlogged"),
    ], got
    times = [r["t"] for r in gke_lc.admin.gke_requests(CLUSTER, since=since)]
    assert times == sorted(times) and times[0] >= since
