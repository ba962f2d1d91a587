"""Failure callback: say which step failed, for which run key, and where a retry would resume."""

from __future__ import annotations

import logging
from typing import Any

from interlude.lifecycle import STAGES

log = logging.getLogger(__name__)


def resume_points(bucket: str, run_key: str) -> dict[str, str]:
    from interlude_workload.checkpoints import CheckpointStore

    out = {}
    for stage in STAGES:
        latest = CheckpointStore(bucket, run_key, stage).latest().checkpoint
        out[stage] = f"step {latest.step} ({latest.uri})" if latest else "no committed checkpoint"
    return out


def on_task_failure(context: Any) -> None:
    ti = context["ti"]
    spec = ti.xcom_pull(task_ids="resolve_run") or {}
    lines = [f"Interlude: step {ti.task_id!r} failed (try {ti.try_number})."]
    if spec.get("run_key"):
        lines.append(f"  run_key {spec['run_key']}  (checkpoints: gs://{spec['bucket']}/interlude/{spec['run_key']}/)")
        try:
            for stage, point in resume_points(spec["bucket"], spec["run_key"]).items():
                lines.append(f"  resume point {stage}: {point}")
        except Exception as exc:  # noqa: BLE001 - a callback must not hide the original failure
            lines.append(f"  resume points unavailable: {exc}")
    lines.append("  Clear the step to retry: its machine is provisioned again and it resumes from there.")
    log.error("\n".join(lines))
