"""TrainingStageOperator on real local-cloud machines: the stages run to their final checkpoints (watched from
the worker, and from the trigger), and what execute_complete does to the machine for each action the state
machine asks for (restart the workload, send a drill, re-provision, wait for capacity), read back from the
cloud's own view of its machines and from GCS. The extra links open the local cloud's pages of both.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from interlude.operators.provision import ProvisionOperator
from interlude.operators.stage import TrainingStageOperator
from interlude.stage.machine import next_step
from interlude.stage.model import Drill, Limits, Machine, Observation, Phase, StageState
from interlude.triggers.stage import transition_event
from interlude_localcloud.testing import RunningLocalCloud
from interlude_workload import hf_export
from tests.plugins.interlude.operators.support import (
    ZONE,
    TrainingRun,
    context,
    drive,
    first_event,
    machines_of,
    training_run,
)

# The machines run their startup script, as on Google: the workload's agent and its trainer (tests/quick.py).
pytestmark = pytest.mark.processes

GPU_TYPES = ("nvidia-h100-80gb", "nvidia-l4", "nvidia-tesla-t4")
TPU_TYPES = ("v6e-8", "v5litepod-8")


def _provisioned(run: TrainingRun, teardown_runs: list[Any]) -> dict[str, Any]:
    teardown_runs.append(run.spec)
    return ProvisionOperator(task_id="provision").execute(context(**run.xcoms()))


def _ctx(run: TrainingRun, machine: dict[str, Any]) -> dict[str, Any]:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    ctx = context(resolve_run=run.spec.to_dict(), provision=machine)
    ctx["outlet_events"] = OutletEventAccessors()  # Airflow's own accessors, as the task runner passes them
    return ctx


def _op(stage: str = "train", **kwargs: Any) -> TrainingStageOperator:
    order = 1 if stage == "train" else 2
    return TrainingStageOperator(task_id=stage, stage=stage, order=order, **kwargs)


def _event(state: StageState, **facts: Any) -> dict[str, Any]:
    obs = Observation(**{"now": time.time(), "notice": None, "committed_step": 0, "progress_step": 0, **facts})
    transition = next_step(state, obs, Limits(restart_timeout=120.0))
    return json.loads(json.dumps(transition_event("train", transition, {}, "", obs)))


def _node(cloud: RunningLocalCloud, machine: dict[str, Any]) -> dict[str, Any] | None:
    return cloud.admin.machine("tpu", machine["zone"], machine["name"])


def _committed(bucket: str, uri: str) -> bool:
    from interlude_workload.gcs import storage_client

    prefix = uri.removeprefix(f"gs://{bucket}/")
    return storage_client().bucket(bucket).blob(prefix + "commit_success.txt").exists()


def _resumed_state(deferred: pytest.ExceptionInfo[TaskDeferred]) -> StageState:
    assert deferred.value.method_name == "execute_complete"
    return StageState.from_dict(deferred.value.trigger.serialize()[1]["state"])


def test_the_stages_run_to_their_final_checkpoints_from_the_worker_and_from_the_trigger(
    training_cloud: RunningLocalCloud, training_bucket: str, teardown_runs: list[Any]
) -> None:
    from interlude.training.assets import EXTRA_URI, FINETUNED_CHECKPOINT

    # A workload that never progresses fails the stage after two stalls (restart once, then fail), not never.
    quick = {"train_steps": 6, "finetune_steps": 4, "checkpoint_every": 2, "step_seconds": 0.0}
    run = training_run(training_bucket, stall_timeout_seconds=60, **quick)
    ctx = _ctx(run, _provisioned(run, teardown_runs))

    trained = _op(deferrable=False).execute(ctx)  # the worker watches: no trigger, no deferral
    assert (trained["final_step"], _committed(training_bucket, trained["final_uri"])) == (6, True)

    finetuned = drive(lambda: _op("finetune", init_from_stage="train", outlets=[FINETUNED_CHECKPOINT]), ctx)
    assert finetuned.deferrals and set(finetuned.deferrals) == {
        ("interlude.triggers.stage.StageTrigger", "execute_complete")
    }
    assert finetuned.result["final_step"] == 4 and _committed(training_bucket, finetuned.result["final_uri"])
    extra = ctx["outlet_events"][FINETUNED_CHECKPOINT].extra
    assert extra == {  # the export is in GCS before the final step's commit, so the event always names it
        EXTRA_URI: finetuned.result["final_uri"],
        "step": 4,
        "run_key": run.spec.run_key,
        "stage": "finetune",
        "export_uri": hf_export.uri(training_bucket, run.spec.run_key, "finetune"),
    }


def test_the_stage_s_links_open_the_local_cloud_s_pages_of_its_machine_and_its_checkpoints(
    training_cloud: RunningLocalCloud, training_bucket: str, teardown_runs: list[Any]
) -> None:
    from interlude.operators.links import CheckpointsLink, MachineConsoleLink
    from interlude_workload import layout
    from interlude_workload.gcs import storage_client

    run = training_run(training_bucket)
    machine = _provisioned(run, teardown_runs)
    bucket = storage_client().bucket(training_bucket)  # an object where the workload writes the stage's files
    bucket.blob(layout.stage_prefix(run.spec.run_key, "train") + "progress.json").upload_from_string(b"{}")
    bucket.blob(layout.stage_prefix(run.spec.run_key, "finetune") + "other-stage.json").upload_from_string(b"{}")
    op = _op(spec=run.spec.to_dict(), machine=machine)  # rendered fields, as when the task finished

    pages = {}
    for link in (MachineConsoleLink(), CheckpointsLink()):
        url = link.get_link(op, ti_key=None)
        assert url.startswith(training_cloud.api_endpoint + "/_localcloud/pages/"), url
        with urllib.request.urlopen(url, timeout=30) as page:
            pages[link.name] = page.read().decode()
    assert machine["name"] in pages["Machine"] and "READY" in pages["Machine"]
    assert "progress.json" in pages["Checkpoints"] and "other-stage.json" not in pages["Checkpoints"]


def test_restart_workload_stops_and_starts_the_machine_so_its_startup_script_runs_again(
    training_cloud: RunningLocalCloud, training_bucket: str, teardown_runs: list[Any]
) -> None:
    run = training_run(training_bucket)
    machine = _provisioned(run, teardown_runs)
    boots = _node(training_cloud, machine)["boots"]
    event = _event(StageState(target_step=60), machine=Machine.READY, startup_failure="exit 3", startup_boot="b1")
    assert event["actions"] == ["restart_workload"]

    with pytest.raises(TaskDeferred) as deferred:
        _op().execute_complete(_ctx(run, machine), event)
    node = _node(training_cloud, machine)
    assert node is not None and node["state"] == "READY" and node["boots"] == boots + 1
    assert _resumed_state(deferred).workload_restarts == 1


def test_a_drill_sends_simulate_maintenance_and_lifts_the_workload_s_hold(
    training_cloud: RunningLocalCloud, training_bucket: str, teardown_runs: list[Any]
) -> None:
    from interlude_workload import layout
    from interlude_workload.gcs import storage_client
    from interlude_workload.plan import read_plans

    run = training_run(training_bucket, drill_maintenance=True, train_steps=20, checkpoint_every=5)
    machine = _provisioned(run, teardown_runs)
    holding = StageState(target_step=20, drill=Drill.PENDING, drill_step=5)
    event = _event(holding, machine=Machine.READY, workload_state="holding", committed_step=5, progress_step=5)
    assert event["actions"] == ["drill"]
    since = time.time()

    with pytest.raises(TaskDeferred) as deferred:
        _op().execute_complete(_ctx(run, machine), event)
    assert _resumed_state(deferred).drill is Drill.SENT
    (plan,) = read_plans(training_bucket, run.spec.run_key)
    assert plan.hold_at_step is None  # a later boot that resumes before step 5 must not hold again
    marker = storage_client().bucket(training_bucket).blob(layout.drill_marker(run.spec.run_key, "train"))
    assert json.loads(marker.download_as_bytes())["step"] == 5
    assert _node(training_cloud, machine)["maintenance"] is not None, "the cloud saw no simulateMaintenanceEvent"
    assert any(e["event"] == "tpu_operation_done" for e in training_cloud.admin.events(since))


def test_a_preempted_machine_is_reprovisioned_under_its_name(
    training_cloud: RunningLocalCloud, training_bucket: str, teardown_runs: list[Any]
) -> None:
    run = training_run(training_bucket, spot=True)  # only Spot capacity is preempted
    machine = _provisioned(run, teardown_runs)
    since = time.time()
    training_cloud.admin.preempt("tpu", ZONE, machine["name"])
    event = _event(StageState(target_step=60, last_step_seen=7), machine=Machine.GONE)
    assert event["actions"] == ["reprovision"]

    with pytest.raises(TaskDeferred) as deferred:
        _op().execute_complete(_ctx(run, machine), event)
    node = _node(training_cloud, machine)
    assert node is not None and (node["state"], node["preempted"]) == ("READY", False)
    lives = [life for life in training_cloud.admin.lifetimes(since) if life["name"] == machine["name"]]
    assert len(lives) == 2, lives  # the preempted node, deleted, and its replacement
    state = _resumed_state(deferred)
    assert (state.phase, state.reprovisions) == (Phase.RECOVERING, 1)


@pytest.fixture
def nothing_anywhere(training_cloud: RunningLocalCloud) -> Any:
    """The zone (the run's only one) can create no TPU and no GPU until the test gives capacity back."""

    def give_back() -> None:
        for accelerator in TPU_TYPES:
            training_cloud.admin.set_capacity(ZONE, "tpu", accelerator, on_demand=8, spot=8)
        for accelerator in GPU_TYPES:
            training_cloud.admin.set_capacity(ZONE, "gpu", accelerator, on_demand=16, spot=16)

    yield give_back
    give_back()


def test_nowhere_to_go_waits_for_capacity_in_the_triggerer_then_reprovisions(
    training_cloud: RunningLocalCloud, training_bucket: str, teardown_runs: list[Any], nothing_anywhere: Any
) -> None:
    run = training_run(training_bucket, spot=True)  # reference-portable: its profile lets a run wait for capacity
    machine = _provisioned(run, teardown_runs)
    for accelerator in TPU_TYPES:
        training_cloud.admin.set_capacity(ZONE, "tpu", accelerator, on_demand=0, spot=0)
    for accelerator in GPU_TYPES:
        training_cloud.admin.set_capacity(ZONE, "gpu", accelerator, on_demand=0, spot=0)
    training_cloud.admin.preempt("tpu", ZONE, machine["name"])
    ctx = _ctx(run, machine)

    with pytest.raises(TaskDeferred) as waiting:
        _op().execute_complete(ctx, _event(StageState(target_step=60), machine=Machine.GONE))
    assert waiting.value.method_name == "capacity_waited"
    path, kwargs = waiting.value.trigger.serialize()
    assert path == "interlude.triggers.provision.QuotaWaitTrigger"
    assert StageState.from_dict(kwargs["state"]["stage_state"]).reprovisions == 1
    assert [m for m in machines_of(training_cloud, run.spec.run_key) if m["state"] == "READY"] == []

    nothing_anywhere()
    with pytest.raises(TaskDeferred) as watching:
        _op().capacity_waited(ctx, first_event(waiting.value.trigger))
    assert _resumed_state(watching).phase is Phase.RECOVERING
    (node,) = machines_of(training_cloud, run.spec.run_key)
    assert node["state"] == "READY"
