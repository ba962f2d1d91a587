"""Discovery (the dynamic client), HPA autoscaling/v2, Events, pod logs, 401/410 and namespace deletion."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client, dynamic

from interlude.hooks.gke import GKEHook
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, LOCATION

NS = "more"


@pytest.fixture(scope="module")
def api(gke_lc: RunningLocalCloud, gke_conn: str) -> Iterator[client.ApiClient]:
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION).kubernetes_hook(CLUSTER, project_id=gke_lc.project)
    with hook.get_conn() as api_client:
        client.CoreV1Api(api_client).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        yield api_client


def test_dynamic_client_discovers_computeclasses_and_hpas(api: client.ApiClient) -> None:
    dyn = dynamic.DynamicClient(api)
    cc = dyn.resources.get(api_version="cloud.google.com/v1", kind="ComputeClass")
    assert cc.name == "computeclasses" and not cc.namespaced
    cc.create(
        body={
            "apiVersion": "cloud.google.com/v1",
            "kind": "ComputeClass",
            "metadata": {"name": "dyn"},
            "spec": {"priorities": [{"nodepools": ["l4-spot"]}]},
        }
    )
    assert [i.metadata.name for i in cc.get().items] == ["dyn"]
    hpa = dyn.resources.get(api_version="autoscaling/v2", kind="HorizontalPodAutoscaler")
    created = hpa.create(
        namespace=NS,
        body={
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "vllm"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm"},
                "minReplicas": 1,
                "maxReplicas": 4,
                "metrics": [
                    {
                        "type": "Pods",
                        "pods": {
                            "metric": {"name": "vllm:num_requests_waiting"},
                            "target": {"type": "AverageValue", "averageValue": "10"},
                        },
                    }
                ],
            },
        },
    )
    assert created.metadata.generation == 1
    with pytest.raises(dynamic.exceptions.DynamicApiError) as e:  # maxReplicas is required
        hpa.create(
            namespace=NS,
            body={
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "bad"},
                "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}},
            },
        )
    assert e.value.status == 422 and "spec.maxReplicas" in str(e.value.body)


def test_events_pod_logs_and_namespace_deletion(gke_lc: RunningLocalCloud, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(
        NS,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="p"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
        ),
    )
    assert pod.status.phase == "Pending" and pod.spec.containers[0].image_pull_policy == "Always"
    node = core.list_node(label_selector="cloud.google.com/gke-nodepool=l4-spot").items[0].metadata.name
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p"),
        target=client.V1ObjectReference(kind="Node", name=node, api_version="v1"),
    )
    core.create_namespaced_pod_binding("p", NS, binding, _preload_content=False)  # what a scheduler does
    bound = core.read_namespaced_pod("p", NS)
    assert bound.spec.node_name == node and [c.type for c in bound.status.conditions] == ["PodScheduled"]
    with pytest.raises(client.ApiException) as again:
        core.create_namespaced_pod_binding("p", NS, binding, _preload_content=False)
    assert again.value.status == 409
    core.create_namespaced_event(
        NS,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="p.1"),
            reason="Scheduled",
            message="assigned",
            involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace=NS),
        ),
    )
    assert [e.reason for e in core.list_namespaced_event(NS, field_selector="involvedObject.name=p").items] == [
        "Scheduled"
    ]
    store = next(iter(gke_lc._lc.gke.clusters.values())).kube.store
    for line in ("INFO vLLM server starting", "INFO Uvicorn running on http://0.0.0.0:8000"):
        store.append_log(NS, "p", line)
    # (kubernetes 36 turns a preloaded `str` answer into "b'...'": read the raw text/plain body.)
    raw = core.read_namespaced_pod_log("p", NS, tail_lines=1, _preload_content=False)
    assert raw.data.decode() == "INFO Uvicorn running on http://0.0.0.0:8000\n"
    core.delete_namespace("more")
    with pytest.raises(client.ApiException) as e:
        core.read_namespaced_pod("p", NS)
    assert e.value.status == 404


def test_unauthenticated_and_expired_watch(gke_lc: RunningLocalCloud, api: client.ApiClient) -> None:
    anonymous = client.ApiClient(api.configuration)
    anonymous.configuration = client.Configuration(host=api.configuration.host)
    anonymous.configuration.ssl_ca_cert = api.configuration.ssl_ca_cert
    anonymous.rest_client = client.rest.RESTClientObject(anonymous.configuration)
    with pytest.raises(client.ApiException) as e:
        client.CoreV1Api(anonymous).list_namespace()
    assert e.value.status == 401 and json.loads(e.value.body)["reason"] == "Unauthorized"
    store = next(iter(gke_lc._lc.gke.clusters.values())).kube.store
    store._history.clear()
    core = client.CoreV1Api(api)
    resp = core.list_namespace(watch=True, resource_version="1", timeout_seconds=2, _preload_content=False)
    line = json.loads(resp.data.splitlines()[0])
    assert line["type"] == "ERROR" and line["object"]["code"] == 410
