"""Shared pieces of the stage fault tests: a DAG runner and readers of independent facts (the workload's own log
in GCS, the local cloud's event log and machines). Their fixtures (`stage_stack`: a fast local cloud and an Airflow
home of the test; `stage_scenario`, which a module may override; `kube`) are in tests/faults/conftest.py, where
pytest finds them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from interlude import naming
from interlude_dev import wiring as dev
from tests.faults.support import BUCKET

DAG_ID = "interlude_training"
BASE: dict[str, Any] = {
    "train_steps": 60,
    "finetune_steps": 30,
    "checkpoint_every": 10,
    "step_seconds": 0.1,
    "seed": 7,
    "data_date": "2024-01-15",
    "bucket": BUCKET,
    "poll_seconds": 0.5,
    "model_size": "tiny",  # the reference model cut to one narrow layer: many trainers share 2 cores
}
Stack = tuple[dev.LocalCloud, dict[str, str]]


def run_dag(
    stack: Stack, tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 600, **conf: Any
) -> tuple[dev.DagTestResult, str]:
    """`airflow dags test` of the lifecycle DAG; a run that does not finish in `timeout` fails the test."""
    cloud, base_env = stack
    result = dev.dags_test(
        {**base_env, **(env or {})}, DAG_ID, {**BASE, **conf}, tmp_path / "dags-test.log", timeout=timeout
    )
    assert result.run_id, f"no run finished; log tail:\n{result.log[-3000:]}"
    return result, naming.run_key(DAG_ID, result.run_id)


def store(cloud: dev.LocalCloud, run_key: str, stage: str) -> Any:
    from interlude_workload.checkpoints import CheckpointStore

    return CheckpointStore(BUCKET, run_key, stage, client=dev.gcs_client(cloud))


def workload_log(cloud: dev.LocalCloud, run_key: str, stage: str) -> str:
    """The workload's own log of a stage, as it wrote it to GCS (every boot, oldest first)."""
    return str(store(cloud, run_key, stage).read_log())


def held_and_resumed(log: str) -> tuple[list[int], list[int]]:
    """Steps the workload says it held at, and steps it says it resumed from, in its own words."""
    held = [int(s) for s in re.findall(r"holding at committed step (\d+)", log)]
    resumed = [int(s) for s in re.findall(r"resume point: step (\d+)", log)]
    return held, resumed


def drilled_stages(cloud: dev.LocalCloud, run_key: str) -> dict[str, tuple[dict[str, Any], list[int], list[int]]]:
    """A run drilled in both stages: each stage's one event in the run report (0 steps recomputed in the run),
    with the steps the workload's own log says it held at and resumed from."""
    report = dev.read_report(cloud, BUCKET, run_key)
    assert report is not None and report["steps_recomputed"] == 0, report
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for event in report["events"]:
        by_stage.setdefault(event["stage"], []).append(event)
    assert set(by_stage) == {"train", "finetune"}, report["events"]
    out = {}
    for stage, stage_events in by_stage.items():
        held, resumed = held_and_resumed(workload_log(cloud, run_key, stage))
        assert held, f"{stage}: the workload never held (its log says no 'holding at committed step')"
        (event,) = stage_events
        assert event["drill"] is True and event["kind"] == "maintenance", event
        out[stage] = (event, held, resumed)
    return out


def boots(cloud: dev.LocalCloud, name: str) -> int:
    """How often the local cloud booted the machine (its own event log)."""
    return sum(1 for e in cloud.admin.events() if e["event"] == "machine_boot" and e["machine"].endswith(name))


def reference(cloud: dev.LocalCloud, **conf: Any) -> str:
    return dev.reference_digest(cloud, BUCKET, {**BASE, **conf})


def final_digest(cloud: dev.LocalCloud, run_key: str) -> str:
    return str(store(cloud, run_key, "finetune").latest().checkpoint.metrics["digest"])


def when_training(
    cloud: dev.LocalCloud,
    ready: Callable[[dict[str, Any], dict[str, Any]], bool],
    act: Callable[[dict[str, Any]], None],
    timeout: float = 400,
    stage: str = "train",
    times: int = 1,
) -> threading.Thread:
    """In the background: when a machine's stage progress satisfies `ready`, act (up to `times` times)."""

    def loop() -> None:
        deadline = time.monotonic() + timeout
        done = 0
        while time.monotonic() < deadline and done < times:
            for m in cloud.admin.machines():
                progress = store(cloud, m["name"].rsplit("-", 1)[0], stage).read_progress() or {}
                if ready(m, progress):
                    act(m)
                    done += 1
                    break
            time.sleep(0.3)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread
