"""TrainingStageOperator's Airflow entry points against a local cloud's GCS and connection: what execute hands
the machine (the stage plan in GCS) and the trigger it defers to; what execute_complete does with each kind
of event. The events are made as the trigger makes them: the stage state machine's own decision
(`next_step`) on an observation, packed by `transition_event`. Actions on a real machine are in
test_stage_actions.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from interlude.operators.stage import TrainingStageOperator
from interlude.stage.machine import next_step
from interlude.stage.model import Limits, Machine, Notice, Observation, Phase, StageState
from interlude.stage.transitions import open_event
from interlude.triggers.stage import StageTrigger, transition_event
from interlude_localcloud.testing import RunningLocalCloud
from tests.plugins.interlude.operators.support import TrainingRun, context, training_run


@pytest.fixture(scope="module")
def run(training_cloud: RunningLocalCloud, training_bucket: str) -> TrainingRun:
    """A run whose machine is never created: nothing here reaches the machine (its record is what provision
    returns)."""
    return training_run(training_bucket, train_steps=20, checkpoint_every=5)


def _machine(run: TrainingRun) -> dict[str, Any]:
    from interlude.machines import provisioning

    spec = run.spec
    record = provisioning.machine_record(
        run.validated["decision"],
        run.validated["runtime"],
        bucket=spec.bucket,
        run_key=spec.run_key,
        dag_id=spec.dag_id,
    )
    return record.to_dict()


def _ctx(run: TrainingRun, spec: Any = None) -> dict[str, Any]:
    return context(resolve_run=(spec or run.spec).to_dict(), provision=_machine(run))


def _op(stage: str = "train", **kwargs: Any) -> TrainingStageOperator:
    order = 1 if stage == "train" else 2
    return TrainingStageOperator(task_id=stage, stage=stage, order=order, **kwargs)


def _plans(spec: Any) -> list[Any]:
    from interlude_workload.plan import read_plans

    return read_plans(spec.bucket, spec.run_key)


def _observe(**facts: Any) -> Observation:
    return Observation(
        **{
            "now": time.time(),
            "machine": Machine.READY,
            "notice": None,
            "committed_step": 0,
            "progress_step": 0,
            **facts,
        }
    )


def _event(state: StageState, obs: Observation, serial: str = "") -> dict[str, Any]:
    """What the trigger sends for this observation: the state machine's transition, as JSON crosses."""
    transition = next_step(state, obs, Limits(restart_timeout=120.0))
    return json.loads(json.dumps(transition_event("train", transition, {}, serial, obs)))


def test_execute_hands_the_stage_plan_to_the_machine_and_defers_to_the_stage_trigger(run: TrainingRun) -> None:
    with pytest.raises(TaskDeferred) as deferred:
        _op().execute(_ctx(run))

    (plan,) = _plans(run.spec)
    assert (plan.order, plan.stage, plan.steps, plan.checkpoint_every, plan.hold_at_step) == (1, "train", 20, 5, None)
    trigger = deferred.value.trigger
    assert isinstance(trigger, StageTrigger) and deferred.value.method_name == "execute_complete"
    path, kwargs = trigger.serialize()
    assert path == "interlude.triggers.stage.StageTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs  # what the triggerer stores
    assert (kwargs["machine"]["name"], kwargs["run_key"], kwargs["stage"]) == (
        _machine(run)["name"],
        run.spec.run_key,
        "train",
    )
    assert StageState.from_dict(kwargs["state"]) == StageState(target_step=20)
    assert kwargs["notice_policy"] is not None  # by_notice, the default maintenance_policy


def test_a_drill_makes_the_workload_hold_at_the_first_periodic_checkpoint(run: TrainingRun) -> None:
    spec = run.spec.replace(drill_maintenance=True, run_key=run.spec.run_key + "-drill")
    with pytest.raises(TaskDeferred) as deferred:
        _op().execute(_ctx(run, spec))
    (plan,) = _plans(spec)
    assert plan.hold_at_step == 5
    state = StageState.from_dict(deferred.value.trigger.serialize()[1]["state"])
    assert (state.drill, state.drill_step) == ("pending", 5)


def test_a_drill_on_a_stage_too_short_for_it_is_refused_before_any_plan_is_written(run: TrainingRun) -> None:
    spec = run.spec.replace(drill_maintenance=True, finetune_steps=1, run_key=run.spec.run_key + "-short")
    with pytest.raises(AirflowException, match="drill_maintenance needs at least 2 steps"):
        _op("finetune", init_from_stage="train").execute(_ctx(run, spec))
    assert _plans(spec) == []


