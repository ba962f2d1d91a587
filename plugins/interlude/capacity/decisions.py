"""The two accelerator decision trees (TPU-first, GPU-first) as pure functions over data.

Input: a :class:`~interlude.capacity.report.CapacityReport`, a :class:`~interlude.capacity.profiles.ModelProfile`, a
:class:`Strategy`, the current time and the :class:`WaitState` carried between walks. Output: a
:class:`Decision` whose ``trail`` lists every question asked and its answer, so an operator reading the
task log sees why the run went where it went. Nothing here talks to the cloud: a stockout met while
provisioning is fed back with ``capacity.mark_stockout`` and the tree is walked again.

Both trees share one shape, with P the preferred family and S the other one::

    model runs on P?  yes -> P available? yes -> leaf P
                      (GPU-first only) smaller GPUs acceptable and available? yes -> smaller_gpu
    model runs on S?  yes -> S available? yes -> leaf S ; no -> wait (allowed, before deadline) | stuck
                      no  -> conversion to S feasible? yes -> S available? yes -> convert_for_S
                                                                         no  -> wait | stuck
                                                       no  -> stuck

A model that runs on neither family is stuck at once. "available" is asked platform x type x zone, in the run's
``platforms`` order (:func:`~interlude.capacity.placement.find_placement`); the leaf names its platform.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from interlude.capacity.decision_model import (
    FAMILY_NAME,
    Decision,
    Leaf,
    ProvisioningMode,
    Strategy,
    TrailStep,
    WaitState,
)
from interlude.capacity.placement import Placement, find_placement, provisioning_mode
from interlude.capacity.profiles import Candidate, Conversion, ModelProfile
from interlude.capacity.report import AcceleratorKind, CapacityReport, QuotaState

# Re-exported: callers import the decision's types from here, where the walk that makes them lives.
__all__ = [
    "Decision",
    "Leaf",
    "Placement",
    "ProvisioningMode",
    "Strategy",
    "TrailStep",
    "WaitState",
    "decide",
    "find_placement",
    "provisioning_mode",
    "stuck_report",
]


# ---------------------------------------------------------------------------------------------------
# The walk.


@dataclass
class _Walk:
    report: CapacityReport
    profile: ModelProfile
    strategy: Strategy
    now: dt.datetime
    wait: WaitState
    platforms: tuple[str, ...] | None = None
    trail: list[TrailStep] = field(default_factory=list)

    def ask(self, question: str, answer: str) -> None:
        self.trail.append(TrailStep(question, answer))

    def base(self, leaf: Leaf, **kw: Any) -> Decision:
        return Decision(
            leaf=leaf,
            strategy=self.strategy,
            model=self.profile.name,
            trail=tuple(self.trail),
            decided_at=self.now,
            **kw,
        )

    def placed(self, leaf: Leaf, p: Placement, conversion: Conversion | None = None) -> Decision:
        return self.base(
            leaf,
            kind=p.candidate.kind,
            accelerator_type=p.candidate.accelerator_type,
            count=p.candidate.count,
            machine_type=p.machine_type,
            zone=p.entry.zone,
            platform=p.platform,
            mode=p.mode,
            reservation=p.reservation,
            conversion=conversion,
            converted_for=p.candidate.kind if leaf in (Leaf.CONVERT_FOR_GPU, Leaf.CONVERT_FOR_TPU) else None,
        )

    def available(
        self, kind: AcceleratorKind, candidates: Sequence[Candidate], question: str | None = None
    ) -> Placement | None:
        labels = ", ".join(c.label() for c in candidates) or "none listed"
        placement, answer = find_placement(self.report, candidates, self.profile, self.platforms)
        self.ask(question or f"Is a {FAMILY_NAME[kind]} available? (candidates: {labels})", answer)
        return placement

    def wait_or_stuck(
        self,
        waiting_for: tuple[AcceleratorKind, ...],
        conversion: Conversion | None = None,
        converted_for: AcceleratorKind | None = None,
    ) -> Decision:
        started = self.wait.started_at or self.now
        deadline = started + self.profile.max_wait
        question = "May the run wait for capacity?"
        if not self.profile.wait_allowed:
            self.ask(question, "no: the profile does not allow waiting")
        elif self.profile.max_wait <= dt.timedelta(0):
            self.ask(question, "no: the profile's max wait is 0")
        elif self.now >= deadline:
            self.ask(
                question,
                f"no: waiting since {started.isoformat()}, deadline {deadline.isoformat()} "
                f"passed (now {self.now.isoformat()})",
            )
        else:
            left = deadline - self.now
            self.ask(
                question,
                f"yes: waiting since {started.isoformat()}, until {deadline.isoformat()} "
                f"({_span(left)} left); re-probe and walk again",
            )
            return self.base(
                Leaf.WAIT,
                waiting_for=waiting_for,
                wait_started_at=started,
                wait_deadline=deadline,
                conversion=conversion,
                converted_for=converted_for,
            )
        return self.stuck(conversion)

    def stuck(self, conversion: Conversion | None = None) -> Decision:
        return self.base(
            Leaf.STUCK,
            conversion=conversion,
            stuck_report=stuck_report(self.report, self.profile, self.strategy, self.trail, self.now, self.wait),
        )


def _span(delta: dt.timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"


def decide(
    report: CapacityReport,
    profile: ModelProfile,
    strategy: Strategy | str,
    now: dt.datetime,
    wait: WaitState | None = None,
    platforms: Sequence[str] | None = None,
) -> Decision:
    """Walk the tree for ``strategy`` and return the leaf with its trail (see the module docstring).

    ``platforms``: where the run may go, most preferred first (the run param); None = the report's platforms in
    its order (the probe asked only the run's platforms)."""
    strategy = Strategy(strategy)
    walk = _Walk(
        report=report,
        profile=profile,
        strategy=strategy,
        now=now,
        wait=wait or WaitState(),
        platforms=None if platforms is None else tuple(platforms),
    )
    p_kind, s_kind = strategy.primary, strategy.secondary
    p_name, s_name = FAMILY_NAME[p_kind], FAMILY_NAME[s_kind]
    walk.ask("Which strategy?", f"{strategy.value}: {p_name} first, then {s_name}")

    runs_p, runs_s = profile.runs_on(p_kind), profile.runs_on(s_kind)
    if not runs_p and not runs_s:
        walk.ask("Does the model run on TPU or GPU?", "no: the profile says neither")
        return walk.stuck()

    walk.ask(f"Does the model run on {p_name}?", "yes" if runs_p else f"no: skip to {s_name}")
    if runs_p and (placed := _primary(walk, p_kind)) is not None:
        return placed

    walk.ask(f"Does the model run on {s_name}?", "yes" if runs_s else "no")
    if runs_s:
        placement = walk.available(s_kind, profile.candidates(s_kind))
        if placement is not None:
            return walk.placed(Leaf(s_kind.value), placement)
        waiting_for = (p_kind, s_kind) if runs_p else (s_kind,)
        return walk.wait_or_stuck(waiting_for)
    return _convert(walk, p_kind, s_kind)


def _primary(walk: _Walk, p_kind: AcceleratorKind) -> Decision | None:
    """The preferred family, then (GPU-first only) smaller GPUs; None when neither places the run."""
    profile = walk.profile
    placement = walk.available(p_kind, profile.candidates(p_kind))
    if placement is not None:
        return walk.placed(Leaf(p_kind.value), placement)
    if walk.strategy != Strategy.GPU_FIRST:
        return None
    if not profile.smaller_gpus:
        walk.ask("Are smaller GPUs acceptable?", "no: the profile lists none")
        return None
    labels = ", ".join(c.label() for c in profile.smaller_gpus)
    walk.ask("Are smaller GPUs acceptable?", f"yes: {labels}")
    placement = walk.available(AcceleratorKind.GPU, profile.smaller_gpus, "Is a smaller GPU available?")
    return walk.placed(Leaf.SMALLER_GPU, placement) if placement is not None else None


def _convert(walk: _Walk, p_kind: AcceleratorKind, s_kind: AcceleratorKind) -> Decision:
    """The model does not run on the other family: convert it for that family, wait, or be stuck."""
    profile, s_name = walk.profile, FAMILY_NAME[s_kind]
    conversion = profile.conversion_to(s_kind)
    walk.ask(
        f"Can the model be converted to run on {s_name}?",
        f"yes: {conversion.summary()}" if conversion.feasible else f"no: {conversion.summary()}",
    )
    if not conversion.feasible:
        return walk.stuck()
    placement = walk.available(
        s_kind,
        profile.candidates(s_kind),
        f"After conversion, is a {s_name} available? (candidates: "
        f"{', '.join(c.label() for c in profile.candidates(s_kind)) or 'none listed'})",
    )
    if placement is not None:
        leaf = Leaf.CONVERT_FOR_GPU if s_kind == AcceleratorKind.GPU else Leaf.CONVERT_FOR_TPU
        return walk.placed(leaf, placement, conversion)
    return walk.wait_or_stuck((p_kind, s_kind), conversion, s_kind)


def stuck_report(
    report: CapacityReport,
    profile: ModelProfile,
    strategy: Strategy,
    trail: Sequence[TrailStep],
    now: dt.datetime,
    wait: WaitState,
) -> str:
    """A human report of everything checked and what would unblock the run."""
    lines = [
        f"No accelerator for model {profile.name!r} (strategy {strategy.value}) at {now.isoformat()}.",
        "",
        "Questions asked:",
    ]
    lines += [f"  {i}. {s.question} -> {s.answer}" for i, s in enumerate(trail, 1)]
    lines += ["", "Capacity seen per candidate:"]
    hints: list[str] = []
    groups = (
        ("TPU", profile.tpu_candidates if profile.runs_on_tpu or profile.convert_to_tpu.feasible else ()),
        ("GPU", profile.gpu_candidates if profile.runs_on_gpu or profile.convert_to_gpu.feasible else ()),
        (
            "smaller GPU",
            profile.smaller_gpus if strategy == Strategy.GPU_FIRST and profile.runs_on_gpu else (),
        ),
    )
    for label, cands in groups:
        for cand in cands:
            lines.append(f"  {label} {cand.label()}:")
            _candidate_lines(report, profile, cand, lines, hints)
    lines += [
        "",
        "Model:",
        f"  runs on TPU: {profile.runs_on_tpu}; runs on GPU: {profile.runs_on_gpu}",
        f"  conversion to GPU: {profile.convert_to_gpu.summary()}",
        f"  conversion to TPU: {profile.convert_to_tpu.summary()}",
        f"  waiting: {'allowed, max ' + _span(profile.max_wait) if profile.wait_allowed else 'not allowed'}"
        + (f" (waiting since {wait.started_at.isoformat()})" if wait.started_at else ""),
    ]
    if not profile.wait_allowed:
        hints.append("allow waiting (wait_allowed, max_wait) to let capacity come back")
    elif wait.started_at is not None:
        hints.append("the wait deadline passed: raise max_wait or start a new run later")
    if not profile.runs_on_tpu and not profile.runs_on_gpu:
        hints.append("fix the profile: a model must run on TPU or GPU")
    if report.notes:
        lines += ["", "Probe notes:"] + [f"  {n}" for n in report.notes]
    lines += ["", "What could unblock it:"]
    lines += [f"  - {h}" for h in dict.fromkeys(hints)] or ["  - nothing obvious; see the capacity above"]
    return "\n".join(lines)


def _candidate_lines(
    report: CapacityReport, profile: ModelProfile, cand: Candidate, lines: list[str], hints: list[str]
) -> None:
    """What was seen for one candidate in every probed zone, and the hints it suggests."""
    entries = report.for_type(cand.accelerator_type)
    if not entries:
        lines.append("    not probed in any zone")
        hints.append(f"probe {cand.accelerator_type} (it was not in the capacity report)")
    for e in entries:
        lines.append(f"    {e.describe()}")
        if e.offered and e.quota == QuotaState.EXHAUSTED and e.quota_metric:
            hints.append(f"raise quota {e.quota_metric} in {e.region} (or free some)")
            if not profile.allow_spot and e.spot_quota != QuotaState.EXHAUSTED:
                hints.append(
                    f"allow spot in the profile ({cand.accelerator_type} spot quota {e.spot_quota.value} in {e.region})"
                )
        if e.stocked_out:
            hints.append(f"{cand.accelerator_type} stocked out in {e.zone}: retry later or add zones")
    if entries and not any(e.offered for e in entries):
        hints.append(f"{cand.accelerator_type} is offered in none of the probed zones: add zones where it is offered")
