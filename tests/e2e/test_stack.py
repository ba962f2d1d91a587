"""The lifecycle DAG on a production-shaped Airflow: PostgreSQL, Redis, Celery worker, separate triggerer.

`airflow dags test` runs triggers inline and tasks in one process; these tests prove what only the real
topology shows: the StageTrigger imports and runs in the triggerer process, tasks run on the Celery
worker, a triggerer killed mid-training hands its trigger to its replacement without losing the
maintenance event, and a training task killed and cleared resumes from its checkpoint. Each run ends
with no machine of it left in the local cloud. One stack serves the whole session (see stack_fixtures).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from interlude import naming
from tests.e2e.stack_fixtures import (
    BUCKET,
    DAG_ID,
    DATA_DATE,
    GPU_ONLY_ZONE,
    Stack,
)

pytestmark = pytest.mark.e2e

STAGE_TRIGGER = "interlude.triggers.stage.StageTrigger"
RUN_TIMEOUT = 600.0  # generous: a loaded 2-core machine runs these several times slower


def base_conf(**overrides: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bucket": BUCKET,
        "data_date": DATA_DATE,
        "train_steps": 30,
        "finetune_steps": 10,
        "checkpoint_every": 5,
        "step_seconds": 0.1,
        "poll_seconds": 0.5,
    }
    conf.update(overrides)
    return conf


def progress(run_key: str, stage: str) -> dict[str, Any]:
    from interlude_workload.checkpoints import CheckpointStore

    return CheckpointStore(BUCKET, run_key, stage).read_progress() or {}


def assert_no_machines_left(stack: Stack, run_key: str) -> None:
    """Teardown deleted every node/VM of the run (the local cloud lists live machines only)."""
    left = [m for m in stack.machines() if m["name"].startswith(run_key)]
    assert not left, f"machines of {run_key} left behind: {left}"


class TriggerWatch:
    """Records, while polling, which trigger class each deferred task was handed to, and by which triggerer."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}
        self.triggerer_jobs: set[int] = set()

    def __call__(self, tis: dict[str, dict[str, Any]]) -> None:
        for task_id, ti in tis.items():
            if ti["state"] == "deferred" and ti.get("trigger"):
                self.seen.setdefault(task_id, set()).add(ti["trigger"]["classpath"])
                if ti.get("triggerer_job"):
                    self.triggerer_jobs.add(int(ti["triggerer_job"]["id"]))


def test_triggered_run_succeeds_on_celery_with_trigger_in_triggerer(stack: Stack) -> None:
    api = stack.api
    run_id = api.trigger(base_conf(seed=7))
    run_key = naming.run_key(DAG_ID, run_id)
    watch = TriggerWatch()
    try:
        run = api.wait_run(run_id, RUN_TIMEOUT, on_poll=watch)
        tis = api.task_instances(run_id)
        assert run["state"] == "success", {t: ti["state"] for t, ti in tis.items()}
        assert run["conf"]["seed"] == 7

        # The stages were deferred to the StageTrigger, and a triggerer job (not the worker) ran it.
        assert STAGE_TRIGGER in watch.seen.get("train", set()), watch.seen
        assert watch.triggerer_jobs, "no triggerer job was assigned to the deferred stages"
        trigger_logs = [p for p in stack.task_logs(run_id, "train") if ".trigger." in p.name]
        assert trigger_logs, "the triggerer wrote no trigger log for train"
        assert "[train] step" in "".join(p.read_text() for p in trigger_logs)

        # Every task that ran, ran on the Celery worker, from the default queue.
        worker_log = stack.log_text("worker")
        # (EmptyOperator tasks never reach an executor: the scheduler marks them done itself.)
        ran = {t: ti for t, ti in tis.items() if ti["state"] == "success" and ti["operator"] != "EmptyOperator"}
        assert {"resolve_run", "provision", "train", "finetune", "run_report", "teardown"} <= set(ran)
        for task_id, ti in ran.items():
            assert ti["queue"] == "default", (task_id, ti["queue"])
            assert ti["hostname"], task_id
            assert ti["executor"] in (None, "CeleryExecutor") or "Celery" in str(ti["executor"]), ti["executor"]
            assert f"task_id={task_id}/attempt=" in worker_log, f"{task_id} not in the Celery worker's log"
        assert progress(run_key, "finetune").get("step") == 10
    finally:
        api.wait_run(run_id, RUN_TIMEOUT)
        assert_no_machines_left(stack, run_key)


