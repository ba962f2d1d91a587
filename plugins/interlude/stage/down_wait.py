"""How long the stage waits for a machine that is down before it provisions another (pure glue).

A machine in host maintenance comes back: a GPU VM with ``automaticRestart`` passes TERMINATED and STAGING
back to RUNNING, a TPU node passes REPAIRING back to READY. Re-provisioning it early deletes a machine
that was about to return, doubles the bill and races it for the same checkpoint. So the stage provisions
another machine only when Google says this one is gone (deleted, PREEMPTED, TERMINATED without a restart:
:func:`interlude.stage.notice_policy.machine_gone`, folded into ``Machine.GONE`` by :mod:`interlude.stage.observe`)
or when it is still away at the deadline :func:`interlude.stage.notice_policy.reprovision_deadline` sets:
the notice's window end plus a margin, else the kind's down budget (Google's figures, in Google-real
seconds, run through the cloud's ``time_scale``).

Without a policy (``maintenance_policy=checkpoint_at_notice``, the old behaviour kept for comparison) the
single ``restart_timeout_seconds`` decides, as it always did.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from interlude.stage.model import Limits, Observation
from interlude.stage.notice_policy import reprovision_deadline

POLL_SLACK = 4
"""The control plane sees a machine come back up to a poll (and a cached zone list) late: a deadline is never
closer to the window's end than this many polls, or a machine back on time would be re-provisioned."""


def _epoch(text: Any) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


def window_end(event: dict[str, Any], obs: Observation) -> float | None:
    """Google's latest word on when the disruption ends: the notice on the machine now (ONGOING while it is
    down), else the one the event opened with."""
    if obs.notice is not None and obs.notice.window_end:
        return _epoch(obs.notice.window_end)
    return _epoch(event.get("window_end"))


def deadline(event: dict[str, Any], obs: Observation, limits: Limits, down_at: float) -> tuple[float, str]:
    """When a machine down since ``down_at`` is given up on (real seconds), and the rule that set it."""
    policy = limits.notice_policy
    if policy is None:
        return down_at + limits.restart_timeout, f"restart_timeout_seconds={limits.restart_timeout:.0f}"
    real = policy.real()
    slack = POLL_SLACK * policy.poll_seconds
    budget = real.budget(policy.kind)
    params = replace(
        real,
        reprovision_margin_s=max(real.reprovision_margin_s, slack),
        down_budget_s={**real.down_budget_s, policy.kind.value: max(budget, slack) if budget > 0 else 0.0},
    )
    end = window_end(event, obs)
    at = reprovision_deadline(policy.kind, down_at, end, params)
    if at != down_at + params.budget(policy.kind):
        return at, f"the maintenance window's end is {at - (end or 0):.1f}s (real) past"
    return at, f"the {policy.kind.value} down budget of {params.budget(policy.kind):.1f}s (real) is spent"


def overdue(event: dict[str, Any], obs: Observation, limits: Limits, down_at: float) -> str | None:
    """Why the machine is given up on now (None: keep waiting for it to come back)."""
    at, why = deadline(event, obs, limits, down_at)
    return why if obs.now > at else None
