"""WaitForCapacityOperator driven through execute / the trigger / execute_complete against a real local cloud."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from interlude.operators.capacity import WaitForCapacityOperator
from interlude.operators.conventions import default_deferrable
from interlude.training.spec import RunSpec
from interlude.triggers.capacity import CapacityTrigger


@pytest.fixture(scope="module")
def cloud() -> Iterator[Any]:
    from interlude_localcloud.testing import running_localcloud

    with running_localcloud("default", strict=True, gcs=False) as lc:
        yield lc


@pytest.fixture
def connected(cloud: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The Google connection points at the local cloud, as dev.airflow_env sets it for every Airflow process."""
    extra = {
        "is_anonymous": True,
        "project": cloud.project,
        "tpu_endpoint": cloud.api_endpoint,
        "compute_endpoint": cloud.api_endpoint,
    }
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )
    return cloud


def _waiting_decision() -> dict[str, Any]:
    import datetime as dt

    from interlude.capacity.decisions import Decision, Leaf, Strategy

    started = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return Decision(
        leaf=Leaf.WAIT,
        strategy=Strategy.TPU_FIRST,
        model="reference-portable",
        trail=(),
        wait_started_at=started,
        wait_deadline=started + dt.timedelta(days=3650),
    ).to_dict()


def test_execute_defers_to_the_capacity_trigger_with_the_run_s_poll_interval() -> None:
    spec = RunSpec(poll_seconds=2.0).to_dict()
    op = WaitForCapacityOperator(task_id="wait", spec=spec, decision=_waiting_decision())
    with pytest.raises(TaskDeferred) as info:
        op.execute(context={})
    trigger = info.value.trigger
    assert isinstance(trigger, CapacityTrigger)
    assert trigger.poll_interval == 10.0
    assert info.value.method_name == "execute_complete"
    # The trigger's kwargs survive the triggerer's serialization round trip.
    path, kwargs = trigger.serialize()
    assert path == "interlude.triggers.capacity.CapacityTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs


def test_trigger_walks_again_against_the_cloud_and_execute_complete_returns_the_placement(connected: Any) -> None:
    """Capacity is there in the default scenario: one poll decides, and the operator returns that decision."""
    spec = RunSpec(zones=("us-central1-a",), run_key="k-wait").to_dict()
    trigger = CapacityTrigger(spec=spec, decision=_waiting_decision(), poll_interval=0.01)

    async def first_event() -> Any:
        async for event in trigger.run():
            return event.payload
        return None

    payload = asyncio.run(asyncio.wait_for(first_event(), timeout=120))
    assert payload["status"] == "decided", payload
    op = WaitForCapacityOperator(task_id="wait", spec=spec, decision=_waiting_decision())
    decision = op.execute_complete(context={}, event=payload)
    assert decision["leaf"] == "tpu" and decision["zone"] == "us-central1-a"


def test_execute_complete_fails_loudly() -> None:
    op = WaitForCapacityOperator(task_id="wait", spec=RunSpec().to_dict(), decision=_waiting_decision())
    with pytest.raises(AirflowException, match="waiting for capacity failed: boom"):
        op.execute_complete(context={}, event={"status": "error", "message": "boom"})
    with pytest.raises(AirflowFailException, match="Still no capacity at the wait deadline"):
        op.execute_complete(
            context={}, event={"status": "decided", "decision": {"leaf": "stuck", "stuck_report": "nothing"}}
        )


@pytest.mark.parametrize(("setting", "expected"), [(None, True), ("false", False), ("true", True)])
def test_deferrable_default_follows_the_operators_config(
    setting: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlude.sensors.checkpoint import CommittedCheckpointSensor

    if setting is None:
        monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", setting)
    assert default_deferrable() is expected
    sensor = CommittedCheckpointSensor(task_id="s", bucket="b", run_key="k", stage="train", min_step=1)
    assert sensor.deferrable is expected
