"""Endpoints/EndpointSlices kept from Services and pod readiness, and cascading deletion, with the real client.

https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/ and
https://kubernetes.io/docs/concepts/architecture/garbage-collection/#cascading-deletion. No kubelet runs
in this cluster: the tests play it (pod IP and Ready through `/status`), so readiness is theirs to say.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from interlude.hooks.gke import GKEHook
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, LOCATION

NS = "endpoints"


def until(pred: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := pred():
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def api(gke_lc: RunningLocalCloud, gke_conn: str) -> Iterator[client.ApiClient]:
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION).kubernetes_hook(CLUSTER, project_id=gke_lc.project)
    with hook.get_conn() as api_client:
        client.CoreV1Api(api_client).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        yield api_client


def _pod(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    container = {"name": "w", "image": "python:3.12", "ports": [{"name": "http", "containerPort": 8080}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [container], **spec},
    }


def _kubelet(core: client.CoreV1Api, name: str, ip: str, ready: bool) -> None:
    """What the kubelet writes once the pod runs: its IP, Running, and whether it is Ready."""
    flag = "True" if ready else "False"
    status = {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": flag}]}
    core.patch_namespaced_pod_status(name, NS, {"status": status})


def _service(name: str, selector: dict[str, str], headless: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": selector, "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def _slices(api: client.ApiClient, svc: str) -> list[client.V1EndpointSlice]:
    selector = f"kubernetes.io/service-name={svc}"
    return client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(NS, label_selector=selector).items


def test_endpoints_and_slices_tell_ready_from_unready_pods(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for name in ("web-0", "web-1"):
        core.create_namespaced_pod(NS, _pod(name, {"app": "web"}))
    core.create_namespaced_pod(NS, _pod("other", {"app": "other"}))
    core.create_namespaced_service(NS, _service("web", {"app": "web"}))
    _kubelet(core, "web-0", "10.4.0.10", ready=True)
    _kubelet(core, "web-1", "10.4.0.11", ready=False)
    _kubelet(core, "other", "10.4.0.12", ready=True)

    def endpoints() -> client.V1Endpoints | None:
        ep = core.read_namespaced_endpoints("web", NS)
        subsets = ep.subsets or []
        return ep if subsets and subsets[0].addresses and subsets[0].not_ready_addresses else None

    subset = until(endpoints, "Endpoints with a ready and an unready address").subsets[0]
    assert [(a.ip, a.target_ref.name) for a in subset.addresses] == [("10.4.0.10", "web-0")]
    assert [(a.ip, a.target_ref.name) for a in subset.not_ready_addresses] == [("10.4.0.11", "web-1")]
    assert [(p.name, p.port, p.protocol) for p in subset.ports] == [("web", 8080, "TCP")]  # targetPort by name
    (slice_,) = until(lambda: [s for s in _slices(api, "web") if len(s.endpoints) == 2], "an EndpointSlice")
    assert slice_.address_type == "IPv4" and [(p.name, p.port) for p in slice_.ports] == [("web", 8080)]
    assert {e.target_ref.name: e.conditions.ready for e in slice_.endpoints} == {"web-0": True, "web-1": False}
    assert [o.kind for o in slice_.metadata.owner_references] == ["Service"]
    # web-1 turns Ready, web-0 is deleted: the next state of both objects says so.
    _kubelet(core, "web-1", "10.4.0.11", ready=True)
    core.delete_namespaced_pod("web-0", NS)

    def moved() -> bool:
        subsets = core.read_namespaced_endpoints("web", NS).subsets or []
        ready = [a.target_ref.name for s in subsets for a in s.addresses or []]
        unready = [a for s in subsets for a in s.not_ready_addresses or []]
        eps = [e.target_ref.name for s in _slices(api, "web") for e in s.endpoints if e.conditions.ready]
        return ready == ["web-1"] and not unready and eps == ["web-1"]

    until(moved, "web-1 ready in both")
    # The Service goes: its Endpoints go, and its slices with it (owned, garbage collected).
    core.delete_namespaced_service("web", NS)
    until(lambda: not _slices(api, "web"), "the slices collected")
    with pytest.raises(client.ApiException) as e:
        until(lambda: core.read_namespaced_endpoints("web", NS) and None, "Endpoints gone", timeout=5)
    assert e.value.status == 404


def test_a_headless_service_publishes_pod_hostnames(api: client.ApiClient) -> None:
    """JobSet's headless Service: pods with `subdomain` = the Service get their `hostname` in the endpoints."""
    core = client.CoreV1Api(api)
    core.create_namespaced_service(NS, _service("workers", {"job": "train"}, headless=True))
    for i in range(2):
        core.create_namespaced_pod(NS, _pod(f"train-{i}", {"job": "train"}, hostname=f"train-{i}", subdomain="workers"))
        _kubelet(core, f"train-{i}", f"10.4.1.{i}", ready=i == 0)

    def published() -> Any:
        got = [e for s in _slices(api, "workers") for e in s.endpoints]
        return got if len(got) == 2 else None

    endpoints = until(published, "both pods in the headless Service's slice")
    assert {(e.hostname, e.conditions.ready) for e in endpoints} == {("train-0", True), ("train-1", False)}
    ep = core.read_namespaced_endpoints("workers", NS)
    assert "service.kubernetes.io/headless" in ep.metadata.labels
    assert "service.kubernetes.io/headless" in _slices(api, "workers")[0].metadata.labels
    assert [a.hostname for a in ep.subsets[0].addresses] == ["train-0"]
    assert [a.hostname for a in ep.subsets[0].not_ready_addresses] == ["train-1"]


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "w", "image": "python:3.12"}]},
            },
        },
    }


