"""Unpaused, the lifecycle DAG runs on its own schedule, and every run the schedule makes succeeds.

The session's stack unpauses the DAG as it starts (a person flips the toggle, or leaves "unpause" ticked in
the Trigger form). The DAG is `@daily` from 2024-01-01 with catchup off, so the scheduler creates the run
of the latest interval only (not one per day since 2024), with every param at its default and no
`data_date`: it fine-tunes on the slice generated for its own date. A catch-up over a short past range is
a backfill of the same timetable (`POST /api/v2/backfills`, in test_stack); its runs are held to the same
rule when they exist in the session.

Judged per run by facts outside the scheduler: the workload's own progress in GCS (it reached the last
fine-tuning step of *this* run), the data slice its spec names against its logical date, and the local
cloud, which must hold no machine of the run. Named zz_s so it runs after the other stack tests: by then
the scheduled run, which started with the session, has had their time to finish.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest

from interlude import naming
from tests.e2e.stack_fixtures import DAG_ID, TERMINAL, Stack

pytestmark = pytest.mark.e2e

RUN_TIMEOUT = 900.0  # defaults (60 + 30 steps): 1-2 min idle, ~5 min on a loaded 2-core machine
TIMETABLE_RUN_TYPES = ("scheduled", "backfill")


def timetable_runs(stack: Stack) -> list[dict[str, Any]]:
    """Every run the timetable made (scheduled, or a backfill of past intervals), oldest first."""
    body = stack.api.call("GET", f"dags/{DAG_ID}/dagRuns", params={"limit": 100, "run_type": list(TIMETABLE_RUN_TYPES)})
    runs = [r for r in body["dag_runs"] if r["run_type"] in TIMETABLE_RUN_TYPES]
    return sorted(runs, key=lambda r: str(r["logical_date"]))


def wait_all_final(stack: Stack, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        runs = {run_id: stack.api.run(run_id) for run_id in run_ids}
        waiting = {run_id: run["state"] for run_id, run in runs.items() if run["state"] not in TERMINAL}
        if not waiting:
            return runs
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs still not final after {RUN_TIMEOUT:.0f}s: {waiting}")
        time.sleep(2)


def resolved_spec(stack: Stack, run_id: str) -> dict[str, Any]:
    path = f"dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/resolve_run/xcomEntries/return_value"
    value = stack.api.call("GET", path)["value"]
    return dict(json.loads(value) if isinstance(value, str) else value)


def finetune_progress(spec: dict[str, Any]) -> dict[str, Any]:
    """What the workload itself wrote about its fine-tuning (progress.json in the run's GCS folder)."""
    from interlude_workload.checkpoints import CheckpointStore

    return CheckpointStore(spec["bucket"], spec["run_key"], "finetune").read_progress() or {}


def test_unpaused_schedule_runs_the_latest_interval_and_every_scheduled_run_succeeds(stack: Stack) -> None:
    details = stack.api.call("GET", f"dags/{DAG_ID}/details")
    assert details["is_paused"] is False, "the session's stack unpauses the DAG"

    deadline = time.monotonic() + 120  # the scheduler creates the run on its next loop after the unpause
    while not [r for r in timetable_runs(stack) if r["run_type"] == "scheduled"]:
        assert time.monotonic() < deadline, "unpaused for 2 min and the scheduler created no scheduled run"
        time.sleep(2)
    runs = timetable_runs(stack)
    scheduled = [r for r in runs if r["run_type"] == "scheduled"]
    # Catchup off: the latest interval only (two when the session crossed midnight UTC), not one per day since 2024.
    assert 1 <= len(scheduled) <= 2, [r["dag_run_id"] for r in scheduled]
    latest = dt.datetime.fromisoformat(str(scheduled[-1]["logical_date"]).replace("Z", "+00:00"))
    now = dt.datetime.now(dt.UTC)
    # The latest interval: today's midnight (UTC), or yesterday's when the session crossed midnight; not a future one.
    today = now.date()
    assert latest.timetz() == dt.time(0, tzinfo=dt.UTC), latest
    assert latest.date() in (today, today - dt.timedelta(days=1)) and latest <= now, f"latest interval {latest}"

    final = wait_all_final(stack, [r["dag_run_id"] for r in runs])
    for run_id, run in final.items():
        states = {t: ti["state"] for t, ti in stack.api.task_instances(run_id).items()}
        assert run["state"] == "success", (run_id, run["run_type"], states)
        spec = resolved_spec(stack, run_id)
        assert spec["run_key"] == naming.run_key(DAG_ID, run_id)
        # Each interval fine-tunes on its own day's slice (generated: these days are outside the shipped sample).
        assert spec["data_date"] == str(run["logical_date"])[:10], (run_id, spec["data_date"])
        # The workload reached the run's last fine-tuning step, by its own account.
        assert finetune_progress(spec).get("step") == spec["finetune_steps"], (run_id, finetune_progress(spec))
        left = [m["name"] for m in stack.machines() if m["name"].startswith(spec["run_key"])]
        assert not left, f"{run_id} left machines behind: {left}"
