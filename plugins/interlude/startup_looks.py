"""When a quiet stage reads its startup script's last words (a TPU node's guest attribute, a VM's serial console).

A READY machine whose workload stopped reporting is worth a look: if its startup script ended, nothing runs the
workload any more and the stage should restart it now, not at the stall timeout. The look is one API call per
stage (getGuestAttributes / getSerialPortOutput), the only per-stage call a watch makes, so a triggerer watching
many quiet stages must not repeat it every period forever: after a look that changed nothing the next one waits
twice as long, up to a cap, and everything starts afresh when the stage's progress, the machine's state or its
maintenance notice changes. A script that ends within the first period is seen at the first look (as before);
one that ends later is seen at most ``cap`` after it ended, and the cap is a quarter of the stall timeout, so
the look still comes well before the stall rule would act.
"""

from __future__ import annotations

from dataclasses import dataclass

SUSPECT_SECONDS = 10.0
"""The shortest quiet spell worth a look, whatever the poll interval (the period is max(this, 4 polls))."""


@dataclass(frozen=True)
class LookPlan:
    """How often a stage may look: the first look after ``period`` of quiet, then gaps doubling up to ``cap``."""

    period: float
    cap: float


def look_plan(poll_interval: float, stall_timeout: float) -> LookPlan:
    """The period scales with the poll interval (four polls, at least SUSPECT_SECONDS); the cap with the stall
    timeout (a quarter of it, at least two periods)."""
    period = max(SUSPECT_SECONDS, 4 * poll_interval)
    return LookPlan(period=period, cap=max(2 * period, stall_timeout / 4))


@dataclass(frozen=True)
class LookClock:
    """One stage's looks so far (monotonic seconds). ``context`` is what they were about: a change resets."""

    context: tuple[object, ...] = ()
    next_at: float = float("-inf")  # no look before this
    gap: float = 0.0  # the wait set by the last look (0: no look yet in this context)


def look_due(clock: LookClock, context: tuple[object, ...], quiet_for: float, now: float, plan: LookPlan) -> bool:
    """Quiet for a period and past the backed-off time of the next look (of this context: a new context is due
    as soon as it has been quiet for a period)."""
    if quiet_for < plan.period:
        return False
    return context != clock.context or now >= clock.next_at


def after_look(clock: LookClock, context: tuple[object, ...], now: float, plan: LookPlan) -> LookClock:
    """A look that led to no event: the next waits twice the last gap (two periods after a first look), up to
    the cap."""
    last = clock.gap if context == clock.context else 0.0
    gap = min(plan.cap, 2 * max(last, plan.period))
    return LookClock(context=context, next_at=now + gap, gap=gap)
