"""The two accelerator decision trees (TPU-first, GPU-first) as pure functions over data.

Input: a :class:`~interlude.capacity.CapacityReport`, a :class:`~interlude.profiles.ModelProfile`, a
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

A model that runs on neither family is stuck at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from interlude.capacity import AcceleratorKind, CapacityEntry, CapacityReport, QuotaState
from interlude.profiles import Candidate, Conversion, ModelProfile


class Strategy(StrEnum):
    TPU_FIRST = "tpu_first"
    GPU_FIRST = "gpu_first"

    @property
    def primary(self) -> AcceleratorKind:
        return AcceleratorKind.TPU if self == Strategy.TPU_FIRST else AcceleratorKind.GPU

    @property
    def secondary(self) -> AcceleratorKind:
        return AcceleratorKind.GPU if self == Strategy.TPU_FIRST else AcceleratorKind.TPU


class Leaf(StrEnum):
    TPU = "tpu"
    GPU = "gpu"
    SMALLER_GPU = "smaller_gpu"
    CONVERT_FOR_GPU = "convert_for_gpu"
    CONVERT_FOR_TPU = "convert_for_tpu"
    WAIT = "wait"
    STUCK = "stuck"


class ProvisioningMode(StrEnum):
    RESERVATION = "reservation"
    ON_DEMAND = "on_demand"
    SPOT = "spot"
    QUEUED = "queued"


_NAME = {AcceleratorKind.TPU: "TPU", AcceleratorKind.GPU: "GPU"}


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse(value: str | None) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromisoformat(value)


@dataclass(frozen=True)
class WaitState:
    """Carried from one walk to the next while the run waits for capacity."""

    started_at: dt.datetime | None = None
    checks: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"started_at": _iso(self.started_at), "checks": self.checks}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> WaitState:
        if not data:
            return cls()
        return cls(started_at=_parse(data.get("started_at")), checks=int(data.get("checks", 0)))


@dataclass(frozen=True)
class TrailStep:
    question: str
    answer: str

    def to_list(self) -> list[str]:
        return [self.question, self.answer]


@dataclass(frozen=True)
class Decision:
    """Where the run goes, and why. ``kind``/``accelerator_type``/... name the target machine (for the
    convert leaves: the machine to use once the model is converted)."""

    leaf: Leaf
    strategy: Strategy
    model: str
    trail: tuple[TrailStep, ...]
    kind: AcceleratorKind | None = None
    accelerator_type: str | None = None
    count: int | None = None
    machine_type: str | None = None
    zone: str | None = None
    mode: ProvisioningMode | None = None
    reservation: str | None = None
    conversion: Conversion | None = None
    converted_for: AcceleratorKind | None = None
    waiting_for: tuple[AcceleratorKind, ...] = ()
    wait_started_at: dt.datetime | None = None
    wait_deadline: dt.datetime | None = None
    stuck_report: str | None = None
    decided_at: dt.datetime | None = None

    @property
    def provisions(self) -> bool:
        """True when the decision names a machine to create now."""
        return self.leaf not in (Leaf.WAIT, Leaf.STUCK)

    def wait_state(self) -> WaitState:
        """The state to carry into the next walk (empty once the run stops waiting)."""
        if self.leaf != Leaf.WAIT:
            return WaitState()
        return WaitState(started_at=self.wait_started_at, checks=0)

    def summary(self) -> str:
        if self.leaf == Leaf.STUCK:
            return f"{self.model}: stuck ({self.strategy.value}); see the report"
        if self.leaf == Leaf.WAIT:
            kinds = " or ".join(_NAME[k] for k in self.waiting_for)
            return f"{self.model}: wait for {kinds} capacity until {_iso(self.wait_deadline)}"
        what = f"{self.accelerator_type}" + (
            f" x{self.count} on {self.machine_type}" if self.machine_type else ""
        )
        mode = self.mode.value if self.mode else "?"
        head = f"{self.model}: {self.leaf.value} -> {what} in {self.zone} ({mode}"
        head += f", reservation {self.reservation})" if self.reservation else ")"
        if self.conversion is not None:
            head += f"; conversion {self.conversion.summary()}"
        return head

    def trail_text(self) -> str:
        lines = [f"Decision trail ({self.strategy.value}, model {self.model}):"]
        lines += [f"  {i}. {s.question} -> {s.answer}" for i, s in enumerate(self.trail, 1)]
        lines.append(f"  => {self.summary()}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "leaf": self.leaf.value,
            "strategy": self.strategy.value,
            "model": self.model,
            "trail": [s.to_list() for s in self.trail],
            "kind": self.kind.value if self.kind else None,
            "accelerator_type": self.accelerator_type,
            "count": self.count,
            "machine_type": self.machine_type,
            "zone": self.zone,
            "mode": self.mode.value if self.mode else None,
            "reservation": self.reservation,
            "conversion": self.conversion.to_dict() if self.conversion else None,
            "converted_for": self.converted_for.value if self.converted_for else None,
            "waiting_for": [k.value for k in self.waiting_for],
            "wait_started_at": _iso(self.wait_started_at),
            "wait_deadline": _iso(self.wait_deadline),
            "stuck_report": self.stuck_report,
            "decided_at": _iso(self.decided_at),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        conv = data.get("conversion")
        return cls(
            leaf=Leaf(data["leaf"]),
            strategy=Strategy(data["strategy"]),
            model=str(data["model"]),
            trail=tuple(TrailStep(str(q), str(a)) for q, a in data.get("trail", ())),
            kind=AcceleratorKind(data["kind"]) if data.get("kind") else None,
            accelerator_type=data.get("accelerator_type"),
            count=data.get("count"),
            machine_type=data.get("machine_type"),
            zone=data.get("zone"),
            mode=ProvisioningMode(data["mode"]) if data.get("mode") else None,
            reservation=data.get("reservation"),
            conversion=Conversion.from_dict(conv) if conv else None,
            converted_for=AcceleratorKind(data["converted_for"]) if data.get("converted_for") else None,
            waiting_for=tuple(AcceleratorKind(k) for k in data.get("waiting_for", ())),
            wait_started_at=_parse(data.get("wait_started_at")),
            wait_deadline=_parse(data.get("wait_deadline")),
            stuck_report=data.get("stuck_report"),
            decided_at=_parse(data.get("decided_at")),
        )


# ---------------------------------------------------------------------------------------------------
# Placement of one candidate.


@dataclass(frozen=True)
class Placement:
    candidate: Candidate
    entry: CapacityEntry
    mode: ProvisioningMode
    reservation: str | None = None

    def describe(self) -> str:
        via = f"reservation {self.reservation}" if self.reservation else self.mode.value
        if self.mode == ProvisioningMode.RESERVATION and not self.reservation:
            via = "reservation"
        return f"{self.candidate.label()} in {self.entry.zone} via {via}"


def _quota_text(entry: CapacityEntry, count: int) -> str:
    if entry.quota_headroom is not None:
        return f"quota {entry.quota_metric} has {entry.quota_headroom:g} free, needs {count}"
    return f"quota {entry.quota.value}"


def provisioning_mode(
    entry: CapacityEntry, candidate: Candidate, profile: ModelProfile
) -> tuple[ProvisioningMode | None, str | None, str]:
    """How ``candidate`` could be provisioned in ``entry``'s zone: (mode, reservation name, why).

    Order: a reservation with room (already paid for), else on-demand when quota is ok or unknown
    (a queued resource instead, for TPUs, when the profile prefers them), else spot when the profile
    allows it and spot quota is not known to be exhausted. ``mode`` is None when nothing fits.
    """
    count = candidate.count
    if not entry.offered:
        return None, None, "not offered"
    if entry.stocked_out:
        return None, None, "stockout met earlier in this run"
    if candidate.kind == AcceleratorKind.GPU:
        room = entry.reservation_for(count, candidate.machine_type)
        if room is not None:
            return (
                ProvisioningMode.RESERVATION,
                room.name,
                f"reservation {room.name} has {room.free_vms} free VM(s)",
            )
    elif entry.reserved >= 1:
        name = entry.reservations[0].name if entry.reservations else None
        return ProvisioningMode.RESERVATION, name, f"{entry.reserved} reserved free"
    if entry.quota_allows(count):
        mode = (
            ProvisioningMode.QUEUED
            if candidate.kind == AcceleratorKind.TPU and profile.prefer_queued
            else ProvisioningMode.ON_DEMAND
        )
        return mode, None, _quota_text(entry, count)
    why = _quota_text(entry, count)
    if not profile.allow_spot:
        return None, None, why + "; spot not allowed by the profile"
    if entry.spot_quota_allows(count):
        return ProvisioningMode.SPOT, None, why + f"; spot quota {entry.spot_quota.value}"
    return None, None, why + "; spot quota exhausted too"


def find_placement(
    report: CapacityReport, candidates: Sequence[Candidate], profile: ModelProfile
) -> tuple[Placement | None, str]:
    """First candidate (in preference order) that fits somewhere; within it, a zone with reserved room
    first, then zone order. Returns the placement (or None) and a readable answer for the trail."""
    if not candidates:
        return None, "no: the profile lists no candidates"
    misses: list[str] = []
    for cand in candidates:
        entries = report.for_type(cand.accelerator_type)
        if not entries:
            misses.append(f"{cand.label()} [not probed]")
            continue
        options: list[Placement] = []
        reasons: list[str] = []
        for entry in entries:
            mode, reservation, why = provisioning_mode(entry, cand, profile)
            if mode is None:
                reasons.append(f"{entry.zone}: {why}")
            else:
                options.append(Placement(cand, entry, mode, reservation))
        if options:
            best = next((o for o in options if o.mode == ProvisioningMode.RESERVATION), options[0])
            why = provisioning_mode(best.entry, cand, profile)[2]
            return best, f"yes: {best.describe()} ({why})"
        misses.append(f"{cand.label()} [{'; '.join(reasons)}]")
    return None, "no: " + " | ".join(misses)


# ---------------------------------------------------------------------------------------------------
# The walk.


@dataclass
class _Walk:
    report: CapacityReport
    profile: ModelProfile
    strategy: Strategy
    now: dt.datetime
    wait: WaitState
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
            machine_type=p.candidate.machine_type,
            zone=p.entry.zone,
            mode=p.mode,
            reservation=p.reservation,
            conversion=conversion,
            converted_for=p.candidate.kind if leaf in (Leaf.CONVERT_FOR_GPU, Leaf.CONVERT_FOR_TPU) else None,
        )

    def available(
        self, kind: AcceleratorKind, candidates: Sequence[Candidate], question: str | None = None
    ) -> Placement | None:
        labels = ", ".join(c.label() for c in candidates) or "none listed"
        placement, answer = find_placement(self.report, candidates, self.profile)
        self.ask(question or f"Is a {_NAME[kind]} available? (candidates: {labels})", answer)
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
            stuck_report=stuck_report(
                self.report, self.profile, self.strategy, self.trail, self.now, self.wait
            ),
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
) -> Decision:
    """Walk the tree for ``strategy`` and return the leaf with its trail (see the module docstring)."""
    strategy = Strategy(strategy)
    walk = _Walk(report=report, profile=profile, strategy=strategy, now=now, wait=wait or WaitState())
    p_kind, s_kind = strategy.primary, strategy.secondary
    p_name, s_name = _NAME[p_kind], _NAME[s_kind]
    walk.ask("Which strategy?", f"{strategy.value}: {p_name} first, then {s_name}")

    runs_p, runs_s = profile.runs_on(p_kind), profile.runs_on(s_kind)
    if not runs_p and not runs_s:
        walk.ask("Does the model run on TPU or GPU?", "no: the profile says neither")
        return walk.stuck()

    walk.ask(f"Does the model run on {p_name}?", "yes" if runs_p else f"no: skip to {s_name}")
    if runs_p:
        placement = walk.available(p_kind, profile.candidates(p_kind))
        if placement is not None:
            return walk.placed(Leaf(p_kind.value), placement)
        if strategy == Strategy.GPU_FIRST:
            if not profile.smaller_gpus:
                walk.ask("Are smaller GPUs acceptable?", "no: the profile lists none")
            else:
                labels = ", ".join(c.label() for c in profile.smaller_gpus)
                walk.ask("Are smaller GPUs acceptable?", f"yes: {labels}")
                placement = walk.available(
                    AcceleratorKind.GPU, profile.smaller_gpus, "Is a smaller GPU available?"
                )
                if placement is not None:
                    return walk.placed(Leaf.SMALLER_GPU, placement)

    walk.ask(f"Does the model run on {s_name}?", "yes" if runs_s else "no")
    if runs_s:
        placement = walk.available(s_kind, profile.candidates(s_kind))
        if placement is not None:
            return walk.placed(Leaf(s_kind.value), placement)
        waiting_for = (p_kind, s_kind) if runs_p else (s_kind,)
        return walk.wait_or_stuck(waiting_for)

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
            entries = report.for_type(cand.accelerator_type)
            lines.append(f"  {label} {cand.label()}:")
            if not entries:
                lines.append("    not probed in any zone")
                hints.append(f"probe {cand.accelerator_type} (it was not in the capacity report)")
            for e in entries:
                lines.append(f"    {e.describe()}")
                if e.offered and e.quota == QuotaState.EXHAUSTED and e.quota_metric:
                    hints.append(f"raise quota {e.quota_metric} in {e.region} (or free some)")
                    if not profile.allow_spot and e.spot_quota != QuotaState.EXHAUSTED:
                        hints.append(
                            f"allow spot in the profile ({cand.accelerator_type} spot quota "
                            f"{e.spot_quota.value} in {e.region})"
                        )
                if e.stocked_out:
                    hints.append(f"{cand.accelerator_type} stocked out in {e.zone}: retry later or add zones")
            if entries and not any(e.offered for e in entries):
                hints.append(
                    f"{cand.accelerator_type} is offered in none of the probed zones: add zones "
                    "where it is offered"
                )
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
