"""Helpers of the fault suite: the cloud's own view of what is left, checkpoint verification, `dags test`."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from interlude_dev import wiring as dev

DAG_ID = "interlude_training"
BUCKET = "interlude-faults"
ZONES = ("us-central1-a", "us-central2-b")
BASE = {
    "train_steps": 20,
    "finetune_steps": 10,
    "checkpoint_every": 10,
    "step_seconds": 0.05,
    "seed": 3,
    "data_date": "2024-01-15",
    "bucket": BUCKET,
    "poll_seconds": 0.5,
    "model_size": "tiny",  # the reference model cut to one narrow layer: many trainers share 2 cores
}
# Orbax's finalisation marker at a step's root (interlude_workload.orbax_layout), not an item's.
_COMMITTED = re.compile(r"^interlude/(?P<run>[^/]+)/(?P<stage>[^/]+)/checkpoints/(?P<step>[0-9]+)/commit_success\.txt$")


def tpu_hook(cloud: dev.LocalCloud) -> Any:
    from interlude.hooks.tpu import TpuHook

    return TpuHook(gcp_conn_id=None, tpu_endpoint=cloud.api_endpoint, project_id=cloud.project)


def compute_hook(cloud: dev.LocalCloud) -> Any:
    from interlude.hooks.compute import ComputeHook

    return ComputeHook(gcp_conn_id=None, compute_endpoint=cloud.api_endpoint, project_id=cloud.project)


def _run_pools(cloud: dev.LocalCloud) -> list[str]:
    """Node pools a run made (``il-<hash>``, interlude.stage.jobset.short_name) in any GKE cluster of the cloud, as
    the Container API lists them: ``projects/P/locations/L/clusters/C/nodePools/N``."""
    base = f"{cloud.api_endpoint}/v1/projects/{cloud.project}/locations/-/clusters"
    out = []
    for c in requests.get(base, timeout=30).json().get("clusters") or []:
        parent = f"projects/{cloud.project}/locations/{c['location']}/clusters/{c['name']}"
        pools = requests.get(f"{cloud.api_endpoint}/v1/{parent}/nodePools", timeout=30).json().get("nodePools") or []
        out += [f"{parent}/nodePools/{p['name']}" for p in pools if p["name"].startswith("il-")]
    return out


def left_in_cloud(cloud: dev.LocalCloud) -> list[str]:
    """Every node, VM, queued resource and run's GKE node pool the cloud holds (the independent fact, not the
    code's account)."""
    left = [f"{m['kind']} {m['zone']}/{m['name']} ({m['state']})" for m in cloud.admin.machines()]
    left += [f"GKE node pool {p}" for p in _run_pools(cloud)]
    from interlude.hooks.errors import NotFoundError

    tpu = tpu_hook(cloud)
    for zone in ZONES:
        try:
            left += [f"queued resource {q['name']}" for q in tpu.list_queued_resources(zone)]
        except NotFoundError:  # a test's own scenario without that zone
            continue
    return left


@dataclass(frozen=True)
class Committed:
    bucket: str
    run_key: str
    stage: str
    step: int


def committed_checkpoints(cloud: dev.LocalCloud) -> list[Committed]:
    client = dev.gcs_client(cloud)
    out = []
    for bucket in client.list_buckets():
        for blob in client.list_blobs(bucket.name, prefix="interlude/"):
            if m := _COMMITTED.match(blob.name):
                out.append(Committed(bucket.name, m["run"], m["stage"], int(m["step"])))
    return out


def verify_failures(cloud: dev.LocalCloud, checkpoints: list[Committed]) -> list[str]:
    from interlude_workload.checkpoints import CheckpointStore

    client = dev.gcs_client(cloud)
    problems = []
    for c in checkpoints:
        store = CheckpointStore(c.bucket, c.run_key, c.stage, client=client)
        status = next((s for s in store.scan() if s.step == c.step), None)
        if status is None or not status.committed:
            problems.append(f"{c}: gone")
            continue
        _, reason = store.verify(status, "full")
        if reason:
            problems.append(f"{c}: {reason}")
    return problems


EARLIER_RUN = "interlude_training__an-earlier-run"  # a run key no test's run can have (see seed_earlier_run)


