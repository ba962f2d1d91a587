"""Scenario files: what a local cloud offers (zones, types, capacity, quotas, timings, faults).

The schema is documented in include/interlude_localcloud/README.md. A scenario is plain YAML so tests and demos
can describe "TPUs are stocked out, GPUs are free" without code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from interlude_localcloud.catalog import runtime_versions_for
from interlude_localcloud.compute_tpu_catalog import TPU_MACHINE_TYPES
from interlude_localcloud.gke.config import ClusterSpec, parse_gke

SCENARIO_DIR = Path(__file__).parent / "scenarios"

DEFAULT_DELAYS: dict[str, float] = {
    "tpu_create": 120.0,
    "tpu_delete": 60.0,
    "tpu_start": 60.0,
    "tpu_stop": 30.0,
    "queue_accept": 30.0,
    "gce_create": 30.0,
    "gce_delete": 30.0,
    "gce_start": 20.0,
    "gce_stop": 20.0,
    "gke_node_pool_create": 60.0,
    "gke_node_pool_delete": 30.0,
    "gke_resize": 30.0,
    # GKE's configurable delay before a TPU priority's stockout falls through to the next ComputeClass priority
    # (https://cloud.google.com/kubernetes-engine/docs/troubleshooting/custom-computeclass); 0 = none
    "gke_tpu_fallback_wait": 0.0,
}

DEFAULT_MAINTENANCE: dict[str, dict[str, float]] = {
    "tpu": {"scheduled_notice": 7200.0, "unscheduled_notice": 60.0, "duration": 600.0},
    "gce": {"scheduled_notice": 3600.0, "unscheduled_notice": 60.0, "duration": 300.0},
}


@dataclass
class Tier:
    """Capacity for one type in one zone, per provisioning tier (units: TPU nodes, or GPUs)."""

    on_demand: int = 0
    spot: int = 0


@dataclass
class Zone:
    name: str
    region: str
    tpu_types: list[str] = field(default_factory=list)
    runtime_versions: list[str] = field(default_factory=list)
    tpu_capacity: dict[str, Tier] = field(default_factory=dict)
    gpu_types: list[str] = field(default_factory=list)
    machine_types: list[str] = field(default_factory=list)
    tpu_machine_types: list[str] = field(default_factory=list)  # Compute Engine TPU VMs (compute_tpu_catalog.py)
    gpu_capacity: dict[str, Tier] = field(default_factory=dict)  # GPUs per GPU type; TPU chips per TPU accelerator
    reservations: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Fault:
    """The next `count` requests matching method/path_regex are answered with `status`."""

    path_regex: str
    status: int = 503
    count: int = 1
    method: str | None = None


@dataclass
class Scenario:
    project: str = "interlude-local"
    time_scale: float = 1.0
    zones: dict[str, Zone] = field(default_factory=dict)
    quotas: dict[str, dict[str, float]] = field(default_factory=dict)
    tpu_quotas: dict[str, dict[str, float]] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_DELAYS))
    maintenance: dict[str, dict[str, float]] = field(
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_MAINTENANCE.items()}
    )
    faults: list[Fault] = field(default_factory=list)
    stop_grace_seconds: float = 3.0
    gke_clusters: list[ClusterSpec] = field(default_factory=list)

    def delay(self, key: str) -> float:
        """Real seconds for a named simulated delay."""
        return self.delays.get(key, 0.0) / self.time_scale

    def regions(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for z in self.zones.values():
            out.setdefault(z.region, []).append(z.name)
        for r in self.quotas:
            out.setdefault(r, [])
        return out


def _tiers(raw: dict[str, Any] | None) -> dict[str, Tier]:
    out: dict[str, Tier] = {}
    for name, val in (raw or {}).items():
        if isinstance(val, int):
            out[name] = Tier(on_demand=val, spot=val)
        else:
            out[name] = Tier(on_demand=int(val.get("on_demand", 0)), spot=int(val.get("spot", 0)))
    return out


def _tpu_machine_types(zone: str, raw: list[str] | None) -> list[str]:
    """The zone's Compute Engine TPU machine types; a name the catalog lacks is an error (a typo, or a type
    Google does not document), so a zone offers TPU7x only where its scenario names tpu7x-standard-4t."""
    names = [str(n) for n in raw or []]
    unknown = [n for n in names if n not in TPU_MACHINE_TYPES]
    if unknown:
        raise ValueError(f"zone {zone}: unknown TPU machine types {unknown}; known: {sorted(TPU_MACHINE_TYPES)}")
    return names


def parse(raw: dict[str, Any]) -> Scenario:
    """Build a Scenario from the YAML mapping (unknown keys are an error, to catch typos)."""
    known = {
        "project",
        "time_scale",
        "zones",
        "regions",
        "delays",
        "maintenance",
        "faults",
        "stop_grace_seconds",
        "description",
        "gke",
    }
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown scenario keys: {sorted(unknown)}")
    sc = Scenario(project=raw.get("project", "interlude-local"), time_scale=float(raw.get("time_scale", 1)))
    sc.stop_grace_seconds = float(raw.get("stop_grace_seconds", 3.0))
    for name, z in (raw.get("zones") or {}).items():
        tpu = z.get("tpu") or {}
        gpu = z.get("gpu") or {}
        sc.zones[name] = Zone(
            name=name,
            region=z.get("region") or name.rsplit("-", 1)[0],
            tpu_types=list(tpu.get("accelerator_types", [])),
            runtime_versions=list(tpu["runtime_versions"])
            if "runtime_versions" in tpu
            else runtime_versions_for(list(tpu.get("accelerator_types", []))),
            tpu_capacity=_tiers(tpu.get("capacity")),
            gpu_types=list(gpu.get("accelerator_types", [])),
            machine_types=list(gpu.get("machine_types", [])),
            tpu_machine_types=_tpu_machine_types(name, gpu.get("tpu_machine_types")),
            gpu_capacity=_tiers(gpu.get("capacity")),
            reservations=list(gpu.get("reservations", [])),
        )
        if tpu.get("quota"):
            sc.tpu_quotas[name] = {k: float(v) for k, v in tpu["quota"].items()}
    for region, r in (raw.get("regions") or {}).items():
        sc.quotas[region] = {k: float(v) for k, v in (r.get("quotas") or {}).items()}
    sc.delays.update({k: float(v) for k, v in (raw.get("delays") or {}).items()})
    for kind, vals in (raw.get("maintenance") or {}).items():
        sc.maintenance.setdefault(kind, {}).update({k: float(v) for k, v in vals.items()})
    sc.faults = [Fault(**f) for f in raw.get("faults") or []]
    sc.gke_clusters = parse_gke(raw.get("gke"))
    return sc


def load(path_or_name: str | Path) -> Scenario:
    """Load a scenario by path, or by the name of a shipped scenario ("default", "tpu_capacity_one")."""
    p = Path(path_or_name)
    if not p.exists():
        p = SCENARIO_DIR / (str(path_or_name).removesuffix(".yaml") + ".yaml")
    return parse(yaml.load(p.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {})  # libyaml's
