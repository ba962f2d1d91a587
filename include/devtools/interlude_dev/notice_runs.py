"""A GPU training run that gets an hour's maintenance notice mid-training, and what it cost, read from the
workload's own log (every line stamped by the workload) and the local cloud's own event log.

Shared by tests/faults/test_notice_policy.py, tests/faults/test_down_budget.py and benchmarks/notice_policy.py:
the same run, once with ``maintenance_policy=by_notice`` and once with ``checkpoint_at_notice`` (the old
behaviour). Tooling, so here beside the other run helpers (interlude_dev.wiring), where a benchmark may import
it without reaching into the test tree.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from interlude import naming
from interlude_dev import wiring as dev

DAG_ID = "interlude_training"
STEP_SECONDS = 0.1
NOTICE_AT_STEP = 20
# At 600x an hour's notice (Google's for GPU VMs) is 6 s and the 5-minute host maintenance 0.5 s.
TIME_SCALE = 600
GPU_NOTICE_S = 3600
CONF: dict[str, Any] = {
    "train_steps": 150,
    "finetune_steps": 20,
    "checkpoint_every": 50,
    "step_seconds": STEP_SECONDS,
    "seed": 7,
    "data_date": "2024-01-15",
    "poll_seconds": 0.5,
    "model_profile": "cuda-kernels-gpu-only",
    "model_size": "tiny",  # the reference model cut to one narrow layer: many trainers share 2 cores
}


def write_scenario(path: Path, gpu_maintenance_s: float = 300, time_scale: float = TIME_SCALE) -> Path:
    """The default scenario (at 600x unless told) with an hour's GPU notice and a GPU host maintenance this long."""
    data = yaml.safe_load((dev.SCENARIOS / "default.yaml").read_text())
    data["time_scale"] = time_scale
    data["maintenance"]["gce"].update(scheduled_notice=GPU_NOTICE_S, duration=gpu_maintenance_s)
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass(frozen=True)
class NoticeFigures:
    """One maintenance in a stage, in the workload's own words (seconds on its clock)."""

    notice_step: int  # the step the workload was at when the notice reached it
    trained_after_notice_s: float  # from the notice to the moment it stopped stepping
    stopped_step: int  # the committed step it stopped at (held at, or committed on SIGTERM)
    window_at: float  # the local cloud's own record of the maintenance starting
    last_commit_before_window: int  # the latest step committed before that
    committed_before_window_s: float  # how long before the window that commit landed
    resume_step: int  # where the new boot resumed
    recomputed_steps: int  # steps the old boot reached that the new one had to do again
    idle_s: float  # stopped stepping -> stepping again on the new boot (held, down, booting)
    lost_s: float  # idle plus the time of the recomputed steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def line_time(line: str) -> float:
    """The workload's stamp at the start of one of its log lines (``2024-01-15T10:00:00.123Z ...``), in epoch
    seconds: the clock the figures are read on."""
    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()


def _first(lines: list[str], pattern: str, after: float = 0.0) -> tuple[float, re.Match[str]] | None:
    for line in lines:
        match = re.search(pattern, line)
        if match and line_time(line) >= after:
            return line_time(line), match
    return None


