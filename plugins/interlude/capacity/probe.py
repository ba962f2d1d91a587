"""Probing capacity (read-only) through the hooks: what Google exposes per zone x accelerator type x platform.

Split from capacity.py (the report's data) because this is the only part that talks to the cloud. Each platform
of the run (``platforms``, its order of preference) is asked only for what it can offer at all
(:mod:`interlude.capacity.platforms`): the Cloud TPU API for TPU node types, Compute Engine for GPUs and for TPU
machine types (``machineTypes.list``, reservations of those machine types), GKE for the node pools the run's cluster
can be given in a zone (GKE node pools are Compute Engine machines: the zone's machine and accelerator types,
the region's GPU quotas; https://cloud.google.com/kubernetes-engine/docs/how-to/gpus,
https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from interlude.capacity.platforms import Platform, compute_tpu_for_machine_type, compute_tpu_shape, offers
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
from interlude.stage.jobset import has_shape


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

    def list_machine_types(self, zone: str) -> list[str]: ...

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
    ``guestAccelerators`` or, for machine types with built-in GPUs, from the machine type. A reservation of a
    Compute Engine TPU machine type counts under its TPU type (``ct6e-standard-8t`` -> ``v6e-8``), one slice
    per VM.
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
        elif (tpu := compute_tpu_for_machine_type(machine_type)) is not None:
            pairs = [(tpu.accelerator_type, 1)]
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
        stockouts: Iterable[tuple[str, ...]],
    ) -> None:
        self.tpu_hook, self.compute_hook = tpu_hook, compute_hook
        self.notes: list[str] = []
        self.offered_reads = {AcceleratorKind.TPU: 0, AcceleratorKind.GPU: 0}
        self.asked = {AcceleratorKind.TPU: False, AcceleratorKind.GPU: False}
        # (zone, type) stocked out on every platform; (zone, type, platform) on that platform only
        self.stocked = {tuple(s) for s in stockouts}
        self.quotas_by_region: dict[str, dict[str, tuple[float, float]] | None] = {}
        self.rooms_by_zone: dict[str, dict[str, list[ReservationRoom]]] = {}
        self.entries: list[CapacityEntry] = []

    def stocked_out(self, zone: str, accelerator_type: str, platform: Platform) -> bool:
        return (zone, accelerator_type) in self.stocked or (zone, accelerator_type, platform.value) in self.stocked

    def rooms(self, zone: str) -> dict[str, list[ReservationRoom]]:
        """Free reserved room per GPU or TPU type in the zone (one reservations.list per zone)."""
        if zone not in self.rooms_by_zone and self.compute_hook is not None:
            hook = self.compute_hook
            self.rooms_by_zone[zone] = reservation_rooms(
                self.read("compute.list_reservations", hook.list_reservations, zone) or ()
            )
        return self.rooms_by_zone.get(zone, {})

    def read(self, what: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except Exception as exc:  # noqa: BLE001 - partial knowledge beats a failed probe; noted
            self.notes.append(f"{what}({', '.join(map(str, args))}) failed: {type(exc).__name__}: {exc}")
            return None

    def offered(self, kind: AcceleratorKind, what: str, call: Callable[[str], list[str]], zone: str) -> set[str]:
        """What ``call`` lists in the zone (accelerator or machine types), the family marked as asked; empty when the
        read failed (noted). Only a read that answered counts for ``blind_families``."""
        self.asked[kind] = True
        listed = self.read(what, call, zone)
        self.offered_reads[kind] += listed is not None
        return set(listed or ())

    def tpu_zone(self, zone: str, tpu_types: Sequence[str]) -> None:
        offered: set[str] = set()
        queued: dict[str, int] = {}
        if (hook := self.tpu_hook) is not None:
            offered = self.offered(AcceleratorKind.TPU, "tpu.list_accelerator_types", hook.list_accelerator_types, zone)
            queued = _queued_types(self.read("tpu.list_queued_resources", hook.list_queued_resources, zone) or ())
        for tpu_type in tpu_types:
            self.entries.append(
                CapacityEntry(
                    zone=zone,
                    accelerator_type=tpu_type,
                    kind=AcceleratorKind.TPU,
                    offered=tpu_type in offered,
                    queued=queued.get(tpu_type, 0),
                    stocked_out=self.stocked_out(zone, tpu_type, Platform.TPU_API),
                    platform=Platform.TPU_API.value,
                )
            )

    def compute_tpu_zone(self, zone: str, tpu_types: Sequence[str]) -> None:
        """TPU types as Compute Engine machine types: offered when the zone lists the machine type; quota unknown
        (TPU VM quotas are Cloud Quotas metrics, not in regions.get); reservations of the machine type count."""
        offered: set[str] = set()
        if (hook := self.compute_hook) is not None:
            offered = self.offered(AcceleratorKind.TPU, "compute.list_machine_types", hook.list_machine_types, zone)
        rooms = self.rooms(zone)
        for tpu_type in tpu_types:
            shape = compute_tpu_shape(tpu_type)
            assert shape is not None  # offers(COMPUTE, t) was checked by the caller
            type_rooms = tuple(rooms.get(tpu_type, ()))
            self.entries.append(
                CapacityEntry(
                    zone=zone,
                    accelerator_type=tpu_type,
                    kind=AcceleratorKind.TPU,
                    offered=shape.machine_type in offered,
                    reserved=sum(r.free_vms for r in type_rooms),
                    reservations=type_rooms,
                    stocked_out=self.stocked_out(zone, tpu_type, Platform.COMPUTE),
                    platform=Platform.COMPUTE.value,
                    machine_type=shape.machine_type,
                )
            )

    def gpu_zone(self, zone: str, gpu_types: Sequence[str], platform: Platform = Platform.COMPUTE) -> None:
        """GPU types the zone lists, on Compute Engine VMs or GKE node pools (a pool's nodes are Compute Engine
        machines): quota from the region's GPU metrics; reservations count for VMs only."""
        region = region_of(zone)
        offered: set[str] = set()
        if (hook := self.compute_hook) is not None:
            offered = self.offered(
                AcceleratorKind.GPU, "compute.list_accelerator_types", hook.list_accelerator_types, zone
            )
            if region not in self.quotas_by_region:
                self.quotas_by_region[region] = self.read("compute.get_region_quotas", hook.get_region_quotas, region)
        rooms = self.rooms(zone) if platform == Platform.COMPUTE else {}
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
                    stocked_out=self.stocked_out(zone, gpu_type, platform),
                    platform=platform.value,
                )
            )

    def gke_zone(self, zone: str, tpu_types: Sequence[str], gpu_types: Sequence[str]) -> None:
        """What a GKE node pool in the zone can be: TPU types with a single-host GKE shape whose machine type the zone
        lists, GPUs the zone lists (quota: the region's GPU metrics, as for a GPU VM; TPU quota unknown)."""
        from interlude.stage.jobset import SHAPES

        machines: set[str] = set()
        if (hook := self.compute_hook) is not None and tpu_types:
            machines = self.offered(AcceleratorKind.TPU, "compute.list_machine_types", hook.list_machine_types, zone)
        for tpu_type in tpu_types:
            machine_type = SHAPES[tpu_type].machine_type
            self.entries.append(
                CapacityEntry(
                    zone=zone,
                    accelerator_type=tpu_type,
                    kind=AcceleratorKind.TPU,
                    offered=machine_type in machines,
                    stocked_out=self.stocked_out(zone, tpu_type, Platform.GKE),
                    platform=Platform.GKE.value,
                    machine_type=machine_type,
                )
            )
        if gpu_types:
            self.gpu_zone(zone, gpu_types, Platform.GKE)

    def blind_families(self, zones: Sequence[str]) -> list[str]:
        """Families some platform was asked about (a hook was there) whose offered list no read returned."""
        return [
            kind.value.upper()
            for kind in (AcceleratorKind.TPU, AcceleratorKind.GPU)
            if zones and self.asked[kind] and self.offered_reads[kind] == 0
        ]


