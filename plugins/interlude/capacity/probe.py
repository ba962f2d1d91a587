"""Probing capacity (read-only) through the hooks: what Google exposes per zone x accelerator type.

Split from capacity.py (the report's data) because this is the only part that talks to the cloud.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from interlude.capacity.report import (
    GPU_MACHINE_TYPES,
    GPU_QUOTA_METRICS,
    AcceleratorKind,
    CapacityEntry,
    CapacityReport,
    QuotaState,
    ReservationRoom,
    region_of,
)


class CapacityProbeError(RuntimeError):
    """The probe learned nothing about a whole accelerator family (every offered-types read failed)."""

    def __init__(self, message: str, notes: Sequence[str]) -> None:
        super().__init__(message + "".join(f"\n  {n}" for n in notes))
        self.notes = tuple(notes)


class TpuCapacitySource(Protocol):
    """The read-only part of ``interlude.hooks.TpuHook`` the probe needs."""

    def list_accelerator_types(self, zone: str) -> list[str]: ...

    def list_queued_resources(self, zone: str) -> list[dict[str, Any]]: ...


class ComputeCapacitySource(Protocol):
    """The read-only part of ``interlude.hooks.ComputeHook`` the probe needs."""

    def list_accelerator_types(self, zone: str) -> list[str]: ...

    def get_region_quotas(self, region: str) -> dict[str, tuple[float, float]]: ...

    def list_reservations(self, zone: str) -> list[dict[str, Any]]: ...


def _short(name: str) -> str:
    """Last path segment of a resource URL or name (Compute returns full URLs in many fields)."""
    return name.rstrip("/").rsplit("/", 1)[-1]


def _quota(quotas: Mapping[str, tuple[float, float]] | None, metric: str | None) -> tuple[QuotaState, float | None]:
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
                (_short(str(a.get("acceleratorType", ""))), int(a.get("acceleratorCount", 0))) for a in accelerators
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


class _Probe:
    """One probe's reads and what they taught: entries, notes, and which families were readable at all."""

    def __init__(
        self,
        tpu_hook: TpuCapacitySource | None,
        compute_hook: ComputeCapacitySource | None,
        stockouts: Iterable[tuple[str, str]],
    ) -> None:
        self.tpu_hook, self.compute_hook = tpu_hook, compute_hook
        self.notes: list[str] = []
        self.offered_reads = {AcceleratorKind.TPU: 0, AcceleratorKind.GPU: 0}
        self.stocked = {(z, t) for z, t in stockouts}
        self.quotas_by_region: dict[str, dict[str, tuple[float, float]] | None] = {}
        self.entries: list[CapacityEntry] = []

    def read(self, what: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except Exception as exc:  # noqa: BLE001 - partial knowledge beats a failed probe; noted
            self.notes.append(f"{what}({', '.join(map(str, args))}) failed: {type(exc).__name__}: {exc}")
            return None

    def tpu_zone(self, zone: str, tpu_types: Sequence[str]) -> None:
        offered: set[str] = set()
        queued: dict[str, int] = {}
        if self.tpu_hook is not None:
            listed = self.read("tpu.list_accelerator_types", self.tpu_hook.list_accelerator_types, zone)
            self.offered_reads[AcceleratorKind.TPU] += listed is not None
            offered = set(listed or ())
            queued = _queued_types(
                self.read("tpu.list_queued_resources", self.tpu_hook.list_queued_resources, zone) or ()
            )
        for tpu_type in tpu_types:
            self.entries.append(
                CapacityEntry(
                    zone=zone,
                    accelerator_type=tpu_type,
                    kind=AcceleratorKind.TPU,
                    offered=tpu_type in offered,
                    queued=queued.get(tpu_type, 0),
                    stocked_out=(zone, tpu_type) in self.stocked,
                )
            )

    def gpu_zone(self, zone: str, gpu_types: Sequence[str]) -> None:
        region = region_of(zone)
        offered: set[str] = set()
        rooms: dict[str, list[ReservationRoom]] = {}
        hook = self.compute_hook
        if hook is not None:
            listed = self.read("compute.list_accelerator_types", hook.list_accelerator_types, zone)
            self.offered_reads[AcceleratorKind.GPU] += listed is not None
            offered = set(listed or ())
            if region not in self.quotas_by_region:
                self.quotas_by_region[region] = self.read("compute.get_region_quotas", hook.get_region_quotas, region)
            rooms = reservation_rooms(self.read("compute.list_reservations", hook.list_reservations, zone) or ())
        quotas = self.quotas_by_region.get(region)
        for gpu_type in gpu_types:
            metric, spot_metric = GPU_QUOTA_METRICS.get(gpu_type, (None, None))
            quota, headroom = _quota(quotas, metric)
            spot_quota, spot_headroom = _quota(quotas, spot_metric)
            type_rooms = tuple(rooms.get(gpu_type, ()))
            self.entries.append(
                CapacityEntry(
                    zone=zone,
                    accelerator_type=gpu_type,
                    kind=AcceleratorKind.GPU,
                    offered=gpu_type in offered,
                    quota=quota,
                    quota_metric=metric,
                    quota_headroom=headroom,
                    spot_quota=spot_quota,
                    spot_quota_headroom=spot_headroom,
                    reserved=sum(r.free_vms * r.gpus_per_vm for r in type_rooms),
                    reservations=type_rooms,
                    stocked_out=(zone, gpu_type) in self.stocked,
                )
            )

    def blind_families(self, zones: Sequence[str], tpu_types: Sequence[str], gpu_types: Sequence[str]) -> list[str]:
        families = (
            (AcceleratorKind.TPU, tpu_types, self.tpu_hook),
            (AcceleratorKind.GPU, gpu_types, self.compute_hook),
        )
        return [
            kind.value.upper()
            for kind, types, hook in families
            if types and hook is not None and zones and self.offered_reads[kind] == 0
        ]


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
    probe = _Probe(tpu_hook, compute_hook, stockouts)
    if tpu_types and tpu_hook is None:
        probe.notes.append("no TPU hook given: TPU types reported as not offered")
    if gpu_types and compute_hook is None:
        probe.notes.append("no Compute hook given: GPU types reported as not offered")
    if tpu_types:
        probe.notes.append("TPU quotas: the TPU API exposes none (Cloud Quotas holds them): quota unknown")
        probe.notes.append("TPU reservations are not read by this probe: reserved is 0 for TPU types")
    for zone in zones:
        if tpu_types:
            probe.tpu_zone(zone, tpu_types)
        if gpu_types:
            probe.gpu_zone(zone, gpu_types)
    blind = probe.blind_families(zones, tpu_types, gpu_types)
    if blind:
        raise CapacityProbeError(
            f"could not list offered {' and '.join(blind)} types in any zone ({', '.join(zones)}); "
            "check the project and the connection's permissions",
            probe.notes,
        )
    when = (now or dt.datetime.now(dt.UTC)).isoformat()
    return CapacityReport(entries=tuple(probe.entries), probed_at=when, notes=tuple(probe.notes))
