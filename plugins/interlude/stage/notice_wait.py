"""A long maintenance notice is training time: the stage state machine's use of the maintenance policy.

Pure glue between :mod:`interlude.stage.machine` (the stage state machine) and the table-driven
:mod:`interlude.stage.notice_policy`. Without a policy (``maintenance_policy="checkpoint_at_notice"``) every
notice is answered with a checkpoint at once, the way Interlude always did. With one, a notice whose window
is further away than the margin opens the event in the NOTICED phase: training goes on, and the checkpoint
is requested when the plan says (window start minus a margin sized from what a checkpoint really costs on
this run: the workload reports its own commit durations and step time). Once that checkpoint is answered and
the workload holds at a commit before the window (its own margin), or at the boundary between two stages, the
maintenance is started early with ``performMaintenance`` when Google allows it (``canReschedule`` and PENDING),
so the window is spent at a planned pause; in that short phase the trigger looks ten times as often.

The policy's durations are Google-real seconds; the machine's clock runs ``time_scale`` times faster on
the local cloud, so the parameters are scaled once here and every comparison is in real seconds.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from interlude.stage.model import Action, Limits, Machine, Notice, Observation, Phase, StageState, Transition
from interlude.stage.notice_policy import (
    MaintenanceKind,
    NoticePlan,
    NoticePolicy,
    Pause,
    PolicyParams,
    kind_for,
    plan_for_notice,
    start_early_now,
)
from interlude.stage.transitions import close, down, maybe_reprovision, rebooted, resumed

POLICIES = ("by_notice", "checkpoint_at_notice")
"""Run param ``maintenance_policy``: the policy by notice length, or the old answer (checkpoint at once)."""


def policy_for(
    machine: Mapping[str, Any],
    name: str,
    time_scale: float,
    overrides: Mapping[str, Any] | None = None,
    poll_seconds: float = 0.0,
    stage_follows: bool = False,
) -> NoticePolicy | None:
    """The stage's policy from its machine record and the run's ``maintenance_policy`` (None: the old way)."""
    if name not in POLICIES:
        raise ValueError(f"maintenance_policy must be one of {POLICIES}, not {name!r}")
    if name == "checkpoint_at_notice":
        return None
    gpu = machine.get("kind") == "gce_vm"
    kind = kind_for(
        "gpu" if gpu else "tpu",
        machine_type=machine.get("machine_type"),
        hosts=1 if gpu else slice_hosts(machine.get("accelerator_type")),
        spot=machine.get("mode") == "spot",
    )
    return NoticePolicy(kind, PolicyParams.from_mapping(overrides), time_scale, poll_seconds, stage_follows)


def slice_hosts(accelerator_type: str | None) -> int:
    """Hosts (TPU VMs) of a TPU slice from its type, by the runtime table: v5e/v6e slices up to 8 chips are
    one host, larger ones spread over 4-chip hosts (v6e-16 = 4 hosts; plugins/interlude/runtimes/runtimes.yaml,
    https://cloud.google.com/tpu/docs/v6e). An unknown type counts as one host."""
    from interlude.runtimes.tpu import UnknownAcceleratorError, parse_tpu_type

    if not accelerator_type:
        return 1
    try:
        return parse_tpu_type(accelerator_type).hosts
    except UnknownAcceleratorError:
        return 1


def policy_overrides(
    *,
    checkpoint_margin_commits: float,
    checkpoint_margin_min_seconds: float,
    start_early_within_seconds: float,
    reprovision_margin_seconds: float,
    down_budget_seconds: float,
) -> dict[str, Any]:
    """The run's policy params (RunSpec) as :class:`PolicyParams` overrides. ``down_budget_seconds`` 0 keeps
    Google's figure per kind; another value replaces it for every kind but Spot (a preempted Spot machine
    never comes back: waiting for it is never right)."""
    budgets = {k.value: down_budget_seconds for k in MaintenanceKind if k is not MaintenanceKind.SPOT}
    return {
        "commit_margin_factor": checkpoint_margin_commits,
        "min_margin_s": checkpoint_margin_min_seconds,
        "near_window_s": start_early_within_seconds,
        "reprovision_margin_s": reprovision_margin_seconds,
        "down_budget_s": budgets if down_budget_seconds > 0 else {},
    }


def workload_margins(policy: NoticePolicy | None) -> tuple[float | None, float | None]:
    """The workload's own hold margin (the plan's ``hold_margin_seconds``, ``hold_margin_commits``): the same
    margin the control plane plans with, so the workload holds where the plan puts the last checkpoint even
    when the control plane is slow to answer. None: the trainer's defaults (the old behaviour)."""
    if policy is None:
        return None, None
    real = policy.real()
    return real.min_margin_s, real.commit_margin_factor


def _epoch(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def plannable(notice: Notice | None) -> Notice | None:
    """The notice when the policy can plan around it (None: no notice, or no window start)."""
    return notice if notice is not None and notice.starts_at is not None else None


def checkpoint_cost(obs: Observation, policy: NoticePolicy) -> float:
    """What a checkpoint costs as the control plane sees it: the poll that notices it is due, then the
    workload's own measure (a step to reach the check and its slowest recent commit)."""
    return policy.poll_seconds + (obs.commit_seconds or 0.0)


def plan(obs: Observation, limits: Limits) -> NoticePlan | None:
    """The policy's plan for this observation's notice (None: no policy, or nothing to plan around)."""
    policy: NoticePolicy | None = limits.notice_policy
    notice = plannable(obs.notice)
    if policy is None or notice is None:
        return None
    return plan_for_notice(policy.kind, notice, checkpoint_cost(obs, policy), obs.now, policy.real())


def on_notice(state: StageState, obs: Observation, limits: Limits, event: dict[str, Any]) -> Transition | None:
    """A new notice on a READY machine: keep training when the plan gives time (None: checkpoint now)."""
    noticed = plan(obs, limits)
    if noticed is None or noticed.checkpoint_at <= obs.now:
        return None
    event = {**event, "policy": noticed.to_dict(), "checkpoint_due_at": noticed.checkpoint_at}
    return Transition(replace(state, phase=Phase.NOTICED, event=event))


def noticed(state: StageState, obs: Observation, limits: Limits) -> Transition:
    """NOTICED: training goes on until the checkpoint is due; then it is requested as for any notice."""
    event = dict(state.event or {})
    if obs.machine is Machine.READY and rebooted(state, obs):  # down and back between two polls
        new = replace(state, phase=Phase.RESUMING, event={**event, "checkpoint_step": None})
        return close(new, obs) if resumed(new, obs) else Transition(new)
    if obs.machine is not Machine.READY:  # the window opened before the checkpoint was due
        new = replace(state, phase=Phase.AWAITING_RESTART, event={**event, "checkpoint_step": obs.committed_step})
        return maybe_reprovision(down(new, obs), obs, limits)
    if obs.notice is None and passed_unseen(event, obs):  # down and back between two polls, new boot not heard
        new = replace(state, phase=Phase.RESUMING, event={**event, "checkpoint_step": None})
        return close(new, obs) if resumed(new, obs) else Transition(new)
    if obs.notice is None:  # withdrawn: nothing happened, nothing to record
        return Transition(replace(state, phase=Phase.RUNNING, event=None))
    if obs.now >= float(event.get("checkpoint_due_at") or 0):
        rid = uuid.uuid4().hex[:12]
        event["checkpoint_requested_at"] = obs.now
        return Transition(
            replace(state, phase=Phase.CHECKPOINT_REQUESTED, request_id=rid, event=event), (Action.REQUEST_CHECKPOINT,)
        )
    return Transition(state)


def passed_unseen(event: dict[str, Any], obs: Observation) -> bool:
    """A notice gone from the API after its window opened, or with the workload saying it was stopped
    (SIGTERM: the machine went down), is a maintenance that came and went between two polls, not a withdrawn
    one: Google reschedules with a new notice, it does not drop one whose window has begun. Going back to
    RUNNING would forget the event (and a drill's): the next boot's report closes it instead."""
    if obs.workload_state == "stopped":
        return True
    start = _epoch(event.get("window_start"))
    return start is not None and obs.now >= start


def start_early(obs: Observation, limits: Limits, pause: Pause) -> bool:
    """At a natural pause: start the pending maintenance now with ``performMaintenance``? After a checkpoint
    only while the workload holds at it: performMaintenance stops the machine at once, and steps trained
    past the checkpoint would be recomputed (the window then opens on Google's schedule, the workload's own
    hold margin keeping them)."""
    policy: NoticePolicy | None = limits.notice_policy
    if policy is None or obs.notice is None or (pause is Pause.PHASE_BOUNDARY and not policy.stage_follows):
        return False
    if pause is Pause.AFTER_CHECKPOINT and not holding_at_commit(obs):
        return False
    notice = plannable(obs.notice)
    if notice is None:
        return False
    return start_early_now(notice, pause, obs.now, checkpoint_cost(obs, policy), policy.real())


def holding_at_commit(obs: Observation) -> bool:
    """The workload holds (it reports ``holding``) at its latest committed step, and that step is not older
    than the one answering our request: it trains no step until the window, so starting the maintenance now
    recomputes nothing. It need not hold at our checkpoint's step: after answering the request it may train
    on and hold at a later commit of its own (its own margin before the window)."""
    if obs.workload_state != "holding" or obs.progress_step != obs.committed_step:
        return False
    return obs.request_ack_step is None or obs.progress_step >= obs.request_ack_step


def start_early_on_hold(state: StageState, obs: Observation, limits: Limits) -> bool:
    """After our checkpoint was answered, before the window: the workload has begun holding at a commit (see
    :func:`holding_at_commit`), so the pause it takes anyway starts the maintenance now. Once per event (the
    notice stays PENDING until the next poll sees the window opened)."""
    if (state.event or {}).get("early_start_at") is not None:
        return False
    return start_early(obs, limits, Pause.AFTER_CHECKPOINT)


HOLD_WATCH_FRACTION = 0.1  # of the poll interval, while a hold before the window may begin at any moment
MIN_WATCH_SECONDS = 0.05


def watch_interval(state: StageState, obs: Observation, limits: Limits, poll_interval: float) -> float:
    """Seconds until the trigger looks again. A tenth of the poll (not under 50 ms) in the one short phase
    where looking sooner buys training time: our checkpoint was answered, the window is near, Google allows an
    early start, and the workload will hold before the window (its own margin: a few commits, 60 Google-seconds
    at least). Each poll later it sees the hold is a poll's worth of idle machine. Elsewhere the normal poll."""
    policy: NoticePolicy | None = limits.notice_policy
    event = state.event or {}
    quick = (
        policy is not None
        and state.phase is Phase.AWAITING_RESTART
        and obs.machine is Machine.READY
        and obs.notice is not None
        and event.get("down_at") is None
        and event.get("early_start_at") is None
    )
    notice = plannable(obs.notice) if quick else None
    if policy is None or notice is None:
        return poll_interval
    if not start_early_now(notice, Pause.AFTER_CHECKPOINT, obs.now, checkpoint_cost(obs, policy), policy.real()):
        return poll_interval
    return min(poll_interval, max(MIN_WATCH_SECONDS, poll_interval * HOLD_WATCH_FRACTION))


def boundary_event(state: StageState, obs: Observation) -> dict[str, Any]:
    """The record of a maintenance started early between two stages: the window is spent at the pause."""
    notice = obs.notice
    return {
        "event_id": uuid.uuid4().hex[:12],
        "kind": "maintenance_started_early",
        "pause": Pause.PHASE_BOUNDARY.value,
        "notice_type": notice.kind if notice else None,
        "window_start": notice.window_start if notice else None,
        "detected_at": obs.now,
        "started_at": obs.now,
        "checkpoint_step": obs.committed_step,
        "steps_recomputed": 0,
        "downtime_s": 0.0,
    }
