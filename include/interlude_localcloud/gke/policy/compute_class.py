"""ComputeClass (``cloud.google.com/v1``): ordered priorities of node configurations for the autoscaler.

Parsed from the manifest as written for GKE
(https://cloud.google.com/kubernetes-engine/docs/reference/crds/computeclass,
https://cloud.google.com/kubernetes-engine/docs/concepts/about-custom-compute-classes); the fields the
policies act on are kept, the rest (node pool config, storage, reservations) is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlude_localcloud.gke.policy.model import (
    DEFAULT_WHEN_UNSATISFIABLE,
    GpuSpec,
    NodePool,
    TpuSpec,
    WhenUnsatisfiable,
)


@dataclass(frozen=True)
class TpuRule:
    type: str
    count: int | None = None
    topology: str | None = None


@dataclass(frozen=True)
class GpuRule:
    type: str
    count: int | None = None
    driver_version: str | None = None


@dataclass(frozen=True)
class PriorityRule:
    """One entry of ``spec.priorities``; a node pool satisfies it when every field set here matches."""

    nodepools: tuple[str, ...] = ()
    machine_family: str | None = None
    machine_type: str | None = None
    tpu: TpuRule | None = None
    gpu: GpuRule | None = None
    spot: bool | None = None

    def matches(self, pool: NodePool) -> bool:
        checks = (
            not self.nodepools or pool.name in self.nodepools,
            self.machine_family is None or pool.machine_family == self.machine_family,
            self.machine_type is None or pool.machine_type == self.machine_type,
            self.spot is None or pool.spot == self.spot,
            self.tpu is None or _tpu_matches(self.tpu, pool.tpu),
            self.gpu is None or _gpu_matches(self.gpu, pool.gpu),
        )
        return all(checks)

    def describe(self) -> str:
        if self.nodepools:
            return "nodepools " + ",".join(self.nodepools)
        parts = [
            f"tpu {self.tpu.type} {self.tpu.topology or ''}".strip() if self.tpu else "",
            f"gpu {self.gpu.type} x{self.gpu.count or 1}" if self.gpu else "",
            f"machineFamily {self.machine_family}" if self.machine_family else "",
            f"machineType {self.machine_type}" if self.machine_type else "",
            "spot" if self.spot else "",
        ]
        return " ".join(p for p in parts if p) or "any"


def _tpu_matches(rule: TpuRule, spec: TpuSpec | None) -> bool:
    if spec is None or spec.type != rule.type:
        return False
    return (rule.topology is None or rule.topology == spec.topology) and (
        rule.count is None or rule.count == spec.chips
    )


def _gpu_matches(rule: GpuRule, spec: GpuSpec | None) -> bool:
    if spec is None or spec.type != rule.type:
        return False
    return rule.count is None or rule.count == spec.count


@dataclass(frozen=True)
class ComputeClass:
    name: str
    priorities: tuple[PriorityRule, ...]
    when_unsatisfiable: WhenUnsatisfiable = DEFAULT_WHEN_UNSATISFIABLE
    optimize_rule_priority: bool = False  # spec.activeMigration.optimizeRulePriority
    consolidation_delay_minutes: int | None = None  # spec.autoscalingPolicy.consolidationDelayMinutes
    node_pool_auto_creation: bool = False

    def rank(self, pool: NodePool) -> int | None:
        """Index of the first priority the pool satisfies (0 is most preferred), None when none does."""
        if pool.compute_class is not None and pool.compute_class != self.name:
            return None
        for index, rule in enumerate(self.priorities):
            if rule.matches(pool):
                return index
        return None

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> ComputeClass:
        """Parse a ``cloud.google.com/v1`` ComputeClass as written for GKE; unknown shapes fail loudly."""
        if manifest.get("apiVersion") != "cloud.google.com/v1" or manifest.get("kind") != "ComputeClass":
            raise ValueError("not a cloud.google.com/v1 ComputeClass")
        name = (manifest.get("metadata") or {}).get("name")
        if not name:
            raise ValueError("ComputeClass needs metadata.name")
        spec = manifest.get("spec") or {}
        raw = spec.get("priorities")
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"ComputeClass {name}: spec.priorities must be a non-empty list")
        when = spec.get("whenUnsatisfiable", DEFAULT_WHEN_UNSATISFIABLE)
        if when not in ("ScaleUpAnyway", "DoNotScaleUp"):
            raise ValueError(f"ComputeClass {name}: whenUnsatisfiable must be ScaleUpAnyway or DoNotScaleUp")
        delay = (spec.get("autoscalingPolicy") or {}).get("consolidationDelayMinutes")
        if delay is not None and (not isinstance(delay, int) or delay < 1):
            raise ValueError(f"ComputeClass {name}: consolidationDelayMinutes must be an integer >= 1")
        return cls(
            name=str(name),
            priorities=tuple(_parse_rule(name, i, r) for i, r in enumerate(raw)),
            when_unsatisfiable=when,
            optimize_rule_priority=bool((spec.get("activeMigration") or {}).get("optimizeRulePriority", False)),
            consolidation_delay_minutes=delay,
            node_pool_auto_creation=bool((spec.get("nodePoolAutoCreation") or {}).get("enabled", False)),
        )


def _parse_rule(class_name: str, index: int, raw: Any) -> PriorityRule:
    if not isinstance(raw, Mapping):
        raise ValueError(f"ComputeClass {class_name}: priorities[{index}] must be a mapping")
    tpu = raw.get("tpu")
    gpu = raw.get("gpu")
    for label, sub in (("tpu", tpu), ("gpu", gpu)):
        if sub is not None and not (isinstance(sub, Mapping) and sub.get("type")):
            raise ValueError(f"ComputeClass {class_name}: priorities[{index}].{label} needs a type")
    spot = raw.get("spot")
    return PriorityRule(
        nodepools=tuple(str(p) for p in raw.get("nodepools") or ()),
        machine_family=raw.get("machineFamily"),
        machine_type=raw.get("machineType"),
        tpu=TpuRule(str(tpu["type"]), tpu.get("count"), tpu.get("topology")) if tpu else None,
        gpu=GpuRule(str(gpu["type"]), gpu.get("count"), gpu.get("driverVersion")) if gpu else None,
        spot=None if spot is None else bool(spot),
    )
