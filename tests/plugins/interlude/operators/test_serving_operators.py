"""The serving DAG's operators called as Airflow calls them, against a local GKE cluster that runs pods (scenario
gke_serving_run: a one-node TPU v6e pool, an L4 pool; the vLLM images run the stand-in behind the shipped
entrypoints) and a fine-tuned model export in the cloud's GCS.

Each fact is read back from the cluster with the Kubernetes client (objects, pods, their nodes' labels) or from
the pods' answers, not from the operators' return values alone. The tests share one deployment (built by
`deployed` through apply and rollout) and run in file order; the delete test is last.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from kubernetes import client

from interlude.operators.serving import (
    ServingApplyOperator,
    ServingDeleteOperator,
    ServingRolloutOperator,
    ServingSmokeOperator,
)
from interlude.operators.serving_maintenance import ServingMaintenanceOperator
from interlude.operators.serving_report import ServingReportOperator
from interlude.serving.render import object_refs
from interlude.serving.spec import ServeSpec
from interlude_localcloud.testing import RunningLocalCloud, running_localcloud
from tests.plugins.interlude.operators.support import Driven, context, drive

TPU_LABEL = "cloud.google.com/gke-tpu-accelerator"
SELECTOR = "app.kubernetes.io/name="
PREFIX = "interlude/serve-ops/finetune/export-00000005"


@dataclass
class Cluster:
    cloud: RunningLocalCloud
    spec: ServeSpec
    api: client.ApiClient

    def pods(self) -> list[client.V1Pod]:
        core = client.CoreV1Api(self.api)
        return list(core.list_namespaced_pod(self.spec.namespace, label_selector=SELECTOR + self.spec.name).items)

    def objects(self) -> Any:
        from interlude.hooks.kube_objects import KubeObjects

        return KubeObjects(self.api)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster, and the model it serves: a fine-tuned export in the cloud's GCS, as the training DAG leaves it."""
    from interlude.hooks.gke import GKEHook
    from interlude_workload.gcs import storage_client
    from tests.include.serving.standin_proc import make_export, upload_export

    export = make_export(tmp_path_factory.mktemp("serving-ops") / "export", seed=7)
    with running_localcloud("gke_serving_run", strict=True, gcs=True) as lc, pytest.MonkeyPatch.context() as mp:
        for name, value in lc.airflow_conn_env().items():
            mp.setenv(name, value)
        mp.setenv("STORAGE_EMULATOR_HOST", lc.gcs_endpoint)
        gcs = storage_client()
        gcs.create_bucket("serving-ops")
        uri = upload_export(export, gcs, "serving-ops", PREFIX)
        spec = ServeSpec.from_params({"checkpoint_uri": uri, "poll_seconds": 0.5})
        hook = GKEHook(location=spec.location)
        with hook.kubernetes_hook(spec.cluster, project_id=lc.project).get_conn() as api:
            yield Cluster(lc, spec, api)
        assert lc.violations == []


@dataclass
class Deployed:
    applied: dict[str, Any]
    rollout: Driven


@pytest.fixture(scope="module")
def deployed(cluster: Cluster) -> Deployed:
    """apply, then rollout (deferred, its trigger run to its event), as the DAG runs them."""
    ctx = context(resolve=cluster.spec.to_dict())
    applied = ServingApplyOperator(task_id="apply").execute(ctx)
    return Deployed(applied, drive(lambda: ServingRolloutOperator(task_id="rollout"), ctx))


def _ctx(cluster: Cluster, spec: ServeSpec | None = None, **xcoms: Any) -> dict[str, Any]:
    return context(resolve=(spec or cluster.spec).to_dict(), **xcoms)


