"""ProvisionOperator called as Airflow calls it (execute, then the method a deferral names), against a local cloud.

Each fact is read back from the cloud (its own list of machines and queued resources) or from GCS (the intent
record, the machine slots), never from the operator's return value alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from interlude.operators.provision import ProvisionOperator
from interlude.triggers.provision import QueuedResourceTrigger, QuotaWaitTrigger
from interlude_localcloud.testing import RunningLocalCloud
from tests.plugins.interlude.operators.support import ZONE, context, drive, first_event, machines_of, training_run


def _op() -> ProvisionOperator:
    return ProvisionOperator(task_id="provision")


def _queued_resources(run_key: str) -> list[dict[str, Any]]:
    from interlude.hooks.tpu import TpuHook

    return [q for q in TpuHook(gcp_conn_id="google_cloud_default").list_queued_resources(ZONE) if run_key in q["name"]]


@pytest.fixture
def no_tpu_capacity(training_cloud: RunningLocalCloud) -> Any:
    """Nothing of the zone's TPU types can be created until the test gives it back (`restore()`)."""
    types = ("v6e-8", "v5litepod-8")

    def restore() -> None:
        for accelerator in types:
            training_cloud.admin.set_capacity(ZONE, "tpu", accelerator, on_demand=8, spot=8)

    for accelerator in types:
        training_cloud.admin.set_capacity(ZONE, "tpu", accelerator, on_demand=0, spot=0)
    yield restore
    restore()


def test_execute_creates_the_decided_machine_and_records_its_intent_first(
    training_cloud: RunningLocalCloud, training_bucket: str, teardown_runs: list[Any]
) -> None:
    from interlude.machines import ledger

    run = training_run(training_bucket)
    teardown_runs.append(run.spec)
    machine = _op().execute(context(**run.xcoms()))

    decision = run.validated["decision"]
    assert (machine["kind"], machine["zone"], machine["accelerator_type"]) == (
        "tpu_node",
        decision["zone"],
        decision["accelerator_type"],
    )
    (node,) = machines_of(training_cloud, run.spec.run_key)
    assert (node["name"], node["zone"], node["state"]) == (machine["name"], ZONE, "READY")
    intents = ledger.read(run.spec.bucket, run.spec.run_key)
    assert [(i.kind, i.zone, i.name) for i in intents] == [("tpu_node", ZONE, machine["name"])]


def test_a_create_the_cloud_refuses_fails_the_task_and_leaves_no_machine(
    training_cloud: RunningLocalCloud, training_bucket: str
) -> None:
    run = training_run(training_bucket)
    run.validated["runtime"] = "tpu-vm-no-such-runtime"
    with pytest.raises(Exception, match="tpu-vm-no-such-runtime"):
        _op().execute(context(**run.xcoms()))
    assert machines_of(training_cloud, run.spec.run_key) == []


def test_all_machine_slots_held_defers_to_the_quota_wait_with_nothing_created_then_creates_once_one_frees(
    training_cloud: RunningLocalCloud, training_bucket: str, teardown_runs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlude.machines import slots

    monkeypatch.setenv("AIRFLOW__INTERLUDE__MAX_MACHINES", "1")
    assert slots.take(training_bucket, "another-run", "interlude_training", "r0", cap=1) == 0
    run = training_run(training_bucket)
    teardown_runs.append(run.spec)
    ctx = context(**run.xcoms())

    with pytest.raises(TaskDeferred) as deferred:
        _op().execute(ctx)
    assert isinstance(deferred.value.trigger, QuotaWaitTrigger)
    assert deferred.value.method_name == "quota_waited"
    assert machines_of(training_cloud, run.spec.run_key) == []

    assert slots.release(training_bucket, "another-run") == [0]
    event = first_event(deferred.value.trigger)
    machine = getattr(_op(), deferred.value.method_name)(ctx, event)
    assert [m["name"] for m in machines_of(training_cloud, run.spec.run_key)] == [machine["name"]]
    assert [s.run_key for s in slots.holders(training_bucket)] == [run.spec.run_key]


def test_a_queued_resource_defers_until_the_node_is_ready(
    training_cloud: RunningLocalCloud, training_bucket: str, teardown_runs: list[Any], no_tpu_capacity: Any
) -> None:
    run = training_run(training_bucket, model_profile="maxtext-tpu-only")
    teardown_runs.append(run.spec)
    assert run.validated["decision"]["mode"] == "queued"  # a TPU-only model asks through a queued resource
    ctx = context(**run.xcoms())

    with pytest.raises(TaskDeferred) as deferred:
        _op().execute(ctx)
    trigger = deferred.value.trigger
    assert isinstance(trigger, QueuedResourceTrigger) and deferred.value.method_name == "queued_complete"
    path, kwargs = trigger.serialize()
    assert path == "interlude.triggers.provision.QueuedResourceTrigger"
    (qr,) = _queued_resources(run.spec.run_key)
    assert qr["name"].endswith("/" + kwargs["queued_resource"])
    assert machines_of(training_cloud, run.spec.run_key) == []  # no node while the capacity is not there

    no_tpu_capacity()
    event = first_event(trigger)
    assert event["status"] == "ready", event
    machine = getattr(_op(), deferred.value.method_name)(ctx, event)
    (node,) = machines_of(training_cloud, run.spec.run_key)
    assert (node["name"], node["state"]) == (machine["name"], "READY")


def test_a_failed_queued_resource_fails_the_task_and_is_deleted(
    training_cloud: RunningLocalCloud, training_bucket: str, no_tpu_capacity: Any
) -> None:
    # Google fails a queued resource still waiting at its validUntilDuration (queue_wait_seconds: 60 s, 0.1 s here).
    run = training_run(training_bucket, model_profile="maxtext-tpu-only", queue_wait_seconds=60)
    with pytest.raises(AirflowException, match="FAILED") as failed:
        drive(_op, context(**run.xcoms()))
    assert run.spec.run_key in str(failed.value)
    assert _queued_resources(run.spec.run_key) == []
    assert machines_of(training_cloud, run.spec.run_key) == []


def test_queued_complete_fails_loudly_on_anything_but_ready(training_cloud: RunningLocalCloud) -> None:
    machine = {"kind": "tpu_node", "zone": ZONE, "name": "never-created-tpu", "mode": "queued"}
    for event in ({"status": "error", "message": "boom", "machine": machine}, {"machine": machine}):
        with pytest.raises(AirflowException, match="never-created-tpu"):
            _op().queued_complete({}, event)
