"""Maintenance events and the run report, kept next to the checkpoints.

One object per event, named from its stage, detection time, kind and the id the state machine gave
it when it opened, so a retried task writes the same object again instead of a second record, and two
events of one stage never overwrite each other. The report is
recomputed from those objects and the checkpoints, never accumulated in memory.
"""

from __future__ import annotations

import json
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
    """Goodput = productive training time / wall time; badput split by named cause (interlude.badput).

    `stages` carry each stage's start/end (epoch seconds), steps, and mean step time; `events` the
    maintenance events as recorded; `provisioning_started_at` (when known) starts the wall clock at the
    first create instead of the first step.
    """
    from interlude.badput import event_badput, split

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
