"""Issue 6 end to end: the lifecycle DAG on the local cloud through maintenance, preemption and failure.

Real pieces only: the local cloud as its own process (TPU API, metadata servers, GCS emulator), the
machine's agent and trainer as the local cloud's machine processes, and Airflow's own `dags test`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from interlude import naming
from interlude.training.assets import EXTRA_URI, FINETUNED_CHECKPOINT
from interlude_dev import scenario, warm_cli
from interlude_dev import wiring as dev
from interlude_workload import hf_export
from tests.faults.support import record_task_states, waiting_in_trigger

pytestmark = pytest.mark.e2e
DAG_ID = "interlude_training"
BUCKET = "interlude-e2e"
BASE = {
    "train_steps": 80,
    "finetune_steps": 60,
    "checkpoint_every": 10,
    "step_seconds": 0.1,
    "seed": 7,
    "data_date": "2024-01-15",
    "bucket": BUCKET,
    "poll_seconds": 0.5,
    "model_size": "tiny",  # the reference model cut to one narrow layer: many trainers share 2 cores
}


@pytest.fixture(scope="module")
def airflow_db(airflow_db_template: Path) -> Path:
    """The session's migrated DB (tests/conftest.py); each test copies it."""
    return airflow_db_template


@pytest.fixture
def fast_scenario(tmp_path: Path) -> Path:
    """The default scenario, with time running 3x faster (a 2 h TPU notice is 4 s)."""
    return scenario.build(tmp_path / "fast.yaml", "default", scenario.FAST)


@pytest.fixture
def stack(
    tmp_path: Path, airflow_db: Path, fast_scenario: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[dev.LocalCloud, dict[str, str]]]:
    cloud = dev.start_localcloud(fast_scenario, tmp_path / "localcloud")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", cloud.gcs_endpoint)  # this test's GCS, restored after it
    try:
        home = tmp_path / "airflow"
        home.mkdir()
        (home / "airflow.db").write_bytes(airflow_db.read_bytes())
        dev.ensure_bucket(cloud, BUCKET)
        yield cloud, dev.airflow_env(home, cloud)
        assert dev.machines(cloud) == [], "a run left machines in the cloud"  # after every test, whatever it was
    finally:
        cloud.stop()


def _store(cloud: dev.LocalCloud, run_key: str, stage: str) -> Any:
    """This test's checkpoints (the `stack` fixtures point STORAGE_EMULATOR_HOST at `cloud` for the test only:
    a worker runs other tests after this one, against other emulators)."""
    assert os.environ.get("STORAGE_EMULATOR_HOST") == cloud.gcs_endpoint
    from interlude_workload.checkpoints import CheckpointStore

    return CheckpointStore(BUCKET, run_key, stage)


def _watch(
    cloud: dev.LocalCloud,
    when: Callable[[dict[str, Any], int], bool],
    act: Callable[[dict[str, Any]], None],
    timeout: float = 240,
) -> threading.Thread:
    """In the background: once a machine exists and its train progress satisfies `when`, act once."""

    def loop() -> None:
        deadline = time.monotonic() + timeout
        admin = cloud.admin
        while time.monotonic() < deadline:
            for m in admin.machines():
                key = m["name"].rsplit("-", 1)[0]
                progress = _store(cloud, key, "train").read_progress() or {}
                if when(m, int(progress.get("step") or 0)):
                    act(m)
                    return
            time.sleep(0.3)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _run(stack: tuple[dev.LocalCloud, dict[str, str]], tmp_path: Path, **conf: Any) -> tuple[dev.DagTestResult, str]:
    """`dags test`, then the run's and its tasks' states read back from Airflow's own database (not from the
    log line the result is parsed from): a test asserting `result.state` asserts what Airflow recorded."""
    cloud, env = stack
    result = dev.dags_test(env, DAG_ID, {**BASE, **conf}, tmp_path / "dags-test.log", timeout=600)
    assert result.run_id, f"no run finished; log tail:\n{result.log[-3000:]}"
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        query = "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?"
        row = db.execute(query, (DAG_ID, result.run_id)).fetchone()
        tasks = dict(
            db.execute(
                "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?", (DAG_ID, result.run_id)
            ).fetchall()
        )
    assert row is not None, f"Airflow has no dag_run {result.run_id}"
    assert row[0] == result.state, f"the log says {result.state}, Airflow recorded {row[0]}; tasks: {tasks}"
    return dataclasses.replace(result, state=row[0], tasks=tasks), naming.run_key(DAG_ID, result.run_id)


