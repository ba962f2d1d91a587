"""The lifecycle DAG on a production-shaped Airflow: PostgreSQL, Redis, Celery worker, separate triggerer.

`airflow dags test` runs triggers inline and tasks in one process; these tests prove what only the real
topology shows: the StageTrigger imports and runs in the triggerer process, tasks run on the Celery
worker, a triggerer killed mid-training hands its trigger to its replacement (the new triggerer process
records the maintenance event), and a training task whose worker process is SIGKILLed resumes, once
cleared, from its last committed checkpoint. Each run ends with no machine of it left in the local cloud.
The assertions read independent facts: GCS objects, the workload's own log, processes, the cloud's machines.
One stack serves the tests of this file and the test_zz_* files that run on one worker (`make test` splits them
into shards, one stack each: tests/xdist_scheduling.py) and stops after the last of them (see stack_fixtures).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from interlude import naming
from tests.e2e.stack_fixtures import (
    BUCKET,
    DAG_ID,
    DATA_DATE,
    GPU_ONLY_ZONE,
    POLL_SECONDS,
    TERMINAL,
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
        "model_size": "tiny",
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


def fired_events(log_file: Path) -> list[str]:
    """The "Trigger fired event" lines of one triggerer job's log of a task (Airflow writes the job id
    into the file name: attempt=N.log.trigger.<job id>.log)."""
    if not log_file.exists():
        return []
    return [line for line in log_file.read_text(errors="replace").splitlines() if "Trigger fired event" in line]


def test_triggerer_restart_during_training_still_handles_maintenance(stack: Stack) -> None:
    """SIGKILL the triggerer while train is deferred and before the drill; the new triggerer job handles
    the drill's maintenance event end to end, and its record matches the workload's own log."""
    from interlude.training import events
    from interlude_workload.checkpoints import CheckpointStore

    api = stack.api
    # The drill holds at step 20 (checkpoint_every): several seconds of stepping in which to restart.
    run_id = api.trigger(
        base_conf(drill_maintenance=True, train_steps=80, finetune_steps=10, checkpoint_every=20, step_seconds=0.25)
    )
    run_key = naming.run_key(DAG_ID, run_id)
    drill = CheckpointStore(BUCKET, run_key, "train")
    drill_blob = drill.bucket.blob(drill.base + "control/drill.json")
    old_pid = stack.state["pids"]["triggerer"]

    def train_with_a_triggerer(run: dict[str, Any]) -> bool:
        ti = api.task_instance(run_id, "train")
        return run["state"] in TERMINAL or (ti["state"] == "deferred" and bool(ti.get("triggerer_job")))

    try:
        api.wait_run(run_id, RUN_TIMEOUT, until=train_with_a_triggerer)
        train = api.task_instance(run_id, "train")
        assert train["state"] == "deferred", "train finished before the restart"
        old_job = int(train["triggerer_job"]["id"])
        # Before the drill: everything about the maintenance event happens after the restart.
        assert not drill_blob.exists(), "the drill was already sent: the restart would not precede the event"
        assert not events.load_events(BUCKET, run_key)
        new_pid = stack.restart("triggerer")
        assert new_pid != old_pid

        jobs_seen: dict[int, str] = {}  # triggerer job id -> its host, as the REST API shows train's job

        def watch(tis: dict[str, dict[str, Any]]) -> None:
            job = tis["train"].get("triggerer_job")
            if job:
                jobs_seen[int(job["id"])] = str(job.get("hostname"))

        run = api.wait_run(run_id, RUN_TIMEOUT, on_poll=watch)
        tis = api.task_instances(run_id)
        assert run["state"] == "success", {t: ti["state"] for t, ti in tis.items()}
        new_jobs = set(jobs_seen) - {old_job}
        assert len(new_jobs) == 1, f"train's triggerer jobs after the restart: {jobs_seen} (before: {old_job})"
        new_job = new_jobs.pop()

        recorded = [e for e in events.load_events(BUCKET, run_key) if e["stage"] == "train"]
        assert len(recorded) == 1, recorded
        event = recorded[0]
        assert event.get("kind") == "maintenance", event
        # The new triggerer (not the killed one) saw the event close: the trigger names its process on the
        # transition (the runner's parent is the `airflow triggerer` the stack restarted), the operator
        # stores it with the event; the new job runs on that host.
        watcher = event.get("watcher") or {}
        assert watcher.get("ppid") == new_pid, (watcher, old_pid, new_pid)
        assert watcher.get("host") == jobs_seen[new_job], (watcher, jobs_seen)
        # ...and that job ran train's trigger: its log file is named for the job (attempt=N.log.trigger.<id>.log).
        log_dir = stack.task_logs(run_id, "train")[0].parent
        assert fired_events(log_dir / f"attempt=1.log.trigger.{new_job}.log"), sorted(p.name for p in log_dir.iterdir())

        # The workload's own account: where it held for the drill and where its next boot resumed.
        log = drill.read_log()
        held = [int(step) for step in re.findall(r"holding at committed step (\d+): drill step", log)]
        assert held == [20], log[-3000:]
        # The first resume point after the hold is the maintenance reboot's (a later boot, for finetune,
        # logs train's final step again before "nothing to do").
        after_hold = log.split("holding at committed step 20: drill step", 1)[1]
        resumed = re.search(r"resume point: step (\d+)", after_hold)
        assert resumed, after_hold[-3000:]
        assert int(resumed.group(1)) == event["resumed_from_step"] == event["checkpoint_step"] == 20, event
        report_blob = drill.bucket.blob(naming.checkpoint_prefix(run_key) + "report.json")
        report = json.loads(report_blob.download_as_bytes())
        assert [e["event_id"] for e in report["events"] if e["stage"] == "train"] == [event["event_id"]]
    finally:
        api.wait_run(run_id, RUN_TIMEOUT)
        assert_no_machines_left(stack, run_key)


# The worker watches the stages itself (no deferral) for the killed-task test: a process then holds `train`.
WATCH_FROM_WORKER = {"AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "False"}


def committed_step(store: Any) -> int:
    """The latest committed checkpoint step in GCS (the objects and their COMMITTED marker), 0 if none."""
    latest = store.latest().checkpoint
    return int(latest.step) if latest is not None else 0


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def ancestors(pid: int) -> list[int]:
    """The parent chain of a live process, from /proc (field 4 of /proc/PID/stat is the parent's pid)."""
    chain: list[int] = []
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        chain.append(pid)
    return chain


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(POLL_SECONDS)


def test_killed_training_task_cleared_resumes_from_checkpoint(stack: Stack) -> None:
    """SIGKILL the worker process running train, let the run fail, clear it: it resumes from its checkpoint.

    The worker is restarted to watch stages itself (no triggerer), so a real task process holds `train`
    on the Celery worker; the test kills that process (the TaskInstance's pid, checked to be in the
    worker's process group) and then checks GCS and the workload's own log, not the code's counters.
    """
    from interlude_workload.checkpoints import CheckpointStore

    api = stack.api
    # Nothing else may be running on the worker that is about to be restarted (e.g. the scheduled run).
    wait_for(lambda: not api.active_runs(), RUN_TIMEOUT, "other DAG runs to finish")
    stack.restart("worker", env=WATCH_FROM_WORKER)
    # 0.4 s a step: the machine must not finish its 150 steps between the kill and the teardown that stops it
    # (on a loaded machine that gap was over 25 s), or there is nothing left to resume.
    run_id = api.trigger(base_conf(train_steps=150, finetune_steps=10, checkpoint_every=10, step_seconds=0.4))
    run_key = naming.run_key(DAG_ID, run_id)
    store = CheckpointStore(BUCKET, run_key, "train")
    worker_pid = int(stack.state["pids"]["worker"])
    try:
        api.wait_run(
            run_id,
            RUN_TIMEOUT,
            until=lambda run: (
                run["state"] in TERMINAL
                or (api.task_instance(run_id, "train")["state"] == "running" and committed_step(store) >= 20)
            ),
        )
        train = api.task_instance(run_id, "train")
        assert train["state"] == "running", f"train is {train['state']}, not running, when it should be killed"
        pid = int(train["pid"])
        # An independent check that this pid is the task process on the Celery worker (not a stale value):
        # the Celery worker is among its ancestors.
        assert worker_pid in ancestors(pid), f"pid {pid} does not descend from the Celery worker {worker_pid}"
        committed_before_kill = committed_step(store)
        assert 20 <= committed_before_kill < 150, committed_before_kill
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: process_gone(pid), 60, f"the killed task process {pid} to be gone")

        failed = api.wait_run(run_id, RUN_TIMEOUT)
        assert failed["state"] == "failed"
        assert api.task_instance(run_id, "train")["state"] == "failed"
        assert api.task_instance(run_id, "teardown")["state"] == "success"
        assert_no_machines_left(stack, run_key)
        # The machine is gone: nothing commits any more. This is where the retry must resume.
        committed_at_retry = committed_step(store)
        assert committed_at_retry >= committed_before_kill

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
        # The workload's own log: the first boot had nothing to restore; the retry's boot resumed from the
        # checkpoint committed before the kill (or a later one written before teardown), and ran to the end.
        # (The log reaches GCS in chunks: wait for the last one, which carries the final digest.)
        wait_for(lambda: "final digest" in store.read_log(tail_chunks=1), 120, "the workload's final log chunk")
        log = store.read_log()
        resumed = [int(step) for step in re.findall(r"resume point: step (\d+)", log)]
        assert resumed, f"the workload never logged a resume point:\n{log[-3000:]}"
        assert resumed[-1] == committed_at_retry >= committed_before_kill, (resumed, committed_at_retry)
        assert f"training train steps {committed_at_retry + 1}..150" in log, log[-3000:]
        assert committed_step(store) == 150
        assert "final digest" in log.split(f"resume point: step {committed_at_retry}")[-1]
    finally:
        try:
            api.wait_run(run_id, RUN_TIMEOUT)
        finally:
            stack.restart("worker")
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
    polls = 0
    while time.monotonic() < deadline:
        pool = api.call("GET", "pools/interlude_accelerators")
        most_used = max(most_used, slots_held(api))
        most_waiting = max(most_waiting, pool["scheduled_slots"] + pool["queued_slots"])
        polls += 1
        if polls % 3 == 0:  # the pool every second; the list of runs (the api-server's dearest answer) every third
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