def test_triggerer_restart_during_training_still_handles_maintenance(stack: Stack) -> None:
    """SIGKILL the triggerer right after the drill's simulateMaintenanceEvent; its replacement carries on."""
    from interlude import events
    from interlude_workload.checkpoints import CheckpointStore

    api = stack.api
    run_id = api.trigger(
        base_conf(drill_maintenance=True, train_steps=80, finetune_steps=10, checkpoint_every=5, step_seconds=0.25)
    )
    run_key = naming.run_key(DAG_ID, run_id)
    drill = CheckpointStore(BUCKET, run_key, "train")
    drill_blob = drill.bucket.blob(drill.base + "control/drill.json")
    old_pid = stack.state["pids"]["triggerer"]
    try:
        api.wait_run(
            run_id,
            RUN_TIMEOUT,
            until=lambda run: (
                run["state"] in ("success", "failed")
                or (drill_blob.exists() and api.task_instance(run_id, "train")["state"] == "deferred")
            ),
        )
        assert api.task_instance(run_id, "train")["state"] == "deferred", "train finished before the restart"
        step_at_kill = int(progress(run_key, "train").get("step") or 0)
        assert step_at_kill < 80, "training already done: the restart would not land during training"
        new_pid = stack.restart("triggerer")
        assert new_pid != old_pid

        run = api.wait_run(run_id, RUN_TIMEOUT)
        tis = api.task_instances(run_id)
        assert run["state"] == "success", {t: ti["state"] for t, ti in tis.items()}
        recorded = [e for e in events.load_events(BUCKET, run_key) if e["stage"] == "train"]
        assert recorded, "no maintenance event of train was recorded across the triggerer restart"
        assert any(e.get("kind") == "maintenance" for e in recorded), recorded
        report_blob = drill.bucket.blob(naming.checkpoint_prefix(run_key) + "report.json")
        report = json.loads(report_blob.download_as_bytes())
        assert any(e["stage"] == "train" for e in report["events"]), report["events"]
        # The replacement triggerer ran the trigger after the restart.
        assert "trigger" in stack.log_text("triggerer").split("Starting the triggerer")[-1]
    finally:
        api.wait_run(run_id, RUN_TIMEOUT)
        assert_no_machines_left(stack, run_key)


def test_killed_training_task_cleared_resumes_from_checkpoint(stack: Stack) -> None:
    """Mark train failed mid-run (as a user would in the UI), let the run fail, clear it: it resumes."""
    api = stack.api
    run_id = api.trigger(base_conf(train_steps=150, finetune_steps=10, checkpoint_every=10, step_seconds=0.2))
    run_key = naming.run_key(DAG_ID, run_id)
    try:
        api.wait_run(
            run_id,
            RUN_TIMEOUT,
            until=lambda run: (
                run["state"] in ("success", "failed")
                or (int(progress(run_key, "train").get("last_checkpoint_step") or 0) >= 20)
            ),
        )
        killed_at = int(progress(run_key, "train").get("step") or 0)
        assert 20 <= killed_at < 150, killed_at
        api.call("PATCH", f"dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train", json={"new_state": "failed"})
        failed = api.wait_run(run_id, RUN_TIMEOUT)
        assert failed["state"] == "failed"
        assert api.task_instance(run_id, "teardown")["state"] == "success"
        assert_no_machines_left(stack, run_key)

        api.call(
            "POST",
            f"dags/{DAG_ID}/clearTaskInstances",
            json={
                "dry_run": False,
                "dag_run_id": run_id,
                "task_ids": ["train"],
                "include_downstream": True,
                "only_failed": False,
                "reset_dag_runs": True,
            },
        )
        run = api.wait_run(run_id, RUN_TIMEOUT, until=lambda run: run["state"] in ("queued", "running"))
        run = api.wait_run(run_id, RUN_TIMEOUT)
        tis = api.task_instances(run_id)
        assert run["state"] == "success", {t: ti["state"] for t, ti in tis.items()}
        assert tis["train"]["try_number"] >= 2
        resumed = progress(run_key, "train")
        assert int(resumed.get("resumed_from") or 0) >= 10, resumed
        assert int(resumed["step"]) == 150
    finally:
        api.wait_run(run_id, RUN_TIMEOUT)
        assert_no_machines_left(stack, run_key)


