"""A run's story as a typed picture model: report JSON (and committed checkpoints) in, lanes, bands and ticks out.

Pure: no Airflow, no network. The inputs are what the project already writes: the training run report
(`interlude.training.events.build_report`, `report.json` under `layout.report_object`), the committed Orbax steps of
each stage (listed by `interlude_workload.checkpoints.CheckpointStore`), and the serving DAG's report XCom
(`interlude.operators.serving_report.build`). `interlude.ui.svg` draws the model; the tests check the model and the
drawing separately.

Per maintenance event the recorded timeline is notice seen (``detected_at``) -> machine down (``down_at``) -> machine
booted (``up_at``) -> workload stepping again (``resumed_at``) (interlude.training.badput); each leg that has both ends
is one band. Steps trained after the last committed checkpoint before the machine went down are computed again after
the restore (``steps_recomputed``): drawn as their own span after ``resumed_at``, ``steps x mean step time`` long.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

BAND_KINDS = ("notice", "down", "restore")
"""notice: detected -> down (training on, or holding at a checkpoint); down: the cloud's downtime; restore: booted ->
stepping again (reading the checkpoint back)."""


@dataclass(frozen=True)
class Tick:
    """One committed checkpoint of a stage."""

    stage: str
    at: float
    step: int


@dataclass(frozen=True)
class Band:
    """One leg of one maintenance event, on its stage's lane."""

    stage: str
    kind: str  # one of BAND_KINDS
    start: float
    end: float
    event_id: str
    title: str


@dataclass(frozen=True)
class Recompute:
    """Steps computed twice after an event: trained past the last commit before the machine went down."""

    stage: str
    start: float
    end: float
    steps: int
    title: str


@dataclass(frozen=True)
class Move:
    """The run left a place (failover): from, to, why, what it cost."""

    stage: str
    at: float
    source: str
    target: str
    title: str


@dataclass(frozen=True)
class EventMark:
    """One recorded event: its bands (zero to three), its recomputed steps, and the text a hover shows."""

    event_id: str
    stage: str
    kind: str
    at: float
    title: str
    bands: tuple[Band, ...] = ()
    recompute: Recompute | None = None


@dataclass(frozen=True)
class StageLane:
    """One stage of a training run: when it ran, its steps over time, its checkpoints and its events."""

    stage: str
    start: float
    end: float
    steps: int
    points: tuple[tuple[float, int], ...]  # (time, step) the run is known to have reached, in time order
    ticks: tuple[Tick, ...]
    title: str


@dataclass(frozen=True)
class PodLane:
    """Running serving pods on one accelerator (or pending), after each change the watch saw."""

    accelerator: str
    points: tuple[tuple[float, int], ...]
    title: str


