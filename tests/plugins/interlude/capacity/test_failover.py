"""Move planning (where a lost stage goes), exhaustively over small worlds: every (available places x lost
places x format) case.

The oracle is written independently of the tree: the first place in the profile's preference order
(own family first, per strategy) that is offered, not lost and whose family the run may use.
"""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from interlude.capacity.failover import PORTABLE_FORMATS, Move, Place, Refusal, Why, move_event, plan_move
from interlude.capacity.profiles import get_profile
from interlude.capacity.report import AcceleratorKind, CapacityEntry, CapacityReport, QuotaState

NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)
ZONES = ("us-central1-a", "us-east5-b")
TPU = "v6e-8"
GPU = "nvidia-h100-80gb"
PLACES = [Place(z, t) for t in (TPU, GPU) for z in ZONES]
PORTABLE = "orbax"
SHARDED = "orbax-sharded/1"


def world(available: set[Place]) -> CapacityReport:
    entries = []
    for place in PLACES:
        kind = AcceleratorKind.TPU if place.accelerator_type == TPU else AcceleratorKind.GPU
        entries.append(
            CapacityEntry(
                place.zone, place.accelerator_type, kind, offered=place in available, quota=QuotaState.UNKNOWN
            )
        )
    return CapacityReport(entries=tuple(entries))


def oracle(available: set[Place], lost: set[Place], current: Place, fmt: str) -> Place | str:
    """Reference profile (runs on both), TPU first: same family first, zone order, then the other family."""
    order = [Place(z, TPU) for z in ZONES] + [Place(z, GPU) for z in ZONES]
    for place in order:
        if place in available and place not in lost | {current}:
            if place.kind != current.kind and fmt not in PORTABLE_FORMATS:
                return "refuse-format"
            return place
    return "refuse-capacity"


SUBSETS = [set(c) for n in range(len(PLACES) + 1) for c in itertools.combinations(PLACES, n)]


@pytest.mark.parametrize("available", SUBSETS, ids=lambda s: "+".join(sorted(str(p) for p in s)) or "none")
@pytest.mark.parametrize("current", [Place(ZONES[0], TPU), Place(ZONES[1], GPU)], ids=str)
@pytest.mark.parametrize("fmt", [PORTABLE, SHARDED])
@pytest.mark.parametrize("lost_extra", [False, True])
def test_plan_matches_the_oracle(available: set[Place], current: Place, fmt: str, lost_extra: bool) -> None:
    profile = get_profile("reference-portable")
    # Only profiles whose model runs on both families take the H100 candidate; restrict to our two types.
    profile = type(profile)(
        **{
            **profile.__dict__,
            "tpu_candidates": profile.tpu_candidates[:1],
            "gpu_candidates": profile.gpu_candidates[:1],
            "smaller_gpus": (),
        }
    )
    lost = {Place(ZONES[1], TPU)} if lost_extra else set()
    plan = plan_move(world(available), profile, "tpu_first", current, Why.STOCKOUT, fmt, NOW, lost)
    expected = oracle(available, lost, current, fmt)
    if isinstance(expected, Place):
        assert isinstance(plan, Move), plan
        assert plan.target == expected
        assert plan.cross_family == (expected.kind != current.kind)
        assert str(current) in plan.reason() and str(expected) in plan.reason()
    else:
        assert isinstance(plan, Refusal), plan
        assert plan.wait is profile.wait_allowed
        if expected == "refuse-format":
            assert "does not load" in plan.reason and SHARDED in plan.reason


def test_a_model_that_runs_on_one_family_never_moves_to_the_other() -> None:
    """maxtext-tpu-only: all TPU gone -> the tree would convert for GPU; a move never converts, it refuses."""
    profile = get_profile("maxtext-tpu-only")
    available = {Place(z, GPU) for z in ZONES} | {Place(z, "nvidia-a100-80gb") for z in ZONES}
    entries = [CapacityEntry(p.zone, p.accelerator_type, p.kind, offered=True) for p in available]
    entries += [
        CapacityEntry(z, t, AcceleratorKind.TPU, offered=False)
        for z in ZONES
        for t in ("v6e-8", "v5litepod-8", "v5p-8")
    ]
    plan = plan_move(
        CapacityReport(entries=tuple(entries)),
        profile,
        "tpu_first",
        Place(ZONES[0], TPU),
        Why.GONE_PAST_BUDGET,
        PORTABLE,
        NOW,
    )
    assert isinstance(plan, Refusal)
    assert "conversion" in plan.reason and plan.wait is True


def test_the_move_event_says_from_to_why_and_cost() -> None:
    profile = get_profile("reference-portable")
    plan = plan_move(world(set(PLACES)), profile, "tpu_first", Place(ZONES[0], TPU), Why.QUOTA, PORTABLE, NOW)
    assert isinstance(plan, Move)
    event = move_event(plan, detected_at=100.0, lost_seconds=12.3456)
    assert event == {
        "kind": "move",
        "from": f"{TPU} in {ZONES[0]}",
        "to": f"{TPU} in {ZONES[1]}",
        "why": "quota",
        "from_zone": ZONES[0],
        "from_type": TPU,
        "event_id": "move-100000",
        "cross_family": False,
        "detected_at": 100.0,
        "time_lost_s": 12.346,
        "reason": plan.reason(),
    }