def _reference_digest(cloud: dev.LocalCloud, tmp_path: Path) -> str:
    return dev.reference_digest(cloud, BUCKET, BASE)


def test_scheduled_maintenance_in_both_stages_loses_nothing(stack, tmp_path: Path) -> None:
    cloud, _ = stack
    result, run_key = _run(stack, tmp_path, drill_maintenance=True)
    assert result.succeeded, result.log[-4000:]
    report = dev.read_report(cloud, BUCKET, run_key)
    assert report is not None
    print(json.dumps({k: report[k] for k in ("steps_recomputed", "goodput", "badput_seconds")}, indent=1))
    stages = sorted(e["stage"] for e in report["events"])  # every event, none keyed away
    assert stages == ["finetune", "train"], report["events"]
    for event in report["events"]:
        assert event["kind"] == "maintenance" and event["notice_type"] == "SCHEDULED"
        assert event["checkpoint_step"] and event["down_at"] and event["downtime_s"] > 0
        assert event["steps_recomputed"] == 0
    assert report["steps_recomputed"] == 0
    final = _store(cloud, run_key, "finetune").latest().checkpoint
    assert final.step == BASE["finetune_steps"]
    assert final.metrics["digest"] == _reference_digest(cloud, tmp_path)
    assert dev.machines(cloud) == []


def test_crash_without_notice_resumes_from_the_last_periodic_checkpoint(stack, tmp_path: Path) -> None:
    cloud, _ = stack
    crashed: list[int] = []

    def crash(m: dict[str, Any]) -> None:
        step = int((_store(cloud, m["name"].rsplit("-", 1)[0], "train").read_progress() or {})["step"])
        cloud.admin.crash("tpu", m["zone"], m["name"])  # SIGKILL, then the machine reboots
        crashed.append(step)

    watcher = _watch(cloud, lambda m, step: m["kind"] == "tpu" and step >= 25 and step % 10 >= 3, crash)
    result, run_key = _run(stack, tmp_path)
    watcher.join(timeout=5)
    assert crashed and result.succeeded, result.log[-4000:]
    events = dev.read_report(cloud, BUCKET, run_key)["events"]
    assert len(events) == 1 and events[0]["kind"] in ("no_notice_loss", "unobserved_restart"), events
    event = events[0]
    assert event["resumed_from_step"] % BASE["checkpoint_every"] == 0, "resumes from a periodic checkpoint"
    # The step at the crash is known only from progress reports (up to ~1 s, 10 steps, behind).
    every = BASE["checkpoint_every"]
    assert crashed[0] - every <= event["resumed_from_step"] <= crashed[0] + every, (crashed, event)
    assert 0 <= event["steps_recomputed"] <= BASE["checkpoint_every"], event
    final = _store(cloud, run_key, "finetune").latest().checkpoint
    assert final.metrics["digest"] == _reference_digest(cloud, tmp_path)


def test_a_failed_stage_still_tears_down_and_fails_the_run(stack, tmp_path: Path) -> None:
    cloud, _ = stack

    def deny_next_list(m: dict[str, Any]) -> None:
        # The trigger's next look at the zone is refused: watching fails, the stage fails.
        cloud.admin.inject_fault(r"^/v2/projects/[^/]+/locations/[^/]+/nodes$", status=403, count=1, method="GET")

    watcher = _watch(cloud, lambda m, step: step >= 15, deny_next_list)
    result, run_key = _run(stack, tmp_path, train_steps=200)
    watcher.join(timeout=5)
    assert result.state == "failed"
    assert result.tasks["train"] == "failed", result.tasks  # the stage failed, not something else
    assert result.tasks["teardown"] == "success", result.tasks
    assert dev.machines(cloud) == [], "teardown must delete the machine after a failure"
    assert _store(cloud, run_key, "train").latest().checkpoint.step >= 10, "checkpoints must remain"


