"""When the place is gone: where a running stage moves, or why it cannot (pure, over the capacity report).

A move is what the run report calls it (event kind ``move``); this module plans one (:func:`plan_move`),
:mod:`interlude.machines.relocate` carries it out (:func:`~interlude.machines.relocate.move_run`).

A stage is pinned to nothing. When its machine cannot come back where it is (re-provisioning met a
stockout or a quota wall, the machine stayed gone past its budget, the zone errors), the zone x type
is marked out and the run's own decision tree is walked again: another zone of the same type, another
type, or the other accelerator family when the profile runs there. The stage then resumes from its
latest committed checkpoint on the new machine.

Moving across families is only safe for a checkpoint whose format any family can load. Orbax steps (`orbax`,
what the workload saves) are: a restore names the dtypes, shapes and shardings it wants for each leaf, so a step
saved on one mesh restores onto another
(https://orbax.readthedocs.io/en/latest/guides/checkpoint/checkpointing_pytrees.html); a device-layout-specific
format is not, and resuming it elsewhere would fail after paying for the new machine, so the move is
refused with the reason and the run waits (if its profile allows) or fails.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from interlude.capacity.decision_model import Decision, Leaf, Strategy
from interlude.capacity.profiles import ModelProfile
from interlude.capacity.report import AcceleratorKind, CapacityReport, kind_of, mark_stockout

PORTABLE_FORMATS: frozenset[str] = frozenset({"orbax", "interlude-checkpoint/1"})
"""Checkpoint formats that load on either family (``Checkpoint.format``; interlude-checkpoint/1 was the format
before Orbax)."""

MOVABLE_LEAVES = (Leaf.TPU, Leaf.GPU, Leaf.SMALLER_GPU)
"""A move never converts the model: that needs a person (see the conversion approval)."""


class Why(StrEnum):
    STOCKOUT = "stockout"  # re-provisioning where it was met GCE_STOCKOUT / TPU capacity errors
    QUOTA = "quota"  # the quota wall did not move within the quota wait
    GONE_PAST_BUDGET = "gone_past_budget"  # the machine stayed down longer than its down budget
    ZONE_ERROR = "zone_error"  # the zone's API keeps failing


@dataclass(frozen=True)
class Place:
    zone: str
    accelerator_type: str

    @property
    def kind(self) -> AcceleratorKind:
        return kind_of(self.accelerator_type)

    def __str__(self) -> str:
        return f"{self.accelerator_type} in {self.zone}"


@dataclass(frozen=True)
class Move:
    """Go to ``target`` (the decision to provision) and resume there."""

    source: Place
    target: Place
    why: Why
    decision: Decision
    cross_family: bool

    def reason(self) -> str:
        family = f" ({self.source.kind.value} -> {self.target.kind.value})" if self.cross_family else ""
        return f"{self.why.value} at {self.source}: moving to {self.target}{family}"


@dataclass(frozen=True)
class Refusal:
    """No move: say why; ``wait`` when the profile lets the run wait for capacity instead of failing."""

    source: Place
    why: Why
    reason: str
    wait: bool
    trail: tuple[str, ...] = field(default=())


def excluded(report: CapacityReport, places: Iterable[Place]) -> CapacityReport:
    """The report with every place this run has lost marked out (stockouts met, budgets spent)."""
    for place in places:
        report = mark_stockout(report, place.zone, place.accelerator_type)
    return report


def plan_move(
    report: CapacityReport,
    profile: ModelProfile,
    strategy: Strategy | str,
    current: Place,
    why: Why,
    checkpoint_format: str | None,
    now: dt.datetime,
    lost: Iterable[Place] = (),
) -> Move | Refusal:
    """Walk the tree again without ``current`` (and every place already ``lost``); move or refuse."""
    from interlude.capacity.decisions import decide

    decision = decide(excluded(report, (current, *lost)), profile, Strategy(strategy), now)
    trail = tuple(f"{s.question} -> {s.answer}" for s in decision.trail)
    if decision.leaf not in MOVABLE_LEAVES or decision.accelerator_type is None or decision.zone is None:
        what = (
            "conversion of the model" if decision.leaf in (Leaf.CONVERT_FOR_GPU, Leaf.CONVERT_FOR_TPU) else ("capacity")
        )
        return Refusal(
            current,
            why,
            f"no other place for this run without {what} ({decision.leaf.value})",
            wait=profile.wait_allowed,
            trail=trail,
        )
    target = Place(decision.zone, decision.accelerator_type)
    cross = target.kind != current.kind
    if cross and (checkpoint_format or "") not in PORTABLE_FORMATS:
        fmt = checkpoint_format or "unknown"
        return Refusal(
            current,
            why,
            f"the nearest place is {target}, but checkpoint format {fmt!r} does not load "
            f"on {target.kind.value.upper()} (portable formats: {', '.join(sorted(PORTABLE_FORMATS))})",
            wait=profile.wait_allowed,
            trail=trail,
        )
    return Move(current, target, why, decision, cross)


def move_event(move: Move, detected_at: float, lost_seconds: float) -> dict[str, Any]:
    """The run report's record of one move: from, to, why, and the time it cost."""
    return {
        "kind": "move",
        "from": str(move.source),
        "to": str(move.target),
        "why": move.why.value,
        "from_zone": move.source.zone,
        "from_type": move.source.accelerator_type,
        "event_id": f"move-{int(detected_at * 1000)}",
        "cross_family": move.cross_family,
        "detected_at": detected_at,
        "time_lost_s": round(lost_seconds, 3),
        "reason": move.reason(),
    }
