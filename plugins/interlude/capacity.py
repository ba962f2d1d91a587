"""What Google lets us know about accelerator capacity, as one typed, JSON-shaped report.

Google offers no capacity query and no dry run: a stockout shows only when a create fails. So the
report holds what *can* be read (offered types, regional quotas, free reservations, existing queued
resources) plus the stockouts this run has already met. The decision trees (``decisions.py``) read it;
provisioning marks a stockout it meets with :func:`mark_stockout` and walks the tree again.

"unknown" is a real quota answer: the TPU API exposes no quotas, and Compute's regional quotas have no
on-demand metric for H100/H200/B200. Unknown means "try, and handle the stockout or quota error".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol


class AcceleratorKind(StrEnum):
    TPU = "tpu"
    GPU = "gpu"


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
    """What is known about one accelerator type in one zone.

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

    @property
    def region(self) -> str:
        return region_of(self.zone)

    @property
    def available(self) -> bool:
        """Offered, no stockout met in this run, and either quota not exhausted or reserved room.

        A reservation's capacity was charged against quota when it was made, so free reserved room is
        usable even when the on-demand quota is used up.
        """
        return (
            self.offered
            and not self.stocked_out
            and (self.quota != QuotaState.EXHAUSTED or self.reserved > 0)
        )

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
        """One line for trails and stuck reports, e.g. ``us-central1-a: offered, quota ok (4 free)``."""
        if not self.offered:
            return f"{self.zone}: not offered"
        parts = ["offered"]
        quota = f"quota {self.quota.value}"
        if self.quota_headroom is not None:
            quota += f" ({self.quota_headroom:g} free of {self.quota_metric})"
        elif self.quota_metric is None and self.kind == AcceleratorKind.GPU:
            quota += " (no regional metric)"
        elif self.kind == AcceleratorKind.TPU:
            quota += " (TPU API exposes none)"
        parts.append(quota)
        if self.reserved:
            parts.append(f"{self.reserved} reserved free")
        if self.queued:
            parts.append(f"{self.queued} queued resource(s) exist")
        if self.stocked_out:
            parts.append("STOCKOUT met earlier in this run")
        return f"{self.zone}: " + ", ".join(parts)

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
        )


