"""Helpers of the fault suite: the cloud's own view of what is left, checkpoint verification, `dags test`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlude import dev

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
}
_COMMITTED = re.compile(r"^interlude/(?P<run>[^/]+)/(?P<stage>[^/]+)/step-(?P<step>[0-9]+)/COMMITTED$")


def tpu_hook(cloud: dev.LocalCloud) -> Any:
    from interlude.hooks.tpu import TpuHook

    return TpuHook(gcp_conn_id=None, tpu_endpoint=cloud.api_endpoint, project_id=cloud.project)


def compute_hook(cloud: dev.LocalCloud) -> Any:
    from interlude.hooks.compute import ComputeHook

    return ComputeHook(gcp_conn_id=None, compute_endpoint=cloud.api_endpoint, project_id=cloud.project)


def left_in_cloud(cloud: dev.LocalCloud) -> list[str]:
    """Every node, VM and queued resource the cloud holds (the independent fact, not the code's account)."""
    left = [f"{m['kind']} {m['zone']}/{m['name']} ({m['state']})" for m in cloud.admin.machines()]
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
        _, reason = store._verify(status, "full")
        if reason:
            problems.append(f"{c}: {reason}")
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

    from interlude import warm_cli

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
    for m in cloud.admin.machines():
        if m["kind"] == "tpu":
            tpu.delete_node(m["zone"], m["name"])
        else:
            compute.delete_instance(m["zone"], m["name"])
