"""Interlude's sweeper: delete machines whose DAG run is over (a backstop for teardown)."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from interlude.training.spec import DEFAULT_ZONES

DOC_MD = """
# Interlude: sweeper

Every 30 minutes: list the TPU nodes, queued resources and GPU VMs labelled `managed-by=interlude` in
the given zones, ask Airflow for the state of the run each one names (metadata `interlude-dag-id` /
`interlude-run-id`, checked against the `interlude-run` label), and delete those whose run is
**success** or **failed**. A machine of a queued or running run, or of a run whose state is unknown,
is kept, never by age alone. With `gke_clusters` (`LOCATION/CLUSTER`), the node pools runs made there are
read the same way (their node config's labels and metadata) and a finished run's JobSet and pools deleted.
Each verdict is in the task log; a zone or cluster that cannot be listed, or a failed delete, fails the task.
"""

with DAG(
    dag_id="interlude_sweeper",
    doc_md=DOC_MD,
    schedule="*/30 * * * *",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["interlude", "cleanup"],
    params={
        "zones": Param(list(DEFAULT_ZONES), type="array", items={"type": "string"}, description="Zones to sweep"),
        "gke_clusters": Param(
            [],
            type="array",
            items={"type": "string"},
            description="GKE clusters to sweep for node pools of finished runs, as LOCATION/CLUSTER",
        ),
    },
) as dag:

    @task
    def sweep() -> list[str]:
        from interlude.training import tasks as lifecycle

        ctx = get_current_context()
        ti = ctx["ti"]

        def state_of(run: tuple[str, str]) -> str | None:
            try:  # the execution API (Airflow 3: tasks have no ORM); a missing run is an unknown
                state = ti.get_dagrun_state(dag_id=run[0], run_id=run[1])
                return str(getattr(state, "value", state))
            except Exception:  # noqa: BLE001
                return None

        zones, clusters = list(ctx["params"]["zones"]), list(ctx["params"].get("gke_clusters") or [])
        return lifecycle.sweep(zones, state_of, clusters)

    sweep()