@dataclass(frozen=True)
class CapacityReport:
    """Capacity per zone x accelerator type, in probe order (zone order is preference order)."""

    entries: tuple[CapacityEntry, ...]
    probed_at: str = ""
    notes: tuple[str, ...] = ()
    _index: dict[tuple[str, str], CapacityEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {(e.zone, e.accelerator_type): e for e in self.entries})

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.zone for e in self.entries))

    @property
    def accelerator_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.accelerator_type for e in self.entries))

    def get(self, zone: str, accelerator_type: str) -> CapacityEntry | None:
        return self._index.get((zone, accelerator_type))

    def for_type(self, accelerator_type: str) -> tuple[CapacityEntry, ...]:
        return tuple(e for e in self.entries if e.accelerator_type == accelerator_type)

    def available(self, accelerator_type: str) -> tuple[CapacityEntry, ...]:
        return tuple(e for e in self.for_type(accelerator_type) if e.available)

    def to_dict(self) -> dict[str, Any]:
        return {
            "probed_at": self.probed_at,
            "notes": list(self.notes),
            "entries": [e.to_dict() for e in self.entries],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityReport:
        return cls(
            entries=tuple(CapacityEntry.from_dict(e) for e in data.get("entries", ())),
            probed_at=str(data.get("probed_at", "")),
            notes=tuple(data.get("notes", ())),
        )

    def table(self) -> str:
        """A fixed-width table for the task log: one row per zone x type, then the notes."""
        header = (
            "zone",
            "type",
            "kind",
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
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if not self.entries:
            lines.append("(no zone x accelerator pairs probed)")
        title = f"Capacity report{' at ' + self.probed_at if self.probed_at else ''}"
        out = [title, *lines]
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)


def mark_stockout(report: CapacityReport, zone: str, accelerator_type: str) -> CapacityReport:
    """A new report with (zone, type) marked stocked out, so the tree can be walked again.

    A pair the report did not hold is added (offered, quota unknown, stocked out): provisioning met it,
    so it exists, and the next walk must not pick it.
    """
    if report.get(zone, accelerator_type) is None:
        added = CapacityEntry(
            zone=zone,
            accelerator_type=accelerator_type,
            kind=kind_of(accelerator_type),
            offered=True,
            stocked_out=True,
        )
        return replace(report, entries=(*report.entries, added))
    entries = tuple(
        replace(e, stocked_out=True) if (e.zone, e.accelerator_type) == (zone, accelerator_type) else e
        for e in report.entries
    )
    return replace(report, entries=entries)


# ---------------------------------------------------------------------------------------------------
# Probing (read-only) through the hooks.


class CapacityProbeError(RuntimeError):
    """The probe learned nothing about a whole accelerator family (every offered-types read failed)."""

    def __init__(self, message: str, notes: Sequence[str]) -> None:
        super().__init__(message + "".join(f"\n  {n}" for n in notes))
        self.notes = tuple(notes)


class TpuCapacitySource(Protocol):
    """The read-only part of ``interlude.hooks.TpuHook`` the probe needs."""

    def list_accelerator_types(self, zone: str) -> list[str]: ...

    def list_queued_resources(self, zone: str) -> list[dict]: ...


class ComputeCapacitySource(Protocol):
    """The read-only part of ``interlude.hooks.ComputeHook`` the probe needs."""

    def list_accelerator_types(self, zone: str) -> list[str]: ...

    def get_region_quotas(self, region: str) -> dict[str, tuple[float, float]]: ...

    def list_reservations(self, zone: str) -> list[dict]: ...


def _short(name: str) -> str:
    """Last path segment of a resource URL or name (Compute returns full URLs in many fields)."""
    return name.rstrip("/").rsplit("/", 1)[-1]


def _quota(
    quotas: Mapping[str, tuple[float, float]] | None, metric: str | None
) -> tuple[QuotaState, float | None]:
    if quotas is None or metric is None or metric not in quotas:
        return QuotaState.UNKNOWN, None
    limit, usage = quotas[metric]
    headroom = float(limit) - float(usage)
    return (QuotaState.OK if headroom >= 1 else QuotaState.EXHAUSTED), headroom


def reservation_rooms(reservations: Iterable[Mapping[str, Any]]) -> dict[str, list[ReservationRoom]]:
    """Free room per GPU type in Compute reservations (raw REST JSON, as ``list_reservations`` gives).

    Only READY (or status-less) specific reservations count. The GPU type comes from
    ``guestAccelerators`` or, for machine types with built-in GPUs, from the machine type.
    """
    rooms: dict[str, list[ReservationRoom]] = {}
    for res in reservations:
        if res.get("status", "READY") != "READY":
            continue
        spec = res.get("specificReservation") or {}
        props = spec.get("instanceProperties") or {}
        machine_type = _short(str(props.get("machineType", "")))
        free = int(spec.get("count", 0)) - int(spec.get("inUseCount", 0))
        if free <= 0:
            continue
        accelerators = props.get("guestAccelerators") or []
        if accelerators:
            pairs = [
                (_short(str(a.get("acceleratorType", ""))), int(a.get("acceleratorCount", 0)))
                for a in accelerators
            ]
        elif machine_type in GPU_MACHINE_TYPES:
            pairs = [GPU_MACHINE_TYPES[machine_type]]
        else:
            continue
        for gpu_type, per_vm in pairs:
            if per_vm > 0:
                rooms.setdefault(gpu_type, []).append(
                    ReservationRoom(
                        name=str(res.get("name", "")),
                        machine_type=machine_type,
                        free_vms=free,
                        gpus_per_vm=per_vm,
                    )
                )
    return rooms


def _queued_types(queued_resources: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Count live queued resources per accelerator type (raw TPU REST JSON)."""
    counts: dict[str, int] = {}
    for qr in queued_resources:
        state = (qr.get("state") or {}).get("state", "")
        if state in ("FAILED", "DELETING", "SUSPENDED"):
            continue
        for spec in (qr.get("tpu") or {}).get("nodeSpec", []) or []:
            accel = str((spec.get("node") or {}).get("acceleratorType", ""))
            if accel:
                counts[accel] = counts.get(accel, 0) + 1
    return counts


def probe_capacity(
    tpu_hook: TpuCapacitySource | None,
    compute_hook: ComputeCapacitySource | None,
    zones: Sequence[str],
    tpu_types: Sequence[str],
    gpu_types: Sequence[str],
    stockouts: Iterable[tuple[str, str]] = (),
    now: dt.datetime | None = None,
) -> CapacityReport:
    """Read what Google exposes for every zone x type; never creates or changes anything.

    A failing read does not fail the probe: the pair gets the most honest answer left (not offered
    when the type list could not be read, quota unknown when quotas could not be read) and the error
    goes into ``notes`` for the log. The tree can still decide on what is known. One exception: when
    the offered-type list of a family could be read in *no* zone, nothing was learned about that family
    (typically wrong project or missing permission), and deciding on it would only wait or stick for
    the wrong reason, so :class:`CapacityProbeError` is raised with every note.
    """
    notes: list[str] = []
    offered_reads = {AcceleratorKind.TPU: 0, AcceleratorKind.GPU: 0}
    stocked = {(z, t) for z, t in stockouts}
    quotas_by_region: dict[str, dict[str, tuple[float, float]] | None] = {}
    entries: list[CapacityEntry] = []

    def read(what: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except Exception as exc:  # noqa: BLE001 - partial knowledge beats a failed probe; noted below
            notes.append(f"{what}({', '.join(map(str, args))}) failed: {type(exc).__name__}: {exc}")
            return None

    if tpu_types and tpu_hook is None:
        notes.append("no TPU hook given: TPU types reported as not offered")
    if gpu_types and compute_hook is None:
        notes.append("no Compute hook given: GPU types reported as not offered")
    if tpu_types:
        notes.append("TPU quotas: the TPU API exposes none (Cloud Quotas holds them): quota unknown")
        notes.append("TPU reservations are not read by this probe: reserved is 0 for TPU types")

    for zone in zones:
        if tpu_types:
            offered_tpu: set[str] = set()
            queued: dict[str, int] = {}
            if tpu_hook is not None:
                listed = read("tpu.list_accelerator_types", tpu_hook.list_accelerator_types, zone)
                offered_reads[AcceleratorKind.TPU] += listed is not None
                offered_tpu = set(listed or ())
                queued = _queued_types(
                    read("tpu.list_queued_resources", tpu_hook.list_queued_resources, zone) or ()
                )
            for tpu_type in tpu_types:
                entries.append(
                    CapacityEntry(
                        zone=zone,
                        accelerator_type=tpu_type,
                        kind=AcceleratorKind.TPU,
                        offered=tpu_type in offered_tpu,
                        queued=queued.get(tpu_type, 0),
                        stocked_out=(zone, tpu_type) in stocked,
                    )
                )
        if gpu_types:
            region = region_of(zone)
            offered_gpu: set[str] = set()
            rooms: dict[str, list[ReservationRoom]] = {}
            if compute_hook is not None:
                listed = read("compute.list_accelerator_types", compute_hook.list_accelerator_types, zone)
                offered_reads[AcceleratorKind.GPU] += listed is not None
                offered_gpu = set(listed or ())
                if region not in quotas_by_region:
                    quotas_by_region[region] = read(
                        "compute.get_region_quotas", compute_hook.get_region_quotas, region
                    )
                rooms = reservation_rooms(
                    read("compute.list_reservations", compute_hook.list_reservations, zone) or ()
                )
            quotas = quotas_by_region.get(region)
            for gpu_type in gpu_types:
                metric, spot_metric = GPU_QUOTA_METRICS.get(gpu_type, (None, None))
                quota, headroom = _quota(quotas, metric)
                spot_quota, spot_headroom = _quota(quotas, spot_metric)
                type_rooms = tuple(rooms.get(gpu_type, ()))
                entries.append(
                    CapacityEntry(
                        zone=zone,
                        accelerator_type=gpu_type,
                        kind=AcceleratorKind.GPU,
                        offered=gpu_type in offered_gpu,
                        quota=quota,
                        quota_metric=metric,
                        quota_headroom=headroom,
                        spot_quota=spot_quota,
                        spot_quota_headroom=spot_headroom,
                        reserved=sum(r.free_vms * r.gpus_per_vm for r in type_rooms),
                        reservations=type_rooms,
                        stocked_out=(zone, gpu_type) in stocked,
                    )
                )
    blind = [
        kind.value.upper()
        for kind, types, hook in (
            (AcceleratorKind.TPU, tpu_types, tpu_hook),
            (AcceleratorKind.GPU, gpu_types, compute_hook),
        )
        if types and hook is not None and zones and offered_reads[kind] == 0
    ]
    if blind:
        raise CapacityProbeError(
            f"could not list offered {' and '.join(blind)} types in any zone ({', '.join(zones)}); "
            "check the project and the connection's permissions",
            notes,
        )
    when = (now or dt.datetime.now(dt.UTC)).isoformat()
    return CapacityReport(entries=tuple(entries), probed_at=when, notes=tuple(notes))
