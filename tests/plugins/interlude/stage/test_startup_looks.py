"""When a quiet stage reads its startup script's last words: the first look, the back-off, the cap, the reset, and
how the looks of many stages are spread."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from interlude.stage.startup_looks import (
    SUSPECT_SECONDS,
    LookClock,
    LookPlan,
    after_look,
    look_due,
    look_plan,
    look_spread,
)

PLAN = LookPlan(period=40.0, cap=150.0, first=40.0)
CTX = (1000.0, "READY", None)


@pytest.mark.parametrize(
    ("poll", "stall", "period", "cap"),
    [
        (10.0, 600.0, 40.0, 150.0),  # the product's defaults: four polls; a quarter of the stall timeout
        (1.0, 600.0, SUSPECT_SECONDS, 150.0),  # fast polls: never under the floor
        (2.0, 30.0, SUSPECT_SECONDS, 20.0),  # short stall timeout: at least two periods
        (10.0, 3600.0, 40.0, 900.0),
        (60.0, 100.0, 240.0, 480.0),
    ],
)
def test_plan_scales_with_the_poll_interval_and_the_stall_timeout(
    poll: float, stall: float, period: float, cap: float
) -> None:
    assert look_plan(poll, stall) == LookPlan(period=period, cap=cap, first=period)


def looks_until(
    end: float, plan: LookPlan = PLAN, poll: float = 10.0, quiet_since: float = 0.0, phase: float = 0.0
) -> list[float]:
    """The times a stage that stays quiet (same context) looks, polling every `poll` seconds (the first poll
    `phase` seconds in) until `end`."""
    clock, times = LookClock(), []
    for i in itertools.count():
        now = phase + i * poll
        if now > end:
            return times
        if look_due(clock, CTX, now - quiet_since, now, plan):
            times.append(now)
            clock = after_look(clock, CTX, now, plan)
    raise AssertionError("unreachable")


def test_a_quiet_stage_looks_after_one_period_then_twice_as_late_each_time_up_to_the_cap() -> None:
    assert looks_until(1000.0) == [40.0, 120.0, 270.0, 420.0, 570.0, 720.0, 870.0]  # gaps 80, then 160 capped at 150
    gaps = [b - a for a, b in itertools.pairwise(looks_until(5000.0))]
    assert max(gaps) == PLAN.cap and gaps == sorted(gaps)


def test_the_back_off_bounds_the_calls_of_a_long_quiet_stage() -> None:
    """An hour of silence: 25 looks instead of the 90 a look every period would make."""
    assert len(looks_until(3600.0)) == 25


@pytest.mark.parametrize("quiet_for", [0.0, 10.0, 39.9])
def test_no_look_before_a_period_of_quiet(quiet_for: float) -> None:
    assert not look_due(LookClock(), CTX, quiet_for, 0.0, PLAN)
    assert look_due(LookClock(), CTX, PLAN.period, 0.0, PLAN)


@pytest.mark.parametrize(
    "changed",
    [
        (1500.0, "READY", None),  # progress moved (then stopped again)
        (1000.0, "REBOOTING", None),  # the machine's state
        (1000.0, "READY", ("SCHEDULED", "PENDING")),  # a maintenance notice came up
    ],
)
def test_any_change_resets_the_back_off(changed: tuple[object, ...]) -> None:
    clock = LookClock()
    for now in (40.0, 120.0, 280.0):
        clock = after_look(clock, CTX, now, PLAN)
    assert clock.gap == PLAN.cap and not look_due(clock, CTX, 300.0, 300.0, PLAN)
    assert look_due(clock, changed, 300.0, 300.0, PLAN), "a new context is due as soon as it is quiet"
    assert not look_due(clock, changed, 39.0, 300.0, PLAN), "but only after a period of quiet"
    fresh = after_look(clock, changed, 300.0, PLAN)
    assert fresh == LookClock(context=changed, next_at=300.0 + 2 * PLAN.period, gap=2 * PLAN.period)


def test_after_look_never_waits_longer_than_the_cap_nor_less_than_two_periods() -> None:
    clock = LookClock()
    for now in range(0, 10_000, 37):
        clock = after_look(clock, CTX, float(now), PLAN)
        assert 2 * PLAN.period <= clock.gap <= PLAN.cap
        assert clock.next_at == now + clock.gap


# ------------------------------------------------------------------------------------- spreading many stages' looks
BENCH = [f"tpu_node/us-central1-a/bench-{i:05d}/bench-{i:05d}/train" for i in range(1000)]


def test_a_stage_s_spread_is_its_own_and_the_same_every_time() -> None:
    """Hashed from the identity (not Python's salted hash()): a fixed value, in [0, 1), distinct per stage."""
    spreads = [look_spread(identity) for identity in BENCH]
    assert spreads == [look_spread(identity) for identity in BENCH]
    assert look_spread("tpu_node/us-central1-a/bench-00000/bench-00000/train") == pytest.approx(spreads[0])
    assert all(0.0 <= s < 1.0 for s in spreads)
    assert len(set(spreads)) == len(spreads)


def test_spreads_of_many_stages_fill_every_tenth_of_the_range() -> None:
    tenths = Counter(int(look_spread(identity) * 10) for identity in BENCH)
    assert sorted(tenths) == list(range(10))
    assert all(70 <= n <= 130 for n in tenths.values()), tenths


@pytest.mark.parametrize("spread", [-0.01, 1.0, 1.5])
def test_a_spread_outside_zero_to_one_is_refused(spread: float) -> None:
    with pytest.raises(ValueError, match="spread"):
        look_plan(10.0, 600.0, spread)


@pytest.mark.parametrize("spread", [0.0, 0.01, 0.25, 0.5, 0.75, 0.999])
@pytest.mark.parametrize(("poll", "stall"), [(10.0, 600.0), (1.0, 600.0), (2.0, 30.0), (60.0, 100.0)])
def test_a_spread_stage_looks_first_within_two_periods_then_never_more_than_a_cap_apart(
    spread: float, poll: float, stall: float
) -> None:
    """The first look after (1 + spread) periods of quiet (so within two, at the poll after), the next two
    periods later (when the cap is longer), then gaps of at most a cap (+ the poll that sees it due), in the
    stage's slot of each cycle; as many looks as without the spread (give or take one: the first look is later,
    the first slot may come early)."""
    plan = look_plan(poll, stall, spread)
    plain = look_plan(poll, stall)
    assert (plan.period, plan.cap) == (plain.period, plain.cap)
    assert plan.first == pytest.approx(plain.period * (1 + spread)) and plan.slot == pytest.approx(spread * plan.cap)
    times = looks_until(40 * plan.cap, plan, poll=poll)
    assert plan.first <= times[0] < plan.first + poll and times[0] < 2 * plan.period + poll
    if plan.cap > 2 * plan.period:  # else two periods are the cap already: the second look is in the slot
        assert times[0] + 2 * plan.period <= times[1] < times[0] + 2 * plan.period + poll
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap < plan.cap + poll for gap in gaps)
    assert abs(len(times) - len(looks_until(40 * plan.cap, plain, poll=poll))) <= 1
    steady = times[-10:]  # long past the first slot: every look in the stage's slot (at the poll that sees it due)
    assert all(0 <= (t - plan.slot) % plan.cap < poll for t in steady), (steady, plan)


