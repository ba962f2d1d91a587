"""CapacityTrigger round-trips for the triggerer; the wait operator fails loudly when still stuck."""

from __future__ import annotations

import importlib

import pytest
from airflow.sdk.exceptions import AirflowException

from interlude.operators.capacity import WaitForCapacityOperator
from interlude.triggers.capacity import CapacityTrigger


def test_serialize_round_trips() -> None:
    trigger = CapacityTrigger(spec={"run_key": "k", "zones": ["z"]}, decision={"leaf": "wait"}, poll_interval=3.0)
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(module), name)(**kwargs).serialize() == (path, kwargs)


def test_execute_complete() -> None:
    op = WaitForCapacityOperator(task_id="w", spec={"poll_seconds": 1}, decision={"leaf": "wait"})
    assert op.poll_interval == 5.0
    placed = {"leaf": "gpu", "accelerator_type": "nvidia-l4", "zone": "z"}
    assert op.execute_complete({}, {"status": "decided", "decision": placed}) == placed
    stuck = {"leaf": "stuck", "stuck_report": "nothing anywhere"}
    with pytest.raises(AirflowException, match="wait deadline.*\n\nnothing anywhere"):
        op.execute_complete({}, {"status": "decided", "decision": stuck})
    with pytest.raises(AirflowException, match="boom"):
        op.execute_complete({}, {"status": "error", "message": "boom"})
