"""What Google lets us know about accelerator capacity, as one typed, JSON-shaped report.

Google offers no capacity query and no dry run: a stockout shows only when a create fails. So the
report holds what *can* be read (offered types, regional quotas, free reservations, existing queued
resources) plus the stockouts this run has already met. The decision trees (``decisions.py``) read it;
provisioning marks a stockout it meets with :func:`mark_stockout` and walks the tree again.

"unknown" is a real quota answer: the TPU API exposes no quotas, and Compute's regional quotas have no
on-demand metric for H100/H200/B200. Unknown means "try, and handle the stockout or quota error".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class AcceleratorKind(StrEnum):
    TPU = "tpu"
    GPU = "gpu"


# The platform an entry describes when it names none: where each family was provisioned before platforms existed
# (TPU types by the Cloud TPU API, GPUs as Compute Engine VMs). interlude.capacity.platforms holds the full table.
DEFAULT_PLATFORM = {"tpu": "tpu_api", "gpu": "compute"}


class QuotaState(StrEnum):
    OK = "ok"
    EXHAUSTED = "exhausted"
    UNKNOWN = "unknown"


def kind_of(accelerator_type: str) -> AcceleratorKind:
    """GPU types are Compute accelerator names (``nvidia-...``); everything else is a TPU type."""
    return AcceleratorKind.GPU if accelerator_type.startswith("nvidia-") else AcceleratorKind.TPU


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1`` (quotas are regional, capacity is zonal)."""
    region, sep, _ = zone.rpartition("-")
    if not sep or not region:
        raise ValueError(f"not a zone name: {zone!r} (expected e.g. 'us-central1-a')")
    return region


# Compute regional quota metrics per GPU type: (on-demand metric, spot/preemptible metric).
# None = Compute's regional quotas have no such metric (it lives in Cloud Quotas): quota is unknown.
GPU_QUOTA_METRICS: Mapping[str, tuple[str | None, str | None]] = {
    "nvidia-l4": ("NVIDIA_L4_GPUS", "PREEMPTIBLE_NVIDIA_L4_GPUS"),
    "nvidia-tesla-t4": ("NVIDIA_T4_GPUS", "PREEMPTIBLE_NVIDIA_T4_GPUS"),
    "nvidia-tesla-a100": ("NVIDIA_A100_GPUS", "PREEMPTIBLE_NVIDIA_A100_GPUS"),
    "nvidia-a100-80gb": ("NVIDIA_A100_80GB_GPUS", "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS"),
    "nvidia-h100-80gb": (None, "PREEMPTIBLE_NVIDIA_H100_GPUS"),
    "nvidia-h100-mega-80gb": (None, "PREEMPTIBLE_NVIDIA_H100_MEGA_GPUS"),
    "nvidia-h200-141gb": (None, "PREEMPTIBLE_NVIDIA_H200_GPUS"),
    "nvidia-b200": (None, "PREEMPTIBLE_NVIDIA_B200_GPUS"),
}

# Machine types whose GPUs are built in (no guestAccelerators in a reservation): type -> (gpu, count).
# Needed to tell which GPU type a reservation holds.
GPU_MACHINE_TYPES: Mapping[str, tuple[str, int]] = {
    "a4-highgpu-8g": ("nvidia-b200", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8),
    "a3-highgpu-1g": ("nvidia-h100-80gb", 1),
    "a3-highgpu-2g": ("nvidia-h100-80gb", 2),
    "a3-highgpu-4g": ("nvidia-h100-80gb", 4),
    "a3-highgpu-8g": ("nvidia-h100-80gb", 8),
    "a2-ultragpu-1g": ("nvidia-a100-80gb", 1),
    "a2-ultragpu-2g": ("nvidia-a100-80gb", 2),
    "a2-ultragpu-4g": ("nvidia-a100-80gb", 4),
    "a2-ultragpu-8g": ("nvidia-a100-80gb", 8),
    "a2-highgpu-1g": ("nvidia-tesla-a100", 1),
    "a2-highgpu-2g": ("nvidia-tesla-a100", 2),
    "a2-highgpu-4g": ("nvidia-tesla-a100", 4),
    "a2-highgpu-8g": ("nvidia-tesla-a100", 8),
    "g2-standard-4": ("nvidia-l4", 1),
    "g2-standard-8": ("nvidia-l4", 1),
    "g2-standard-12": ("nvidia-l4", 1),
    "g2-standard-16": ("nvidia-l4", 1),
    "g2-standard-24": ("nvidia-l4", 2),
    "g2-standard-32": ("nvidia-l4", 1),
    "g2-standard-48": ("nvidia-l4", 4),
    "g2-standard-96": ("nvidia-l4", 8),
}