@dataclass(frozen=True)
class Timeline:
    run_key: str
    start: float
    end: float
    lanes: tuple[StageLane, ...] = ()
    events: tuple[EventMark, ...] = ()
    moves: tuple[Move, ...] = ()
    pods: tuple[PodLane, ...] = ()
    fallbacks: tuple[tuple[float, str], ...] = ()  # (at, "action: reason")
    node_steps: tuple[tuple[float, str], ...] = ()  # (at, "drain NODE: reason"): the maintenance watch's steps
    goodput: float | None = None
    wall_seconds: float | None = None
    steps_recomputed: int = 0
    badput: tuple[tuple[str, float], ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def bands(self) -> tuple[Band, ...]:
        return tuple(b for e in self.events for b in e.bands)

    @property
    def ticks(self) -> tuple[Tick, ...]:
        return tuple(t for lane in self.lanes for t in lane.ticks)

    @property
    def recomputes(self) -> tuple[Recompute, ...]:
        return tuple(e.recompute for e in self.events if e.recompute is not None)

    def headline(self) -> str:
        """One line of figures: goodput, wall, recomputed steps (what a person reads first)."""
        parts = []
        if self.goodput is not None:
            parts.append(f"goodput {self.goodput:.1%}")
        if self.wall_seconds is not None:
            parts.append(f"wall {self.wall_seconds:.1f} s")
        parts.append(f"{len(self.events)} event(s)")
        parts.append(f"{self.steps_recomputed} step(s) recomputed")
        return ", ".join(parts)


def _num(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _seconds(a: float, b: float) -> str:
    return f"{max(b - a, 0.0):.1f} s"


def _event_title(e: Mapping[str, Any]) -> str:
    kind = str(e.get("kind") or "event")
    if kind == "move":
        return (
            f"{e.get('stage', '?')}: moved {e.get('from')} -> {e.get('to')} ({e.get('why')}), "
            f"{float(e.get('time_lost_s') or 0):.1f} s lost; {e.get('reason') or ''}".rstrip("; ")
        )
    return (
        f"{e.get('stage', '?')}: {kind} ({e.get('notice_type') or 'no notice'}{', drill' if e.get('drill') else ''}), "
        f"checkpoint step {e.get('checkpoint_step')}, downtime {float(e.get('downtime_s') or 0):.1f} s, "
        f"resumed from {e.get('resumed_from_step')}, steps recomputed {int(e.get('steps_recomputed') or 0)}, "
        f"{float(e.get('beyond_downtime_s') or 0):.1f} s beyond the downtime"
    )


def event_mark(e: Mapping[str, Any], step_seconds: float) -> EventMark:
    """The bands and recomputed span of one recorded event (legs with a missing end are left out)."""
    stage, event_id = str(e.get("stage") or "?"), str(e.get("event_id") or e.get("detected_at"))
    detected, down = _num(e.get("detected_at")), _num(e.get("down_at"))
    up, resumed = _num(e.get("up_at")), _num(e.get("resumed_at"))
    legs = (("notice", detected, down), ("down", down, up), ("restore", up, resumed))
    bands = []
    for kind, start, end in legs:
        if start is not None and end is not None and end > start:
            title = f"{stage}: {kind} {_seconds(start, end)} ({_event_title(e)})"
            bands.append(Band(stage, kind, start, end, event_id, title))
    steps = int(e.get("steps_recomputed") or 0)
    recompute = None
    after = resumed if resumed is not None else up
    if steps > 0 and after is not None:
        length = steps * max(step_seconds, 0.0)
        recompute = Recompute(
            stage,
            after,
            after + length,
            steps,
            f"{stage}: {steps} step(s) recomputed after resuming from step {e.get('resumed_from_step')}, "
            f"{length:.1f} s",
        )
    at = detected if detected is not None else (down if down is not None else 0.0)
    return EventMark(event_id, stage, str(e.get("kind") or "event"), at, _event_title(e), tuple(bands), recompute)


EVENT_STEPS = (
    ("detected_at", "step_at_detection"),
    ("checkpoint_committed_at", "checkpoint_step"),
    ("down_at", "step_at_down"),
    ("resumed_at", "resumed_from_step"),
)
"""The (time, step) pairs an event records: where the stage was when the notice came, what it committed, where it
was when the machine went down, where it resumed (below the step at down when steps were lost)."""


def event_points(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, int]]:
    out = []
    for e in events:
        for at, step in EVENT_STEPS:
            t, n = _num(e.get(at)), e.get(step)
            if t is not None and isinstance(n, int | float):
                out.append((t, int(n)))
    return out


def stage_lane(
    stage: Mapping[str, Any], commits: Sequence[tuple[int, float]], events: Sequence[Mapping[str, Any]] = ()
) -> StageLane:
    """A stage row of the report plus its committed steps as (step, committed at) (Orbax keeps the last few only)
    and its events' recorded steps."""
    name = str(stage["stage"])
    start, end = float(stage.get("started_at") or 0.0), float(stage.get("finished_at") or 0.0)
    ticks = tuple(Tick(name, at, step) for step, at in sorted(commits, key=lambda c: c[1]))
    points = ((start, 0), *((t.at, t.step) for t in ticks), *event_points(events))
    steps = int(stage.get("steps") or 0)
    if not ticks or ticks[-1].step < steps:
        points = (*points, (end, steps))
    title = (
        f"{name}: {steps} steps, {_seconds(start, end)}, {len(ticks)} committed checkpoint(s), "
        f"mean step {float(stage.get('mean_step_seconds') or 0):.3f} s"
    )
    return StageLane(name, start, end, steps, tuple(sorted(points)), ticks, title)


def from_training_report(
    report: Mapping[str, Any], commits: Mapping[str, Sequence[tuple[int, float]]] | None = None
) -> Timeline:
    """A training run's timeline from its report.json (and each stage's committed steps, when listed)."""
    commits = commits or {}
    step_time = {str(s["stage"]): float(s.get("mean_step_seconds") or 0.0) for s in report.get("stages") or []}
    raw = sorted(report.get("events") or [], key=lambda e: float(e.get("detected_at") or 0))
    lanes = tuple(
        stage_lane(s, commits.get(str(s["stage"]), ()), [e for e in raw if e.get("stage") == s["stage"]])
        for s in sorted(report.get("stages") or [], key=lambda s: float(s.get("started_at") or 0))
    )
    events = tuple(event_mark(e, step_time.get(str(e.get("stage")), 0.0)) for e in raw if e.get("kind") != "move")
    moves = tuple(
        Move(
            str(e.get("stage") or "?"),
            float(e.get("detected_at") or 0),
            str(e.get("from")),
            str(e.get("to")),
            _event_title(e),
        )
        for e in raw
        if e.get("kind") == "move"
    )
    times = [t for lane in lanes for t in (lane.start, lane.end)]
    times += [t for ev in events for b in ev.bands for t in (b.start, b.end)]
    times += [r.end for ev in events if (r := ev.recompute) is not None]
    times += [m.at for m in moves]
    start, end = (min(times), max(times)) if times else (0.0, 1.0)
    return Timeline(
        run_key=str(report.get("run_key") or ""),
        start=start,
        end=max(end, start + 1e-6),
        lanes=lanes,
        events=events,
        moves=moves,
        goodput=_num(report.get("goodput")),
        wall_seconds=_num(report.get("wall_seconds")),
        steps_recomputed=int(report.get("steps_recomputed") or 0),
        badput=tuple((str(k), float(v)) for k, v in (report.get("badput_seconds") or {}).items()),
    )


def from_serving_report(
    run_key: str, report: Mapping[str, Any], decisions: Sequence[Mapping[str, Any]] = ()
) -> Timeline:
    """A serving run's timeline from its report XCom (running pods per accelerator over time, the fallbacks) and the
    maintenance watch's decisions (cordon, surge, drain, ...; the waits left out)."""
    samples = sorted(report.get("pods_over_time") or [], key=lambda s: float(s["at"]))
    kinds = sorted({k for s in samples for k in (s.get("counts") or {})})
    pods = []
    for kind in kinds:
        points = tuple((float(s["at"]), int((s.get("counts") or {}).get(kind, 0))) for s in samples)
        peak = max((n for _, n in points), default=0)
        pods.append(PodLane(kind, points, f"{kind}: up to {peak} pod(s), {len(points)} change(s) seen"))
    fallbacks = tuple(
        (float(f["at"]), f"{f.get('action')}: {f.get('reason')}")
        for f in sorted(report.get("fallbacks") or [], key=lambda f: float(f["at"]))
    )
    node_steps = tuple(
        (float(d["at"]), f"{d.get('kind')} {d.get('node')}: {d.get('reason')}")
        for d in sorted(decisions, key=lambda d: float(d.get("at") or 0))
        if d.get("kind") not in ("wait", "none") and d.get("at") is not None
    )
    times = [float(s["at"]) for s in samples] + [at for at, _ in fallbacks] + [at for at, _ in node_steps]
    start, end = (min(times), max(times)) if times else (0.0, 1.0)
    return Timeline(
        run_key=run_key,
        start=start,
        end=max(end, start + 1e-6),
        pods=tuple(pods),
        fallbacks=fallbacks,
        node_steps=node_steps,
        notes=tuple(str(n) for n in report.get("notes") or []),
    )
