"""Where the seconds of a run that were not training went: badput split into named causes.

Pure: a recorded timeline in (each stage's start/end/steps/step time, each maintenance event's
timestamps as the state machine recorded them, when provisioning began), seconds per cause out. The
report calls it; a benchmark or a test calls it on any recorded timeline.

Per event the timeline is notice seen (``detected_at``) -> the requested checkpoint committed
(``checkpoint_committed_at``) -> machine down (``down_at``) -> machine booted (``up_at``) -> workload
stepping again (``resumed_at``). Between commit and down the workload either holds (waiting for the
window) or trains on, and steps trained on after the checkpoint are recomputed after the restore; so
the wait is that gap minus the recomputed steps' time, never counted twice.

A drill (``drill_maintenance``) makes the workload hold at the drill step until the maintenance it asks for
has come and gone: from the drill being sent (``drill_sent_at``, the poll that saw the hold) to the checkpoint
before the window (or the machine going down) the workload sits idle through the whole notice. That is
``drill_hold``: the price of the rehearsal, not of maintenance (a workload that trained on past the drill step
did not hold, and pays nothing here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

CAUSES = (
    "provisioning",
    "stage_handoff",
    "checkpoint_writes",
    "waiting_for_window",
    "drill_hold",
    "cloud_downtime",
    "restore",
    "recomputed_steps",
    "other",
)


@dataclass(frozen=True)
class Badput:
    """Seconds per cause; ``other`` is what no recorded timestamp explains (periodic and extra checkpoints, steps
    slower than the stage's mean, poll latency)."""

    provisioning: float = 0.0
    stage_handoff: float = 0.0
    checkpoint_writes: float = 0.0
    waiting_for_window: float = 0.0
    drill_hold: float = 0.0
    cloud_downtime: float = 0.0
    restore: float = 0.0
    recomputed_steps: float = 0.0
    other: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class EventBadput:
    """One maintenance event's cost, for the report's event lines."""

    checkpoint_write: float
    waiting_for_window: float
    cloud_downtime: float
    restore: float
    recomputed_steps: float
    drill_hold: float = 0.0

    @property
    def beyond_downtime(self) -> float:
        """What the event cost beyond the cloud's own downtime: the part the control plane can shrink."""
        return self.checkpoint_write + self.waiting_for_window + self.restore + self.recomputed_steps + self.drill_hold


def _num(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _gap(start: Any, end: Any) -> float:
    a, b = _num(start), _num(end)
    return max(b - a, 0.0) if a is not None and b is not None else 0.0


def _bounded(value: float | None, low: float | None, high: float) -> float | None:
    if value is None:
        return None
    return min(max(value, low), high) if low is not None else min(value, high)


def workload_times(
    event: Mapping[str, Any], seen_at: float, stopped: Any, booted: Any, stepping: Any
) -> dict[str, Any]:
    """An event's down/up/resumed times and its downtime, from the workload's own stamps where it has them.

    ``stopped`` is the old boot's last report, ``booted`` the new boot's start (the startup script's clock),
    ``stepping`` when the new boot started stepping again (None: the workload did not say, or did not reboot).
    The polls' times (``down_at``/``up_at`` as recorded, and ``seen_at``, the poll that saw the workload past its
    resume point) are only bounds: a poll sees each moment up to an interval late. In a GPU drill they made the
    downtime 2.4 s where the workload's log showed 1.0 s, and ``resumed_at`` fell after the workload's next
    commit. Each time is kept in order (down <= up <= resumed <= seen_at): a VM's clock a little ahead of the
    control plane's must not make a negative gap. ``downtime_s`` is down -> up: the restore after it is a cause of
    its own (:func:`event_badput`). The polls' own times stay in ``seen`` for a reader who wants them.
    """
    polled_down, polled_up = _num(event.get("down_at")), _num(event.get("up_at"))
    down = _bounded(_num(stopped) if _num(stopped) is not None else polled_down, None, seen_at)
    up = _num(booted) if _num(booted) is not None else polled_up
    up = _bounded(up if up is not None else seen_at, down, seen_at)
    resumed = _bounded(_num(stepping) if _num(stepping) is not None else seen_at, up, seen_at)
    return {
        "down_at": down,
        "up_at": up,
        "resumed_at": resumed,
        "downtime_s": round(up - down, 3) if down is not None and up is not None else 0.0,
        "seen": {"down_at": polled_down, "up_at": polled_up, "resumed_at": seen_at},
    }


def drill_hold(event: Mapping[str, Any], checkpoint_write: float) -> float:
    """Seconds a drill held the workload idle before its window: drill sent -> the checkpoint before the window
    (else the machine down), less that checkpoint's write. 0 unless the workload held: still at the drill step
    when the machine went down."""
    step, at_down = _num(event.get("drill_step")), _num(event.get("step_at_down"))
    if not event.get("drill") or step is None or at_down is None or at_down > step:
        return 0.0
    end = event.get("checkpoint_committed_at")
    held = _gap(event.get("drill_sent_at"), end if end is not None else event.get("down_at"))
    return max(held - (checkpoint_write if end is not None else 0.0), 0.0)


def event_badput(event: Mapping[str, Any], step_seconds: float) -> EventBadput:
    """Split one recorded event. Missing timestamps (a reboot no poll saw, no checkpoint asked) count as 0."""
    recomputed = int(event.get("steps_recomputed") or 0) * step_seconds
    write = max(_num(event.get("checkpoint_write_s")) or 0.0, 0.0)
    up = event.get("up_at") if event.get("up_at") is not None else event.get("resumed_at")
    if event.get("down_at") is None:  # no down time recorded, only its length (or none): all of it is the cloud's
        downtime, restore = max(_num(event.get("downtime_s")) or 0.0, 0.0), 0.0
    else:
        downtime, restore = _gap(event.get("down_at"), up), _gap(up, event.get("resumed_at"))
    return EventBadput(
        checkpoint_write=write,
        waiting_for_window=max(_gap(event.get("checkpoint_committed_at"), event.get("down_at")) - recomputed, 0.0),
        cloud_downtime=downtime,
        restore=restore,
        recomputed_steps=recomputed,
        drill_hold=drill_hold(event, write),
    )


def split(
    stages: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    provisioning_started_at: float | None = None,
) -> tuple[float, float, Badput]:
    """(wall seconds, productive seconds, badput by cause) of a run's recorded timeline."""
    rows = sorted(stages, key=lambda s: float(s["started_at"]))
    if not rows:
        return 0.0, 0.0, Badput()
    step_time = {str(s["stage"]): float(s.get("mean_step_seconds") or 0.0) for s in rows}
    first = float(rows[0]["started_at"])
    start = min(first, provisioning_started_at) if provisioning_started_at is not None else first
    wall = max(max(float(s["finished_at"]) for s in rows) - start, 0.0)
    productive = min(sum(int(s["steps"]) * step_time[str(s["stage"])] for s in rows), wall)
    handoff = sum(_gap(a["finished_at"], b["started_at"]) for a, b in zip(rows, rows[1:], strict=False))
    per_event = [event_badput(e, step_time.get(str(e.get("stage", "")), 0.0)) for e in events]
    named = {
        "provisioning": first - start,
        "stage_handoff": handoff,
        "checkpoint_writes": sum(e.checkpoint_write for e in per_event),
        "waiting_for_window": sum(e.waiting_for_window for e in per_event),
        "drill_hold": sum(e.drill_hold for e in per_event),
        "cloud_downtime": sum(e.cloud_downtime for e in per_event),
        "restore": sum(e.restore for e in per_event),
        "recomputed_steps": sum(e.recomputed_steps for e in per_event),
    }
    other = max(wall - productive - sum(named.values()), 0.0)
    return wall, productive, Badput(**named, other=other)