def test_without_the_run_spec_or_the_machine_in_xcom_the_stage_asks_for_the_whole_run_to_be_cleared() -> None:
    for ctx in (context(), context(resolve_run={"bucket": "b"})):
        with pytest.raises(AirflowException, match="clear the whole run"):
            _op().execute(ctx)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"status": "error", "message": "boom"}, "watching failed: boom"),
        ({"status": "timeout"}, "unexpected trigger event status 'timeout'"),
        ({}, "unexpected trigger event status None"),
    ],
)
def test_execute_complete_fails_loudly_on_anything_but_a_transition(
    run: TrainingRun, event: dict[str, Any], message: str
) -> None:
    with pytest.raises(AirflowException, match=message):
        _op().execute_complete(_ctx(run), event)


def test_a_failed_stage_fails_the_task_with_the_reason_and_the_machine_s_last_words(run: TrainingRun) -> None:
    event = _event(
        StageState(target_step=20),
        _observe(workload_error="data_date 2031-01-01 has no data", progress_step=3),
        serial="startup: begin: boot b1\ntrainer exited with 2",
    )
    assert event["actions"] == ["fail"]
    with pytest.raises(AirflowException) as failed:
        _op().execute_complete(_ctx(run), event)
    message = str(failed.value)
    assert "stage train failed: the workload failed: data_date 2031-01-01 has no data" in message
    assert "guest attributes (interlude/startup) tail:" in message and "trainer exited with 2" in message


def test_a_notice_requests_a_checkpoint_from_the_workload_and_watches_on(run: TrainingRun) -> None:
    from interlude_workload.checkpoints import CheckpointStore

    spec = run.spec.replace(maintenance_policy="checkpoint_at_notice", run_key=run.spec.run_key + "-notice")
    event = _event(StageState(target_step=20), _observe(notice=Notice("UNSCHEDULED", "PENDING"), progress_step=7))
    assert event["actions"] == ["request_checkpoint"]
    with pytest.raises(TaskDeferred) as deferred:
        _op().execute_complete(_ctx(run, spec), event)

    state = StageState.from_dict(deferred.value.trigger.serialize()[1]["state"])
    assert state.phase is Phase.CHECKPOINT_REQUESTED and state.request_id
    assert CheckpointStore(spec.bucket, spec.run_key, "train").pending_requests() == [state.request_id]
    assert deferred.value.method_name == "execute_complete"


def test_a_finished_maintenance_is_recorded_in_gcs_and_the_stage_watches_on(run: TrainingRun) -> None:
    from interlude.training import events

    spec = run.spec.replace(run_key=run.spec.run_key + "-event")
    noticed = _observe(notice=Notice("SCHEDULED", "PENDING"), committed_step=10, progress_step=12, boot_id="boot-1")
    opened = {**open_event("maintenance", noticed, StageState(20), noticed.notice), "checkpoint_step": 10}
    resuming = StageState(target_step=20, phase=Phase.RESUMING, boot_id="boot-1", last_step_seen=12, event=opened)
    event = _event(resuming, _observe(committed_step=10, progress_step=13, resumed_from=10, boot_id="boot-2"))
    assert event["actions"] == ["record_event"]
    with pytest.raises(TaskDeferred) as deferred:
        _op().execute_complete(_ctx(run, spec), event)

    (recorded,) = events.load_events(spec.bucket, spec.run_key)
    assert (recorded["event_id"], recorded["kind"], recorded["stage"]) == (opened["event_id"], "maintenance", "train")
    assert (recorded["resumed_from_step"], recorded["boot_id"]) == (10, "boot-2")
    state = StageState.from_dict(deferred.value.trigger.serialize()[1]["state"])
    assert (state.phase, state.boot_id, state.event) == (Phase.RUNNING, "boot-2", None)


def test_done_without_a_committed_final_checkpoint_fails_the_stage(run: TrainingRun) -> None:
    spec = run.spec.replace(run_key=run.spec.run_key + "-nofinal")
    event = _event(StageState(target_step=20), _observe(committed_step=20, progress_step=20))
    assert event["actions"] == ["complete"]
    with pytest.raises(AirflowException, match="no committed final checkpoint"):
        _op().execute_complete(_ctx(run, spec), event)