@dataclass(frozen=True)
class ReservationRoom:
    """Free room in one Compute reservation: whole VMs of ``machine_type``, each with ``gpus_per_vm``."""

    name: str
    machine_type: str
    free_vms: int
    gpus_per_vm: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "machine_type": self.machine_type,
            "free_vms": self.free_vms,
            "gpus_per_vm": self.gpus_per_vm,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReservationRoom:
        return cls(
            name=str(data["name"]),
            machine_type=str(data["machine_type"]),
            free_vms=int(data["free_vms"]),
            gpus_per_vm=int(data["gpus_per_vm"]),
        )


@dataclass(frozen=True)
class CapacityEntry:
    """What is known about one accelerator type in one zone, on one platform.

    ``platform`` is where it would run (``tpu_api``, ``compute``, ``gke``; blank = the family's default:
    TPU types on the Cloud TPU API, GPUs on Compute Engine); ``machine_type`` the Compute Engine machine type a
    TPU type is offered as there (``ct6e-standard-8t`` for v6e-8).

    ``quota_headroom`` is limit - usage in accelerator units (GPUs) when the quota is known.
    ``reserved`` counts free reserved units (GPUs for GPU types), detailed per reservation in
    ``reservations``. ``queued`` counts queued resources that already exist for this type and zone.
    """

    zone: str
    accelerator_type: str
    kind: AcceleratorKind
    offered: bool
    quota: QuotaState = QuotaState.UNKNOWN
    quota_metric: str | None = None
    quota_headroom: float | None = None
    spot_quota: QuotaState = QuotaState.UNKNOWN
    spot_quota_headroom: float | None = None
    reserved: int = 0
    reservations: tuple[ReservationRoom, ...] = ()
    queued: int = 0
    stocked_out: bool = False
    platform: str = ""
    machine_type: str | None = None

    def __post_init__(self) -> None:
        if not self.platform:
            object.__setattr__(self, "platform", DEFAULT_PLATFORM[self.kind.value])

    @property
    def region(self) -> str:
        return region_of(self.zone)

    @property
    def where(self) -> str:
        """The zone, and the platform when it is not the family's default: ``us-central1-a on compute``."""
        if self.platform == DEFAULT_PLATFORM[self.kind.value]:
            return self.zone
        return f"{self.zone} on {self.platform}" + (f" ({self.machine_type})" if self.machine_type else "")

    @property
    def available(self) -> bool:
        """Offered, no stockout met in this run, and either quota not exhausted or reserved room.

        A reservation's capacity was charged against quota when it was made, so free reserved room is
        usable even when the on-demand quota is used up.
        """
        return self.offered and not self.stocked_out and (self.quota != QuotaState.EXHAUSTED or self.reserved > 0)

    def quota_allows(self, count: int) -> bool:
        """On-demand quota is not known to forbid ``count`` more units (unknown = try)."""
        if self.quota == QuotaState.EXHAUSTED:
            return False
        return self.quota_headroom is None or self.quota_headroom >= count

    def spot_quota_allows(self, count: int) -> bool:
        if self.spot_quota == QuotaState.EXHAUSTED:
            return False
        return self.spot_quota_headroom is None or self.spot_quota_headroom >= count

    def reservation_for(self, count: int, machine_type: str | None) -> ReservationRoom | None:
        """A reservation with room for one VM of ``machine_type`` carrying ``count`` accelerators."""
        for room in self.reservations:
            if room.free_vms < 1:
                continue
            if machine_type is not None and room.machine_type != machine_type:
                continue
            if room.gpus_per_vm >= count:
                return room
        return None

    def describe(self) -> str:
        """One line for trails and stuck reports, e.g. ``us-central1-a: offered, quota ok (4 free)``; a platform
        other than the family's default is named: ``us-central1-a on compute (ct6e-standard-8t): ...``."""
        where = self.where
        if not self.offered:
            return f"{where}: not offered"
        parts = ["offered"]
        quota = f"quota {self.quota.value}"
        if self.quota_headroom is not None:
            quota += f" ({self.quota_headroom:g} free of {self.quota_metric})"
        elif self.quota_metric is None and self.kind == AcceleratorKind.GPU:
            quota += " (no regional metric)"
        elif self.kind == AcceleratorKind.TPU and self.platform == "tpu_api":
            quota += " (TPU API exposes none)"
        elif self.kind == AcceleratorKind.TPU:
            quota += " (TPU VM quotas live in Cloud Quotas)"
        parts.append(quota)
        if self.reserved:
            parts.append(f"{self.reserved} reserved free")
        if self.queued:
            parts.append(f"{self.queued} queued resource(s) exist")
        if self.stocked_out:
            parts.append("STOCKOUT met earlier in this run")
        return f"{where}: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "zone": self.zone,
            "accelerator_type": self.accelerator_type,
            "kind": self.kind.value,
            "offered": self.offered,
            "quota": self.quota.value,
            "quota_metric": self.quota_metric,
            "quota_headroom": self.quota_headroom,
            "spot_quota": self.spot_quota.value,
            "spot_quota_headroom": self.spot_quota_headroom,
            "reserved": self.reserved,
            "reservations": [r.to_dict() for r in self.reservations],
            "queued": self.queued,
            "stocked_out": self.stocked_out,
            "platform": self.platform,
            "machine_type": self.machine_type,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityEntry:
        headroom = data.get("quota_headroom")
        spot_headroom = data.get("spot_quota_headroom")
        return cls(
            zone=str(data["zone"]),
            accelerator_type=str(data["accelerator_type"]),
            kind=AcceleratorKind(data["kind"]),
            offered=bool(data["offered"]),
            quota=QuotaState(data.get("quota", "unknown")),
            quota_metric=data.get("quota_metric"),
            quota_headroom=None if headroom is None else float(headroom),
            spot_quota=QuotaState(data.get("spot_quota", "unknown")),
            spot_quota_headroom=None if spot_headroom is None else float(spot_headroom),
            reserved=int(data.get("reserved", 0)),
            reservations=tuple(ReservationRoom.from_dict(r) for r in data.get("reservations", ())),
            queued=int(data.get("queued", 0)),
            stocked_out=bool(data.get("stocked_out", False)),
            platform=str(data.get("platform") or ""),
            machine_type=data.get("machine_type"),
        )