def test_apply_creates_every_object_of_the_plan_and_a_second_apply_changes_nothing(
    cluster: Cluster, deployed: Deployed
) -> None:
    kube = cluster.objects()
    assert {(a["kind"], a["name"]) for a in deployed.applied["applied"]} == {
        (kind, name) for _, kind, _, name in object_refs(cluster.spec)
    }
    for ref in object_refs(cluster.spec):
        assert kube.get(ref) is not None, f"{ref} is not in the cluster"
    again = ServingApplyOperator(task_id="apply").execute(_ctx(cluster))
    assert again["changed"] == 0 and {a["outcome"] for a in again["applied"]} == {"unchanged"}


def test_a_spec_the_plan_refuses_is_refused_before_anything_is_applied(cluster: Cluster) -> None:
    from interlude.serving.plan import ServingPlanError

    bad = cluster.spec.replace(name="refused-vllm", tpu_image="docker.io/vllm/vllm-tpu:v0.0.1")
    with pytest.raises(ServingPlanError, match="tpu_image"):
        ServingApplyOperator(task_id="apply").execute(_ctx(cluster, bad))
    assert [ref for ref in object_refs(bad) if cluster.objects().get(ref) is not None] == []


def test_rollout_defers_until_the_deployment_is_ready_on_the_tpu_node(cluster: Cluster, deployed: Deployed) -> None:
    assert deployed.rollout.deferrals == [("interlude.triggers.serving.RolloutTrigger", "execute_complete")]
    result = deployed.rollout.result
    assert result["status"] == "done" and result["fallbacks"] == []
    core = client.CoreV1Api(cluster.api)
    ready = {
        p.metadata.name: p.spec.node_name
        for p in cluster.pods()
        if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    }
    assert sorted(ready) == sorted(p["name"] for p in result["pods"]) and ready
    for node in ready.values():
        assert TPU_LABEL in (core.read_node(node).metadata.labels or {})  # the TPU-first class placed it


@pytest.mark.parametrize(
    "event",
    [None, {"status": "timeout", "reason": "0 of 1 replicas Ready"}, {"status": "error", "message": "boom"}],
)
def test_rollout_execute_complete_fails_loudly_on_anything_but_done(cluster: Cluster, event: Any) -> None:
    with pytest.raises(AirflowException, match="rollout"):
        ServingRolloutOperator(task_id="rollout").execute_complete(_ctx(cluster), event)


def test_a_fallback_decision_applies_the_gpu_first_class_and_waits_for_the_rollout_again(
    cluster: Cluster, deployed: Deployed
) -> None:
    import time

    from interlude.serving.fallback import FallbackState

    ref = ("cloud.google.com/v1", "ComputeClass", None, cluster.spec.name)
    plan = {"action": "fall_back_to_gpu", "order": "gpu_first", "reason": "TPU stockout", "stuck_pods": ["p-1"]}
    state = FallbackState("tpu_first", time.time(), cluster.cloud.scenario.time_scale)
    event = {"status": "fallback", "plan": plan, "fallback_state": state.to_dict(), "deadline": time.time() + 600}
    try:
        with pytest.raises(TaskDeferred) as deferred:
            ServingRolloutOperator(task_id="rollout").execute_complete(_ctx(cluster), event)
        priorities = cluster.objects().get(ref)["spec"]["priorities"]
        assert "gpu" in priorities[0] and "tpu" in priorities[1], priorities
        path, kwargs = deferred.value.trigger.serialize()
        assert (path, deferred.value.method_name) == ("interlude.triggers.serving.RolloutTrigger", "execute_complete")
        assert kwargs["deadline"] == event["deadline"]  # the rollout's deadline does not move
        carried = FallbackState.from_dict(kwargs["fallback"]["state"])
        assert carried.order == "gpu_first" and [r["action"] for r in carried.records] == ["fall_back_to_gpu"]
    finally:
        ServingApplyOperator(task_id="apply").execute(_ctx(cluster))  # TPU first again for the tests after
    assert "tpu" in cluster.objects().get(ref)["spec"]["priorities"][0]


