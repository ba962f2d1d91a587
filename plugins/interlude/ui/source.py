"""Where the pages' facts come from, read only: Airflow's metadata DB (runs and their tasks' return values), the run's
objects in GCS (report, events, committed checkpoints) and the cloud (machines, GKE nodes).

Nothing here writes: the DB session is rolled back and closed, never committed, and GCS and the cloud are only
listed and read. Each read goes through the project's own code: the report's object name from
`interlude_workload.layout`, the events from `interlude.training.events.load_events`, checkpoints from
`interlude_workload.checkpoints.CheckpointStore`, a moved run's machine from `interlude.machines.relocate`, the
machines from `interlude.hooks.machines`, the cluster from `interlude.hooks.gke`. The Runs page needs two queries
whatever the number of runs (one for the runs, one for their return values), and no GCS read.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from interlude.training.spec import RunSpec
from interlude.ui import fleet as fleet_rows
from interlude.ui.runs import SERVING_DAG, TASKS, TRAINING_DAG, RunInfo
from interlude.ui.timeline import Timeline, from_serving_report, from_training_report

log = logging.getLogger(__name__)
GCP_CONN_ID = "google_cloud_default"


@contextmanager
def read_only_session() -> Iterator[Any]:
    """A metadata DB session that is never committed: whatever happens, it is rolled back and closed."""
    from airflow import settings

    if settings.Session is None:
        raise RuntimeError("Airflow's ORM is not configured in this process")
    session = settings.Session()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


def _epoch(value: Any) -> float | None:
    return value.timestamp() if value is not None else None


def list_runs(
    session: Any, dag_ids: Sequence[str], state: str | None = None, limit: int = 200
) -> list[tuple[RunInfo, dict[str, Any]]]:
    """The newest `limit` runs of `dag_ids` (optionally in one state), each with its tasks' return values."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    if not dag_ids:
        return []
    query = select(DagRun.id, DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.start_date, DagRun.end_date).where(
        DagRun.dag_id.in_(list(dag_ids))
    )
    if state:
        query = query.where(DagRun.state == state)
    query = query.order_by(DagRun.run_after.desc()).limit(limit)
    runs = session.execute(query).all()
    by_id: dict[int, tuple[RunInfo, dict[str, Any]]] = {
        r.id: (RunInfo(r.dag_id, r.run_id, str(r.state), _epoch(r.start_date), _epoch(r.end_date)), {}) for r in runs
    }
    if not by_id:
        return []
    wanted = sorted({t for d in dag_ids for t in TASKS.get(d, ())})
    rows = session.execute(
        select(XComModel.dag_run_id, XComModel.task_id, XComModel.value).where(
            XComModel.dag_run_id.in_(list(by_id)),
            XComModel.key == "return_value",
            XComModel.map_index == -1,
            XComModel.task_id.in_(wanted),
        )
    ).all()
    for row in rows:
        by_id[row.dag_run_id][1][row.task_id] = XComModel.deserialize_value(row)
    return list(by_id.values())


def run_xcoms(session: Any, dag_id: str, run_id: str) -> tuple[RunInfo, dict[str, Any]] | None:
    """One run and its tasks' return values, or None when Airflow has no such run."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    found = session.execute(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)).first()
    if found is None:
        return None
    from airflow.models.xcom import XComModel

    run = session.execute(
        select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.start_date, DagRun.end_date).where(
            DagRun.id == found.id
        )
    ).one()
    values = session.execute(
        select(XComModel.task_id, XComModel.value).where(
            XComModel.dag_run_id == found.id, XComModel.key == "return_value", XComModel.map_index == -1
        )
    ).all()
    info = RunInfo(run.dag_id, run.run_id, str(run.state), _epoch(run.start_date), _epoch(run.end_date))
    return info, {v.task_id: XComModel.deserialize_value(v) for v in values}


# ------------------------------------------------------------------------------------------------ GCS (training)


def committed_steps(bucket: str, run_key: str, stage: str) -> list[tuple[int, float]]:
    """(step, committed at) of every finalised Orbax step of a stage: one listing, the marker's own time."""
    from interlude_workload.checkpoints import CheckpointStore
    from interlude_workload.orbax_layout import COMMIT_SUCCESS

    out = []
    for status in CheckpointStore(bucket, run_key, stage).scan():
        marker = status.objects.get(COMMIT_SUCCESS) if status.committed else None
        updated = getattr(marker, "updated", None)
        if updated is not None:
            out.append((status.step, updated.timestamp()))
    return out


def training_report(bucket: str, run_key: str) -> dict[str, Any] | None:
    """report.json as `run_report` wrote it (interlude.training.events.write_report), or None before it exists."""
    from google.api_core.exceptions import NotFound

    from interlude.training import events
    from interlude_workload import layout

    try:
        raw = events.storage_client().bucket(bucket).blob(layout.report_object(run_key)).download_as_bytes()
    except NotFound:
        return None
    report: dict[str, Any] = json.loads(raw)
    return report


