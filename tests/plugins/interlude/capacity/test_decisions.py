"""Both decision trees, exhaustively: every combination of model abilities, availability and wait state.

The expected leaves and trails come from two oracles written straight from the tree descriptions in
the brief (one per strategy), independent of the implementation's shared walk.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from dataclasses import replace

import pytest

from interlude.capacity.decisions import (
    Decision,
    Leaf,
    ProvisioningMode,
    Strategy,
    WaitState,
    decide,
    find_placement,
)
from interlude.capacity.profiles import (
    NOT_FEASIBLE,
    PROFILES,
    Candidate,
    Conversion,
    ModelProfile,
    get_profile,
)
from interlude.capacity.report import (
    AcceleratorKind,
    CapacityEntry,
    CapacityReport,
    QuotaState,
    ReservationRoom,
    mark_stockout,
)

NOW = dt.datetime(2026, 11, 3, 12, 0, tzinfo=dt.UTC)
TPU = Candidate("v6e-8")
GPU = Candidate("nvidia-h100-80gb", 8, "a3-highgpu-8g")
SMALL = Candidate("nvidia-l4", 1, "g2-standard-8")
ZONE_T, ZONE_G = "us-east5-b", "us-central1-a"


def report_for(tpu: bool, gpu: bool, small: bool) -> CapacityReport:
    """Each family unavailable for a different reason, so every reason is exercised."""
    return CapacityReport(
        entries=(
            CapacityEntry(ZONE_T, TPU.accelerator_type, AcceleratorKind.TPU, offered=tpu),
            CapacityEntry(ZONE_G, GPU.accelerator_type, AcceleratorKind.GPU, offered=True, stocked_out=not gpu),
            CapacityEntry(
                ZONE_G,
                SMALL.accelerator_type,
                AcceleratorKind.GPU,
                offered=True,
                quota=QuotaState.OK if small else QuotaState.EXHAUSTED,
                quota_metric="NVIDIA_L4_GPUS",
                quota_headroom=8.0 if small else 0.0,
            ),
        )
    )


WAITS = {
    "may_wait": (True, None),  # allowed, first walk
    "no_wait": (False, None),  # profile forbids waiting
    "expired": (True, NOW - dt.timedelta(hours=3)),  # allowed, but waiting since 3 h with max 1 h
}


def profile_for(runs_tpu: bool, runs_gpu: bool, conv_gpu: bool, conv_tpu: bool, wait: str) -> ModelProfile:
    allowed, _ = WAITS[wait]
    return ModelProfile(
        name="m",
        runs_on_tpu=runs_tpu,
        runs_on_gpu=runs_gpu,
        convert_to_gpu=Conversion(True, 10, "port kernels") if conv_gpu else NOT_FEASIBLE,
        convert_to_tpu=Conversion(True, 15, "port to XLA") if conv_tpu else NOT_FEASIBLE,
        tpu_candidates=(TPU,),
        gpu_candidates=(GPU,),
        smaller_gpus=(SMALL,),
        wait_allowed=allowed,
        max_wait=dt.timedelta(hours=1),
    )


def oracle_tpu_first(
    runs_tpu: bool, runs_gpu: bool, conv_gpu: bool, tpu: bool, gpu: bool, wait: str
) -> tuple[Leaf, list[str]]:
    """TPU-first, from the brief: TPU available -> tpu. Else if the model runs on GPU: GPU available ->
    gpu, else wait/stuck. Else (TPU-only): conversion feasible -> convert_for_gpu when a GPU is
    available, else wait/stuck; not feasible -> stuck."""
    q = ["Which strategy?"]
    wait_leaf = Leaf.WAIT if wait == "may_wait" else Leaf.STUCK
    if not runs_tpu and not runs_gpu:
        return Leaf.STUCK, [*q, "Does the model run on TPU or GPU?"]
    q.append("Does the model run on TPU?")
    if runs_tpu:
        q.append("Is a TPU available?")
        if tpu:
            return Leaf.TPU, q
    q.append("Does the model run on GPU?")
    if runs_gpu:
        q.append("Is a GPU available?")
        return (Leaf.GPU, q) if gpu else (wait_leaf, [*q, "May the run wait for capacity?"])
    q.append("Can the model be converted to run on GPU?")
    if not conv_gpu:
        return Leaf.STUCK, q
    q.append("After conversion, is a GPU available?")
    return (Leaf.CONVERT_FOR_GPU, q) if gpu else (wait_leaf, [*q, "May the run wait for capacity?"])


def oracle_gpu_first(
    runs_tpu: bool, runs_gpu: bool, conv_tpu: bool, tpu: bool, gpu: bool, small: bool, wait: str
) -> tuple[Leaf, list[str]]:
    """GPU-first, from the brief: GPU available -> gpu. Else smaller GPUs viable and available ->
    smaller_gpu. Else if the model runs on TPU: TPU available -> tpu, else wait/stuck. Else conversion
    feasible -> convert_for_tpu (then TPU capacity), else stuck."""
    q = ["Which strategy?"]
    wait_leaf = Leaf.WAIT if wait == "may_wait" else Leaf.STUCK
    if not runs_tpu and not runs_gpu:
        return Leaf.STUCK, [*q, "Does the model run on TPU or GPU?"]
    q.append("Does the model run on GPU?")
    if runs_gpu:
        q.append("Is a GPU available?")
        if gpu:
            return Leaf.GPU, q
        q += ["Are smaller GPUs acceptable?", "Is a smaller GPU available?"]
        if small:
            return Leaf.SMALLER_GPU, q
    q.append("Does the model run on TPU?")
    if runs_tpu:
        q.append("Is a TPU available?")
        return (Leaf.TPU, q) if tpu else (wait_leaf, [*q, "May the run wait for capacity?"])
    q.append("Can the model be converted to run on TPU?")
    if not conv_tpu:
        return Leaf.STUCK, q
    q.append("After conversion, is a TPU available?")
    return (Leaf.CONVERT_FOR_TPU, q) if tpu else (wait_leaf, [*q, "May the run wait for capacity?"])


CASES = list(
    itertools.product(
        Strategy,
        [True, False],
        [True, False],
        [True, False],
        [True, False],
        [True, False],
        [True, False],
        [True, False],
        list(WAITS),
    )
)


def _case_id(case: tuple) -> str:
    strategy, runs_tpu, runs_gpu, conv_gpu, conv_tpu, tpu, gpu, small, wait = case
    flags = [
        ("runsT", runs_tpu),
        ("runsG", runs_gpu),
        ("convG", conv_gpu),
        ("convT", conv_tpu),
        ("T", tpu),
        ("G", gpu),
        ("S", small),
    ]
    return f"{strategy.value}-" + "".join(n if v else n.lower() for n, v in flags) + f"-{wait}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_truth_table(case: tuple) -> None:
    strategy, runs_tpu, runs_gpu, conv_gpu, conv_tpu, tpu, gpu, small, wait = case
    profile = profile_for(runs_tpu, runs_gpu, conv_gpu, conv_tpu, wait)
    started = WAITS[wait][1]
    decision = decide(report_for(tpu, gpu, small), profile, strategy, NOW, WaitState(started_at=started))
    if strategy == Strategy.TPU_FIRST:
        leaf, questions = oracle_tpu_first(runs_tpu, runs_gpu, conv_gpu, tpu, gpu, wait)
    else:
        leaf, questions = oracle_gpu_first(runs_tpu, runs_gpu, conv_tpu, tpu, gpu, small, wait)

    assert decision.leaf == leaf, decision.trail_text()
    asked = [step.question for step in decision.trail]
    assert len(asked) == len(questions), decision.trail_text()
    for got, want in zip(asked, questions, strict=True):
        assert got.startswith(want), decision.trail_text()
    assert all(step.answer for step in decision.trail)
    assert decision.strategy == strategy and decision.model == "m" and decision.decided_at == NOW
    assert Decision.from_dict(json.loads(json.dumps(decision.to_dict()))) == decision
    _check_leaf_fields(decision, profile)


def _check_leaf_fields(d: Decision, profile: ModelProfile) -> None:
    """What each leaf must carry, beside its trail."""
    target = {
        Leaf.TPU: TPU,
        Leaf.GPU: GPU,
        Leaf.SMALLER_GPU: SMALL,
        Leaf.CONVERT_FOR_GPU: GPU,
        Leaf.CONVERT_FOR_TPU: TPU,
    }.get(d.leaf)
    if target is not None:
        assert d.provisions
        assert (d.kind, d.accelerator_type, d.count, d.machine_type) == (
            target.kind,
            target.accelerator_type,
            target.count,
            target.machine_type,
        )
        assert d.zone == (ZONE_T if target.kind == AcceleratorKind.TPU else ZONE_G)
        assert d.mode == ProvisioningMode.ON_DEMAND
        assert d.trail[-1].answer.startswith("yes: ")
        assert d.stuck_report is None and d.wait_deadline is None
        if d.leaf in (Leaf.CONVERT_FOR_GPU, Leaf.CONVERT_FOR_TPU):
            assert d.conversion is not None and d.conversion.feasible and d.conversion.person_days
            assert d.converted_for == target.kind
            assert "person-days" in d.trail[-2].answer
        else:
            assert d.conversion is None and d.converted_for is None
    elif d.leaf == Leaf.WAIT:
        assert not d.provisions and d.accelerator_type is None and d.zone is None
        assert d.wait_started_at == NOW and d.wait_deadline == NOW + profile.max_wait
        assert d.waiting_for
        assert d.trail[-1].answer.startswith("yes: waiting since")
        assert d.wait_state() == WaitState(started_at=NOW)
        converted = any(s.question.startswith("Can the model be converted") for s in d.trail)
        assert (d.conversion is not None) is converted
        if converted:
            other = AcceleratorKind.GPU if d.strategy == Strategy.TPU_FIRST else AcceleratorKind.TPU
            assert d.converted_for == other and d.conversion.feasible
    else:
        assert d.leaf == Leaf.STUCK and not d.provisions and d.accelerator_type is None
        assert d.stuck_report and "Questions asked:" in d.stuck_report
        for i, step in enumerate(d.trail, 1):
            assert f"{i}. {step.question} -> {step.answer}" in d.stuck_report
        assert d.wait_state() == WaitState()


def test_every_leaf_is_reached() -> None:
    """The truth table really covers all seven leaves (guards against a table that lost a branch)."""
    seen = set()
    for case in CASES:
        strategy, runs_tpu, runs_gpu, conv_gpu, conv_tpu, tpu, gpu, small, wait = case
        d = decide(
            report_for(tpu, gpu, small),
            profile_for(runs_tpu, runs_gpu, conv_gpu, conv_tpu, wait),
            strategy,
            NOW,
            WaitState(started_at=WAITS[wait][1]),
        )
        seen.add(d.leaf)
    assert seen == set(Leaf)


def test_trail_reads_as_a_story() -> None:
    profile = profile_for(True, False, True, False, "may_wait")
    d = decide(report_for(tpu=False, gpu=True, small=False), profile, "tpu_first", NOW)
    assert d.leaf == Leaf.CONVERT_FOR_GPU
    text = d.trail_text()
    assert text.splitlines()[0] == "Decision trail (tpu_first, model m):"
    assert "1. Which strategy? -> tpu_first: TPU first, then GPU" in text
    assert f"v6e-8 [{ZONE_T}: not offered]" in text
    assert "Can the model be converted to run on GPU? -> yes: feasible, ~10 person-days: port kernels" in text
    assert text.splitlines()[-1].startswith("  => m: convert_for_gpu -> nvidia-h100-80gb x8 on a3-highgpu-8g")


def test_unavailable_reasons_in_answers() -> None:
    profile = replace(profile_for(False, True, False, False, "no_wait"), allow_spot=False)
    d = decide(report_for(tpu=False, gpu=False, small=False), profile, Strategy.GPU_FIRST, NOW)
    answers = {s.question.split("?")[0]: s.answer for s in d.trail}
    assert "stockout met earlier in this run" in answers["Is a GPU available"]
    assert "quota NVIDIA_L4_GPUS has 0 free, needs 1; spot not allowed" in answers["Is a smaller GPU available"]


def test_wait_deadline_carried_between_walks() -> None:
    profile = profile_for(True, True, False, False, "may_wait")
    empty = report_for(False, False, False)
    first = decide(empty, profile, Strategy.TPU_FIRST, NOW)
    assert first.leaf == Leaf.WAIT and first.waiting_for == (AcceleratorKind.TPU, AcceleratorKind.GPU)
    later = NOW + dt.timedelta(minutes=50)
    second = decide(empty, profile, Strategy.TPU_FIRST, later, first.wait_state())
    assert second.leaf == Leaf.WAIT and second.wait_deadline == first.wait_deadline
    assert "(10m left)" in second.trail[-1].answer
    at_deadline = decide(empty, profile, Strategy.TPU_FIRST, NOW + dt.timedelta(hours=1), first.wait_state())
    assert at_deadline.leaf == Leaf.STUCK
    assert "deadline" in at_deadline.trail[-1].answer and "passed" in at_deadline.trail[-1].answer
    assert "the wait deadline passed" in at_deadline.stuck_report
    # capacity came back while waiting
    back = decide(report_for(False, True, False), profile, Strategy.TPU_FIRST, later, first.wait_state())
    assert back.leaf == Leaf.GPU and back.wait_state() == WaitState()
    zero = decide(empty, replace(profile, max_wait=dt.timedelta(0)), Strategy.TPU_FIRST, NOW)
    assert zero.leaf == Leaf.STUCK and zero.trail[-1].answer == "no: the profile's max wait is 0"


def test_wait_after_conversion_records_the_conversion() -> None:
    profile = profile_for(False, True, False, True, "may_wait")
    d = decide(report_for(False, False, False), profile, Strategy.GPU_FIRST, NOW)
    assert d.leaf == Leaf.WAIT
    assert d.conversion == profile.convert_to_tpu and d.converted_for == AcceleratorKind.TPU


# ---------------------------------------------------------------------------------------------------
# Provisioning mode and zone/candidate choice.


def _gpu_entry(zone: str, **kw: object) -> CapacityEntry:
    return CapacityEntry(zone, GPU.accelerator_type, AcceleratorKind.GPU, offered=True, **kw)


def _gpu_profile(**kw: object) -> ModelProfile:
    return replace(profile_for(False, True, False, False, "no_wait"), **kw)


def test_reservation_wins_over_earlier_zone() -> None:
    report = CapacityReport(
        entries=(
            _gpu_entry("us-central1-a"),
            _gpu_entry(
                "us-central1-b",
                reserved=8,
                reservations=(ReservationRoom("h100-res", "a3-highgpu-8g", 1, 8),),
            ),
        )
    )
    d = decide(report, _gpu_profile(), Strategy.GPU_FIRST, NOW)
    assert (d.zone, d.mode, d.reservation) == ("us-central1-b", ProvisioningMode.RESERVATION, "h100-res")
    assert "reservation h100-res has 1 free VM(s)" in d.trail[-1].answer


def test_reservation_of_another_machine_shape_is_not_used() -> None:
    report = CapacityReport(
        entries=(_gpu_entry("us-central1-a", reserved=4, reservations=(ReservationRoom("r", "a3-highgpu-4g", 1, 4),)),)
    )
    d = decide(report, _gpu_profile(), Strategy.GPU_FIRST, NOW)
    assert (d.mode, d.reservation) == (ProvisioningMode.ON_DEMAND, None)


def test_reservation_used_when_quota_exhausted() -> None:
    report = CapacityReport(
        entries=(
            _gpu_entry(
                "us-central1-a",
                quota=QuotaState.EXHAUSTED,
                quota_headroom=0.0,
                quota_metric="X",
                reserved=8,
                reservations=(ReservationRoom("r", "a3-highgpu-8g", 1, 8),),
            ),
        )
    )
    assert decide(report, _gpu_profile(), Strategy.GPU_FIRST, NOW).mode == ProvisioningMode.RESERVATION


@pytest.mark.parametrize(
    ("quota", "headroom", "spot", "spot_headroom", "allow_spot", "mode"),
    [
        (QuotaState.OK, 8.0, QuotaState.UNKNOWN, None, False, ProvisioningMode.ON_DEMAND),
        (QuotaState.UNKNOWN, None, QuotaState.UNKNOWN, None, False, ProvisioningMode.ON_DEMAND),
        (QuotaState.OK, 4.0, QuotaState.UNKNOWN, None, False, None),  # 4 free, needs 8
        (QuotaState.OK, 4.0, QuotaState.OK, 8.0, True, ProvisioningMode.SPOT),
        (QuotaState.EXHAUSTED, 0.0, QuotaState.UNKNOWN, None, True, ProvisioningMode.SPOT),
        (QuotaState.EXHAUSTED, 0.0, QuotaState.EXHAUSTED, 0.0, True, None),
        (QuotaState.EXHAUSTED, 0.0, QuotaState.OK, 16.0, False, None),
        (QuotaState.OK, 8.0, QuotaState.OK, 8.0, True, ProvisioningMode.ON_DEMAND),  # on-demand first
    ],
)
def test_gpu_modes(
    quota: QuotaState,
    headroom: float | None,
    spot: QuotaState,
    spot_headroom: float | None,
    allow_spot: bool,
    mode: ProvisioningMode | None,
) -> None:
    report = CapacityReport(
        entries=(
            _gpu_entry(
                "us-central1-a",
                quota=quota,
                quota_headroom=headroom,
                quota_metric="M",
                spot_quota=spot,
                spot_quota_headroom=spot_headroom,
            ),
        )
    )
    d = decide(report, _gpu_profile(allow_spot=allow_spot), Strategy.GPU_FIRST, NOW)
    assert d.mode == mode
    assert d.leaf == (Leaf.GPU if mode else Leaf.STUCK)


def test_tpu_queued_when_preferred_and_tpu_reservation() -> None:
    profile = replace(profile_for(True, False, False, False, "no_wait"), prefer_queued=True)
    report = CapacityReport(entries=(CapacityEntry(ZONE_T, "v6e-8", AcceleratorKind.TPU, True),))
    assert decide(report, profile, Strategy.TPU_FIRST, NOW).mode == ProvisioningMode.QUEUED
    reserved = CapacityReport(entries=(CapacityEntry(ZONE_T, "v6e-8", AcceleratorKind.TPU, True, reserved=1),))
    d = decide(reserved, profile, Strategy.TPU_FIRST, NOW)
    assert (d.mode, d.reservation) == (ProvisioningMode.RESERVATION, None)


@pytest.mark.parametrize(
    ("tpu_type", "mode"),
    [
        ("v6e-8", ProvisioningMode.ON_DEMAND),  # one host of 8 chips
        ("v6e-16", ProvisioningMode.QUEUED),  # 4 hosts of 4 chips
        ("v5litepod-16", ProvisioningMode.QUEUED),
        ("v5p-8", ProvisioningMode.ON_DEMAND),
        ("v5p-16", ProvisioningMode.QUEUED),
        ("v4-8", ProvisioningMode.ON_DEMAND),
        ("v4-16", ProvisioningMode.QUEUED),
    ],
)
def test_a_multi_host_slice_is_asked_for_as_a_queued_resource_even_unpreferred(
    tpu_type: str, mode: ProvisioningMode
) -> None:
    profile = replace(
        profile_for(True, False, False, False, "no_wait"), tpu_candidates=(Candidate(tpu_type),), prefer_queued=False
    )
    report = CapacityReport(entries=(CapacityEntry(ZONE_T, tpu_type, AcceleratorKind.TPU, True),))
    assert decide(report, profile, Strategy.TPU_FIRST, NOW).mode == mode


def test_candidate_order_beats_zone_order() -> None:
    profile = replace(
        profile_for(True, False, False, False, "no_wait"),
        tpu_candidates=(Candidate("v6e-8"), Candidate("v5litepod-8")),
    )
    report = CapacityReport(
        entries=(
            CapacityEntry("z1-a", "v5litepod-8", AcceleratorKind.TPU, True),
            CapacityEntry("z2-a", "v6e-8", AcceleratorKind.TPU, True),
        )
    )
    assert decide(report, profile, Strategy.TPU_FIRST, NOW).accelerator_type == "v6e-8"
    placement, answer = find_placement(report, (), profile)
    assert placement is None and answer == "no: the profile lists no candidates"
    _, answer = find_placement(CapacityReport(entries=()), (Candidate("v5p-8"),), profile)
    assert answer == "no: v5p-8 [not probed]"


def test_stockout_at_provisioning_walks_again_until_wait() -> None:
    """Each stockout met moves the choice on: next zone, next candidate, then the other family, then wait."""
    profile = replace(
        profile_for(True, True, False, False, "may_wait"),
        tpu_candidates=(Candidate("v6e-8"), Candidate("v5litepod-8")),
    )
    report = CapacityReport(
        entries=(
            CapacityEntry("us-east5-b", "v6e-8", AcceleratorKind.TPU, True),
            CapacityEntry("europe-west4-a", "v6e-8", AcceleratorKind.TPU, True),
            CapacityEntry("us-east5-b", "v5litepod-8", AcceleratorKind.TPU, True),
            CapacityEntry("us-central1-a", GPU.accelerator_type, AcceleratorKind.GPU, True),
        )
    )
    picks = []
    for _ in range(10):
        d = decide(report, profile, Strategy.TPU_FIRST, NOW)
        if not d.provisions:
            break
        picks.append((d.leaf, d.zone, d.accelerator_type))
        report = mark_stockout(report, d.zone, d.accelerator_type)
    assert picks == [
        (Leaf.TPU, "us-east5-b", "v6e-8"),
        (Leaf.TPU, "europe-west4-a", "v6e-8"),
        (Leaf.TPU, "us-east5-b", "v5litepod-8"),
        (Leaf.GPU, "us-central1-a", GPU.accelerator_type),
    ]
    assert d.leaf == Leaf.WAIT


def test_stuck_report_says_what_was_checked_and_what_would_help() -> None:
    profile = ModelProfile(
        name="big",
        runs_on_tpu=False,
        runs_on_gpu=True,
        tpu_candidates=(TPU,),
        gpu_candidates=(GPU, Candidate("nvidia-l4", 1, "g2-standard-8")),
    )
    report = CapacityReport(
        entries=(
            _gpu_entry("us-central1-a", stocked_out=True),
            CapacityEntry(
                "us-central1-a",
                "nvidia-l4",
                AcceleratorKind.GPU,
                True,
                QuotaState.EXHAUSTED,
                "NVIDIA_L4_GPUS",
                0.0,
                QuotaState.OK,
                8.0,
            ),
        ),
        notes=("TPU quotas: unknown",),
    )
    d = decide(report, profile, Strategy.TPU_FIRST, NOW)
    assert d.leaf == Leaf.STUCK
    text = d.stuck_report
    assert text.startswith("No accelerator for model 'big' (strategy tpu_first)")
    assert "us-central1-a: offered, quota unknown (no regional metric), STOCKOUT met earlier" in text
    assert "raise quota NVIDIA_L4_GPUS in us-central1" in text
    assert "allow spot in the profile (nvidia-l4 spot quota ok in us-central1)" in text
    assert "nvidia-h100-80gb stocked out in us-central1-a" in text
    assert "allow waiting (wait_allowed, max_wait)" in text
    assert "conversion to TPU: not feasible" in text
    assert "Probe notes:\n  TPU quotas: unknown" in text
    assert "GPU nvidia-l4 x1 (g2-standard-8):" in text


def test_stuck_report_for_unprobed_and_unoffered_types() -> None:
    profile = profile_for(True, False, False, False, "no_wait")
    d = decide(report_for(False, False, False), profile, Strategy.TPU_FIRST, NOW)
    assert "v6e-8 is offered in none of the probed zones" in d.stuck_report
    other = replace(profile, tpu_candidates=(Candidate("v5p-8"),))
    assert "probe v5p-8" in decide(report_for(False, False, False), other, Strategy.TPU_FIRST, NOW).stuck_report
    neither = ModelProfile(name="n", runs_on_tpu=False, runs_on_gpu=False)
    d = decide(report_for(True, True, True), neither, Strategy.GPU_FIRST, NOW)
    assert d.leaf == Leaf.STUCK and "fix the profile" in d.stuck_report


def test_bad_strategy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="cheapest_first"):
        decide(
            report_for(True, True, True),
            profile_for(True, True, False, False, "no_wait"),
            "cheapest_first",
            NOW,
        )


# ---------------------------------------------------------------------------------------------------
# Profiles (the trees' other input).


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_json_round_trip(name: str) -> None:
    profile = get_profile(name)
    assert ModelProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile


def test_profile_defaults_and_errors() -> None:
    minimal = ModelProfile.from_dict({"name": "x", "runs_on_tpu": True, "runs_on_gpu": False})
    assert minimal.convert_to_gpu == NOT_FEASIBLE and minimal.tpu_candidates[0] == Candidate("v6e-8")
    assert minimal.gpu_candidates[0] == Candidate("nvidia-h100-80gb", 8, "a3-highgpu-8g")
    with pytest.raises(KeyError, match="unknown model profile 'nope'"):
        get_profile("nope")
    with pytest.raises(ValueError, match="not a GPU type"):
        ModelProfile(name="bad", runs_on_tpu=True, runs_on_gpu=True, gpu_candidates=(Candidate("v6e-8"),))
    with pytest.raises(ValueError, match="not a TPU type"):
        ModelProfile(name="bad", runs_on_tpu=True, runs_on_gpu=True, tpu_candidates=(SMALL,))
    assert Conversion(True).summary() == "feasible, effort unestimated"
    assert Conversion(False, notes="custom ASIC ops").summary() == "not feasible: custom ASIC ops"


def test_wait_state_round_trip() -> None:
    state = WaitState(started_at=NOW, checks=3)
    assert WaitState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert WaitState.from_dict(None) == WaitState()
