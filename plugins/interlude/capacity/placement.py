"""Where one candidate accelerator could go, and how (reservation, on-demand, queued, spot).

Pure: reads a CapacityReport and the profile's candidates, answers with a Placement and a sentence
for the decision trail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from interlude.capacity.decision_model import ProvisioningMode
from interlude.capacity.profiles import Candidate, ModelProfile
from interlude.capacity.report import AcceleratorKind, CapacityEntry, CapacityReport


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
    (a queued resource instead, for TPUs, when the profile prefers them or the slice spans several hosts:
    Google's recommended way to get multi-host slices, https://cloud.google.com/tpu/docs/queued-resources,
    which grants every host at once or none), else spot when the profile
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
        queued = candidate.kind == AcceleratorKind.TPU and (profile.prefer_queued or _multi_host(candidate))
        mode = ProvisioningMode.QUEUED if queued else ProvisioningMode.ON_DEMAND
        return mode, None, _quota_text(entry, count)
    why = _quota_text(entry, count)
    if not profile.allow_spot:
        return None, None, why + "; spot not allowed by the profile"
    if entry.spot_quota_allows(count):
        return ProvisioningMode.SPOT, None, why + f"; spot quota {entry.spot_quota.value}"
    return None, None, why + "; spot quota exhausted too"


def _multi_host(candidate: Candidate) -> bool:
    """A TPU slice of more than one host (v6e-16 = 4 hosts of 4 chips), per the runtime table's host sizes."""
    from interlude.runtimes.tpu import UnknownAcceleratorError, parse_tpu_type

    try:
        return parse_tpu_type(candidate.accelerator_type).multi_host
    except UnknownAcceleratorError:
        return False


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
