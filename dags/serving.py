"""Interlude's serving DAG: the fine-tuned model's export served with vLLM on GKE, TPU first and GPU second."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from interlude.operators.serving import (
    ServingApplyOperator,
    ServingDeleteOperator,
    ServingRolloutOperator,
    ServingSmokeOperator,
)
from interlude.operators.serving_maintenance import ServingMaintenanceOperator
from interlude.operators.serving_report import ServingReportOperator
from interlude.serving.spec import ServeSpec
from interlude.training.assets import FINETUNED_CHECKPOINT

DOC_MD = """
# Interlude: serving (vLLM on GKE, TPU first, GPU second)

One run = one rollout of a fine-tuned model's Hugging Face export (`checkpoint_uri`: a gs:// directory with
config.json, model.safetensors and tokenizer files) onto a GKE cluster, the way Google's TPU/GPU
interoperability guide serves with vLLM: a custom **ComputeClass** lists TPU node pools first and GPU pools
second; each pod carries a vLLM TPU container and a vLLM GPU container, and the one matching its node's
accelerator serves. Each reads the export as Google documents for its image: `--load-format=runai_streamer`
from gs:// where the image has the Run:ai streamer's GCS backend, else a Cloud Storage FUSE CSI volume; the pods'
ServiceAccount reads the bucket through Workload Identity (`model_loader`, `gcp_service_account`).

Scheduled on the Asset `interlude_finetuned_checkpoint`: each fine-tuned checkpoint the training DAG commits
starts a run that serves it (the event's `checkpoint_uri`; an explicit `checkpoint_uri` param wins).

1. **resolve** — every param checked and typed (`ServeSpec`); bad input fails here, naming each param,
   before anything touches the cluster.
2. **route** — `action=delete` goes to **delete**, anything else to **plan**.
3. **plan** — runtimes checked (the vLLM TPU image supports the TPU generation, the GPU image's CUDA fits the
   driver, the image can load the export the way `model_loader` asks; an unknown image tag is refused naming the
   param), every manifest rendered and validated (Kubernetes schemas, the ComputeClass and PodMonitoring
   schemas, each container's `vllm serve` args against vLLM's parser or its flag table). The log shows the exact
   YAML. `plan_only` stops here.
4. **apply** — server-side apply of the plan's objects in order through the provider's GKE hooks; a re-run with
   the same params changes nothing (each object's outcome is logged: created / configured / unchanged).
5. **rollout** — deferred to the triggerer until the new pods are Ready (or `rollout_timeout_seconds` passes);
   logs the accelerator each pod landed on. Pods pending on a TPU stockout (the autoscaler's events) for
   `fallback_after_seconds` make it re-apply the ComputeClass GPU-first (logged with the reason; listed in
   the report): GPU replicas within minutes instead of GKE's TPU wait.
6. **smoke** — one greedy `/v1/completions` request through the Service (API server proxy); fails unless the
   answer comes from the served model and `/v1/models` names the export (or its FUSE mount).
7. **maintenance_watch** — for `watch_minutes` (0 = skip), deferred: a TPU/GPU node labelled
   `cloud.google.com/scheduled-maintenance-time` is cordoned, a replacement replica surged (HPA min/max + 1)
   and awaited Ready elsewhere, the node's pod evicted (Eviction API, PodDisruptionBudgets honoured), the
   maintenance started early (`maintenance_perform_early`), then the surge removed and the node uncordoned
   when it is back. Each decision is logged with its reason. With `load_requests` > 0 it sends a bounded load
   through the Service meanwhile (a drill). Bounded: never waits past the watch plus a finishing grace.
8. **report** — pods per accelerator after every change since the apply (the Kubernetes watch), time to first
   Ready, fallbacks, requests answered per accelerator (the pods' own access logs: smoke and load); the watch's
   decisions, and for a drill: requests sent/failed, p50/p99. What it could not count, it names.

**delete** removes every object the spec renders (reverse apply order) and waits until no pod, Service or
ComputeClass of it is left.
"""

with DAG(
    dag_id="interlude_serving",
    doc_md=DOC_MD,
    # Each fine-tuned checkpoint the training DAG commits (its Asset event names the URI); also by hand.
    schedule=[FINETUNED_CHECKPOINT],
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one rollout of a Deployment at a time
    tags=["interlude", "serving", "gke", "vllm", "tpu", "gpu"],
    params={name: Param(default, **schema) for name, (default, schema) in ServeSpec.form_schema().items()},
) as dag:

    @task(multiple_outputs=False)  # one XCom, return_value: see accelerator_training.MULTIPLE_OUTPUTS
    def resolve() -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from interlude.serving.spec import ServeSpecError
        from interlude.training.assets import triggering_checkpoint

        context = get_current_context()
        event_uri = triggering_checkpoint(context.get("triggering_asset_events"))
        if event_uri:
            print(f"Checkpoint from the triggering Asset event: {event_uri}")
        try:
            spec = ServeSpec.from_params(context["params"], checkpoint_uri=event_uri)
        except ServeSpecError as exc:  # bad input: a retry cannot fix it, the params must change
            raise AirflowFailException(str(exc)) from exc
        return spec.to_dict()

    @task.branch
    def route() -> str:
        spec = ServeSpec.from_dict(get_current_context()["ti"].xcom_pull(task_ids="resolve"))
        return "delete" if spec.action == "delete" else "plan"

    @task(multiple_outputs=False)
    def plan() -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from interlude.serving.entrypoints import load_scripts
        from interlude.serving.plan import ServingPlanError, require_plan

        spec = ServeSpec.from_dict(get_current_context()["ti"].xcom_pull(task_ids="resolve"))
        try:
            result = require_plan(spec, scripts=load_scripts())
        except ServingPlanError as exc:  # a bad image tag, an unsupported TPU generation: change the params
            raise AirflowFailException(str(exc)) from exc
        print(result.text)
        kinds = [f"{o['kind']}/{o['metadata']['name']}" for o in result.objects]
        return {"objects": kinds, "plan_only": spec.plan_only}

    @task.short_circuit
    def deploying() -> bool:
        """False for plan_only: the run ends after the plan, with nothing applied."""
        return not get_current_context()["ti"].xcom_pull(task_ids="plan")["plan_only"]

    apply = ServingApplyOperator(task_id="apply")
    rollout = ServingRolloutOperator(task_id="rollout")
    smoke = ServingSmokeOperator(task_id="smoke")
    maintenance_watch = ServingMaintenanceOperator(task_id="maintenance_watch")
    report = ServingReportOperator(task_id="report")
    delete = ServingDeleteOperator(task_id="delete")

    routed = route()
    resolve() >> routed
    routed >> plan() >> deploying() >> apply >> rollout >> smoke >> maintenance_watch >> report
    routed >> delete
