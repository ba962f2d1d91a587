"""When a quiet stage reads its startup script's last words (a TPU node's guest attribute, a VM's serial console).

A READY machine whose workload stopped reporting is worth a look: if its startup script ended, nothing runs the
workload any more and the stage should restart it now, not at the stall timeout. The look is one API call per
stage (getGuestAttributes / getSerialPortOutput), the only per-stage call a watch makes, so a triggerer watching
many quiet stages must not repeat it every period forever: after a look that changed nothing the next one waits
twice as long, up to a cap, and everything starts afresh when the stage's progress, the machine's state or its
maintenance notice changes. A script that ends within the first period is seen at the first look (as before);
one that ends later is seen at most ``cap`` after it ended, and the cap is a quarter of the stall timeout, so
the look still comes well before the stall rule would act.

The looks of many stages are spread, each by a fraction of its own (``look_spread``, hashed from the stage's
identity, so the same after every restart): its first look comes after one to two periods of quiet, not all at
one period, and once its gaps reach the cap it looks in its own slot of the cap's cycle (on the process's
monotonic clock), at most a cap after its last look. Why: a triggerer restart (or a zone-wide event that resets
every stage's clock) starts a thousand stages' clocks together; without the spread they would all look at the
same poll, then again together at every cap, forever: a burst of a thousand calls against the API's per-minute
quota and the triggerer's event loop every few minutes, and nothing in the doubling would ever draw them apart.
With it the first looks arrive over a whole period and the later ones evenly over every cycle, for the same
number of calls. A maintenance notice never waits for a look: the machine's own state and notice are read every
poll (the shared zone list), the looks only tell whether the startup script still runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SUSPECT_SECONDS = 10.0
"""The shortest quiet spell worth a look, whatever the poll interval (the period is max(this, 4 polls))."""


@dataclass(frozen=True)
class LookPlan:
    """How often a stage may look: the first look after ``first`` seconds of quiet (one to two periods), then
    gaps of two periods, doubling, up to ``cap``; at the cap, in the stage's ``slot`` of every cap-long cycle
    (seconds into it; None: a cap after the last look, wherever that falls)."""

    period: float
    cap: float
    first: float
    slot: float | None = None


def look_spread(identity: str) -> float:
    """A stage's own fraction in [0, 1): the same for the same identity in every process and after every restart
    (a hash of it, not Python's salted ``hash``), evenly spread over many stages."""
    digest = hashlib.blake2b(identity.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def look_plan(poll_interval: float, stall_timeout: float, spread: float | None = None) -> LookPlan:
    """The period scales with the poll interval (four polls, at least SUSPECT_SECONDS); the cap with the stall
    timeout (a quarter of it, at least two periods). ``spread`` (``look_spread``; None: not spread) puts the
    first look ``spread`` periods later and the stage's slot ``spread`` of the way through the cap's cycle."""
    if spread is not None and not 0.0 <= spread < 1.0:
        raise ValueError(f"spread {spread} must be in [0, 1)")
    period = max(SUSPECT_SECONDS, 4 * poll_interval)
    cap = max(2 * period, stall_timeout / 4)
    if spread is None:
        return LookPlan(period=period, cap=cap, first=period)
    return LookPlan(period=period, cap=cap, first=period * (1.0 + spread), slot=spread * cap)


@dataclass(frozen=True)
class LookClock:
    """One stage's looks so far (monotonic seconds). ``context`` is what they were about: a change resets."""

    context: tuple[object, ...] = ()
    next_at: float = float("-inf")  # no look before this
    gap: float = 0.0  # the wait set by the last look (0: no look yet in this context)


def look_due(clock: LookClock, context: tuple[object, ...], quiet_for: float, now: float, plan: LookPlan) -> bool:
    """Quiet for the plan's first wait and past the backed-off time of the next look (of this context: a new
    context is due as soon as it has been quiet for that first wait)."""
    if quiet_for < plan.first:
        return False
    return context != clock.context or now >= clock.next_at


def after_look(clock: LookClock, context: tuple[object, ...], now: float, plan: LookPlan) -> LookClock:
    """A look that led to no event: the next waits twice the last gap (two periods after a first look), up to
    the cap; at the cap, until the stage's next slot (never more than a cap away, the first time maybe less)."""
    last = clock.gap if context == clock.context else 0.0
    gap = min(plan.cap, 2 * max(last, plan.period))
    if gap < plan.cap or plan.slot is None:
        return LookClock(context=context, next_at=now + gap, gap=gap)
    wait = (plan.slot - now) % plan.cap or plan.cap
    return LookClock(context=context, next_at=now + wait, gap=gap)