def test_a_thousand_stages_deferred_together_look_over_a_period_then_evenly() -> None:
    """A triggerer restart: 1,000 quiet stages start their clocks together (polls every 10 s, each at its own
    phase). Not spread, they all look in one poll and then together every cap; spread, at most ~a quarter of
    them in any one poll of the first period, and after that the same number of looks, evenly over every cycle."""

    def per_minute(spread: bool) -> tuple[Counter[int], Counter[int], int]:
        minutes: Counter[int] = Counter()
        tens: Counter[int] = Counter()
        total = 0
        for i, identity in enumerate(BENCH):
            plan = look_plan(10.0, 600.0, look_spread(identity) if spread else None)
            times = looks_until(7200.0, plan, quiet_since=i % 10, phase=i % 10)
            total += len(times)
            minutes.update(int(t // 60) for t in times)
            tens.update(int(t // 10) for t in times[:1])
        return minutes, tens, total

    plain_minutes, plain_tens, plain_total = per_minute(spread=False)
    minutes, tens, total = per_minute(spread=True)
    assert max(plain_tens.values()) == 1000 and max(plain_minutes.values()) == 1000
    assert max(tens.values()) <= 300, tens  # the first looks: over a whole period, not in one poll
    assert total == pytest.approx(plain_total, rel=0.02), "the same calls, not more"
    steady = [minutes[m] for m in range(30, 120)]  # from half an hour on: 1,000 stages / 150 s = 400 a minute
    assert 330 <= min(steady) and max(steady) <= 470, steady
    assert min(plain_minutes[m] for m in range(30, 120)) == 0, "not spread: bursts and silent minutes"