def test_smoke_answers_from_the_served_checkpoint(cluster: Cluster, deployed: Deployed) -> None:
    answer = ServingSmokeOperator(task_id="smoke").execute(_ctx(cluster))
    assert answer["root"] == cluster.spec.checkpoint_uri and answer["text"]


def test_smoke_fails_when_the_service_serves_another_checkpoint(cluster: Cluster, deployed: Deployed) -> None:
    other = cluster.spec.replace(checkpoint_uri="gs://serving-ops/interlude/serve-ops/finetune/export-00000099")
    with pytest.raises(AirflowFailException, match="smoke test failed") as failed:
        ServingSmokeOperator(task_id="smoke").execute(_ctx(cluster, other))
    assert "export-00000099" in str(failed.value)


def test_the_maintenance_watch_is_skipped_at_zero_minutes_and_otherwise_waits_in_its_trigger(
    cluster: Cluster, deployed: Deployed
) -> None:
    assert ServingMaintenanceOperator(task_id="maintenance_watch").execute(_ctx(cluster)) == {"skipped": True}

    spec = cluster.spec.replace(watch_minutes=0.05, load_requests=3)
    ctx = _ctx(cluster, spec, apply=deployed.applied)
    watched = drive(lambda: ServingMaintenanceOperator(task_id="maintenance_watch"), ctx)
    assert watched.deferrals == [("interlude.triggers.serving_maintenance.MaintenanceWatchTrigger", "execute_complete")]
    assert watched.result["status"] == "done" and watched.result["decisions"] == []
    load = watched.result["load"]
    assert (load["sent"], load["failed"]) == (3, 0), load


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (None, "maintenance watch no event"),
        ({"status": "error", "message": "boom"}, "maintenance watch error: boom"),
        ({"status": "timeout", "in_flight": ["drain node-1"]}, "maintenance watch timeout: drain node-1"),
    ],
)
def test_the_maintenance_watch_fails_loudly_on_anything_but_done(cluster: Cluster, event: Any, message: str) -> None:
    with pytest.raises(AirflowException, match=message):
        ServingMaintenanceOperator(task_id="maintenance_watch").execute_complete(_ctx(cluster), event)


def test_the_report_counts_the_requests_the_pods_answered_since_the_apply(cluster: Cluster, deployed: Deployed) -> None:
    applied = ServingApplyOperator(task_id="apply").execute(_ctx(cluster))  # the report counts from here
    body = {"model": cluster.spec.served_model_name, "prompt": "count me", "max_tokens": 2}
    for _ in range(3):
        cluster.objects().service_call(cluster.spec.namespace, cluster.spec.name, "v1/completions", body)
    xcoms = {"apply": applied, "rollout": deployed.rollout.result, "maintenance_watch": {"skipped": True}}

    report = ServingReportOperator(task_id="report").execute(_ctx(cluster, **xcoms))
    assert report["requests_per_accelerator"]["tpu"] == {"answered": 3, "failed": 0}, report["text"]
    assert report["pods_per_accelerator"] == {"tpu": len(deployed.rollout.result["pods"])}
    assert report["fallbacks"] == [] and "maintenance decisions" not in report["text"]


def test_delete_removes_every_object_and_waits_until_nothing_is_left(cluster: Cluster, deployed: Deployed) -> None:
    ctx = _ctx(cluster)
    deleted = drive(lambda: ServingDeleteOperator(task_id="delete"), ctx)
    assert deleted.deferrals == [("interlude.triggers.serving.DeletedTrigger", "execute_complete")]
    assert deleted.result["status"] == "done"
    assert [ref for ref in object_refs(cluster.spec) if cluster.objects().get(ref) is not None] == []
    assert cluster.pods() == []
    with pytest.raises(AirflowException, match="delete timeout"):
        ServingDeleteOperator(task_id="delete").execute_complete(ctx, {"status": "timeout", "left": ["pod/x"]})