def test_stockout_at_provisioning_walks_the_tree_again(tmp_path: Path, airflow_db: Path) -> None:
    """Google has no capacity query: the probe says v6e-8 is available, the create stocks out, and the
    run moves to the next candidate instead of failing. Teardown removes only this run's machine."""
    from interlude.hooks.tpu import TpuHook

    cloud = dev.start_localcloud("tpu_capacity_one", tmp_path / "localcloud")
    try:
        home = tmp_path / "airflow"
        home.mkdir()
        (home / "airflow.db").write_bytes(airflow_db.read_bytes())
        dev.ensure_bucket(cloud, BUCKET)
        squatter = TpuHook(gcp_conn_id=None, tpu_endpoint=cloud.api_endpoint, project_id=cloud.project)
        squatter.create_node(
            "us-central2-b", "someone-else", {"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e"}
        )
        conf = {**BASE, "zones": ["us-central2-b"], "train_steps": 20, "finetune_steps": 10, "checkpoint_every": 5}
        result = dev.dags_test(dev.airflow_env(home, cloud), DAG_ID, conf, tmp_path / "dags-test.log", timeout=600)
        assert result.succeeded, result.log[-4000:]
        assert "Stockout" in result.log and "v5litepod-8" in result.log
        report = dev.read_report(cloud, BUCKET, naming.run_key(DAG_ID, result.run_id))
        assert report["accelerator"] == "v5litepod-8"
        assert [m["name"] for m in dev.machines(cloud)] == ["someone-else"]
    finally:
        cloud.stop()


def _airflow(env: dict[str, str], *args: str) -> None:
    code, output = warm_cli.airflow_output(args, env)
    assert code == 0, output[-3000:]


def _checkpoint_asset_events(env: dict[str, str]) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Airflow's own records: events on the fine-tuned checkpoint Asset, and the DAGs queued to run on them."""
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        events = db.execute(
            "SELECT e.extra, e.source_dag_id, e.source_task_id, e.source_run_id FROM asset_event e "
            "JOIN asset a ON a.id = e.asset_id WHERE a.name = ?",
            (FINETUNED_CHECKPOINT.name,),
        ).fetchall()
        queued = db.execute(
            "SELECT q.target_dag_id FROM asset_dag_run_queue q JOIN asset a ON a.id = q.asset_id WHERE a.name = ?",
            (FINETUNED_CHECKPOINT.name,),
        ).fetchall()
    return events, [q[0] for q in queued]