@dataclass(frozen=True)
class _Asked:
    """Which types each platform of the run is asked about (only what it can offer at all)."""

    order: tuple[Platform, ...]
    tpu_api: list[str]
    compute_tpu: list[str]
    compute_gpu: list[str]
    gke_tpu: list[str]
    gke_gpu: list[str]

    @classmethod
    def of(cls, tpu_types: Sequence[str], gpu_types: Sequence[str], platforms: Sequence[str] | None) -> _Asked:
        legacy = platforms is None
        order = (Platform.TPU_API, Platform.COMPUTE) if platforms is None else tuple(Platform(p) for p in platforms)
        return cls(
            order=order,
            tpu_api=[t for t in tpu_types if Platform.TPU_API in order and (legacy or offers(Platform.TPU_API, t))],
            compute_tpu=[
                t for t in tpu_types if not legacy and Platform.COMPUTE in order and offers(Platform.COMPUTE, t)
            ],
            compute_gpu=list(gpu_types) if Platform.COMPUTE in order else [],
            gke_tpu=[t for t in tpu_types if Platform.GKE in order and offers(Platform.GKE, t) and has_shape(t)],
            gke_gpu=list(gpu_types) if Platform.GKE in order else [],
        )

    def notes(self, tpu_hook: bool, compute_hook: bool) -> list[str]:
        notes: list[str] = []
        if self.tpu_api and not tpu_hook:
            notes.append("no TPU hook given: TPU types reported as not offered")
        if (self.compute_gpu or self.compute_tpu) and not compute_hook:
            notes.append("no Compute hook given: GPU types reported as not offered")
        if self.tpu_api:
            notes.append("TPU quotas: the TPU API exposes none (Cloud Quotas holds them): quota unknown")
            notes.append("TPU reservations are not read by this probe: reserved is 0 for TPU types")
        if self.compute_tpu:
            notes.append(
                "Compute Engine TPU VM quotas are Cloud Quotas metrics (not in regions.get): quota unknown; "
                "reservations of TPU machine types are read"
            )
        if Platform.GKE in self.order:
            notes.append(
                "GKE node pools: the zone's machine and accelerator types (a pool's nodes are Compute Engine "
                "machines); only single-host TPU shapes Interlude renders a JobSet for are asked"
            )
        return notes


