"""A spot TPU preempted mid-training: the run resumes from the step the workload last committed and ends with
the weights of an uninterrupted run (issue 6; issue 32 item 3: not only the run's own report).

Real local cloud and `airflow dags test`. Besides the run report, the facts come from outside the code under
test: the workload's own log in GCS (what it committed before the preemption, where the new boot resumed),
the local cloud's own event log (how often it booted the machine) and the final weights against a reference.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from interlude_dev import wiring as dev

from .stage_fixtures import BASE, BUCKET, boots, final_digest, reference, run_dag, when_training, workload_log

pytestmark = pytest.mark.e2e
TRAIN_STEPS = 120
RESUME = re.compile(r"resume point: step (\d+)")


def first_boot_and_resume(log: str) -> tuple[list[int], int]:
    """Steps the first boot committed, and the step the next boot resumed from, in the workload's own words
    (the new boot writes its resume point next to its "new boot" line)."""
    lines = log.splitlines()
    new_boot = next((i for i, line in enumerate(lines) if " new boot " in line), None)
    assert new_boot is not None, f"the workload never booted again; its log:\n{log[-3000:]}"
    committed = [int(m[1]) for line in lines[:new_boot] if (m := re.search(r"checkpoint step (\d+) committed", line))]
    resumes = [(abs(i - new_boot), int(m[1])) for i, line in enumerate(lines) if (m := RESUME.search(line))]
    assert resumes, f"no boot names a resume point; its log:\n{log[-3000:]}"
    return committed, min(resumes)[1]


def test_spot_preemption_resumes_from_the_last_committed_step_with_the_reference_weights(
    stage_stack,
    tmp_path: Path,
) -> None:
    cloud, _ = stage_stack
    preempted: list[dict[str, Any]] = []

    def preempt(m: dict[str, Any]) -> None:
        cloud.admin.preempt("tpu", m["zone"], m["name"])
        preempted.append(m)

    watcher = when_training(cloud, lambda m, p: m["kind"] == "tpu" and int(p.get("step") or 0) >= 35, preempt)
    result, run_key = run_dag(stage_stack, tmp_path, spot=True, train_steps=TRAIN_STEPS)
    watcher.join(timeout=5)
    assert preempted, "the machine was never preempted"
    assert result.succeeded, result.log[-4000:]

    report = dev.read_report(cloud, BUCKET, run_key)
    assert report is not None
    (event,) = report["events"]
    assert event["kind"] == "preemption" and event["reprovisioned"] is True, event
    # The workload's own account: the new boot resumed from the last step the preempted boot committed
    # (a spot VM gets a short SIGTERM first, so that may be a step committed on it), and the report agrees.
    committed, resumed = first_boot_and_resume(workload_log(cloud, run_key, "train"))
    assert committed and resumed == committed[-1] >= 30, (committed, resumed)
    assert event["resumed_from_step"] == resumed, (event, resumed)
    assert 0 <= event["steps_recomputed"] <= BASE["checkpoint_every"], event
    assert boots(cloud, f"{run_key}-tpu") == 2, "one boot, then one on the replacement"
    assert final_digest(cloud, run_key) == reference(cloud, train_steps=TRAIN_STEPS)
    assert dev.machines(cloud) == []
