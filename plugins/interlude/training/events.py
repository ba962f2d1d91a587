"""Maintenance events and the run report, kept next to the checkpoints.

One object per event, named from its stage, detection time, kind and the id the state machine gave
it when it opened, so a retried task writes the same object again instead of a second record, and two
events of one stage never overwrite each other. The report is
recomputed from those objects and the checkpoints, never accumulated in memory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from interlude_workload import layout


def storage_client() -> Any:
    """Imported late: DAG files import the operators that import this module."""
    from interlude_workload.gcs import storage_client as make

    return make()


def events_prefix(run_key: str) -> str:
    return layout.events_prefix(run_key)


def record_event(bucket: str, run_key: str, stage: str, event: dict[str, Any]) -> str:
    detected = int(float(event.get("detected_at") or 0) * 1000)
    name = layout.event_object(
        run_key, stage, detected, str(event.get("kind", "event")), str(event.get("event_id") or "")
    )
    blob = storage_client().bucket(bucket).blob(name)
    blob.upload_from_string(json.dumps({**event, "stage": stage}, sort_keys=True), content_type="application/json")
    return f"gs://{bucket}/{name}"


RESUME_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\S+Z) \[[^\]]*\] resume point: step (\d+)\b", re.MULTILINE)
"""The line the workload's SDK logs once it has read its checkpoint back (``Checkpointer.restore``), stamped by the
workload's clock."""


def restore_finished(log: str, event: Mapping[str, Any]) -> float | None:
    """When the new boot finished reading its checkpoint back, by the workload's own log: the last "resume point:
    step N" line for the event's resume step between the machine going down and the poll that saw it stepping, held
    between its boot (``up_at``) and its first step (``resumed_at``). None when the log does not say."""
    step, down = event.get("resumed_from_step"), event.get("down_at")
    up, resumed = event.get("up_at"), event.get("resumed_at")
    seen = (event.get("seen") or {}).get("resumed_at") or resumed
    if step is None or up is None or resumed is None or seen is None:
        return None
    times = [
        datetime.fromisoformat(m[1].replace("Z", "+00:00")).timestamp()
        for m in RESUME_LINE.finditer(log)
        if int(m[2]) == int(step)
    ]
    low = float(down) if down is not None else float("-inf")
    times = [t for t in times if low <= t <= float(seen)]  # this boot's, not an older boot's resume
    return min(max(times[-1], float(up)), float(resumed)) if times else None


def restore_stamped(progress: Mapping[str, Any], event: Mapping[str, Any]) -> float | None:
    """When the new boot finished its restore, by the SDK's stamp in its progress (``restored_at_epoch``, taken as
    it logs "resume point"), for the event's boot only, held between its boot and its first step. None otherwise."""
    up, resumed, stamp = event.get("up_at"), event.get("resumed_at"), progress.get("restored_at_epoch")
    if stamp is None or up is None or resumed is None or progress.get("boot_id") != event.get("boot_id"):
        return None
    return min(max(float(stamp), float(up)), float(resumed))


def load_events(bucket: str, run_key: str) -> list[dict[str, Any]]:
    client = storage_client()
    blobs = sorted(client.list_blobs(bucket, prefix=events_prefix(run_key)), key=lambda b: b.name)
    loaded = [json.loads(b.download_as_bytes()) for b in blobs if b.name.endswith(".json")]
    return sorted(loaded, key=lambda e: float(e.get("detected_at") or 0))


def build_report(
    *,
    run_key: str,
    machine: dict[str, Any],
    stages: list[dict[str, Any]],
    events: list[dict[str, Any]],
    provisioning_started_at: float | None = None,
) -> dict[str, Any]:
    """Goodput = productive training time / wall time; badput split by named cause (interlude.training.badput).

    `stages` carry each stage's start/end (epoch seconds), steps, and mean step time; `events` the
    maintenance events as recorded; `provisioning_started_at` (when known) starts the wall clock at the
    first create instead of the first step.
    """
    from interlude.training.badput import event_badput, split

    wall, productive, badput = split(stages, events, provisioning_started_at)
    step_time = {s["stage"]: float(s.get("mean_step_seconds") or 0.0) for s in stages}
    recomputed = sum(int(e.get("steps_recomputed") or 0) for e in events)
    costed = []
    for e in events:
        cost = event_badput(e, step_time.get(e.get("stage", ""), 0.0))
        costed.append({**e, "beyond_downtime_s": round(cost.beyond_downtime, 3)})
    return {
        "run_key": run_key,
        "accelerator": machine.get("accelerator_type"),
        "zone": machine.get("zone"),
        "machine": {k: machine.get(k) for k in ("kind", "name", "zone", "mode", "runtime")},
        "stages": stages,
        "events": costed,
        "steps_recomputed": recomputed,
        "wall_seconds": round(max(wall, 1e-9), 3),
        "goodput": round(productive / max(wall, 1e-9), 4),
        "badput_seconds": badput.as_dict(),
    }


def write_report(bucket: str, run_key: str, report: dict[str, Any]) -> str:
    name = layout.report_object(run_key)
    storage_client().bucket(bucket).blob(name).upload_from_string(
        json.dumps(report, indent=2, sort_keys=True), content_type="application/json"
    )
    return f"gs://{bucket}/{name}"


def render_report(report: dict[str, Any]) -> str:
    lines = [
        f"Interlude run report  {report['run_key']}",
        f"  accelerator {report['accelerator']} in {report['zone']} ({report['machine'].get('kind')}, "
        f"{report['machine'].get('mode')})",
    ]
    for s in report["stages"]:
        lines.append(f"  stage {s['stage']}: {s['steps']} steps, final checkpoint {s.get('final_uri', '?')}")
        if s.get("export_uri"):
            lines.append(f"    Hugging Face export (what vLLM serves): {s['export_uri']}")
    lines.append(f"  maintenance events: {len(report['events'])}")
    for e in report["events"]:
        lines.append(
            f"    - {e.get('stage')}: {e.get('kind')} ({e.get('notice_type') or 'no notice'}), checkpoint step "
            f"{e.get('checkpoint_step')}, downtime {float(e.get('downtime_s') or 0):.1f}s, "
            f"steps recomputed {e.get('steps_recomputed')}, resumed from {e.get('resumed_from_step')}, "
            f"{float(e.get('beyond_downtime_s') or 0):.1f}s beyond the downtime"
        )
    bad = report["badput_seconds"]
    lines.append(
        f"  steps recomputed: {report['steps_recomputed']}   goodput: {report['goodput']:.1%} of "
        f"{report['wall_seconds']:.1f}s wall"
    )
    lines.append("  badput: " + ", ".join(f"{k} {v:.1f}s" for k, v in bad.items()))
    return "\n".join(lines)
