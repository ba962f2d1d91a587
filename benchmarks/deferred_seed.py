"""Put N StageTriggers in front of a real triggerer: one DAG run, N deferred mapped task instances.

Run as a script in the Airflow environment (AIRFLOW_HOME etc. set; the benchmark DAG already
serialized with ``airflow dags reserialize``)::

    python benchmarks/deferred_seed.py SPEC.json

Why this shape: the triggerer only runs a trigger row that a DEFERRED task instance points at (rows
nobody references are deleted by ``Trigger.clean_unused``), and it needs the task instance's
``dag_version_id`` to build the workload. So we let Airflow create the run and its task instances
(``SerializedDAG.create_dagrun`` expands the literal-mapped task into N instances), then do per
instance exactly what the Execution API does when a worker defers (``ti_update_state`` with a
``TIDeferredStatePayload``): insert a ``Trigger`` row from the trigger's ``serialize()`` and set the
instance to DEFERRED with ``trigger_id`` and ``next_method``. No worker, scheduler or api-server is
needed, and the triggerer cannot tell these rows from ones a worker wrote.

SPEC.json: {"dag_id", "run_id", "bucket", "poll_interval", "restart_timeout", "trigger_kwargs" (optional,
more StageTrigger arguments: the watch design), "trigger" (optional: "stage", the default, the shipped
StageTrigger; "per_stage", the benchmark's PerStageReadsTrigger, triggerer_watch_modes.py; or "datetime":
Airflow's DateTimeTrigger a day ahead, the floor any trigger costs), "placements": [{"kind", "zone", "name",
"run_key"}, ...]} (one per map index, in order).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DAG_TEMPLATE = '''"""Written by benchmarks/triggerer_watch.py: N mapped instances, deferred by hand."""
import pendulum
from airflow.sdk import dag, task


@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False)
def bench_watch():
    @task
    def watch(i: int) -> None:
        raise RuntimeError("benchmark placeholder: its instances only ever run in the triggerer")

    watch.expand(i=list(range({n})))


bench_watch()
'''


def write_dag(dags_folder: Path, dag_id: str, n: int) -> Path:
    """The DAG file whose literal-mapped task gives exactly n task instances per run."""
    dags_folder.mkdir(parents=True, exist_ok=True)
    path = dags_folder / f"{dag_id}.py"
    path.write_text(DAG_TEMPLATE.format(dag_id=dag_id, n=n))
    return path


def floor_trigger() -> Any:
    """Airflow's own trivial trigger: logs that it starts and how long it sleeps, then sleeps (a day ahead)."""
    from datetime import timedelta

    from airflow._shared.timezones import timezone
    from airflow.providers.standard.triggers.temporal import DateTimeTrigger

    return DateTimeTrigger(moment=timezone.utcnow() + timedelta(days=1))


def seed(spec: dict[str, Any]) -> dict[str, Any]:
    from airflow._shared.timezones import timezone
    from airflow.models.dagbag import DBDagBag
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import select
    from triggerer_watch_modes import PerStageReadsTrigger  # this script's folder, sys.path[0]

    from interlude.stage.model import StageState
    from interlude.triggers.stage import StageTrigger

    placements: list[dict[str, Any]] = spec["placements"]
    with create_session() as session:
        dag = DBDagBag().get_latest_version_of_dag(spec["dag_id"], session=session)
        if dag is None:
            raise SystemExit(f"DAG {spec['dag_id']} is not serialized; run `airflow dags reserialize` first")
        dag.create_dagrun(
            run_id=spec["run_id"],
            run_after=timezone.utcnow(),
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST,
            state=DagRunState.RUNNING,
            session=session,
        )
        session.flush()
        tis = session.scalars(
            select(TaskInstance)
            .where(
                TaskInstance.dag_id == spec["dag_id"],
                TaskInstance.run_id == spec["run_id"],
                TaskInstance.map_index >= 0,
            )
            .order_by(TaskInstance.map_index)
        ).all()
        if len(tis) != len(placements):
            raise SystemExit(f"expected {len(placements)} mapped task instances, Airflow made {len(tis)}")
        for ti, p in zip(tis, placements, strict=True):
            # A stage that runs: the workload reported progress with this boot id; the trigger carries it.
            state = StageState(target_step=1_000_000, boot_id="bench-boot", last_step_seen=100).to_dict()
            kind = spec.get("trigger", "stage")
            trigger = floor_trigger() if kind == "datetime" else None
            trigger = trigger or (PerStageReadsTrigger if kind == "per_stage" else StageTrigger)(
                machine={"kind": p["kind"], "zone": p["zone"], "name": p["name"]},
                bucket=spec["bucket"],
                run_key=p["run_key"],
                stage="train",
                state=state,
                restart_timeout=spec["restart_timeout"],
                poll_interval=spec["poll_interval"],
                **spec.get("trigger_kwargs", {}),
            )
            row = Trigger.from_object(trigger)
            session.add(row)
            session.flush()
            ti.state = TaskInstanceState.DEFERRED
            ti.trigger_id = row.id
            ti.next_method = "execute_complete"
            ti.trigger_timeout = None
        return {"task_instances": len(tis)}


if __name__ == "__main__":
    print(json.dumps(seed(json.loads(Path(sys.argv[1]).read_text()))))