@dataclass(frozen=True)
class CapacityReport:
    """Capacity per zone x accelerator type x platform, in probe order (zone order is preference order).

    ``platforms`` is the run's order of preference among the platforms probed (empty: the order they first
    appear in ``entries``).
    """

    entries: tuple[CapacityEntry, ...]
    probed_at: str = ""
    notes: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    _index: dict[tuple[str, str, str], CapacityEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {(e.zone, e.accelerator_type, e.platform): e for e in self.entries})
        if not self.platforms:
            object.__setattr__(self, "platforms", tuple(dict.fromkeys(e.platform for e in self.entries)))

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.zone for e in self.entries))

    @property
    def accelerator_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.accelerator_type for e in self.entries))

    def get(self, zone: str, accelerator_type: str, platform: str | None = None) -> CapacityEntry | None:
        """The entry of (zone, type) on ``platform``; None = on the first platform that has one."""
        if platform is not None:
            return self._index.get((zone, accelerator_type, platform))
        return next((e for e in self.entries if (e.zone, e.accelerator_type) == (zone, accelerator_type)), None)

    def for_type(self, accelerator_type: str) -> tuple[CapacityEntry, ...]:
        return tuple(e for e in self.entries if e.accelerator_type == accelerator_type)

    def available(self, accelerator_type: str) -> tuple[CapacityEntry, ...]:
        return tuple(e for e in self.for_type(accelerator_type) if e.available)

    def to_dict(self) -> dict[str, Any]:
        return {
            "probed_at": self.probed_at,
            "notes": list(self.notes),
            "platforms": list(self.platforms),
            "entries": [e.to_dict() for e in self.entries],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityReport:
        return cls(
            entries=tuple(CapacityEntry.from_dict(e) for e in data.get("entries", ())),
            probed_at=str(data.get("probed_at", "")),
            notes=tuple(data.get("notes", ())),
            platforms=tuple(data.get("platforms", ())),
        )

    def table(self) -> str:
        """A fixed-width table for the task log: one row per zone x type, then the notes."""
        header = (
            "zone",
            "type",
            "kind",
            "platform",
            "offered",
            "quota",
            "headroom",
            "reserved",
            "queued",
            "stockout",
            "available",
        )
        rows = [header]
        for e in self.entries:
            rows.append(
                (
                    e.zone,
                    e.accelerator_type,
                    e.kind.value,
                    e.platform,
                    "yes" if e.offered else "no",
                    e.quota.value,
                    "-" if e.quota_headroom is None else f"{e.quota_headroom:g}",
                    str(e.reserved),
                    str(e.queued),
                    "YES" if e.stocked_out else "no",
                    "yes" if e.available else "no",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if not self.entries:
            lines.append("(no zone x accelerator pairs probed)")
        title = f"Capacity report{' at ' + self.probed_at if self.probed_at else ''}"
        out = [title, *lines]
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)


def mark_stockout(
    report: CapacityReport, zone: str, accelerator_type: str, platform: str | None = None
) -> CapacityReport:
    """A new report with (zone, type) on ``platform`` marked stocked out, so the tree can be walked again.

    ``platform`` None marks the pair on every platform (a lost place that does not say where it ran: the
    conservative reading). A pair the report did not hold is added (offered, quota unknown, stocked out):
    provisioning met it, so it exists, and the next walk must not pick it.
    """

    def hit(e: CapacityEntry) -> bool:
        return (e.zone, e.accelerator_type) == (zone, accelerator_type) and platform in (None, e.platform)

    if not any(hit(e) for e in report.entries):
        added = CapacityEntry(
            zone=zone,
            accelerator_type=accelerator_type,
            kind=kind_of(accelerator_type),
            offered=True,
            stocked_out=True,
            platform=platform or "",
        )
        return replace(report, entries=(*report.entries, added))
    return replace(report, entries=tuple(replace(e, stocked_out=True) if hit(e) else e for e in report.entries))