def figures(log: str, window_at: float) -> NoticeFigures:
    """Read one maintenance from a stage's workload log (all boots, oldest first)."""
    lines = [ln for ln in log.splitlines() if re.match(r"\d{4}-\d\d-\d\dT", ln)]
    notice = _first(lines, r"metadata notice: maintenance-event=TERMINATE")
    assert notice, "the workload never saw the notice"
    notice_at = notice[0]
    commit = _first(lines, r"notice-to-commit \S+ \(step (\d+)\)", notice_at)
    assert commit, "the workload never committed after the notice"
    stops = [
        s
        for s in (
            _first(lines, r"holding at committed step (\d+)", notice_at),
            _first(lines, r"SIGTERM received", notice_at),
        )
        if s
    ]
    assert stops, "the workload neither held nor was stopped"
    stopped_at = min(s[0] for s in stops)
    resumed = _first(lines, r"resume point: step (\d+)", stopped_at)  # the new boot's first words
    assert resumed, "no new boot resumed after the maintenance"
    training = _first(lines, r"training \S+ steps (\d+)\.\.", resumed[0])
    assert training, "the new boot did not train"
    old_boot = [ln for ln in lines if notice_at <= line_time(ln) < resumed[0]]
    reached = max((int(m[1]) for ln in old_boot if (m := re.search(r"\] step (\d+)/", ln))), default=0)
    commits = [
        (line_time(ln), int(m[1]))
        for ln in lines
        if (m := re.search(r"checkpoint step (\d+) committed", ln)) and line_time(ln) < window_at
    ]
    last_at, last_step = max(commits)
    stopped_step = max(
        (int(m[1]) for ln in old_boot if (m := re.search(r"checkpoint step (\d+) committed", ln))), default=0
    )
    resume_step = int(resumed[1][1])
    recomputed = max(0, reached - resume_step)
    idle = training[0] - stopped_at
    return NoticeFigures(
        notice_step=int(commit[1][1]),
        trained_after_notice_s=round(stopped_at - notice_at, 3),
        stopped_step=stopped_step,
        window_at=window_at,
        last_commit_before_window=last_step,
        committed_before_window_s=round(window_at - last_at, 3),
        resume_step=resume_step,
        recomputed_steps=recomputed,
        idle_s=round(idle, 3),
        lost_s=round(idle + recomputed * STEP_SECONDS, 3),
    )


def announce_when_training(
    cloud: dev.LocalCloud, bucket: str, at_step: int = NOTICE_AT_STEP, timeout: float = 300
) -> list[float]:
    """In the background: at step ``at_step`` of the train stage, Google announces a SCHEDULED host
    maintenance an hour ahead on the run's GPU VM (the local cloud's admin API). Returns the times it did."""
    import threading

    from interlude_workload.checkpoints import CheckpointStore

    announced: list[float] = []

    def loop() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not announced:
            for m in cloud.admin.machines():
                if m["kind"] != "gce":
                    continue
                run_key = m["name"].rsplit("-", 1)[0]
                progress = CheckpointStore(bucket, run_key, "train", client=dev.gcs_client(cloud)).read_progress()
                if int((progress or {}).get("step") or 0) >= at_step:
                    cloud.admin.maintenance("gce", m["zone"], m["name"], "SCHEDULED", GPU_NOTICE_S)
                    announced.append(time.time())
                    break
            time.sleep(0.2)

    threading.Thread(target=loop, daemon=True).start()
    return announced


def maintenance_starts(cloud: dev.LocalCloud, run_key: str) -> list[float]:
    """When the local cloud started a maintenance on this run's machine (its own event log)."""
    return [
        e["t"] for e in cloud.admin.events() if e["event"] == "maintenance_start" and run_key in str(e.get("machine"))
    ]


def run_with_notice(
    cloud: dev.LocalCloud,
    env: dict[str, str],
    bucket: str,
    policy: str,
    log_path: Path,
    timeout: float = 600,
    also_at_step: int | None = None,
    extra: dict[str, Any] | None = None,
) -> tuple[dev.DagTestResult, str, NoticeFigures | None]:
    """One lifecycle run with a notice mid-training (and another at ``also_at_step``); the figures of the
    first maintenance of its train stage (None: no notice came)."""
    from interlude_workload.checkpoints import CheckpointStore

    announced = announce_when_training(cloud, bucket)
    if also_at_step is not None:
        announce_when_training(cloud, bucket, also_at_step)
    conf = {**CONF, "bucket": bucket, "maintenance_policy": policy, **(extra or {})}
    result = dev.dags_test(env, DAG_ID, conf, log_path, timeout=timeout)
    assert result.run_id, f"no run finished; log tail:\n{result.log[-3000:]}"
    run_key = naming.run_key(DAG_ID, result.run_id)
    if not announced:
        return result, run_key, None
    starts = maintenance_starts(cloud, run_key)
    assert len(starts) == 1 + (also_at_step is not None), f"maintenances of {run_key}: {starts}"
    log = str(CheckpointStore(bucket, run_key, "train", client=dev.gcs_client(cloud)).read_log())
    log_path.with_suffix(".workload.log").write_text(log)
    return result, run_key, figures(log, starts[0])