def seed_earlier_run(cloud: dev.LocalCloud, bucket: str = BUCKET) -> None:
    """Commit a checkpoint of a run that finished before the test, as its trainer would have (an Orbax step): a
    fresh cloud otherwise holds no checkpoint a test could lose, and the promise "nothing committed is lost" would
    be checked against nothing."""
    import numpy as np

    from interlude_workload.checkpoints import CheckpointStore

    store = CheckpointStore(bucket, EARLIER_RUN, "finetune", client=dev.gcs_client(cloud))
    store.write(
        10, {"weights": np.frombuffer(b"weights of an earlier run" * 64, np.uint8)}, metrics={"digest": "earlier"}
    )


# The clouds a test used, each with the checkpoints committed in it when the test started (conftest checks them).
WATCHED = pytest.StashKey[list[tuple[dev.LocalCloud, list[Committed]]]]()


def watch_cloud(node: pytest.Item, cloud: dev.LocalCloud) -> None:
    """Check this cloud after the test body (conftest's pytest_runtest_call), while it still runs."""
    node.stash.setdefault(WATCHED, []).append((cloud, committed_checkpoints(cloud)))


def left_or_lost(cloud: dev.LocalCloud, before: list[Committed], settle_s: float = 60.0) -> list[str]:
    """What the test left in the cloud (after letting deletes in flight finish) and which of the checkpoints
    committed before it no longer verify. Whatever was left is then deleted, so the next test starts clean."""
    deadline = time.monotonic() + settle_s  # deletes finish in simulated seconds; be generous to a busy machine
    left = left_in_cloud(cloud)
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = left_in_cloud(cloud)
    problems = [f"left in the cloud after the test: {x}" for x in left]
    problems += [f"committed checkpoint that no longer verifies: {x}" for x in verify_failures(cloud, before)]
    if left:
        clear_cloud(cloud)
    return problems


@dataclass
class Run:
    """One finished `airflow dags test`, as Airflow's DB saw it."""

    rc: int
    run_id: str
    state: str
    states: dict[str, str | None]
    log: str


_TEST_AT = """
import json, sys
import pendulum
from airflow.utils.cli import get_bagged_dag
dag_id, conf, at = sys.argv[1], json.loads(sys.argv[2]), pendulum.parse(sys.argv[3])
dag = get_bagged_dag(bundle_names=None, dag_id=dag_id)
dag.test(run_after=at, logical_date=at, run_conf=conf)  # what `airflow dags test` calls, with run_after fixed
"""


def dags_test(
    env: dict[str, str],
    dag_id: str,
    conf: dict[str, Any],
    log_path: Path,
    run_at: str | None = None,
    timeout: float = 420,
) -> Run:
    """`airflow dags test`, read back from the DB. With `run_at`, Airflow's own `DAG.test` with a fixed
    run_after: the same run id every time (the CLI names runs after the wall clock)."""
    import json
    import sqlite3

    from interlude_dev import warm_cli

    if run_at:
        rc = warm_cli.run_airflow([dag_id, json.dumps(conf), run_at], env, log_path, timeout, python_c=_TEST_AT)
    else:
        rc = warm_cli.run_airflow(["dags", "test", dag_id, "--conf", json.dumps(conf)], env, log_path, timeout)
    text = log_path.read_text(errors="replace")
    db = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT run_id, state FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (dag_id,)
        ).fetchone()
        assert row is not None, f"no dag_run of {dag_id}; log tail:\n{text[-3000:]}"
        states = dict(
            conn.execute(
                "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?", (dag_id, row[0])
            ).fetchall()
        )
    return Run(rc, str(row[0]), str(row[1]), states, text)


# Every change of a task instance's state, recorded by SQLite itself in the test's copy of Airflow's DB.
_STATE_LOG_SQL = """
CREATE TABLE IF NOT EXISTS interlude_test_ti_states (
    t REAL, dag_id TEXT, run_id TEXT, task_id TEXT, state TEXT, trigger_id INTEGER, next_method TEXT
);
CREATE TRIGGER IF NOT EXISTS interlude_test_ti_state AFTER UPDATE OF state ON task_instance
WHEN NEW.state IS NOT OLD.state
BEGIN
    INSERT INTO interlude_test_ti_states VALUES ((julianday('now') - 2440587.5) * 86400.0, NEW.dag_id,
        NEW.run_id, NEW.task_id, NEW.state, NEW.trigger_id, NEW.next_method);
END;
"""


def record_task_states(airflow_home: Path) -> None:
    """Have the database record every task state change (a SQLite trigger in this test's DB copy).

    Airflow's own state, not its logs: a deferral is the execution API writing DEFERRED with the trigger's
    row. `dags test` then sets the task QUEUED while it runs the trigger in line (airflow/sdk/definitions/
    dag.py, `_run_task`), where a deployment's triggerer would leave it DEFERRED; a poll of the table alone
    would see QUEUED and never know the task had deferred.
    """
    import sqlite3

    with sqlite3.connect(airflow_home / "airflow.db") as conn:
        conn.executescript(_STATE_LOG_SQL)


@dataclass(frozen=True)
class Waiting:
    """A task waiting in a trigger, by Airflow's own records."""

    task_id: str
    classpath: str  # the trigger row the execution API created when the task deferred
    next_method: str  # the task's method the trigger's event resumes
    running: list[str]  # task ids of the run RUNNING meanwhile (a task holding a worker slot)


def waiting_in_trigger(airflow_home: Path, task_id: str) -> Waiting | None:
    """The task is waiting in a trigger: its last recorded states are DEFERRED (then QUEUED, `dags test`
    running the trigger in line; nothing after, so the task's own code is not running), and its trigger row
    exists. None when it is not (or the DB is busy for a moment)."""
    import sqlite3

    try:
        with sqlite3.connect(airflow_home / "airflow.db", timeout=5) as conn:
            rows = conn.execute(
                "SELECT state, trigger_id, next_method, run_id FROM interlude_test_ti_states WHERE task_id = ? "
                "ORDER BY rowid DESC LIMIT 2",
                (task_id,),
            ).fetchall()
            deferral = next((r for r in rows if r[0] == "deferred"), None)
            if deferral is None or rows[0][0] not in ("deferred", "queued") or deferral[1] is None:
                return None
            trigger = conn.execute("SELECT classpath FROM trigger WHERE id = ?", (deferral[1],)).fetchone()
            running = conn.execute(
                "SELECT task_id FROM task_instance WHERE run_id = ? AND state = 'running'", (deferral[3],)
            ).fetchall()
    except sqlite3.OperationalError:  # Airflow holds the write lock for a moment
        return None
    if trigger is None:
        return None
    return Waiting(task_id, str(trigger[0]), str(deferral[2]), sorted(str(r[0]) for r in running))


def failing_gcs_proxy(upstream: str, fails: Any, status: int = 403) -> Any:
    """A real HTTP proxy in front of the GCS emulator answering `status` to requests `fails(method, path)`.

    The GCS emulator has no fault injection; this puts one on the wire, so the process under test (a
    real trainer subprocess) sees a failed read exactly as it would from GCS.
    """
    from aiohttp import web

    from benchmarks.counting_proxy import CountingProxy, classify_gcs

    class FailingProxy(CountingProxy):
        async def _handle(self, request: web.Request) -> web.StreamResponse:
            if fails(request.method, request.path_qs):
                body = {"error": {"code": status, "message": "injected by the test", "errors": []}}
                return web.json_response(body, status=status)
            return await super()._handle(request)

    return FailingProxy(upstream, classify_gcs).start()


def clear_cloud(cloud: dev.LocalCloud) -> None:
    """Delete whatever a failed test left (after the failure was recorded), so the next test starts clean."""
    from interlude.hooks.errors import NotFoundError

    tpu, compute = tpu_hook(cloud), compute_hook(cloud)
    for zone in ZONES:
        try:
            for q in tpu.list_queued_resources(zone):
                tpu.delete_queued_resource(zone, q["name"].rsplit("/", 1)[-1], force=True)
        except NotFoundError:
            continue
    for pool in _run_pools(cloud):
        requests.delete(f"{cloud.api_endpoint}/v1/{pool}", timeout=30)
    for m in cloud.admin.machines():
        if m["kind"] == "tpu":
            tpu.delete_node(m["zone"], m["name"])
        else:
            compute.delete_instance(m["zone"], m["name"])


def runs_in_states(env: dict[str, str], dag_id: str, states: dict[str, str]) -> None:
    """Real runs of ``dag_id`` in the Airflow DB of ``env`` (`airflow dags trigger`), each then set to its state
    (``{run_id: "failed" | "running" | ...}``): what the sweeper asks Airflow about."""
    import sqlite3

    from interlude_dev import warm_cli

    for args in (("dags", "reserialize"), *(("dags", "trigger", dag_id, "--run-id", r) for r in states)):
        code, output = warm_cli.airflow_output(args, env)  # the DAG must be in Airflow's DB to be triggered
        assert code == 0, output[-3000:]
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        for run_id, state in states.items():
            db.execute("UPDATE dag_run SET state = ? WHERE run_id = ?", (state, run_id))
