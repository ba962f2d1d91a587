"""The Kubernetes API conventions JobSets and their clients rely on, through the real `kubernetes` client.

Validation of pod templates and immutable fields, `dryRun=All`, watches resumed from a resourceVersion
(https://kubernetes.io/docs/reference/using-api/api-concepts/). Endpoints/EndpointSlices and cascading
deletion are in test_endpoints_and_deletion.py. The cluster runs no kubelet here: the tests play it by
writing pods' `/status`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from interlude.hooks.gke import GKEHook
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, LOCATION

NS = "conventions"


@pytest.fixture(scope="module")
def api(gke_lc: RunningLocalCloud, gke_conn: str) -> Iterator[client.ApiClient]:
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION).kubernetes_hook(CLUSTER, project_id=gke_lc.project)
    with hook.get_conn() as api_client:
        client.CoreV1Api(api_client).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        yield api_client


def _container(name: str) -> dict[str, Any]:
    return {"name": name, "image": "python:3.12", "command": ["sleep", "60"]}


def _template(labels: dict[str, str], *names: str, restart: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [_container(n) for n in names]}
    if restart:
        spec["restartPolicy"] = restart
    return {"metadata": {"labels": labels}, "spec": spec}


def _deployment(name: str, labels: dict[str, str], *names: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": _template(labels, *names)},
    }


def _invalid(e: pytest.ExceptionInfo[client.ApiException]) -> list[dict[str, str]]:
    assert e.value.status == 422, e.value.body
    body = json.loads(e.value.body)
    assert body["reason"] == "Invalid"
    return list(body["details"]["causes"])


def test_duplicate_container_names_are_invalid_in_pods_and_templates(api: client.ApiClient) -> None:
    """The API server validates a template as the pod it makes: the later entry is a Duplicate value."""
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "twins"},
        "spec": _template({}, "a", "b", "a")["spec"],
    }
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod(NS, pod)
    assert _invalid(e) == [
        {"reason": "FieldValueDuplicate", "message": 'Duplicate value: "a"', "field": "spec.containers[2].name"}
    ]
    pod["spec"]["initContainers"] = [_container("b")]
    pod["spec"]["containers"] = [_container("a"), _container("b")]
    with pytest.raises(client.ApiException) as e:  # an init container may not take a container's name either
        core.create_namespaced_pod(NS, pod)
    assert [c["field"] for c in _invalid(e)] == ["spec.initContainers[0].name"]

    with pytest.raises(client.ApiException) as e:
        apps.create_namespaced_deployment(NS, _deployment("twins", {"app": "twins"}, "main", "main"))
    assert [(c["field"], c["reason"]) for c in _invalid(e)] == [
        ("spec.template.spec.containers[1].name", "FieldValueDuplicate")
    ]
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "twins"},
        "spec": {"template": _template({}, "w", "w", restart="Never")},
    }
    with pytest.raises(client.ApiException) as e:
        batch.create_namespaced_job(NS, job)
    assert [c["field"] for c in _invalid(e)] == ["spec.template.spec.containers[1].name"]
    job["spec"]["template"] = _template({}, "w", "x", restart="Never")
    created = batch.create_namespaced_job(NS, job)
    assert created.spec.backoff_limit == 6 and created.spec.template.spec.restart_policy == "Never"
    with pytest.raises(client.ApiException) as e:  # a Job's pods run to completion
        batch.create_namespaced_job(
            NS, {**job, "metadata": {"name": "forever"}, "spec": {"template": _template({}, "w")}}
        )
    assert [c["field"] for c in _invalid(e)] == ["spec.template.spec.restartPolicy"]
    # An update is validated the same way.
    apps.create_namespaced_deployment(NS, _deployment("single", {"app": "single"}, "main"))
    with pytest.raises(client.ApiException) as e:
        apps.patch_namespaced_deployment(
            "single",
            NS,
            [{"op": "add", "path": "/spec/template/spec/containers/-", "value": _container("main")}],
        )
    assert [c["field"] for c in _invalid(e)] == ["spec.template.spec.containers[1].name"]
    assert [c.name for c in apps.read_namespaced_deployment("single", NS).spec.template.spec.containers] == ["main"]


def test_a_deployments_selector_is_immutable(api: client.ApiClient) -> None:
    """apps/v1: spec.selector is fixed at creation (patch, replace and apply alike); other fields change."""
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(NS, _deployment("fixed", {"app": "fixed"}, "main"))
    moved = {
        "spec": {"selector": {"matchLabels": {"app": "moved"}}, "template": {"metadata": {"labels": {"app": "moved"}}}}
    }
    with pytest.raises(client.ApiException) as e:
        apps.patch_namespaced_deployment("fixed", NS, moved)
    cause = _invalid(e)[0]
    assert cause["field"] == "spec.selector" and cause["message"].endswith("field is immutable")
    assert '"app":"moved"' in cause["message"]
    current = apps.read_namespaced_deployment("fixed", NS)
    current.spec.selector.match_labels = {"app": "moved", "tier": "x"}
    current.spec.template.metadata.labels = {"app": "moved", "tier": "x"}
    with pytest.raises(client.ApiException) as e:
        apps.replace_namespaced_deployment("fixed", NS, current)
    assert [c["field"] for c in _invalid(e)] == ["spec.selector"]
    assert apps.read_namespaced_deployment("fixed", NS).spec.selector.match_labels == {"app": "fixed"}
    patched = apps.patch_namespaced_deployment("fixed", NS, {"spec": {"replicas": 0, "minReadySeconds": 5}})
    assert patched.spec.min_ready_seconds == 5 and patched.metadata.generation == 2


def test_a_jobs_generated_selector_is_kept_and_immutable(api: client.ApiClient) -> None:
    """batch/v1: the API server generates a Job's selector once (the Job strategy's Validate, keeping labels the
    template already has); later writes keep it, and changing it is 422 as for a Deployment."""
    batch = client.BatchV1Api(api)
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "picked"},
        "spec": {"template": _template({"job-name": "mine"}, "w", restart="Never")},
    }
    created = batch.create_namespaced_job(NS, body)
    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    labels = created.spec.template.metadata.labels
    assert labels["job-name"] == "mine" and labels["batch.kubernetes.io/job-name"] == "picked"
    assert labels["controller-uid"] == labels["batch.kubernetes.io/controller-uid"] == uid
    relabelled = batch.patch_namespaced_job("picked", NS, {"metadata": {"labels": {"team": "ml"}}})
    assert relabelled.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    with pytest.raises(client.ApiException) as e:
        batch.patch_namespaced_job("picked", NS, {"spec": {"selector": {"matchLabels": {"app": "other"}}}})
    cause = _invalid(e)[0]
    assert cause["field"] == "spec.selector" and cause["message"].endswith("field is immutable")
    assert batch.read_namespaced_job("picked", NS).spec.selector.match_labels == {
        "batch.kubernetes.io/controller-uid": uid
    }
    batch.delete_namespaced_job("picked", NS)


def test_dry_run_validates_and_answers_but_persists_nothing(gke_lc: RunningLocalCloud, api: client.ApiClient) -> None:
    """`dryRun=All` on create, update, patch and delete: the answer a real write would get, nothing stored."""
    core = client.CoreV1Api(api)
    rv = core.list_namespaced_config_map(NS).metadata.resource_version
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "dry-"}, "data": {"k": "v"}}
    answered = core.create_namespaced_config_map(NS, cm, dry_run="All")
    assert answered.metadata.name.startswith("dry-") and answered.metadata.uid and answered.data == {"k": "v"}
    assert answered.metadata.resource_version is None  # never written to storage
    assert core.list_namespaced_config_map(NS).items == []
    with pytest.raises(client.ApiException) as e:  # still validated
        core.create_namespaced_config_map(NS, {**cm, "metadata": {"name": "Not_Valid"}}, dry_run="All")
    assert e.value.status == 422
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_config_map(NS, cm, dry_run="Some")
    assert e.value.status == 422 and 'supported values: "All"' in json.loads(e.value.body)["message"]

    real = core.create_namespaced_config_map(NS, {**cm, "metadata": {"name": "real"}})
    rv = real.metadata.resource_version
    patched = core.patch_namespaced_config_map("real", NS, {"data": {"k": "patched"}}, dry_run="All")
    assert patched.data == {"k": "patched"} and patched.metadata.resource_version == rv
    real.data = {"k": "replaced"}
    replaced = core.replace_namespaced_config_map("real", NS, real, dry_run="All")
    assert replaced.data == {"k": "replaced"}
    applied = core.patch_namespaced_config_map(
        "real",
        NS,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "real"}, "data": {"k": "applied"}},
        field_manager="dry",
        force=True,
        dry_run="All",
        _content_type="application/apply-patch+yaml",
    )
    assert applied.data == {"k": "applied"}
    core.delete_namespaced_config_map("real", NS, dry_run="All")
    core.delete_namespaced_config_map("real", NS, body=client.V1DeleteOptions(dry_run=["All"]))
    stored = core.read_namespaced_config_map("real", NS)
    assert stored.data == {"k": "v"} and stored.metadata.resource_version == rv
    # No watcher saw any of it: the cluster's resourceVersion moved only for the one real create.
    assert core.list_namespaced_config_map(NS).metadata.resource_version == rv


def test_a_resumed_watch_replays_the_recorded_event_types(gke_lc: RunningLocalCloud, api: client.ApiClient) -> None:
    """From resourceVersion N the watch sends what happened after N: MODIFIED stays MODIFIED (also for an
    object deleted since), a label change out of a selection is DELETED; a compacted N is 410 Gone."""
    core = client.CoreV1Api(api)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w", "labels": {"tier": "a"}}, "data": {}}
    core.create_namespaced_config_map(NS, cm)
    core.create_namespaced_config_map(NS, {**cm, "metadata": {"name": "w2", "labels": {"tier": "a"}}})
    since = core.list_namespaced_config_map(NS).metadata.resource_version
    core.patch_namespaced_config_map("w", NS, {"data": {"x": "1"}})
    core.delete_namespaced_config_map("w", NS)
    core.patch_namespaced_config_map("w2", NS, {"data": {"x": "1"}})
    core.patch_namespaced_config_map("w2", NS, {"metadata": {"labels": {"tier": "b"}}})

    for marker, tier in (("end-a", "a"), ("end-b", "b")):  # the last events: where a replay has been read
        core.create_namespaced_config_map(NS, {**cm, "metadata": {"name": marker, "labels": {"tier": tier}}})

    def replay(selector: str | None, marker: str) -> list[tuple[str, str]]:
        seen, w = [], watch.Watch()
        kwargs = {"resource_version": since, "label_selector": selector, "timeout_seconds": 10}
        for ev in w.stream(core.list_namespaced_config_map, NS, **kwargs):
            if (name := ev["raw_object"]["metadata"]["name"]) == marker:
                w.stop()
                break
            seen.append((ev["type"], name))
        return seen

    assert replay(None, "end-b") == [
        ("MODIFIED", "w"),
        ("DELETED", "w"),
        ("MODIFIED", "w2"),
        ("MODIFIED", "w2"),
        ("ADDED", "end-a"),
    ]
    assert replay("tier=a", "end-a") == [("MODIFIED", "w"), ("DELETED", "w"), ("MODIFIED", "w2"), ("DELETED", "w2")]
    assert replay("tier=b", "end-b") == [("ADDED", "w2")]
    # After compaction (what etcd does every few minutes) the old resourceVersion is gone for good.
    next(iter(gke_lc._lc.gke.clusters.values())).kube.store.compact()
    stream = watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=since, timeout_seconds=10)
    with pytest.raises(client.ApiException) as e:
        list(stream)
    assert e.value.status == 410
    resp = core.list_namespaced_config_map(
        NS, watch=True, resource_version=since, timeout_seconds=10, _preload_content=False
    )
    error = json.loads(resp.data.splitlines()[0])
    assert error["type"] == "ERROR" and error["object"]["reason"] == "Expired"
    assert error["object"]["message"].startswith(f"too old resource version: {since} (")
