"""The Runs page's rows: one Airflow run of an Interlude DAG plus its tasks' return values -> one typed row.

Pure. The values are what the tasks already return to XCom (Airflow keeps them; nothing is written for the UI):
training `resolve_run` (the RunSpec), `provision` (the MachineRecord), `train` / `finetune` (each stage's final
checkpoint and the machine it finished on), `run_report` (goodput, events, steps recomputed, the machine the run ended
on); serving `resolve` (the ServeSpec), `rollout` (the
fallbacks), `maintenance_watch` (its decisions), `report` (pods per accelerator, requests). A run still going has
fewer of them: its row shows what is known and leaves the rest blank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TRAINING_DAG = "interlude_training"
SERVING_DAG = "interlude_serving"
DAGS = (TRAINING_DAG, SERVING_DAG)

TRAINING_TASKS = ("resolve_run", "provision", "train", "finetune", "run_report")
SERVING_TASKS = ("resolve", "rollout", "maintenance_watch", "report")
TASKS = {TRAINING_DAG: TRAINING_TASKS, SERVING_DAG: SERVING_TASKS}
"""The tasks whose return values a row is built from, per DAG: the only XComs the Runs page reads."""

PLATFORMS = {"tpu_node": "Cloud TPU", "gce_vm": "Compute Engine"}


@dataclass(frozen=True)
class RunInfo:
    """What Airflow says about the run itself (its DagRun row)."""

    dag_id: str
    run_id: str
    state: str
    start: float | None  # epoch seconds
    end: float | None


@dataclass(frozen=True)
class RunRow:
    dag_id: str
    run_id: str
    kind: str  # training | serving
    state: str
    platform: str
    accelerator: str
    zone: str
    steps_done: int | None
    steps_total: int | None
    events: int | None
    goodput: float | None
    start: float | None
    run_key: str = ""
    detail: str = ""  # serving: requests and fallbacks; training: the report's URI

    @property
    def steps(self) -> str:
        if self.steps_total is None:
            return ""
        return f"{self.steps_done or 0} / {self.steps_total}"


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def ended_on(xcoms: Mapping[str, Any]) -> Mapping[str, Any]:
    """The machine the run is known to be on last: a failover moves a run off `provision`'s machine, and the run
    report and each finished stage say where it ended (`machine`). The newest that says wins; a run still in its
    first stage shows `provision`'s (the page reads no GCS, where a move in progress is recorded)."""
    for task in ("run_report", "finetune", "train"):
        machine = _dict(_dict(xcoms.get(task)).get("machine"))
        if machine.get("zone"):
            return machine
    return _dict(xcoms.get("provision"))


def training_row(run: RunInfo, xcoms: Mapping[str, Any]) -> RunRow:
    from interlude.training.spec import RunSpec

    raw = _dict(xcoms.get("resolve_run"))
    spec = RunSpec.from_dict(raw) if raw else None  # the run's params are read through RunSpec only
    report = _dict(xcoms.get("run_report"))
    stages = [_dict(xcoms.get(t)) for t in ("train", "finetune")]
    machine = ended_on(xcoms)
    total = None
    if spec:
        total = spec.train_steps + spec.finetune_steps
    done = sum(int(s.get("final_step") or 0) for s in stages) if any(stages) else (0 if spec else None)
    return RunRow(
        dag_id=run.dag_id,
        run_id=run.run_id,
        kind="training",
        state=run.state,
        platform=PLATFORMS.get(str(machine.get("kind")), str(machine.get("kind") or "")),
        accelerator=str(machine.get("accelerator_type") or ""),
        zone=str(machine.get("zone") or ""),
        steps_done=done,
        steps_total=total,
        events=int(report["events"]) if "events" in report else None,
        goodput=float(report["goodput"]) if report.get("goodput") is not None else None,
        start=run.start,
        run_key=spec.run_key if spec else "",
        detail=str(report.get("uri") or ""),
    )


def serving_row(run: RunInfo, xcoms: Mapping[str, Any]) -> RunRow:
    spec, report = _dict(xcoms.get("resolve")), _dict(xcoms.get("report"))
    rollout, watch = _dict(xcoms.get("rollout")), _dict(xcoms.get("maintenance_watch"))
    pods = _dict(report.get("pods_per_accelerator"))
    fallbacks = report.get("fallbacks") or rollout.get("fallbacks") or []
    steps = [d for d in watch.get("decisions") or [] if isinstance(d, Mapping) and d.get("kind") not in ("wait",)]
    served = _dict(report.get("requests_per_accelerator"))
    answered = ", ".join(f"{k} {int(_dict(v).get('answered') or 0)}" for k, v in sorted(served.items()))
    detail = "; ".join(p for p in (f"answered: {answered}" if answered else "", f"{len(fallbacks)} fallback(s)") if p)
    return RunRow(
        dag_id=run.dag_id,
        run_id=run.run_id,
        kind="serving",
        state=run.state,
        platform="GKE" + (f" {spec.get('cluster')}" if spec.get("cluster") else ""),
        accelerator=", ".join(f"{k} x{v}" for k, v in sorted(pods.items())),
        zone=str(spec.get("location") or ""),
        steps_done=None,
        steps_total=None,
        events=(len(fallbacks) + len(steps)) if (report or rollout or watch) else None,
        goodput=None,
        start=run.start,
        run_key=str(spec.get("name") or ""),
        detail=detail,
    )


def build_rows(runs: Iterable[tuple[RunInfo, Mapping[str, Any]]]) -> list[RunRow]:
    """Rows newest first (runs not started yet last)."""
    rows = [training_row(r, x) if r.dag_id == TRAINING_DAG else serving_row(r, x) for r, x in runs]
    return sorted(rows, key=lambda row: -(row.start or 0.0))
