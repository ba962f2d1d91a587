"""Which platform offers what (interlude.capacity.platforms), and the trees choosing platform x type x zone.

The table is checked exhaustively against an oracle written from Google's pages (the module docstring), the
probe against in-test sources with the hooks' return shapes, and the trees on hand-made reports: a TPU7x run is
planned on GKE and never on the TPU API or Compute Engine; ``platforms: [tpu_api]`` never plans a Compute Engine
machine or a GPU; the run's platform order beats the profile's type order.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools

import pytest

from interlude.capacity.decisions import Leaf, Strategy, decide
from interlude.capacity.platforms import (
    COMPUTE_TPU_SHAPES,
    Platform,
    compute_tpu_for_machine_type,
    in_order,
    offered_on,
    offers,
    tpu7x_problem,
    why_not,
)
from interlude.capacity.probe import probe_capacity, reservation_rooms
from interlude.capacity.profiles import Candidate, get_profile
from interlude.capacity.report import AcceleratorKind, CapacityEntry, CapacityReport, mark_stockout

NOW = dt.datetime(2026, 12, 6, 9, 0, tzinfo=dt.UTC)
TPU_TYPES = ("v6e-1", "v6e-4", "v6e-8", "v6e-16", "v5p-8", "v5p-16", "v5litepod-8", "v4-8", "tpu7x-8", "tpu7x-64")
GPU_TYPES = ("nvidia-l4", "nvidia-h100-80gb", "nvidia-tesla-t4")
# Google's Compute Engine TPU machine types (https://cloud.google.com/compute/docs/tpus/tpu-machines)
MACHINE_TYPES = {"v6e-1": "ct6e-standard-1t", "v6e-4": "ct6e-standard-4t", "v6e-8": "ct6e-standard-8t"}
MACHINE_TYPES["v5p-8"] = "ct5p-hightpu-4t"


def _oracle(platform: Platform, accel: str) -> bool:
    """Written from the pages: GPUs on Compute Engine and GKE; TPU7x on GKE only; single-host v6e/v5p machine
    types on Compute Engine; every other TPU on the TPU API and GKE."""
    if accel.startswith("nvidia-"):
        return platform in (Platform.COMPUTE, Platform.GKE)
    if accel.startswith("tpu7x-"):
        return platform == Platform.GKE
    if platform == Platform.COMPUTE:
        return accel in MACHINE_TYPES
    return True


@pytest.mark.parametrize(("platform", "accel"), list(itertools.product(Platform, TPU_TYPES + GPU_TYPES)))
def test_offers_matches_the_oracle_and_says_why_not(platform: Platform, accel: str) -> None:
    assert offers(platform, accel) == _oracle(platform, accel)
    assert offers(platform.value, accel) == offers(platform, accel)
    reason = why_not(platform, accel)
    assert (reason == "") == offers(platform, accel)
    if reason:
        assert accel in reason and "https://cloud.google.com/" in reason


def test_compute_machine_types_are_googles_names_and_single_host() -> None:
    assert {a: s.machine_type for a, s in COMPUTE_TPU_SHAPES.items()} == MACHINE_TYPES
    for shape in COMPUTE_TPU_SHAPES.values():
        assert compute_tpu_for_machine_type(shape.machine_type) == shape
        assert compute_tpu_for_machine_type(f"zones/us-central1-a/machineTypes/{shape.machine_type}") == shape
        assert shape.image_project == "ubuntu-os-accelerator-images" and "tpu" in shape.image_family
        chips_in_name = int(shape.machine_type.rsplit("-", 1)[1].rstrip("t"))
        assert shape.chips == chips_in_name
    assert compute_tpu_for_machine_type("g2-standard-8") is None
    assert not offers(Platform.COMPUTE, "v6e-16") and not offers(Platform.COMPUTE, "v5p-16")  # multi-host


def test_platform_order_follows_the_run() -> None:
    assert in_order("v6e-8", ["gke", "compute", "tpu_api"]) == (Platform.GKE, Platform.COMPUTE, Platform.TPU_API)
    assert in_order("tpu7x-8", ["tpu_api", "compute", "gke"]) == (Platform.GKE,)
    assert in_order("tpu7x-8", ["tpu_api", "compute"]) == ()
    assert in_order("nvidia-l4", ["tpu_api"]) == ()
    assert offered_on("v5litepod-8") == (Platform.TPU_API, Platform.GKE)


@pytest.mark.parametrize(
    ("name", "ok"), [("tpu7x-8", True), ("tpu7x-64", True), ("tpu7x-4", False), ("tpu7x-12", False), ("v7x-8", False)]
)
def test_tpu7x_names(name: str, ok: bool) -> None:
    assert (tpu7x_problem(name) is None) == ok


# ------------------------------------------------------------------ the probe


class Tpu:
    def __init__(self, types: list[str]) -> None:
        self.types = types
        self.calls: list[str] = []

    def list_accelerator_types(self, zone: str) -> list[str]:
        self.calls.append(f"types {zone}")
        return list(self.types)

    def list_queued_resources(self, zone: str) -> list[dict]:
        return []


class Compute:
    def __init__(self, machine_types: list[str], reservations: list[dict] | None = None) -> None:
        self.machine_types, self.reservations = machine_types, reservations or []
        self.calls: list[str] = []

    def list_accelerator_types(self, zone: str) -> list[str]:
        self.calls.append(f"accelerators {zone}")
        return ["nvidia-l4"]

    def list_machine_types(self, zone: str) -> list[str]:
        self.calls.append(f"machine types {zone}")
        return list(self.machine_types)

    def get_region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        return {"NVIDIA_L4_GPUS": (8.0, 0.0)}

    def list_reservations(self, zone: str) -> list[dict]:
        self.calls.append(f"reservations {zone}")
        return list(self.reservations)


def _tpu_reservation(machine_type: str, count: int, in_use: int) -> dict:
    return {
        "name": f"res-{machine_type}",
        "status": "READY",
        "specificReservation": {
            "count": str(count),
            "inUseCount": str(in_use),
            "instanceProperties": {"machineType": machine_type},
        },
    }


def test_probe_asks_each_platform_only_for_what_it_offers() -> None:
    tpu = Tpu(["v6e-8"])
    compute = Compute(["ct6e-standard-8t", "g2-standard-8"], [_tpu_reservation("ct6e-standard-8t", 2, 1)])
    report = probe_capacity(
        tpu,
        compute,
        ["us-central1-a"],
        ["v6e-8", "v5p-8", "tpu7x-8"],
        ["nvidia-l4"],
        now=NOW,
        platforms=["compute", "tpu_api", "gke"],
    )
    assert report.platforms == ("compute", "tpu_api", "gke")
    got = {(e.platform, e.accelerator_type): e for e in report.entries}
    assert set(got) == {
        ("compute", "v6e-8"),
        ("compute", "v5p-8"),
        ("compute", "nvidia-l4"),
        ("tpu_api", "v6e-8"),
        ("tpu_api", "v5p-8"),
        ("gke", "v6e-8"),
        ("gke", "tpu7x-8"),
        ("gke", "nvidia-l4"),
    }, "TPU7x of GKE only, v5p-8 of GKE only when Interlude renders a JobSet for it: not yet"
    v6e = got[("compute", "v6e-8")]
    assert v6e.offered and v6e.machine_type == "ct6e-standard-8t" and v6e.reserved == 1
    assert v6e.available and v6e.describe().startswith("us-central1-a on compute (ct6e-standard-8t): offered")
    assert not got[("compute", "v5p-8")].offered  # ct5p-hightpu-4t not listed in the zone
    assert got[("tpu_api", "v6e-8")].offered and not got[("tpu_api", "v5p-8")].offered
    assert compute.calls.count("reservations us-central1-a") == 1, "one reservations.list per zone"
    assert got[("gke", "v6e-8")].offered and got[("gke", "v6e-8")].machine_type == "ct6e-standard-8t"
    assert not got[("gke", "tpu7x-8")].offered  # tpu7x-standard-4t not listed in the zone
    assert got[("gke", "nvidia-l4")].offered and got[("gke", "nvidia-l4")].quota_headroom == 8.0
    assert any("GKE node pools" in n for n in report.notes)
    assert CapacityReport.from_dict(report.to_dict()) == report


def test_probe_without_platforms_reads_what_it_read_before() -> None:
    tpu, compute = Tpu(["v6e-8"]), Compute(["ct6e-standard-8t"])
    report = probe_capacity(tpu, compute, ["us-central1-a"], ["v6e-8"], ["nvidia-l4"], now=NOW)
    got = [(e.platform, e.accelerator_type) for e in report.entries]
    assert got == [("tpu_api", "v6e-8"), ("compute", "nvidia-l4")]
    assert "machine types us-central1-a" not in compute.calls


def test_probe_on_tpu_api_only_never_asks_compute() -> None:
    tpu, compute = Tpu(["v6e-8"]), Compute(["ct6e-standard-8t"])
    report = probe_capacity(tpu, compute, ["us-central1-a"], ["v6e-8"], ["nvidia-l4"], now=NOW, platforms=["tpu_api"])
    assert [e.platform for e in report.entries] == ["tpu_api"] and compute.calls == []


def test_reservations_of_tpu_machine_types_count_as_slices() -> None:
    rooms = reservation_rooms([_tpu_reservation("zones/z/machineTypes/ct6e-standard-4t", 3, 1)])
    assert [(r.machine_type, r.free_vms, r.gpus_per_vm) for r in rooms["v6e-4"]] == [("ct6e-standard-4t", 2, 1)]


# ------------------------------------------------------------------ the trees


def _entry(zone: str, accel: str, platform: str, offered: bool = True) -> CapacityEntry:
    kind = AcceleratorKind.GPU if accel.startswith("nvidia-") else AcceleratorKind.TPU
    machine = COMPUTE_TPU_SHAPES[accel].machine_type if platform == "compute" and kind == AcceleratorKind.TPU else None
    return CapacityEntry(zone, accel, kind, offered, platform=platform, machine_type=machine)


def _everything(zones: tuple[str, ...] = ("us-central1-a", "us-east5-a")) -> CapacityReport:
    """Every type offered on every platform that can offer it, in every zone."""
    entries = [
        _entry(z, a, p.value)
        for z in zones
        for p in Platform
        for a in (*TPU_TYPES, *GPU_TYPES, "nvidia-a100-80gb", "nvidia-tesla-t4")
        if offers(p, a)
    ]
    return CapacityReport(tuple(entries))


def _profile(*tpu_types: str):
    import dataclasses

    return dataclasses.replace(get_profile("reference-portable"), tpu_candidates=tuple(Candidate(t) for t in tpu_types))


@pytest.mark.parametrize("platforms", [p for n in (1, 2, 3) for p in itertools.permutations(list(Platform), n)])
@pytest.mark.parametrize("strategy", list(Strategy))
def test_tpu7x_is_planned_on_gke_and_never_on_the_tpu_api_or_compute(platforms, strategy) -> None:
    profile = _profile("tpu7x-8")
    names = [p.value for p in platforms]
    d = decide(_everything(), profile, strategy, NOW, platforms=names)
    if d.accelerator_type == "tpu7x-8":
        assert d.platform == "gke", d.trail_text()
    if "gke" in names and strategy == Strategy.TPU_FIRST:
        assert (d.leaf, d.accelerator_type, d.platform) == (Leaf.TPU, "tpu7x-8", "gke"), d.trail_text()
    # even a report that (wrongly) lists TPU7x on the TPU API or Compute Engine never places it there
    wrong = CapacityReport(
        (_entry("us-central1-a", "tpu7x-8", "tpu_api"), _entry("us-central1-a", "tpu7x-8", "gke"))
        + tuple(e for e in _everything().entries if e.accelerator_type != "tpu7x-8")
    )
    d = decide(wrong, profile, Strategy.TPU_FIRST, NOW, platforms=[n for n in names if n != "gke"])
    assert d.accelerator_type != "tpu7x-8", d.trail_text()


def test_tpu7x_run_without_gke_is_told_why() -> None:
    d = decide(_everything(), _profile("tpu7x-8"), Strategy.TPU_FIRST, NOW, platforms=["tpu_api", "compute"])
    assert d.leaf != Leaf.TPU
    assert "tpu7x-8 [not probed]" in d.trail[2].answer, d.trail_text()


@pytest.mark.parametrize("strategy", list(Strategy))
@pytest.mark.parametrize("profile", ["reference-portable", "maxtext-tpu-only", "cuda-kernels-gpu-only"])
def test_tpu_api_only_never_plans_compute_or_gpus(profile: str, strategy: Strategy) -> None:
    report = _everything()
    for stocked in (False, True):
        if stocked:  # every TPU API place gone: the tree must wait or stick, never leave the TPU API
            for e in report.entries:
                if e.platform == "tpu_api":
                    report = mark_stockout(report, e.zone, e.accelerator_type, "tpu_api")
        d = decide(report, get_profile(profile), strategy, NOW, platforms=["tpu_api"])
        assert d.kind != AcceleratorKind.GPU and d.platform in (None, "tpu_api"), d.trail_text()
        if d.provisions:
            assert d.machine_type is None and not stocked
        else:
            assert d.leaf in (Leaf.WAIT, Leaf.STUCK)


def test_the_runs_platform_order_beats_the_profiles_type_order() -> None:
    report = _everything(("us-central1-a",))
    profile = _profile("v5litepod-8", "v6e-8")  # v5e preferred, but only the TPU API has it
    d = decide(report, profile, Strategy.TPU_FIRST, NOW, platforms=["compute", "tpu_api"])
    assert (d.accelerator_type, d.platform, d.machine_type) == ("v6e-8", "compute", "ct6e-standard-8t")
    assert "on compute" in d.summary() and d.mode is not None and d.mode.value == "on_demand"
    d = decide(report, profile, Strategy.TPU_FIRST, NOW, platforms=["tpu_api", "compute"])
    assert (d.accelerator_type, d.platform, d.machine_type) == ("v5litepod-8", "tpu_api", None)


def test_a_compute_stockout_moves_to_the_next_platform_and_round_trips() -> None:
    report = _everything(("us-central1-a",))
    profile = _profile("v6e-8")
    first = decide(report, profile, Strategy.TPU_FIRST, NOW, platforms=["compute", "tpu_api"])
    assert first.platform == "compute"
    marked = mark_stockout(report, "us-central1-a", "v6e-8", "compute")
    assert marked.get("us-central1-a", "v6e-8", "tpu_api").available  # the TPU API's v6e-8 is another request
    again = decide(marked, profile, Strategy.TPU_FIRST, NOW, platforms=["compute", "tpu_api"])
    assert (again.platform, again.accelerator_type, again.machine_type) == ("tpu_api", "v6e-8", None)
    assert "on compute (ct6e-standard-8t): stockout met earlier" in again.trail[2].answer, again.trail_text()
    assert type(again).from_dict(again.to_dict()) == again
    # a multi-host queued resource is the TPU API's; a TPU VM on Compute Engine is created on demand
    queued = decide(
        report,
        _profile("v6e-8").__class__.from_dict({**profile.to_dict(), "prefer_queued": True}),
        Strategy.TPU_FIRST,
        NOW,
        platforms=["compute"],
    )
    assert queued.mode is not None and queued.mode.value == "on_demand"


def test_the_trail_says_why_the_preferred_platform_was_passed_over() -> None:
    report = mark_stockout(_everything(("us-central1-a",)), "us-central1-a", "v6e-8", "tpu_api")
    d = decide(report, _profile("v6e-8"), Strategy.TPU_FIRST, NOW, platforms=["tpu_api", "compute"])
    assert d.platform == "compute"
    assert d.trail[2].answer.endswith("; not on tpu_api: v6e-8 us-central1-a: stockout met earlier in this run")


def test_gke_offers_tpu_pools_and_gpu_pools_and_a_tpu_stockout_walks_to_the_gpu_pool() -> None:
    """The GKE offer in the tree: a v6e-4 TPU pool first; its stockout (on GKE) walks the portable model's tree to a
    GPU pool on GKE, never to a platform the run did not name; a zone that lists no ct6e-standard-4t offers none."""
    compute = Compute(["ct6e-standard-4t", "g2-standard-8"])
    report = probe_capacity(None, compute, ["us-central1-a"], ["v6e-4"], ["nvidia-l4"], now=NOW, platforms=["gke"])
    assert {(e.platform, e.accelerator_type, e.offered) for e in report.entries} == {
        ("gke", "v6e-4", True),
        ("gke", "nvidia-l4", True),
    }
    profile = get_profile("reference-portable")
    profile = dataclasses.replace(
        profile, tpu_candidates=(Candidate("v6e-4"),), gpu_candidates=(Candidate("nvidia-l4", 1, "g2-standard-8"),)
    )
    first = decide(report, profile, Strategy.TPU_FIRST, NOW, platforms=["gke"])
    assert (first.leaf, first.platform, first.accelerator_type) == (Leaf.TPU, "gke", "v6e-4")
    out = mark_stockout(report, "us-central1-a", "v6e-4", "gke")
    after = decide(out, profile, Strategy.TPU_FIRST, NOW, platforms=["gke"])
    assert (after.leaf, after.platform, after.accelerator_type) == (Leaf.GPU, "gke", "nvidia-l4")
    assert after.machine_type == "g2-standard-8" and after.zone == "us-central1-a"
    assert "STOCKOUT" in after.trail_text() or "stockout" in after.trail_text()
    bare = probe_capacity(
        None, Compute(["g2-standard-8"]), ["us-central1-a"], ["v6e-4"], [], now=NOW, platforms=["gke"]
    )
    assert [(e.accelerator_type, e.offered) for e in bare.entries] == [("v6e-4", False)]
    assert decide(bare, profile, Strategy.TPU_FIRST, NOW, platforms=["gke"]).leaf in (Leaf.WAIT, Leaf.STUCK)
