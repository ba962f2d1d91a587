"""When a quiet stage reads its startup script's last words: the first look, the back-off, the cap, the reset."""

from __future__ import annotations

import itertools

import pytest

from interlude.startup_looks import SUSPECT_SECONDS, LookClock, LookPlan, after_look, look_due, look_plan

PLAN = LookPlan(period=40.0, cap=150.0)
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
    assert look_plan(poll, stall) == LookPlan(period=period, cap=cap)


def looks_until(end: float, plan: LookPlan = PLAN, poll: float = 10.0, quiet_since: float = 0.0) -> list[float]:
    """The times a stage that stays quiet (same context) looks, polling every `poll` seconds until `end`."""
    clock, times = LookClock(), []
    for i in itertools.count():
        now = i * poll
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
