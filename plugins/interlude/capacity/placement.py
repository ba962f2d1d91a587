"""Where one candidate accelerator could go, and how (reservation, on-demand, queued, spot), on which platform.

Pure: reads a CapacityReport and the profile's candidates, answers with a Placement and a sentence
for the decision trail. Places are chosen platform x type x zone: the run's first platform (its ``platforms``
order, carried by the report) with any candidate, before a later platform with a more preferred type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from interlude.capacity.decision_model import ProvisioningMode
from interlude.capacity.platforms import offers, why_not
from interlude.capacity.profiles import Candidate, ModelProfile
from interlude.capacity.report import AcceleratorKind, CapacityEntry, CapacityReport


@dataclass(frozen=True)
class Placement:
    candidate: Candidate
    entry: CapacityEntry
    mode: ProvisioningMode
    reservation: str | None = None

    @property
    def platform(self) -> str:
        return self.entry.platform

    @property
    def machine_type(self) -> str | None:
        """The Compute Engine machine type to create: the candidate's (GPUs) or the platform's (TPU VMs)."""
        return self.candidate.machine_type or self.entry.machine_type

    def describe(self) -> str:
        via = f"reservation {self.reservation}" if self.reservation else self.mode.value
        if self.mode == ProvisioningMode.RESERVATION and not self.reservation:
            via = "reservation"
        return f"{self.candidate.label()} in {self.entry.where} via {via}"


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
        queued = (
            candidate.kind == AcceleratorKind.TPU
            and entry.platform == "tpu_api"  # queued resources are the Cloud TPU API's
            and (profile.prefer_queued or _multi_host(candidate))
        )
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


def platform_order(report: CapacityReport, platforms: Sequence[str] | None = None) -> tuple[str, ...]:
    """The platforms to try, most preferred first: ``platforms`` (the run's) when given, else the report's."""
    if platforms is not None:
        return tuple(platforms)
    seen = (e.platform for e in report.entries)
    return tuple(dict.fromkeys((*report.platforms, *seen)))


def _earlier(order: Sequence[str], chosen: str, reasons: dict[Candidate, list[tuple[str, str]]]) -> str:
    """What ruled out the run's more preferred platforms, for the trail (empty when the first one placed it)."""
    before = order[: order.index(chosen)]
    missed = [f"{c.accelerator_type} {text}" for c, rs in reasons.items() for p, text in rs if p in before]
    return f"; not on {', '.join(before)}: " + "; ".join(missed) if missed else ""


def find_placement(
    report: CapacityReport,
    candidates: Sequence[Candidate],
    profile: ModelProfile,
    platforms: Sequence[str] | None = None,
) -> tuple[Placement | None, str]:
    """On the first platform (in the run's order) where any candidate fits: the first candidate (in preference
    order) that fits, in a zone with reserved room first, then zone order. Entries on platforms outside
    ``platforms``, or on a platform that never offers the type (TPU7x off GKE), are never chosen. Returns the
    placement (or None) and a readable answer for the trail."""
    if not candidates:
        return None, "no: the profile lists no candidates"
    order = platform_order(report, platforms)
    reasons: dict[Candidate, list[tuple[str, str]]] = {c: [] for c in candidates}
    for platform in order:
        for cand in candidates:
            options: list[Placement] = []
            for entry in report.for_type(cand.accelerator_type):
                if entry.platform != platform:
                    continue
                if not offers(platform, cand.accelerator_type):  # Google never sells it there, whatever a probe says
                    reasons[cand].append((platform, f"{entry.where}: {why_not(platform, cand.accelerator_type)}"))
                    continue
                mode, reservation, why = provisioning_mode(entry, cand, profile)
                if mode is None:
                    reasons[cand].append((platform, f"{entry.where}: {why}"))
                else:
                    options.append(Placement(cand, entry, mode, reservation))
            if options:
                best = next((o for o in options if o.mode == ProvisioningMode.RESERVATION), options[0])
                why = provisioning_mode(best.entry, cand, profile)[2]
                return best, f"yes: {best.describe()} ({why})" + _earlier(order, platform, reasons)
    misses = [f"{c.label()} [{'; '.join(t for _, t in r) if r else 'not probed'}]" for c, r in reasons.items()]
    return None, "no: " + " | ".join(misses)
