"""When a down machine is given up on: Google says it is gone, or its window's end / its kind's budget is past.

Pure: the policy's decision functions over every kind, window shape and machine state, then the stage state
machine on Google's clock (time_scale 1) and on the local cloud's (600x), with no Airflow.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from interlude.stage import down_wait
from interlude.stage.machine import next_step
from interlude.stage.model import Action, Limits, Machine, Notice, Observation, Phase, StageState
from interlude.stage.notice_policy import (
    GONE_STATES,
    HOUR,
    KINDS,
    MachineState,
    MaintenanceKind,
    NoticePolicy,
    PolicyParams,
    machine_gone,
    reprovision_deadline,
    reprovision_due,
)
from interlude.stage.notice_wait import policy_for, policy_overrides, slice_hosts
from interlude.stage.observe import gce_machine, tpu_machine

T0 = 1_800_000_000.0  # the machine goes down here (epoch seconds)
MARGIN = PolicyParams().reprovision_margin_s
STATES = ("READY", "RUNNING", "REPAIRING", "STOPPING", "TERMINATED", "STAGING", "CREATING", *sorted(GONE_STATES))


# ---------------------------------------------------------------------- the pure decision functions
@pytest.mark.parametrize("kind", list(MaintenanceKind))
@pytest.mark.parametrize("end_offset", [None, -2 * MARGIN, -MARGIN, -1.0, 0.0, 300.0, 5 * HOUR])
def test_reprovision_deadline_every_kind_and_window_shape(kind: MaintenanceKind, end_offset: float | None) -> None:
    """A window end still meaningful at the moment the machine went down wins (Google's own word); none, or a
    stale one (ended more than the margin before), leaves the kind's down budget."""
    end = None if end_offset is None else T0 + end_offset
    at = reprovision_deadline(kind, T0, end)
    if end is not None and end + MARGIN > T0:
        assert at == end + MARGIN
    else:
        assert at == T0 + KINDS[kind].down_budget_s
    overridden = reprovision_deadline(kind, T0, end, PolicyParams(down_budget_s={kind.value: 7.0}))
    assert overridden == (at if end is not None and end + MARGIN > T0 else T0 + 7.0)


def test_googles_budgets_per_kind() -> None:
    """GPU VMs: about an hour; TPU: an hour; multi-host slices: a few hours; Spot: none (gone at once)."""
    budgets = {k: reprovision_deadline(k, T0, None) - T0 for k in MaintenanceKind}
    assert budgets == {
        MaintenanceKind.TPU: HOUR,
        MaintenanceKind.TPU_MULTI_HOST: 3 * HOUR,
        MaintenanceKind.GPU: HOUR,
        MaintenanceKind.AI_HYPERCOMPUTER: HOUR,
        MaintenanceKind.SPOT: 0.0,
    }


@pytest.mark.parametrize(("exists", "state", "restart"), list(itertools.product((True, False), STATES, (True, False))))
def test_reprovision_due_every_machine_state(exists: bool, state: str, restart: bool) -> None:
    machine = MachineState(exists, state, restart)
    gone = not exists or state in GONE_STATES or (state == "TERMINATED" and not restart)
    assert machine_gone(machine) is gone
    up = state in ("READY", "RUNNING")
    deadline = T0 + HOUR
    for now in (T0, deadline - 1.0, deadline, deadline + HOUR):
        assert reprovision_due(machine, deadline, now) is (gone or (not up and now >= deadline)), (machine, now)


# ---------------------------------------------------------------------- what Google's resources say
@pytest.mark.parametrize(
    ("instance", "machine"),
    [
        (None, Machine.GONE),  # deleted
        ({"status": "TERMINATED", "scheduling": {"automaticRestart": False}}, Machine.GONE),
        ({"status": "TERMINATED", "scheduling": {"provisioningModel": "SPOT"}}, Machine.GONE),
        ({"status": "TERMINATED", "scheduling": {"automaticRestart": True}}, Machine.DOWN),  # on its way back
        ({"status": "TERMINATED"}, Machine.DOWN),  # automaticRestart defaults to true
        ({"status": "STOPPING"}, Machine.DOWN),
        ({"status": "STAGING"}, Machine.DOWN),
        ({"status": "RUNNING"}, Machine.READY),
    ],
)
def test_gce_gone_is_googles_word(instance: dict | None, machine: Machine) -> None:
    assert gce_machine(instance)[0] is machine


@pytest.mark.parametrize(
    ("node", "machine"),
    [
        (None, Machine.GONE),
        *[({"state": s}, Machine.GONE) for s in sorted(GONE_STATES)],
        ({"state": "REPAIRING", "health": "UNHEALTHY_MAINTENANCE"}, Machine.DOWN),
        ({"state": "TERMINATED"}, Machine.DOWN),
        ({"state": "READY", "health": "HEALTHY"}, Machine.READY),
    ],
)
def test_tpu_gone_is_googles_word(node: dict | None, machine: Machine) -> None:
    assert tpu_machine(node)[0] is machine


# ---------------------------------------------------------------------- hosts of a TPU slice
@pytest.mark.parametrize(
    ("accelerator_type", "hosts", "kind"),
    [
        ("v6e-1", 1, MaintenanceKind.TPU),
        ("v6e-8", 1, MaintenanceKind.TPU),  # one host of 8 chips
        ("v6e-16", 4, MaintenanceKind.TPU_MULTI_HOST),  # 4 hosts of 4 chips
        ("v6e-256", 64, MaintenanceKind.TPU_MULTI_HOST),
        ("v5litepod-8", 1, MaintenanceKind.TPU),
        ("v5litepod-16", 4, MaintenanceKind.TPU_MULTI_HOST),
        ("v5litepod-32", 8, MaintenanceKind.TPU_MULTI_HOST),
        ("not-a-tpu", 1, MaintenanceKind.TPU),
        (None, 1, MaintenanceKind.TPU),
    ],
)
def test_multi_host_slices_count_hosts(accelerator_type: str | None, hosts: int, kind: MaintenanceKind) -> None:
    assert slice_hosts(accelerator_type) == hosts
    policy = policy_for({"kind": "tpu_node", "accelerator_type": accelerator_type, "mode": "on_demand"}, "by_notice", 1)
    assert policy is not None and policy.kind is kind
    assert policy.real().budget(kind) == (3 * HOUR if hosts > 1 else HOUR)


# ---------------------------------------------------------------------- the stage state machine
def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def limits(
    kind: MaintenanceKind = MaintenanceKind.GPU, time_scale: float = 1.0, poll: float = 0.0, **params: object
) -> Limits:
    policy = NoticePolicy(kind, PolicyParams.from_mapping(params or None), time_scale, poll)
    return Limits(restart_timeout=120.0, notice_policy=policy)


def down_obs(now: float, machine: Machine = Machine.DOWN, window_end: float | None = None) -> Observation:
    notice = None
    if window_end is not None:
        notice = Notice("SCHEDULED", "ONGOING", window_start=stamp(T0), window_end=stamp(window_end))
    return Observation(now=now, machine=machine, notice=notice, committed_step=40, progress_step=40, boot_id="b1")


AWAITING = StageState(
    target_step=100,
    phase=Phase.AWAITING_RESTART,
    boot_id="b1",
    last_step_seen=40,
    event={"event_id": "e", "kind": "maintenance", "down_at": T0, "checkpoint_step": 40, "window_end": None},
)


def reprovisions(state: StageState, obs: Observation, lim: Limits) -> bool:
    t = next_step(state, obs, lim)
    return Action.REPROVISION in t.actions


@pytest.mark.parametrize("kind", [k for k in MaintenanceKind if k is not MaintenanceKind.SPOT])
def test_down_past_the_old_restart_timeout_but_inside_the_budget_waits(kind: MaintenanceKind) -> None:
    """Google's clock: the old 120 s would have deleted a machine in the middle of a normal maintenance."""
    lim = limits(kind)
    budget = KINDS[kind].down_budget_s
    assert reprovisions(AWAITING, down_obs(T0 + 121.0), Limits(restart_timeout=120.0))  # the old rule
    assert not reprovisions(AWAITING, down_obs(T0 + 121.0), lim)
    assert not reprovisions(AWAITING, down_obs(T0 + budget), lim)
    t = next_step(AWAITING, down_obs(T0 + budget + 1.0), lim)
    assert Action.REPROVISION in t.actions and "down budget" in t.state.event["reprovision_reason"]


def test_a_window_end_is_waited_for_with_margin_then_given_up_on() -> None:
    end = T0 + 2 * HOUR  # longer than the GPU budget: Google's window says so
    lim = limits()
    assert not reprovisions(AWAITING, down_obs(T0 + 1.5 * HOUR, window_end=end), lim)
    assert not reprovisions(AWAITING, down_obs(end + MARGIN, window_end=end), lim)
    t = next_step(AWAITING, down_obs(end + MARGIN + 1.0, window_end=end), lim)
    assert Action.REPROVISION in t.actions and "window" in t.state.event["reprovision_reason"]
    # The window end the event opened with counts when the notice is gone from the machine.
    opened = StageState(**{**AWAITING.to_dict(), "event": {**AWAITING.event, "window_end": stamp(end)}})
    assert not reprovisions(opened, down_obs(T0 + 1.5 * HOUR), lim)
    assert reprovisions(opened, down_obs(end + MARGIN + 1.0), lim)


@pytest.mark.parametrize("phase", [Phase.AWAITING_RESTART, Phase.RECOVERING, Phase.RESUMING])
def test_gone_is_reprovisioned_at_once_whatever_the_budget(phase: Phase) -> None:
    state = StageState(**{**AWAITING.to_dict(), "phase": phase})
    lim = limits(down_budget_s={"gpu": 10 * HOUR})
    t = next_step(state, down_obs(T0 + 1.0, Machine.GONE, window_end=T0 + HOUR), lim)
    assert Action.REPROVISION in t.actions and t.state.event["reprovision_reason"] == "Google says the machine is gone"


def test_running_machine_lost_without_notice_waits_the_budget() -> None:
    running = StageState(target_step=100, boot_id="b1", last_step_seen=40)
    lim = limits()
    t = next_step(running, down_obs(T0), lim)
    assert t.state.phase is Phase.RECOVERING and Action.REPROVISION not in t.actions
    assert not reprovisions(t.state, down_obs(T0 + HOUR), lim)
    assert reprovisions(t.state, down_obs(T0 + HOUR + 1.0), lim)


def test_the_local_clouds_time_scale_maps_the_budgets() -> None:
    """600x: the GPU's hour is 6 s, the margin's 10 minutes 1 s; never closer than POLL_SLACK polls."""
    lim = limits(time_scale=600.0, poll=0.5)
    assert down_wait.deadline({}, down_obs(T0), lim, T0)[0] == pytest.approx(T0 + 6.0)
    assert down_wait.deadline({}, down_obs(T0, window_end=T0 + 10.0), lim, T0)[0] == pytest.approx(T0 + 12.0)
    fast = limits(time_scale=600.0, poll=0.5, reprovision_margin_s=60.0)  # 0.1 s real: the polls' slack wins
    assert down_wait.deadline({}, down_obs(T0, window_end=T0 + 10.0), fast, T0)[0] == pytest.approx(T0 + 12.0)
    spot = limits(MaintenanceKind.SPOT, time_scale=600.0, poll=0.5)
    assert down_wait.deadline({}, down_obs(T0), spot, T0)[0] == T0  # nothing to wait for


def test_without_a_policy_the_old_restart_timeout_decides() -> None:
    old = Limits(restart_timeout=120.0)
    assert not reprovisions(AWAITING, down_obs(T0 + 120.0), old)
    assert reprovisions(AWAITING, down_obs(T0 + 120.5), old)


def test_policy_overrides_from_params() -> None:
    keep = policy_overrides(
        checkpoint_margin_commits=3.0,
        checkpoint_margin_min_seconds=60.0,
        start_early_within_seconds=900.0,
        reprovision_margin_seconds=600.0,
        down_budget_seconds=0.0,
    )
    assert PolicyParams.from_mapping(keep) == PolicyParams()
    params = PolicyParams.from_mapping(
        policy_overrides(
            checkpoint_margin_commits=2.0,
            checkpoint_margin_min_seconds=30.0,
            start_early_within_seconds=0.0,
            reprovision_margin_seconds=1.0,
            down_budget_seconds=2 * HOUR,
        )
    )
    assert (params.commit_margin_factor, params.min_margin_s, params.near_window_s) == (2.0, 30.0, 0.0)
    assert params.reprovision_margin_s == 1.0
    assert {k: params.budget(k) for k in MaintenanceKind} == {
        **{k: 2 * HOUR for k in MaintenanceKind},
        MaintenanceKind.SPOT: 0.0,  # a preempted Spot machine never comes back
    }
