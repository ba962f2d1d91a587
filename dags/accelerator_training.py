"""Interlude's lifecycle DAG: choose an accelerator, validate, provision, train, fine-tune, tear down."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import DAG, Param, TaskGroup, get_current_context, task
from airflow.task.trigger_rule import TriggerRule

from interlude.training.assets import FINETUNED_CHECKPOINT
from interlude.training.spec import RunSpec

DOC_MD = """
# Interlude: accelerator training

One run takes a model through its whole life on Google Cloud TPUs or GPUs (or the local cloud):

1. **choose** — `evaluate_capacity` reads what Google exposes per zone (offered types, quota,
   reservations, queued resources); `decide` walks the **TPU-first** or **GPU-first** tree of the model
   profile. Every leaf is a task you see in the grid: `tpu`, `gpu`, `smaller_gpu`, `convert_for_gpu`,
   `convert_for_tpu`, `wait_for_capacity`, `stuck` (fails with a report of everything checked).
2. **validate_runtime** — accelerator x runtime version x framework against `plugins/interlude/runtimes/runtimes.yaml`
   and the zone's live runtime list, before anything costs money. `plan_only` stops here.
3. **provision** (setup) — TPU node or GPU VM (`onHostMaintenance=TERMINATE`), named from the run key,
   adopted if it exists. A stockout walks the tree again without that zone and type. Waiting for a
   queued resource or for quota defers to the triggerer (the task shows DEFERRED and holds no slot).
   With `platforms` naming `gke` first: a TPU node pool in `gke_cluster` and the run's JobSet, whose pod runs
   the same agent; GKE drains the node at a maintenance window and the stage checks the new pod resumed.
4. **train**, **finetune_gate**, **finetune** — the machine's agent runs each stage and checkpoints to
   GCS; deferrable triggers watch for maintenance notices, ask for a checkpoint, wait out the restart
   and check the workload resumed past it. `drill_maintenance` rehearses this with Google's
   `simulateMaintenanceEvent`.
   When fine-tuning's final checkpoint is committed, `finetune` emits an event on the Asset
   `interlude_finetuned_checkpoint` (its extra: `checkpoint_uri`, `step`, `run_key`): `interlude_serving`
   is scheduled on it.
5. **report** and **teardown** (always, even after failures or a killed `provision`; checkpoints stay).
   It deletes by label, name prefix and the intent record `provision` writes before each create, in
   every zone of the run; a zone it cannot list or anything still there afterwards fails the run.

