"""The facts of one training run of the badput benchmark, read from sources other than Interlude's own report:
the workload's log in GCS (every line stamped by the workload on its boot) and the local cloud's event log
(when it announced a maintenance, took the machine down and brought it back).

Pure: text and event dicts in, typed figures out (the benchmark fetches them; a test can feed any log).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from interlude.training.badput import Badput, split

STAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\S+) \[[^\]]+\] (.*)$")
COMMIT = re.compile(r"checkpoint step (\d+) (?:already )?committed in ([\d.]+)s \(([^)]*)\)")
TRAINING = re.compile(r"training \S+ steps (\d+)\.\.(\d+)")
STEP = re.compile(r"^step (\d+)/")


@dataclass(frozen=True)
class Line:
    at: float
    text: str


@dataclass(frozen=True)
class EventFacts:
    """One maintenance: the cloud's times, and what the workload did around it."""

    notice_at: float  # the cloud announced it (maintenance_notice)
    down_at: float  # the window opened: machine down (maintenance_start)
    up_at: float  # the host was serviced: machine back and booting (maintenance_end)
    resumed_at: float  # the new boot's trainer started stepping ("training ... steps A..")
    resume_step: int  # it resumed from this committed step
    reached_step: int  # the highest step the old boot logged (steps are logged every 10 and at commits)
    checkpoint_committed_at: float | None  # when the resume step was committed, if after the notice
    checkpoint_write_s: float  # what that commit took, by the workload's own clock
    recomputed_steps: int
    first_commit_at: float | None = None  # the first checkpoint committed after the notice, before the window

    @property
    def downtime_s(self) -> float:
        return self.up_at - self.down_at

    @property
    def notice_to_first_commit_s(self) -> float | None:
        """Notice to the first checkpoint committed after it (the workload's reaction; None: none before the window)."""
        return None if self.first_commit_at is None else self.first_commit_at - self.notice_at

    @property
    def notice_to_commit_s(self) -> float | None:
        """Notice to the committed checkpoint the machine resumed from (None: nothing committed after it)."""
        return None if self.checkpoint_committed_at is None else self.checkpoint_committed_at - self.notice_at


@dataclass(frozen=True)
class RunFacts:
    """One row: a training stage from its first step to its final commit, and its maintenance events."""

    steps: int  # the final committed step (from the log; the benchmark checks it against GCS)
    started_at: float  # first boot's trainer started stepping
    finished_at: float  # final step committed
    events: list[EventFacts] = field(default_factory=list)

    @property
    def span_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def downtime_s(self) -> float:
        return sum(e.downtime_s for e in self.events)

    @property
    def recomputed_steps(self) -> int:
        return sum(e.recomputed_steps for e in self.events)

    def badput(self, step_seconds: float) -> tuple[float, float, Badput]:
        """interlude.training.badput's split of this timeline (the same function the report uses, other inputs)."""
        stage = {
            "stage": "train",
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "steps": self.steps,
            "mean_step_seconds": step_seconds,
        }
        events = [
            {
                "stage": "train",
                "detected_at": e.notice_at,
                "checkpoint_committed_at": e.checkpoint_committed_at,
                "checkpoint_write_s": e.checkpoint_write_s if e.checkpoint_committed_at is not None else 0.0,
                "down_at": e.down_at,
                "up_at": e.up_at,
                "resumed_at": e.resumed_at,
                "steps_recomputed": e.recomputed_steps,
            }
            for e in self.events
        ]
        return split([stage], events)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(span_s=round(self.span_s, 3), downtime_s=round(self.downtime_s, 3))
        return out


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def parse_log(log: str) -> list[Line]:
    """The workload's stamped lines, oldest first, each once (the same line may come from its GCS log and from the
    machine's serial console; the startup script's own lines have no run/stage tag)."""
    lines = {Line(stamp(m[1]), m[2]) for raw in log.splitlines() if (m := STAMPED.match(raw.strip()))}
    return sorted(lines, key=lambda ln: (ln.at, ln.text))


def _event(lines: list[Line], notice_at: float, down_at: float, up_at: float) -> EventFacts:
    start = next((ln for ln in lines if ln.at >= down_at and TRAINING.search(ln.text)), None)
    if start is None:
        raise ValueError(f"no boot trained again after the maintenance at {down_at}")
    match = TRAINING.search(start.text)
    assert match is not None
    resume_step = int(match[1]) - 1
    old = [ln for ln in lines if notice_at <= ln.at < start.at]
    reached = [int(m[1]) for ln in old if (m := STEP.match(ln.text) or COMMIT.search(ln.text))]
    commits = [(ln.at, float(m[2])) for ln in lines if (m := COMMIT.search(ln.text)) and int(m[1]) == resume_step]
    first = min(commits, default=None)
    after_notice = first is not None and first[0] >= notice_at
    reaction = [ln.at for ln in lines if notice_at <= ln.at < down_at and COMMIT.search(ln.text)]
    return EventFacts(
        notice_at=notice_at,
        down_at=down_at,
        up_at=up_at,
        resumed_at=start.at,
        resume_step=resume_step,
        reached_step=max(reached, default=resume_step),
        checkpoint_committed_at=first[0] if after_notice and first else None,
        checkpoint_write_s=first[1] if first else 0.0,
        recomputed_steps=max(max(reached, default=resume_step) - resume_step, 0),
        first_commit_at=min(reaction, default=None),
    )


def run_facts(log: str, cloud_events: list[dict[str, Any]], machine_id: str, steps: int) -> RunFacts:
    """The run's figures from its workload log and the cloud's events for its machine (``machine_id``).

    ``log``: the workload's log from GCS, best with the machine's serial console appended: a process killed
    without a SIGTERM commit (the naive row) never uploads its last second of lines, the console has them."""
    lines = parse_log(log)
    first = next((ln for ln in lines if TRAINING.search(ln.text)), None)
    final = next((ln for ln in lines if (m := COMMIT.search(ln.text)) and int(m[1]) == steps), None)
    if first is None or final is None:
        raise ValueError(f"the log shows no training start or no commit of step {steps}")
    mine = [e for e in cloud_events if e.get("machine") == machine_id]
    notices = [float(e["t"]) for e in mine if e["event"] == "maintenance_notice"]
    starts = [float(e["t"]) for e in mine if e["event"] == "maintenance_start"]
    ends = [float(e["t"]) for e in mine if e["event"] == "maintenance_end"]
    if not len(notices) == len(starts) == len(ends):
        raise ValueError(f"unpaired maintenance events: {len(notices)} notices, {len(starts)} starts, {len(ends)} ends")
    events = [_event(lines, n, s, e) for n, s, e in zip(notices, starts, ends, strict=True)]
    return RunFacts(steps=steps, started_at=first.at, finished_at=final.at, events=events)