def _scheduled_serving_run(env: dict[str, str], log: Path, timeout: float = 120) -> str:
    """Airflow's own scheduler turns the queued Asset event into an asset-triggered `interlude_serving` run; the
    scheduler is stopped once the run exists (its tasks are run below with `tasks test`, without executors)."""
    db = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    cmd = [str(Path(sys.executable).parent / "airflow"), "scheduler", "--skip-serve-logs"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with sqlite3.connect(db) as conn:
                row = conn.execute(
                    "SELECT run_id FROM dag_run WHERE dag_id = 'interlude_serving' AND run_type = 'asset_triggered'"
                ).fetchone()
            if row:
                return str(row[0])
            time.sleep(0.5)
        raise AssertionError(f"no asset-triggered serving run after {timeout:.0f} s; see {log}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # our own scheduler's process group
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_queued_resource_provisioning_for_a_profile_that_prefers_it(stack, tmp_path: Path) -> None:
    """maxtext-tpu-only prefers queued resources: the TPU comes through one, and teardown removes both.

    The same run's committed fine-tuned checkpoint is an event on the checkpoint Asset, and the (unpaused)
    serving DAG is queued on it for the scheduler: serving follows training without glue."""
    cloud, env = stack
    _airflow(env, "dags", "reserialize")  # what the dag processor does: both DAGs' schedules are in the DB
    _airflow(env, "dags", "unpause", "interlude_serving")
    result, run_key = _run(
        stack, tmp_path, model_profile="maxtext-tpu-only", train_steps=20, finetune_steps=10, checkpoint_every=5
    )
    assert result.succeeded, result.log[-4000:]
    assert "Queued resource" in result.log or "(v6e-8, queued)" in result.log

    events = cloud.admin.events()
    qr = f"{run_key}-tpu-qr"
    states = [
        e.get("state")
        for e in events
        if e["event"] == "queued_resource_state" and str(e.get("queued_resource", "")).endswith(qr)
    ]
    assert states[-1] == "ACTIVE", states
    assert any(e["event"] == "queued_resource_deleted" and str(e["queued_resource"]).endswith(qr) for e in events)
    assert dev.machines(cloud) == []

    asset_events, queued = _checkpoint_asset_events(env)
    (event,) = asset_events
    extra, source_dag, source_task, source_run = event
    extra = json.loads(extra)
    assert (source_dag, source_task, source_run) == (DAG_ID, "finetune", result.run_id), event
    committed = _store(cloud, run_key, "finetune").latest().checkpoint  # read from GCS, not from Airflow
    assert committed is not None and committed.step == 10
    assert extra[EXTRA_URI] == committed.uri and extra["step"] == committed.step, (extra, committed)
    store = _store(cloud, run_key, "finetune")
    marker = hf_export.read_marker(store.client, store.bucket_name, run_key, "finetune")  # the export, whole in GCS
    assert marker is not None and marker["step"] == 10 and "model.safetensors" in marker["files"], marker
    export_uri = hf_export.uri(store.bucket_name, run_key, "finetune")
    assert extra["export_uri"] == export_uri, extra
    assert queued == ["interlude_serving"], queued

    # the scheduler starts serving on that event, and serving's resolve takes the checkpoint from it
    for dag_id in ("interlude_training", "interlude_sweeper"):
        _airflow(env, "dags", "pause", dag_id)  # only the Asset's consumer may start
    serving_run = _scheduled_serving_run(env, tmp_path / "scheduler.log")
    _code, resolved = warm_cli.airflow_output(["tasks", "test", "interlude_serving", "resolve", serving_run], env)
    assert f"Checkpoint from the triggering Asset event: {export_uri}" in resolved, resolved[-3000:]
    assert "invalid serving parameters" not in resolved


def test_wait_for_capacity_defers_until_quota_frees(tmp_path: Path, airflow_db: Path) -> None:
    """The only GPU the zone offers has its quota used up by someone else: the tree says `wait`, the
    run waits in the triggerer, and goes on to that GPU as soon as the other VM is deleted."""
    from interlude.hooks.compute import ComputeHook
    from interlude.machines import provisioning

    zone = "us-central1-a"
    scenario = {
        "description": "one A100 80GB whose quota is taken",
        "project": "interlude-local",
        "time_scale": 3600,
        "zones": {
            zone: {
                "region": "us-central1",
                "gpu": {
                    "accelerator_types": ["nvidia-a100-80gb"],
                    "machine_types": ["a2-ultragpu-1g"],
                    "capacity": {"nvidia-a100-80gb": {"on_demand": 4}},
                },
            }
        },
        "regions": {"us-central1": {"quotas": {"NVIDIA_A100_80GB_GPUS": 1, "CPUS": 100}}},
    }
    path = tmp_path / "a100.yaml"
    path.write_text(yaml.safe_dump(scenario))
    cloud = dev.start_localcloud(path, tmp_path / "localcloud")
    try:
        home = tmp_path / "airflow"
        home.mkdir()
        (home / "airflow.db").write_bytes(airflow_db.read_bytes())
        dev.ensure_bucket(cloud, BUCKET)
        compute = ComputeHook(gcp_conn_id=None, compute_endpoint=cloud.api_endpoint, project_id=cloud.project)
        squatter = provisioning.gce_vm_body(
            name="someone-else",
            zone=zone,
            accelerator_type="nvidia-a100-80gb",
            count=1,
            machine_type="a2-ultragpu-1g",
            image_family="x",
            mode="on_demand",
            labels={},
            script="true",
            network=None,
            subnetwork=None,
            service_account=None,
        )
        compute.insert_instance(zone, squatter)
        log = tmp_path / "dags-test.log"
        conf = {
            **BASE,
            "zones": [zone],
            "train_steps": 10,
            "finetune_steps": 5,
            "checkpoint_every": 5,
            "poll_seconds": 0.5,
        }
        result: list[dev.DagTestResult] = []
        runner = threading.Thread(
            target=lambda: result.append(dev.dags_test(dev.airflow_env(home, cloud), DAG_ID, conf, log, timeout=600)),
            daemon=True,
        )
        record_task_states(home)
        runner.start()
        deadline = time.monotonic() + 180
        waiting = None
        while waiting is None:
            assert time.monotonic() < deadline and runner.is_alive(), "the run never waited in the triggerer"
            time.sleep(0.5)
            waiting = waiting_in_trigger(home, "choose.wait_for_capacity")
        # Deferred to the capacity trigger, no task of the run holding a worker meanwhile: Airflow's own records.
        assert waiting.classpath.endswith("CapacityTrigger") and waiting.running == [], waiting
        time.sleep(3)  # a few re-evaluations that still find nothing
        compute.delete_instance(zone, "someone-else")
        runner.join(timeout=400)
        (done,) = result
        assert done.succeeded, done.log[-4000:]
        assert "Capacity found: gpu -> nvidia-a100-80gb" in done.log
        report = dev.read_report(cloud, BUCKET, naming.run_key(DAG_ID, done.run_id))
        assert report["accelerator"] == "nvidia-a100-80gb"
        assert dev.machines(cloud) == []
    finally:
        cloud.stop()