Clearing a failed step re-runs its setup and teardown: the machine is provisioned again and the stage
resumes from its latest committed checkpoint. Checkpoints live under
`gs://<bucket>/interlude/<run_key>/`.
"""

# The stages run in this pool (create it with --include-deferred): slots = stages training at once. Machines
# alive at once are capped by `[interlude] max_machines` (interlude.machines.slots: provision to teardown).
ACCELERATOR_POOL = "interlude_accelerators"

# MULTIPLE_OUTPUTS: the tasks returning a dict say multiple_outputs=False. Airflow infers True from a `dict` return
# annotation and then pushes one XCom per key beside return_value; every reader here pulls return_value whole, so
# those rows were written for nobody: ~65 Execution API calls and XCom rows per run (resolve_run alone: one per
# param), three quarters of a run's XCom writes and a fifth of the api-server's requests (the stack's access log).


def _on_failure(context: Any) -> None:
    from interlude.training.callbacks import on_task_failure

    on_task_failure(context)


with DAG(
    dag_id="interlude_training",
    doc_md=DOC_MD,
    # One fine-tune per data interval; backfills over past dates each fine-tune on their own slice.
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    tags=["interlude", "training", "tpu", "gpu"],
    default_args={"retries": 0, "on_failure_callback": _on_failure},
    # The form is generated from RunSpec: one default and one check per param, shared with the code.
    params={name: Param(default, **schema) for name, (default, schema) in RunSpec.form_schema().items()},
) as dag:

    @task(multiple_outputs=False)  # see MULTIPLE_OUTPUTS
    def resolve_run() -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from interlude.training import tasks as lifecycle
        from interlude.training.spec import RunSpecError

        ctx = get_current_context()
        start = ctx.get("data_interval_start") or ctx["dag_run"].run_after
        try:
            return lifecycle.resolve_run(ctx["params"], ctx["dag"].dag_id, ctx["run_id"], start.date().isoformat())
        except RunSpecError as exc:  # bad input: a retry cannot fix it, the params must change
            raise AirflowFailException(str(exc)) from exc

    spec = resolve_run()

    def run_spec() -> RunSpec:
        """The run's spec from resolve_run's XCom: pulled, not passed, so the graph shows the lifecycle."""
        return RunSpec.from_dict(get_current_context()["ti"].xcom_pull(task_ids="resolve_run"))

    def pulled(task_id: str) -> Any:
        return get_current_context()["ti"].xcom_pull(task_ids=task_id)

    with TaskGroup("choose", tooltip="Capacity per zone, then the decision tree's leaf (in tree order)") as choose:

        @task(multiple_outputs=False)
        def evaluate_capacity() -> dict[str, Any]:
            from interlude.training import tasks as lifecycle

            return lifecycle.evaluate_capacity(run_spec())

        @task(multiple_outputs=False)
        def decide(report: dict[str, Any]) -> dict[str, Any]:
            from interlude.training import tasks as lifecycle

            return lifecycle.decide(run_spec(), report)

        @task.branch
        def route(decision: dict[str, Any]) -> str:
            leaf = decision["leaf"]
            return f"choose.{'wait_for_capacity' if leaf == 'wait' else leaf}"

        @task
        def stuck() -> None:
            from interlude.training import tasks as lifecycle

            lifecycle.fail_stuck(pulled("choose.decide"))

        @task(multiple_outputs=False)
        def conversion() -> dict[str, Any]:
            decision = pulled("choose.decide")
            conv = decision.get("conversion") or {}
            print(
                f"Conversion for {decision['converted_for']}: {conv.get('person_days')} person-days; "
                f"{conv.get('notes')}"
            )
            return decision

        @task.short_circuit(ignore_downstream_trigger_rules=False)
        def approval_required() -> bool:
            """Skips only the approval task below: validate_runtime still follows the convert leaf."""
            return run_spec().require_conversion_approval

        from interlude.operators.capacity import WaitForCapacityOperator

        report = evaluate_capacity()
        decision = decide(report)
        routed = route(decision)
        # The leaves in the order the trees reach them: own family, the other, smaller GPUs, convert, wait, stuck.
        leaves = [EmptyOperator(task_id=leaf) for leaf in ("tpu", "gpu", "smaller_gpu")]
        convert = [conversion.override(task_id=leaf)() for leaf in ("convert_for_gpu", "convert_for_tpu")]
        waited = WaitForCapacityOperator(task_id="wait_for_capacity")
        routed >> [*leaves, *convert, waited, stuck()]
        for family, leaf in zip(("GPU", "TPU"), convert, strict=True):
            name = f"convert_for_{family.lower()}"
            approve = ApprovalOperator(
                task_id=f"approve_{name}",
                fail_on_reject=True,
                subject=f"Convert the model for {family}?",
                body="{% set d = ti.xcom_pull(task_ids='choose.decide') %}"
                "Model **{{ d['model'] }}** has no capacity on its own accelerator family. The tree chose "
                f"to convert it for {family} and run on {{{{ d['accelerator_type'] }}}} in "
                "{{ d['zone'] }}.\n\nEstimated effort: **{{ d['conversion']['person_days'] }} "
                "person-days**; {{ d['conversion']['notes'] }}\n\nApprove to go on, reject to fail the run.",
            )
            leaf >> approval_required.override(task_id=f"{name}_needs_approval")() >> approve

    @task(trigger_rule="none_failed_min_one_success", multiple_outputs=False)
    def validate_runtime() -> dict[str, Any]:
        from interlude.training import tasks as lifecycle

        decision = pulled("choose.wait_for_capacity") or pulled("choose.decide")
        return lifecycle.validate_runtime(run_spec(), decision)

    @task.short_circuit(ignore_downstream_trigger_rules=True)
    def continue_unless_plan_only(validated: dict[str, Any]) -> bool:
        if run_spec().plan_only:
            print(
                f"Plan only: would provision {validated['decision']['accelerator_type']} in "
                f"{validated['decision']['zone']} with runtime {validated['runtime']} "
                f"(platform {validated['decision'].get('platform') or 'default'}); nothing was created."
            )
            return False
        return True

    @task(trigger_rule="all_done")
    def teardown() -> list[str]:
        from airflow.sdk.exceptions import AirflowSkipException

        from interlude.training import tasks as lifecycle

        if pulled("resolve_run") is None:  # refused params: no run key, nothing was ever created
            raise AirflowSkipException("resolve_run did not succeed: nothing of this run can exist")
        return lifecycle.teardown(run_spec())

    @task(multiple_outputs=False)
    def run_report() -> dict[str, Any]:
        from interlude.machines.relocate import current_machine
        from interlude.training import tasks as lifecycle

        spec = run_spec()  # the machine the run ended on (a failover may have moved it)
        return lifecycle.run_report(
            spec, current_machine(spec, pulled("provision")), [pulled("train"), pulled("finetune")]
        )

    from interlude.operators.provision import ProvisionOperator
    from interlude.operators.stage import TrainingStageOperator
    from interlude.sensors.checkpoint import CommittedCheckpointSensor

    validated = validate_runtime()
    spec >> choose >> validated
    # A skipped approval (not required) must not hide the convert leaf's success from validate_runtime.
    convert >> validated
    gate = continue_unless_plan_only(validated)
    # Deferrable: a queued resource or a quota wait waits in the triggerer. Default pool (deferred tasks
    # hold no slot there): provision holds no machine while it waits; the stages hold the accelerator pool.
    machine = ProvisionOperator(task_id="provision")
    gate >> machine

    train = TrainingStageOperator(task_id="train", stage="train", order=1, pool=ACCELERATOR_POOL)
    finetune_gate = CommittedCheckpointSensor(
        task_id="finetune_gate",
        bucket="{{ ti.xcom_pull(task_ids='resolve_run')['bucket'] }}",
        run_key="{{ ti.xcom_pull(task_ids='resolve_run')['run_key'] }}",
        stage="train",
        min_step="{{ ti.xcom_pull(task_ids='resolve_run')['train_steps'] }}",
        poll_interval=1.0,
        stall_timeout=600,
        pool=ACCELERATOR_POOL,
    )
    # Its committed final checkpoint is an event on the fine-tuned checkpoint Asset: serving is scheduled on it.
    finetune = TrainingStageOperator(
        task_id="finetune",
        stage="finetune",
        order=2,
        init_from_stage="train",
        pool=ACCELERATOR_POOL,
        outlets=[FINETUNED_CHECKPOINT],
    )
    reported = run_report()
    torn_down = teardown()

    # The report and the teardown both follow the last stage: the report is the leaf that carries the
    # run's own outcome (a teardown flagged to fail the run would otherwise be the only leaf, and a failed
    # provision followed by a clean teardown would end in "success").
    machine >> train >> finetune_gate >> finetune >> [reported, torn_down]
    # A failing teardown fails the run: "could not confirm nothing is left" must never end in success.
    torn_down.as_teardown(setups=machine, on_failure_fail_dagrun=True)
    # ...and it runs even when provision failed or was killed after its create call (the setup-success
    # rule would leave that machine behind): it deletes by label and intent record in every zone of the run.
    torn_down.operator.trigger_rule = TriggerRule.ALL_DONE