def slots_held(api: Any) -> int:
    """Pool slots of the accelerator pool's running and deferred task instances, from one SELECT: the pool
    endpoint's running_slots and deferred_slots are two queries, so a task deferring between them counts twice."""
    listed = api.call(
        "GET",
        "dags/~/dagRuns/~/taskInstances",
        params={"pool": "interlude_accelerators", "state": ["running", "deferred"], "limit": 100},
    )["task_instances"]
    return sum(int(ti.get("pool_slots") or 1) for ti in listed)


class PoolCapExceeded(AssertionError):
    """More machines alive at once than the accelerator pool has slots."""


def test_machines_alive_at_once_never_exceed_the_accelerator_pool(stack: Stack) -> None:
    """Four runs at once on a 2-slot pool: the machines alive in the local cloud never outnumber the slots (the
    cap as users read it: the stack sets `[interlude] max_machines` to the pool's slots, interlude.machines.slots
    holds it from provision to teardown), and the cap is reached. Counted from the cloud's own record of each
    machine's create and delete times (its admin view's lifetimes), not sampled: an overlap of a moment counts."""
    from interlude_localcloud.testing import Admin, most_alive_at_once

    api = stack.api
    slots = int(api.call("GET", "pools/interlude_accelerators")["slots"])
    wait_for(lambda: not api.active_runs(), RUN_TIMEOUT, "other DAG runs to finish")
    since = time.time()
    run_ids = [
        api.trigger(base_conf(seed=40 + i, train_steps=20, finetune_steps=5, checkpoint_every=5)) for i in range(4)
    ]
    keys = [naming.run_key(DAG_ID, run_id) for run_id in run_ids]
    try:
        states = {run_id: api.wait_run(run_id, 2 * RUN_TIMEOUT)["state"] for run_id in run_ids}
        assert all(state == "success" for state in states.values()), states
        admin = Admin(stack.state["localcloud"]["api_endpoint"])
        lives = [e for e in admin.lifetimes(since) if e["name"].startswith(tuple(keys))]
        assert {e["name"].rsplit("-", 1)[0] for e in lives} == set(keys), lives  # every run made its machine
        count, most = most_alive_at_once(lives)
        if count > slots:
            raise PoolCapExceeded(f"{count} machines alive at once on {slots} slots: {most}")
        assert count == slots, f"the cap was never reached ({count} of {slots}): the test shows nothing"
    finally:
        for run_id, key in zip(run_ids, keys, strict=True):
            api.wait_run(run_id, RUN_TIMEOUT)
            assert_no_machines_left(stack, key)


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
        r"duration_us=(\d+) .*method=PATCH path=/execution/task-instances/([^/ ]+)/run .*"
        r"status_code=(\d+)",
        stack.log_text("api-server"),
    )
    assert starts, "no task-start call in the api-server's log"
    first_us, _, first_status = starts[0]
    assert first_status == "200" and int(first_us) < 5_000_000, starts[:3]
    # Every task instance that was started was started once with 200. On a loaded machine a later call can
    # time out on the Task SDK's side (the server then logs 400 for the request the client dropped) and be
    # retried: that is the SDK working as designed, not a cold start.
    started = {ti for _, ti, status in starts if status == "200"}
    assert {ti for _, ti, _ in starts} <= started, [s for s in starts if s[1] not in started]
    # The Task SDK's retry (tenacity) says "this is the 2nd time calling it" when a call had to be repeated:
    # not for the session's first task (the warmed Execution API answers it at once).
    worker = stack.log_text("worker")
    first_task = worker.split("Workload finished", 1)[0]
    assert "time calling it" not in first_task, "the first task's calls to the Execution API were retried"


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
        stack.state["outsider"]["password"],  # the user without a role (the Interlude view's 403 test)
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
