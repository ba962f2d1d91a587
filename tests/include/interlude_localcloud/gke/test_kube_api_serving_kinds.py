"""Every object the serving plan renders is served and admitted by the local GKE API (ServiceAccount, RBAC,
PodMonitoring next to the core kinds), applied server-side through KubeObjects (the serving DAG's hook);
applying the same manifests again is no write, as on Kubernetes; an invalid PodMonitoring is refused."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic.exceptions import UnprocessibleEntityError

from interlude.hooks import kube_objects
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


def test_the_service_proxy_answers_as_the_api_server_does_without_endpoints(
    kube: KubeObjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No pods run in this cluster (no `gke: run`): a Service without Ready endpoints is 503, a missing one 404.
    (The proxied answers themselves are asserted by the serving DAG's end-to-end test.) The retries are counted:
    every answer the proxy gave, and the hook's sleeps on a clock of the test's own (it moves only when slept on)."""
    service = next(o for o in require_plan(SPEC, scripts=load_scripts()).objects if o["kind"] == "Service")
    kube.apply(copy.deepcopy(service))
    answers: list[int] = []
    real_call = kube.api_client.call_api

    def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            out = real_call(*args, **kwargs)
        except client.ApiException as e:
            answers.append(e.status)
            raise
        answers.append(200)
        return out

    class Clock:
        now = 0.0
        sleeps: list[float] = []

        @classmethod
        def monotonic(cls) -> float:
            return cls.now

        @classmethod
        def sleep(cls, seconds: float) -> None:
            cls.sleeps.append(seconds)
            cls.now += seconds

    monkeypatch.setattr(kube.api_client, "call_api", counted)
    monkeypatch.setattr(kube_objects, "time", Clock)
    with pytest.raises(client.ApiException) as no_endpoints:
        kube.service_call(SPEC.namespace, SPEC.name, "v1/models", unavailable_for=0)
    assert no_endpoints.value.status == 503 and answers == [503] and Clock.sleeps == []
    # A 503 is retried for the window (endpoints lag readiness), then raised: one look at its start and one after
    # each retry interval until the window has passed (2.5 s at 1 s a retry: three sleeps, four looks).
    answers.clear()
    with pytest.raises(client.ApiException) as still_none:
        kube.service_call(SPEC.namespace, SPEC.name, "v1/models", unavailable_for=2.5)
    assert still_none.value.status == 503
    retries = math.ceil(2.5 / kube_objects.UNAVAILABLE_RETRY_INTERVAL)
    assert Clock.sleeps == [kube_objects.UNAVAILABLE_RETRY_INTERVAL] * retries and answers == [503] * (retries + 1)
    # A 404 is never retried.
    answers.clear()
    Clock.sleeps.clear()
    with pytest.raises(client.ApiException) as missing:
        kube.service_call(SPEC.namespace, "no-such-service", "v1/models")
    assert missing.value.status == 404 and answers == [404] and Clock.sleeps == []