def probe_capacity(
    tpu_hook: TpuCapacitySource | None,
    compute_hook: ComputeCapacitySource | None,
    zones: Sequence[str],
    tpu_types: Sequence[str],
    gpu_types: Sequence[str],
    stockouts: Iterable[tuple[str, ...]] = (),
    now: dt.datetime | None = None,
    platforms: Sequence[str] | None = None,
) -> CapacityReport:
    """Read what Google exposes for every zone x type x platform; never creates or changes anything.

    ``platforms`` (the run's, in its order of preference) says whom to ask: ``tpu_api`` for TPU node types,
    ``compute`` for GPUs and the TPU types Compute Engine sells as machine types; None = TPU types on the TPU
    API and GPUs on Compute Engine only (what the probe read before platforms existed); ``gke`` for the node pools
    (TPU shapes and GPUs) the zone can give a cluster. A stockout is
    (zone, type) on every platform or (zone, type, platform) on one.

    A failing read does not fail the probe: the pair gets the most honest answer left (not offered
    when the type list could not be read, quota unknown when quotas could not be read) and the error
    goes into ``notes`` for the log. The tree can still decide on what is known. One exception: when
    the offered-type list of a family could be read in *no* zone, nothing was learned about that family
    (typically wrong project or missing permission), and deciding on it would only wait or stick for
    the wrong reason, so :class:`CapacityProbeError` is raised with every note.
    """
    probe = _Probe(tpu_hook, compute_hook, stockouts)
    asked = _Asked.of(tpu_types, gpu_types, platforms)
    probe.notes += asked.notes(tpu_hook is not None, compute_hook is not None)
    for zone in zones:
        for platform in asked.order:
            if platform == Platform.TPU_API and asked.tpu_api:
                probe.tpu_zone(zone, asked.tpu_api)
            elif platform == Platform.COMPUTE:
                if asked.compute_tpu:
                    probe.compute_tpu_zone(zone, asked.compute_tpu)
                if asked.compute_gpu:
                    probe.gpu_zone(zone, asked.compute_gpu)
            elif platform == Platform.GKE and (asked.gke_tpu or asked.gke_gpu):
                probe.gke_zone(zone, asked.gke_tpu, asked.gke_gpu)
    blind = probe.blind_families(zones)
    if blind:
        raise CapacityProbeError(
            f"could not list offered {' and '.join(blind)} types in any zone ({', '.join(zones)}); "
            "check the project and the connection's permissions",
            probe.notes,
        )
    when = (now or dt.datetime.now(dt.UTC)).isoformat()
    return CapacityReport(
        entries=tuple(probe.entries),
        probed_at=when,
        notes=tuple(probe.notes),
        platforms=tuple(p.value for p in asked.order),
    )
