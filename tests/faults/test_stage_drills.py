"""Drills that always drill, on every path: TPU and GPU, deferrable and not (issue 10.9, 11.5). The GPU VM's drill
is tests/faults/test_report_times.py's (one real run per promise and platform: issue 44).

Each test runs the lifecycle DAG with `airflow dags test` on the local cloud and checks what the
workload itself wrote (the steps it held at and resumed from, in its log in GCS), what the local cloud
did (how often it booted the machine), and the final weights against an uninterrupted reference run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from interlude_dev import wiring as dev

from .stage_fixtures import boots, final_digest, held_and_resumed, reference, run_dag, workload_log

pytestmark = pytest.mark.e2e


def _events_by_stage(cloud: dev.LocalCloud, run_key: str) -> dict[str, list[dict[str, Any]]]:
    report = dev.read_report(cloud, "interlude-faults", run_key)
    assert report is not None
    out: dict[str, list[dict[str, Any]]] = {}
    for event in report["events"]:  # every event, none keyed away
        out.setdefault(event["stage"], []).append(event)
    print(json.dumps(report["events"], indent=1, sort_keys=True))
    return out


def _check_drilled_stage(cloud: dev.LocalCloud, run_key: str, stage: str, events: list[dict[str, Any]]) -> None:
    """One event per stage, matching the workload's own account of where it held and resumed."""
    held, resumed = held_and_resumed(workload_log(cloud, run_key, stage))
    assert held, f"{stage}: the workload never held (its log says no 'holding at committed step')"
    (event,) = events
    assert event["drill"] is True and event["kind"] == "maintenance"
    assert event["checkpoint_step"] == held[0], (held, event)
    assert event["resumed_from_step"] == held[0] and held[0] in resumed, (held, resumed, event)
    assert event["downtime_s"] > 0 and event["steps_recomputed"] == 0, event


def test_drill_in_both_stages_records_the_held_step_and_a_real_downtime(stage_stack, tmp_path: Path) -> None:
    cloud, _ = stage_stack
    result, run_key = run_dag(stage_stack, tmp_path, drill_maintenance=True)
    assert result.succeeded, result.log[-4000:]
    by_stage = _events_by_stage(cloud, run_key)
    assert set(by_stage) == {"train", "finetune"}
    for stage, events in by_stage.items():
        _check_drilled_stage(cloud, run_key, stage, events)
    assert boots(cloud, f"{run_key}-tpu") == 3, "one boot, then one per drill"
    assert final_digest(cloud, run_key) == reference(cloud)
    assert dev.machines(cloud) == []


def test_non_deferrable_stages_drill_and_finish_with_the_reference_weights(stage_stack, tmp_path: Path) -> None:
    """deferrable=False (no triggerer): the worker watches with the same observations and decisions."""
    cloud, _ = stage_stack
    result, run_key = run_dag(
        stage_stack, tmp_path, env={"AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "False"}, drill_maintenance=True
    )
    assert result.succeeded, result.log[-4000:]
    assert "StageTrigger" not in result.log and "DEFERRED" not in result.log, "the stages must not defer"
    by_stage = _events_by_stage(cloud, run_key)
    assert set(by_stage) == {"train", "finetune"}
    for stage, events in by_stage.items():
        _check_drilled_stage(cloud, run_key, stage, events)
    assert final_digest(cloud, run_key) == reference(cloud)
    assert dev.machines(cloud) == []
