"""Failure callback: say which step failed, why in the user's terms, and what a retry would do.

Two kinds of failure need opposite advice. Bad input (a param the checks refused) is fixed by
changing the params and triggering again: clearing would fail the same way, and no machine exists
to talk about. An infrastructure or workload failure is fixed by clearing the step: it provisions
its machine again if needed and resumes from the latest committed checkpoint.
"""

from __future__ import annotations

import logging
from typing import Any

from interlude import naming
from interlude.training.spec import RunSpec, RunSpecError
from interlude.training.tasks import STAGES

log = logging.getLogger(__name__)

# Steps before anything is created: a failure there never involves a machine.
BEFORE_MACHINES = ("resolve_run", "choose.", "validate_runtime", "continue_unless_plan_only")


def resume_points(bucket: str, run_key: str) -> dict[str, str]:
    """Where each stage would resume, as told to a person; "unknown" when a committed step could not be read
    (an unknown is never reported as "no committed checkpoint")."""
    from interlude_workload.checkpoints import CheckpointStore, CheckpointUnreadable

    out = {}
    for stage in STAGES:
        try:
            latest = CheckpointStore(bucket, run_key, stage).latest().checkpoint
        except CheckpointUnreadable as exc:
            out[stage] = f"unknown (a committed step could not be read: {exc})"
            continue
        out[stage] = f"step {latest.step} ({latest.uri})" if latest else "no committed checkpoint"
    return out


def is_bad_input(exception: BaseException | None) -> bool:
    """A refused param: RunSpecError itself, or the AirflowFailException the DAG wraps it in."""
    seen: BaseException | None = exception
    while seen is not None:
        if isinstance(seen, RunSpecError):
            return True
        seen = seen.__cause__
    return False


def failure_lines(task_id: str, try_number: int, exception: BaseException | None, spec: RunSpec | None) -> list[str]:
    lines = [f"Interlude: step {task_id!r} failed (try {try_number})."]
    if is_bad_input(exception):
        lines.append(f"  Bad input: {exception}")
        lines.append(
            "  Nothing was created. Fix the param(s) named above and trigger a new run; clearing this "
            "step would fail the same way."
        )
        return lines
    if spec is None:
        lines.append(f"  Cause: {exception}")
        lines.append("  Clear the step to retry it.")
        return lines
    lines.append(
        f"  run_key {spec.run_key}  (checkpoints: gs://{spec.bucket}/{naming.checkpoint_prefix(spec.run_key)})"
    )
    if task_id.startswith(BEFORE_MACHINES):
        lines.append(f"  Cause: {exception}")
        lines.append("  No machine was created yet. Clear the step to retry it.")
        return lines
    try:
        for stage, point in resume_points(spec.bucket, spec.run_key).items():
            lines.append(f"  resume point {stage}: {point}")
    except Exception as exc:  # noqa: BLE001 - a callback must not hide the original failure
        lines.append(f"  resume points unavailable: {exc}")
    lines.append(
        "  Clear the step to retry: its machine is provisioned again if needed and the stage resumes "
        "from its latest committed checkpoint (committed work is never redone)."
    )
    return lines


def on_task_failure(context: Any) -> None:
    ti = context["ti"]
    raw = ti.xcom_pull(task_ids="resolve_run")
    spec = RunSpec.from_dict(raw) if raw else None
    log.error("\n".join(failure_lines(ti.task_id, ti.try_number, context.get("exception"), spec)))
