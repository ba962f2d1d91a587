"""Issue 10 item 2's backstop: the sweeper DAG deletes an orphan of a finished run, never a running run's machine.

Real pieces: two runs of the lifecycle DAG in Airflow's DB (created with `airflow dags trigger`, one then
marked finished), one machine of each created on the local cloud exactly as `provision` builds it,
and `airflow dags test interlude_sweeper`, which asks Airflow for the runs' states through the task
execution API. The cloud's machine list is what is asserted.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from interlude import naming
from interlude.machines import provisioning, teardown
from tests.faults.support import BUCKET, DAG_ID, ZONES, dags_test, left_in_cloud, runs_in_states

pytestmark = pytest.mark.e2e


def _machine_of(run_id: str, zone: str) -> dict:
    decision = {"kind": "tpu", "zone": zone, "accelerator_type": "v5litepod-8", "mode": "on_demand"}
    return provisioning.machine_record(
        decision,
        "v2-alpha-tpuv5-lite",
        bucket=BUCKET,
        dag_id=DAG_ID,
        run_key=naming.run_key(DAG_ID, run_id),
        run_id=run_id,
    ).to_dict()


def test_sweeper_deletes_a_finished_runs_orphan_and_keeps_a_running_runs_machine(
    cloud, airflow_env, tmp_path: Path
) -> None:
    runs_in_states(airflow_env, DAG_ID, {"sweep-finished": "failed", "sweep-running": "running"})
    os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = airflow_env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"]
    orphan, live = _machine_of("sweep-finished", ZONES[0]), _machine_of("sweep-running", ZONES[1])
    try:
        for m in (orphan, live):
            provisioning.create(m, "google_cloud_default")
        assert {m["name"] for m in cloud.admin.machines()} == {orphan["name"], live["name"]}

        run = dags_test(airflow_env, "interlude_sweeper", {"zones": list(ZONES)}, tmp_path / "sweeper.log")

        verdicts = "\n".join(line for line in run.log.splitlines() if "Sweeper" in line or "rror" in line)
        assert run.state == "success", run.log[-4000:]
        assert {m["name"] for m in cloud.admin.machines()} == {live["name"]}, verdicts
        assert f"delete: run sweep-finished of {DAG_ID} is failed" in run.log
        assert f"keep: run sweep-running of {DAG_ID} is running" in run.log
    finally:
        teardown.teardown_run(naming.run_key(DAG_ID, "sweep-running"), list(ZONES), "google_cloud_default")
        teardown.teardown_run(naming.run_key(DAG_ID, "sweep-finished"), list(ZONES), "google_cloud_default")
    assert left_in_cloud(cloud) == []