def _answer(resp: Any) -> dict[str, Any]:
    """A DELETE's body as sent (the generated methods read every answer as a Status; a kept object is not)."""
    return dict(json.loads(resp.data))


def _pods_of(core: client.CoreV1Api, app: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(NS, label_selector=f"app={app}").items


def test_foreground_deletion_deletes_dependents_first(api: client.ApiClient) -> None:
    """Foreground: the owner stays, marked, until every dependent that blocks it is gone."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    apps.create_namespaced_deployment(NS, _deployment("fg", 2))
    pods = until(lambda: (p := _pods_of(core, "fg")) and len(p) == 2 and p, "two pods")
    assert all(o.block_owner_deletion for p in pods for o in p.metadata.owner_references)
    held = pods[0].metadata.name  # a finalizer of its own keeps this pod (and so its owner) for a while
    core.patch_namespaced_pod(held, NS, {"metadata": {"finalizers": ["example.com/hold"]}})
    options = client.V1DeleteOptions(propagation_policy="Foreground")
    answer = _answer(apps.delete_namespaced_deployment("fg", NS, body=options, _preload_content=False))
    assert answer["kind"] == "Deployment" and answer["metadata"]["deletionTimestamp"]
    assert answer["metadata"]["finalizers"] == ["foregroundDeletion"]
    until(lambda: [p.metadata.name for p in _pods_of(core, "fg")] == [held], "the free pod deleted")
    waiting = core.read_namespaced_pod(held, NS)
    assert waiting.metadata.deletion_timestamp is not None
    owner = apps.read_namespaced_deployment("fg", NS)  # still there: a blocking dependent is left
    assert owner.metadata.finalizers == ["foregroundDeletion"] and owner.metadata.deletion_timestamp
    with pytest.raises(client.ApiException) as e:  # no new finalizer on an object being deleted
        apps.patch_namespaced_deployment("fg", NS, {"metadata": {"finalizers": ["foregroundDeletion", "x.io/late"]}})
    assert e.value.status == 422
    core.patch_namespaced_pod(held, NS, {"metadata": {"finalizers": None}})
    until(lambda: not _pods_of(core, "fg"), "the held pod gone")
    with pytest.raises(client.ApiException) as e:
        until(lambda: apps.read_namespaced_deployment("fg", NS) and None, "the owner gone", timeout=10)
    assert e.value.status == 404
    # A dying Deployment makes no pods: since the delete, its pods were only deleted (or marked so).
    core.create_namespaced_pod(
        NS, {"metadata": {"name": "fg-end", "labels": {"app": "fg"}}, "spec": _pod("x", {})["spec"]}
    )
    seen, w = set(), watch.Watch()
    kwargs = {
        "label_selector": "app=fg",
        "resource_version": answer["metadata"]["resourceVersion"],
        "timeout_seconds": 10,
    }
    for ev in w.stream(core.list_namespaced_pod, NS, **kwargs):
        if ev["raw_object"]["metadata"]["name"] == "fg-end":  # the marker: every earlier event has been read
            w.stop()
            break
        seen.add(ev["type"])
    assert seen == {"MODIFIED", "DELETED"}
    core.delete_namespaced_pod("fg-end", NS)


def _job(name: str, completions: int) -> dict[str, Any]:
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "python:3.12"}]}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"completions": completions, "parallelism": 1, "template": template},
    }


def _job_pods(core: client.CoreV1Api, job: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(NS, label_selector=f"batch.kubernetes.io/job-name={job}").items


def test_a_job_being_deleted_makes_no_pods_and_its_pods_are_collected(api: client.ApiClient) -> None:
    """The Job controller leaves a Job with a deletionTimestamp alone; its pods go through the garbage collector."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    batch.create_namespaced_job(NS, _job("fgjob", completions=2))
    (pod,) = until(lambda: _job_pods(core, "fgjob"), "the Job's first pod")
    ref = pod.metadata.owner_references[0]
    assert (ref.kind, ref.name, ref.controller, ref.block_owner_deletion) == ("Job", "fgjob", True, True)
    held = pod.metadata.name
    core.patch_namespaced_pod(held, NS, {"metadata": {"finalizers": ["example.com/hold"]}})
    options = client.V1DeleteOptions(propagation_policy="Foreground")
    answer = _answer(batch.delete_namespaced_job("fgjob", NS, body=options, _preload_content=False))
    assert answer["metadata"]["finalizers"] == ["foregroundDeletion"]
    until(lambda: core.read_namespaced_pod(held, NS).metadata.deletion_timestamp, "the collector deleting the pod")
    # The pod now succeeds: a live Job would count it and start the second completion's pod.
    core.patch_namespaced_pod_status(held, NS, {"status": {"phase": "Succeeded"}})
    batch.create_namespaced_job(NS, _job("marker", completions=1))  # a controller pass after the patch ...
    until(lambda: _job_pods(core, "marker"), "the marker Job's pod")  # ... has run once this pod exists
    assert [p.metadata.name for p in _job_pods(core, "fgjob")] == [held]
    dying = batch.read_namespaced_job("fgjob", NS)
    assert dying.metadata.deletion_timestamp and not dying.status.succeeded
    # Not even a pod made and collected at once: since the delete, the held pod's changes are all there is.
    end = _pod("fgjob-end", {"batch.kubernetes.io/job-name": "fgjob"})
    core.create_namespaced_pod(NS, end)
    seen, w = set(), watch.Watch()
    kwargs = {
        "label_selector": "batch.kubernetes.io/job-name=fgjob",
        "resource_version": answer["metadata"]["resourceVersion"],
        "timeout_seconds": 10,
    }
    for ev in w.stream(core.list_namespaced_pod, NS, **kwargs):
        if ev["raw_object"]["metadata"]["name"] == "fgjob-end":  # the marker: every earlier event has been read
            w.stop()
            break
        seen.add((ev["type"], ev["raw_object"]["metadata"]["name"]))
    assert seen == {("MODIFIED", held)}
    core.delete_namespaced_pod("fgjob-end", NS)
    core.patch_namespaced_pod(held, NS, {"metadata": {"finalizers": None}})
    with pytest.raises(client.ApiException) as e:
        until(lambda: batch.read_namespaced_job("fgjob", NS) and None, "the Job gone", timeout=10)
    assert e.value.status == 404
    batch.delete_namespaced_job("marker", NS)  # Background: the Job at once, its pod by the collector
    until(lambda: not _job_pods(core, "marker"), "the marker's pod collected")


def test_orphan_leaves_the_dependents_without_their_owner(api: client.ApiClient) -> None:
    """Orphan (here as a query parameter): the pods stay, their ownerReference to the owner removed."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    apps.create_namespaced_deployment(NS, _deployment("orphans", 2))
    until(lambda: len(_pods_of(core, "orphans")) == 2, "two pods")
    answer = apps.delete_namespaced_deployment("orphans", NS, propagation_policy="Orphan", _preload_content=False)
    assert _answer(answer)["metadata"]["finalizers"] == ["orphan"]
    with pytest.raises(client.ApiException) as e:
        until(lambda: apps.read_namespaced_deployment("orphans", NS) and None, "the owner gone", timeout=10)
    assert e.value.status == 404
    pods = _pods_of(core, "orphans")
    assert len(pods) == 2 and all(not p.metadata.owner_references for p in pods)
    # Nothing collects them later either: another delete would (a sync point: the collector ran past it).
    apps.create_namespaced_deployment(NS, _deployment("bg", 1))
    until(lambda: len(_pods_of(core, "bg")) == 1, "one pod")
    assert apps.delete_namespaced_deployment("bg", NS).status == "Success"  # Background: gone at once
    until(lambda: not _pods_of(core, "bg"), "the background deletion's pod collected")
    assert len(_pods_of(core, "orphans")) == 2


def test_delete_options_preconditions_and_dry_run(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(NS, {"metadata": {"name": "pre"}, "data": {}})
    with pytest.raises(client.ApiException) as e:
        core.delete_namespaced_config_map("pre", NS, body=client.V1DeleteOptions(preconditions={"uid": "not-it"}))
    assert e.value.status == 409 and "Precondition failed: UID in precondition: not-it" in e.value.body
    with pytest.raises(client.ApiException) as e:
        core.delete_namespaced_config_map("pre", NS, propagation_policy="Sideways")
    assert e.value.status == 422
    options = client.V1DeleteOptions(propagation_policy="Foreground")
    answer = _answer(core.delete_namespaced_config_map("pre", NS, body=options, dry_run="All", _preload_content=False))
    assert answer["metadata"]["finalizers"] == ["foregroundDeletion"]  # the answer a real one would get ...
    assert core.read_namespaced_config_map("pre", NS).metadata.deletion_timestamp is None  # ... nothing done
