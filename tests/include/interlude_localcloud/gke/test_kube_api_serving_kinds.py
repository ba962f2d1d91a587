"""Every object the serving plan renders is served and admitted by the local GKE API (ServiceAccount, RBAC,
PodMonitoring next to the core kinds), applied server-side through KubeObjects (the serving DAG's hook);
applying the same manifests again is no write, as on Kubernetes; an invalid PodMonitoring is refused."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.dynamic.exceptions import UnprocessibleEntityError

from interlude.hooks.gke import GKEHook
from interlude.hooks.kube_objects import KubeObjects
from interlude.serving.entrypoints import load_scripts
from interlude.serving.plan import require_plan
from interlude.serving.render import object_refs
from interlude.serving.spec import ServeSpec
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, LOCATION

SPEC = ServeSpec(checkpoint_uri="gs://bucket/interlude/run/finetune/", namespace="kinds", name="kinds-vllm")


@pytest.fixture(scope="module")
def kube(gke_lc: RunningLocalCloud, gke_conn: str) -> Iterator[KubeObjects]:
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION).kubernetes_hook(CLUSTER, project_id=gke_lc.project)
    with hook.get_conn() as api_client:
        client.CoreV1Api(api_client).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=SPEC.namespace))
        )
        yield KubeObjects(api_client)


def test_the_whole_plan_applies_then_reapplies_as_no_write_then_deletes(kube: KubeObjects) -> None:
    objects = require_plan(SPEC, scripts=load_scripts()).objects
    first = [kube.apply(copy.deepcopy(o)) for o in objects]
    assert [a.outcome for a in first] == ["created"] * len(objects)
    kinds = {a.kind for a in first}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "PodMonitoring"} <= kinds
    stored = {(a.kind, a.name): kube.get((a.api_version, a.kind, a.namespace, a.name)) for a in first}
    again = [kube.apply(copy.deepcopy(o)) for o in objects]
    assert [a.outcome for a in again] == ["unchanged"] * len(objects)
    for a in again:
        now = kube.get((a.api_version, a.kind, a.namespace, a.name))
        assert now is not None
        assert now["metadata"]["managedFields"] == stored[(a.kind, a.name)]["metadata"]["managedFields"]
    # a changed spec (another checkpoint) is a write again
    changed = require_plan(SPEC.replace(checkpoint_uri="gs://bucket/interlude/run2/finetune/"), scripts=load_scripts())
    assert any(kube.apply(o).outcome == "configured" for o in changed.objects)
    assert all(kube.delete(ref) for ref in object_refs(SPEC))
    assert all(kube.get(ref) is None for ref in object_refs(SPEC))


def test_an_invalid_podmonitoring_is_refused(kube: KubeObjects) -> None:
    bad = next(o for o in require_plan(SPEC, scripts=load_scripts()).objects if o["kind"] == "PodMonitoring")
    bad = copy.deepcopy(bad)
    bad["spec"]["endpoints"] = [{"port": "metrics", "interval": "often"}]
    with pytest.raises(UnprocessibleEntityError):
        kube.apply(bad)


def test_the_service_proxy_answers_as_the_api_server_does_without_endpoints(kube: KubeObjects) -> None:
    """No pods run in this cluster (no `gke: run`): a Service without Ready endpoints is 503, a missing one 404.
    (The proxied answers themselves are asserted by the serving DAG's end-to-end test.)"""
    service = next(o for o in require_plan(SPEC, scripts=load_scripts()).objects if o["kind"] == "Service")
    kube.apply(copy.deepcopy(service))
    with pytest.raises(client.ApiException) as no_endpoints:
        kube.service_call(SPEC.namespace, SPEC.name, "v1/models", unavailable_for=0)
    assert no_endpoints.value.status == 503
    # A 503 is retried for the window (endpoints lag readiness), then raised; a 404 is never retried.
    started = time.monotonic()
    with pytest.raises(client.ApiException) as still_none:
        kube.service_call(SPEC.namespace, SPEC.name, "v1/models", unavailable_for=2.5)
    assert still_none.value.status == 503
    assert time.monotonic() - started >= 2.5
    started = time.monotonic()
    with pytest.raises(client.ApiException) as missing:
        kube.service_call(SPEC.namespace, "no-such-service", "v1/models")
    assert missing.value.status == 404
    assert time.monotonic() - started < 5
