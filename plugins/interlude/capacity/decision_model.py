"""The accelerator decision's data: strategies, leaves, provisioning modes, the trail and the wait state.

JSON-shaped (``to_dict``/``from_dict``) because a decision travels through XCom and trigger arguments;
the walk that produces it is in decisions.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from interlude.capacity.profiles import Conversion
from interlude.capacity.report import AcceleratorKind


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


FAMILY_NAME = {AcceleratorKind.TPU: "TPU", AcceleratorKind.GPU: "GPU"}


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
    convert leaves: the machine to use once the model is converted); ``platform`` where it is created
    (``tpu_api``: a Cloud TPU node or queued resource; ``compute``: a Compute Engine VM, GPU or TPU machine type,
    named by ``machine_type``; ``gke``: GKE node pools)."""

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
    platform: str | None = None

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
            kinds = " or ".join(FAMILY_NAME[k] for k in self.waiting_for)
            return f"{self.model}: wait for {kinds} capacity until {_iso(self.wait_deadline)}"
        what = f"{self.accelerator_type}" + (f" x{self.count} on {self.machine_type}" if self.machine_type else "")
        mode = self.mode.value if self.mode else "?"
        where = f"{self.zone}" + (f" on {self.platform}" if self.platform and not self._default_platform else "")
        head = f"{self.model}: {self.leaf.value} -> {what} in {where} ({mode}"
        head += f", reservation {self.reservation})" if self.reservation else ")"
        if self.conversion is not None:
            head += f"; conversion {self.conversion.summary()}"
        return head

    @property
    def _default_platform(self) -> bool:
        """The family's platform before platforms existed (TPU API nodes, Compute Engine GPU VMs)."""
        return self.kind is not None and self.platform == {"tpu": "tpu_api", "gpu": "compute"}[self.kind.value]

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
            "platform": self.platform,
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
            platform=data.get("platform"),
        )