def test_backfill_three_dates_gives_three_runs(stack: Stack) -> None:
    """A backfill of 2026-11-28..30 (days outside the shipped sample, as a catch-up over recent days would be):
    three runs, three run keys, each fine-tuning on its own day's (generated) slice."""
    api = stack.api
    details = api.call("GET", f"dags/{DAG_ID}/details")
    if details.get("timetable_summary") in (None, "None") or details.get("timetable_description") == "Never":
        pytest.skip(f"{DAG_ID} has schedule=None: a backfill needs a timetable (data interval per date)")
    conf = {k: v for k, v in base_conf(train_steps=10, finetune_steps=5).items() if k != "data_date"}
    backfill = api.call(
        "POST",
        "backfills",
        json={
            "dag_id": DAG_ID,
            "from_date": "2026-11-28T00:00:00Z",
            "to_date": "2026-11-30T00:00:00Z",
            "run_backwards": False,
            "dag_run_conf": conf,
            "reprocess_behavior": "none",
            "max_active_runs": 3,
        },
    )
    deadline = time.monotonic() + 3 * RUN_TIMEOUT
    runs: list[dict[str, Any]] = []
    most_used = most_waiting = 0
    while time.monotonic() < deadline:
        pool = api.call("GET", "pools/interlude_accelerators")
        most_used = max(most_used, pool["running_slots"] + pool["deferred_slots"])
        most_waiting = max(most_waiting, pool["scheduled_slots"] + pool["queued_slots"])
        runs = [
            r
            for r in api.call("GET", f"dags/{DAG_ID}/dagRuns", params={"limit": 100})["dag_runs"]
            if r.get("run_type") == "backfill" and str(r.get("logical_date", "")).startswith("2026-11-")
        ]
        if len(runs) == 3 and all(r["state"] in ("success", "failed") for r in runs):
            break
        time.sleep(1)
    pool = api.call("GET", "pools/interlude_accelerators")
    assert pool["slots"] == 2 and pool["include_deferred"] is True
    # Every task that holds a machine runs in the pool (deferred ones included): never more than 2 at once.
    # (Between two tasks of a run the slot is free, so machines, which live from provision to teardown,
    # can briefly outnumber the slots; the pool caps the work, quota errors are waited out in provision.)
    assert most_used == 2, f"the pool must fill up and cap at 2 slots; saw {most_used}"
    assert backfill["id"]
    assert len(runs) == 3 and all(r["state"] == "success" for r in runs), runs
    keys = {naming.run_key(DAG_ID, r["dag_run_id"]) for r in runs}
    assert len(keys) == 3
    slices = set()
    for run in runs:
        key = naming.run_key(DAG_ID, run["dag_run_id"])
        assert progress(key, "finetune").get("step") == 5
        assert_no_machines_left(stack, key)
        spec = api.call(
            "GET", f"dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/taskInstances/resolve_run/xcomEntries/return_value"
        )["value"]
        spec = json.loads(spec) if isinstance(spec, str) else spec
        slices.add(spec["data_date"])
        assert spec["data_date"] == str(run["logical_date"])[:10], "each run fine-tunes on its own data slice"
    assert len(slices) == 3