def report_so_far(spec: RunSpec, machine: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run without its report yet (still going, or failed before it): the same report built the same way
    (events.build_report) from the recorded events and each stage's progress as the workload wrote it."""
    from interlude.training import events
    from interlude_workload.checkpoints import CheckpointStore

    bucket, run_key = spec.bucket, spec.run_key
    stages = []
    for stage in ("train", "finetune"):
        progress = CheckpointStore(bucket, run_key, stage).read_progress() or {}
        started = progress.get("stage_started_at") or progress.get("started_at")
        if not started:
            continue
        stages.append(
            {
                "stage": stage,
                "steps": int(progress.get("step") or 0),
                "started_at": float(started),
                "finished_at": float(progress.get("updated_at_epoch") or time.time()),
                "mean_step_seconds": float(progress.get("mean_step_seconds") or spec.step_seconds or 0.0),
            }
        )
    return events.build_report(
        run_key=run_key, machine=dict(machine or {}), stages=stages, events=events.load_events(bucket, run_key)
    )


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def timeline_for(info: RunInfo, xcoms: Mapping[str, Any]) -> tuple[Timeline | None, list[str]]:
    """The run's timeline and notes on what it is drawn from (or why there is none)."""
    if info.dag_id == SERVING_DAG:
        report = xcoms.get("report")
        if not isinstance(report, Mapping):
            return None, ["no serving report yet: the report task has not run"]
        spec = _mapping(xcoms.get("resolve"))
        watch = _mapping(xcoms.get("maintenance_watch"))
        tl = from_serving_report(str(spec.get("name") or info.run_id), report, watch.get("decisions") or [])
        return tl, ["pods per accelerator and requests: the serving report (the pods' own records)"]
    raw_spec = xcoms.get("resolve_run")
    if not isinstance(raw_spec, Mapping):
        return None, ["the run has no resolved params: it failed before resolve_run finished"]
    run_spec = RunSpec.from_dict(raw_spec)
    bucket, run_key = run_spec.bucket, run_spec.run_key
    report = training_report(bucket, run_key)
    notes = [f"from gs://{bucket}/{run_key}/report.json and its committed checkpoints"]
    if report is None:
        report = report_so_far(
            run_spec, xcoms.get("provision") if isinstance(xcoms.get("provision"), Mapping) else None
        )
        notes = ["no report yet: drawn from the recorded events and the stages' progress so far"]
    commits = {str(s["stage"]): committed_steps(bucket, run_key, str(s["stage"])) for s in report.get("stages") or []}
    return from_training_report(report, commits), notes


# ------------------------------------------------------------------------------------------------ the cloud (fleet)


def fleet(runs: Sequence[tuple[RunInfo, Mapping[str, Any]]], now: float) -> tuple[list[fleet_rows.FleetRow], list[str]]:
    """Rows for the machines of running training runs and the accelerator nodes of running serving runs."""
    rows: list[fleet_rows.FleetRow] = []
    errors: list[str] = []
    hooks = None
    for info, xcoms in runs:
        label = f"{info.dag_id} / {info.run_id}"
        try:
            if info.dag_id == TRAINING_DAG and isinstance(xcoms.get("provision"), Mapping):
                from interlude.hooks.machines import machine_hooks
                from interlude.machines.relocate import current_machine
                from interlude.training.spec import RunSpec

                spec = RunSpec.from_dict(xcoms["resolve_run"])
                record = current_machine(spec, dict(xcoms["provision"])) or dict(xcoms["provision"])
                hooks = hooks or machine_hooks(GCP_CONN_ID)
                zone, name = str(record["zone"]), str(record["name"])
                raw = (
                    hooks.compute.get_instance(zone, name)
                    if record["kind"] == "gce_vm"
                    else hooks.tpu.get_node(zone, name)
                )
                rows.append(fleet_rows.machine_row(label, record, raw, now))
            elif info.dag_id == SERVING_DAG and isinstance(xcoms.get("resolve"), Mapping):
                rows += _serving_nodes(label, xcoms["resolve"], now)
        except Exception as exc:  # one run the cloud could not answer for must not hide the others
            log.warning("fleet: %s: %s", label, exc, exc_info=True)
            errors.append(f"{label}: {type(exc).__name__}: {exc}")
    return fleet_rows.soonest_first(rows), errors


def _serving_nodes(label: str, raw_spec: Mapping[str, Any], now: float) -> list[fleet_rows.FleetRow]:
    from kubernetes import client

    from interlude.hooks.gke import GKEHook
    from interlude.operators.serving_records import list_pods
    from interlude.serving.spec import ServeSpec

    spec = ServeSpec.from_dict(raw_spec)
    hook = GKEHook(gcp_conn_id=GCP_CONN_ID, location=spec.location)
    with hook.kubernetes_hook(spec.cluster, project_id=hook.project_id).get_conn() as api_client:
        core = client.CoreV1Api(api_client)
        nodes = json.loads(core.list_node(_preload_content=False).data).get("items") or []
        _, pods = list_pods(core, spec.namespace, spec.name)
    return fleet_rows.node_rows(label, spec, nodes, pods, now)