def test_conversion_approval_given_through_the_rest_api(stack: Stack) -> None:
    """A TPU-only model where no TPU is offered: convert for GPU, wait for a person, approve, run on GPU."""
    api = stack.api
    conf = base_conf(model_profile="maxtext-tpu-only", zones=[GPU_ONLY_ZONE], require_conversion_approval=True)
    run_id = api.trigger(conf)
    task = "choose.approve_convert_for_gpu"
    waiting = ("deferred", "awaiting_input")
    api.wait_run(
        run_id, RUN_TIMEOUT, until=lambda run: api.task_instances(run_id).get(task, {}).get("state") in waiting
    )
    pending = api.call("GET", f"dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task}/-1/hitlDetails")
    assert "person-days" in pending["body"] and pending["options"] == ["Approve", "Reject"]
    assert api.task_instances(run_id)["provision"]["state"] in (None, "none", "scheduled", "queued")
    api.call(
        "PATCH",
        f"dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task}/-1/hitlDetails",
        json={"chosen_options": ["Approve"]},
    )
    run = api.wait_run(run_id, RUN_TIMEOUT)
    states = {t: ti["state"] for t, ti in api.task_instances(run_id).items()}
    assert run["state"] == "success", states
    assert states["choose.convert_for_gpu"] == "success" and states["choose.tpu"] == "skipped"
    machine = api.call("GET", f"dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/provision/xcomEntries/return_value")
    machine = json.loads(machine["value"]) if isinstance(machine["value"], str) else machine["value"]
    assert machine["kind"] == "gce_vm" and machine["zone"] == GPU_ONLY_ZONE
    assert machine["body"]["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert_no_machines_left(stack, naming.run_key(DAG_ID, run_id))


def test_component_logs_show_no_insecure_key_and_no_cold_first_task_start(stack: Stack) -> None:
    """From the components' own logs: the JWT key is long enough, and the first task start was answered at once.

    The api-server builds its Execution API on the first request; `up` warms it before the worker
    starts, so the worker's first `PATCH .../run` must not be the slow one (the Task SDK gives up after
    5 s and retries). Needs one task started in this session: a plan-only run when none has.
    """
    import re

    if "method=PATCH path=/execution/task-instances/" not in stack.log_text("api-server"):
        run_id = stack.api.trigger(base_conf(plan_only=True))
        assert stack.api.wait_run(run_id, RUN_TIMEOUT)["state"] == "success"
    for name in ("api-server", "scheduler", "dag-processor", "triggerer", "worker"):
        assert "InsecureKeyLengthWarning" not in stack.log_text(name), name
    starts = re.findall(
        r"duration_us=(\d+) .*method=PATCH path=/execution/task-instances/[^/ ]+/run .*"
        r"status_code=(\d+)",
        stack.log_text("api-server"),
    )
    assert starts, "no task-start call in the api-server's log"
    first_us, first_status = starts[0]
    assert first_status == "200" and int(first_us) < 5_000_000, starts[:3]
    assert all(status in ("200", "409") for _, status in starts), starts
    # The Task SDK's retry (tenacity) says "this is the 2nd time calling it" when a call had to be repeated.
    assert "time calling it" not in stack.log_text("worker"), "a worker call to the Execution API was retried"


def test_no_file_of_the_running_stack_shows_a_secret_to_others(stack: Stack) -> None:
    """Every file under the live stack's var dir that holds one of its secrets is owner-only (0600).

    The secrets are read from where `up` put them (airflow.cfg, stack.json, db-password), then every
    file (logs, local cloud state, Airflow home) is searched for their values.
    """
    import configparser
    import os
    import stat
    from pathlib import Path

    var_dir = Path(stack.state["var_dir"])
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(Path(stack.state["airflow_home"]) / "airflow.cfg")
    values = [
        cfg["api_auth"]["jwt_secret"],
        cfg["core"]["fernet_key"],
        cfg["api"]["secret_key"],
        stack.state["auth"]["password"],
        (var_dir / "db-password").read_text().strip(),
    ]
    assert all(len(v) >= 16 for v in values)
    holders = {}
    for dirpath, _, names in os.walk(var_dir):
        if Path(dirpath).is_relative_to(var_dir / "postgres" / "data"):
            continue  # PostgreSQL's own 0700 cluster (it stores a SCRAM verifier, not the password)
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                if any(v.encode() in data for v in values):
                    holders[str(path.relative_to(var_dir))] = stat.S_IMODE(path.stat().st_mode)
    assert {"stack.json", "db-password", "airflow/airflow.cfg"} <= set(holders), holders
    assert not {p: oct(m) for p, m in holders.items() if m & 0o077}, holders
