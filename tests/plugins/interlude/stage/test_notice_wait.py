"""The stage state machine with the maintenance policy: a long notice is training time, a short one is not."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from interlude.stage.machine import next_step
from interlude.stage.model import Action, Limits, Machine, Notice, Observation, Phase, StageState
from interlude.stage.notice_policy import MaintenanceKind, NoticePolicy, PolicyParams
from interlude.stage.notice_wait import policy_for, watch_interval, workload_margins

T0 = 1_800_000_000.0  # the notice arrives here (epoch seconds)
GPU = NoticePolicy(MaintenanceKind.GPU, PolicyParams(), time_scale=600.0, stage_follows=True)  # 600x clock
POLICY = Limits(restart_timeout=100.0, notice_policy=GPU)
OLD = Limits(restart_timeout=100.0)


def notice(lead_s: float, mtype: str = "SCHEDULED", can: bool = True, status: str = "PENDING") -> Notice:
    start = datetime.fromtimestamp(T0 + lead_s, UTC).isoformat().replace("+00:00", "Z")
    return Notice(kind=mtype, status=status, window_start=start, can_reschedule=can)


def obs(
    now: float, n: Notice | None, *, step: int = 50, committed: int = 40, ack: int | None = None, **kw
) -> Observation:
    return Observation(
        now=now,
        machine=kw.pop("machine", Machine.READY),
        notice=n,
        committed_step=committed,
        progress_step=step,
        resumed_from=kw.pop("resumed", 0),
        boot_id=kw.pop("boot", "b1"),
        request_ack_step=ack,
        commit_seconds=0.2,  # the workload's measure: a step + its slowest commit
        workload_state=kw.pop("state", None),
    )


RUNNING = StageState(target_step=1000, boot_id="b1", last_step_seen=50)


def test_long_notice_keeps_training_until_the_margin_then_requests_the_checkpoint() -> None:
    """GPU, 6 s of notice (an hour on Google at 600x): margin = max(60 s/600, 3 x 0.2 s) = 0.6 s."""
    n = notice(6.0)
    t = next_step(RUNNING, obs(T0, n), POLICY)
    assert t.state.phase is Phase.NOTICED and t.actions == ()
    assert t.differs_from(RUNNING)  # the operator hears of it (and logs the plan)
    due = t.state.event["checkpoint_due_at"]
    assert due == pytest.approx(T0 + 6.0 - 0.6)
    held = next_step(t.state, obs(due - 0.1, n, step=90), POLICY)
    assert held.state.phase is Phase.NOTICED and held.actions == () and not held.differs_from(t.state)
    asked = next_step(held.state, obs(due, n, step=95), POLICY)
    assert asked.state.phase is Phase.CHECKPOINT_REQUESTED and asked.actions == (Action.REQUEST_CHECKPOINT,)
    assert asked.state.request_id and asked.state.event["step_at_detection"] == 50
    # The checkpoint answered with the window this near and canReschedule, the workload holding at it: start
    # the maintenance now.
    acked = next_step(asked.state, obs(due + 0.2, n, step=96, committed=96, ack=96, state="holding"), POLICY)
    assert acked.state.phase is Phase.AWAITING_RESTART and acked.actions == (Action.START_MAINTENANCE,)
    assert acked.state.event["checkpoint_step"] == 96


@pytest.mark.parametrize(
    ("step", "state"),
    [(99, "running"), (96, "running"), (99, "holding"), (96, None)],
    ids=["trained-on", "running-at-the-checkpoint", "holding-elsewhere", "unknown"],
)
def test_no_early_start_while_the_workload_may_train_past_the_checkpoint(step: int, state: str | None) -> None:
    """performMaintenance stops the machine at once: steps trained after the checkpoint would be recomputed,
    so the window opens on Google's schedule and the workload's own hold (its margin) keeps them."""
    n = notice(6.0)
    noticed = next_step(RUNNING, obs(T0, n), POLICY).state
    asked = next_step(noticed, obs(noticed.event["checkpoint_due_at"], n, step=95), POLICY).state
    acked = next_step(asked, obs(T0 + 5.6, n, step=step, committed=96, ack=96, state=state), POLICY)
    assert acked.state.phase is Phase.AWAITING_RESTART and acked.actions == ()


def test_the_old_way_checkpoints_at_once_and_never_starts_early() -> None:
    n = notice(6.0)
    t = next_step(RUNNING, obs(T0, n), OLD)
    assert t.state.phase is Phase.CHECKPOINT_REQUESTED and t.actions == (Action.REQUEST_CHECKPOINT,)
    acked = next_step(t.state, obs(T0 + 0.5, n, committed=51, ack=51), OLD)
    assert acked.state.phase is Phase.AWAITING_RESTART and acked.actions == ()


@pytest.mark.parametrize(
    "n",
    [
        notice(0.3),  # shorter than the margin
        notice(600.0, status="ONGOING"),  # already under way
        Notice(kind="SCHEDULED", status="PENDING", window_start=None),  # no window to plan around
    ],
)
def test_short_or_unplannable_notices_checkpoint_at_once(n: Notice) -> None:
    t = next_step(RUNNING, obs(T0, n), POLICY)
    assert t.actions == (Action.REQUEST_CHECKPOINT,)


def test_unscheduled_after_checkpoint_does_not_start_early() -> None:
    """canReschedule is false for UNSCHEDULED maintenance: performMaintenance would be refused."""
    n = notice(0.3, mtype="UNSCHEDULED", can=False)
    t = next_step(RUNNING, obs(T0, n), POLICY)
    acked = next_step(t.state, obs(T0 + 0.1, n, committed=51, ack=51), POLICY)
    assert acked.state.phase is Phase.AWAITING_RESTART and acked.actions == ()


def test_window_opening_early_while_noticed_keeps_the_committed_checkpoint() -> None:
    n = notice(6.0)
    noticed = next_step(RUNNING, obs(T0, n), POLICY).state
    gone = next_step(noticed, obs(T0 + 2, replace(n, status="ONGOING"), machine=Machine.DOWN, committed=60), POLICY)
    assert gone.state.phase is Phase.AWAITING_RESTART and gone.state.event["checkpoint_step"] == 60
    assert gone.state.event["down_at"] == T0 + 2


def test_withdrawn_notice_goes_back_to_running_without_an_event() -> None:
    noticed = next_step(RUNNING, obs(T0, notice(6.0)), POLICY).state
    t = next_step(noticed, obs(T0 + 1, None, step=60), POLICY)
    assert t.state.phase is Phase.RUNNING and t.state.event is None and t.event is None


@pytest.mark.parametrize("seen_at", [T0 + 7, T0 + 1], ids=["after-the-window-opened", "before-the-window"])
def test_a_notice_gone_with_the_workload_stopped_waits_for_the_new_boot_not_back_to_running(seen_at: float) -> None:
    """Seen in the stack under load: the window opened, the machine went down and came back between two
    polls, and the first poll after saw no notice and the old boot's last words (stopped at step 10). That
    is the maintenance: the event stays open until the new boot reports, then it is closed from its account."""
    noticed = next_step(RUNNING, obs(T0, notice(6.0)), POLICY).state
    t = next_step(noticed, obs(seen_at, None, step=60, committed=60, state="stopped"), POLICY)
    assert t.state.phase is Phase.RESUMING and t.state.event is not None and t.event is None
    back = next_step(t.state, obs(seen_at + 3, None, step=65, committed=60, boot="b2", resumed=60), POLICY)
    assert back.actions == (Action.RECORD_EVENT,) and back.state.phase is Phase.RUNNING
    assert back.event["resumed_from_step"] == 60 and back.event["checkpoint_step"] == 60


@pytest.mark.parametrize("workload", [None, "running"])
def test_a_notice_gone_after_its_window_with_the_workload_running_is_recorded_as_passed(workload: str | None) -> None:
    """The window opened and the notice is gone, the same boot still training: the maintenance passed without
    stopping it. That is recorded (not dropped as a withdrawal)."""
    noticed = next_step(RUNNING, obs(T0, notice(6.0)), POLICY).state
    t = next_step(noticed, obs(T0 + 7, None, step=60, committed=50, state=workload), POLICY)
    assert t.actions == (Action.RECORD_EVENT,) and t.state.phase is Phase.RUNNING
    assert t.event is not None and t.event["down_at"] is None


def test_a_drill_notice_that_passed_unseen_still_records_the_drill() -> None:
    """The drill's event must not vanish when the maintenance is quicker than a poll."""
    from interlude.stage.model import Drill

    sent = replace(RUNNING, drill=Drill.SENT, drill_step=50)
    noticed = next_step(sent, obs(T0, notice(6.0), state="holding"), POLICY).state
    assert noticed.drill is Drill.DONE and noticed.event["drill"] is True
    t = next_step(noticed, obs(T0 + 9, None, step=50, committed=50, state="stopped"), POLICY)
    back = next_step(t.state, obs(T0 + 12, None, step=52, committed=50, boot="b2", resumed=50), POLICY)
    assert back.event["drill"] is True and back.event["drill_step"] == 50 and back.event["resumed_from_step"] == 50


def test_reboot_while_noticed_is_closed_from_the_workload_account() -> None:
    noticed = next_step(RUNNING, obs(T0, notice(6.0)), POLICY).state
    t = next_step(noticed, obs(T0 + 8, None, step=75, committed=70, boot="b2", resumed=70), POLICY)
    assert t.actions == (Action.RECORD_EVENT,) and t.event["resumed_from_step"] == 70


def test_stage_boundary_starts_a_pending_reschedulable_maintenance() -> None:
    """Training done with the window still ahead: spend it between the stages; the event is not this stage's."""
    n = notice(6.0)
    noticed = next_step(RUNNING, obs(T0, n), POLICY).state
    done = next_step(noticed, obs(T0 + 1, n, step=1000, committed=1000), POLICY)
    assert done.actions == (Action.START_MAINTENANCE, Action.RECORD_EVENT, Action.COMPLETE)
    assert done.event["kind"] == "maintenance_started_early" and done.event["pause"] == "phase_boundary"
    assert done.event["checkpoint_step"] == 1000 and done.state.phase is Phase.DONE
    last = replace(POLICY, notice_policy=replace(GPU, stage_follows=False))  # nothing runs after: no pause
    assert next_step(noticed, obs(T0 + 1, n, step=1000, committed=1000), last).actions == (Action.COMPLETE,)
    old = next_step(RUNNING, obs(T0, n, step=1000, committed=1000), OLD)
    assert old.actions == (Action.COMPLETE,)
    cannot = next_step(RUNNING, obs(T0, replace(n, can_reschedule=False), step=1000, committed=1000), POLICY)
    assert cannot.actions == (Action.COMPLETE,)


def test_policy_from_the_machine_record_and_its_round_trip() -> None:
    gpu = policy_for({"kind": "gce_vm", "machine_type": "g2-standard-4", "mode": "on_demand"}, "by_notice", 600)
    assert gpu is not None and gpu.kind is MaintenanceKind.GPU
    assert NoticePolicy.from_dict(gpu.to_dict()) == gpu
    a3u = policy_for({"kind": "gce_vm", "machine_type": "a3-ultragpu-8g", "mode": "on_demand"}, "by_notice", 1)
    assert a3u is not None and a3u.kind is MaintenanceKind.AI_HYPERCOMPUTER
    tpu = policy_for({"kind": "tpu_node", "mode": "spot"}, "by_notice", 1)
    assert tpu is not None and tpu.kind is MaintenanceKind.SPOT
    assert policy_for({"kind": "tpu_node"}, "checkpoint_at_notice", 1) is None
    with pytest.raises(ValueError, match="maintenance_policy"):
        policy_for({"kind": "tpu_node"}, "whenever", 1)


def test_workload_margin_is_the_policy_floor_on_this_clock() -> None:
    assert workload_margins(None) == (None, None)
    seconds, commits = workload_margins(GPU)
    assert seconds == pytest.approx(60.0 / 600.0) and commits == 3.0


def test_early_start_faster_than_a_poll_waits_for_the_new_boot() -> None:
    """performMaintenance right after the checkpoint: the GPU VM is down and back between two polls and the
    workload, which trained on after the checkpoint, says it was stopped. That is not a maintenance that
    passed it by: the event stays open until the new boot resumes, and records where it really resumed."""
    n = notice(6.0)
    state = next_step(RUNNING, obs(T0, n), POLICY).state
    due = state.event["checkpoint_due_at"]
    state = next_step(state, obs(due, n, step=95), POLICY).state
    state = next_step(state, obs(due + 0.2, n, step=96, committed=96, ack=96), POLICY).state
    back = Observation(
        now=due + 1.0,
        machine=Machine.READY,
        notice=None,
        committed_step=99,
        progress_step=99,
        resumed_from=0,
        boot_id="b1",
        workload_state="stopped",
    )
    waiting = next_step(state, back, POLICY)
    assert waiting.state.phase is Phase.RESUMING and waiting.event is None
    resumed = next_step(waiting.state, obs(due + 3.0, None, step=101, committed=99, boot="b2", resumed=99), POLICY)
    assert resumed.actions == (Action.RECORD_EVENT,)
    assert resumed.event["resumed_from_step"] == 99 and resumed.event["steps_recomputed"] == 0


def _acked_while_training() -> StageState:
    """Our checkpoint (step 96) answered 0.5 s before a 6 s notice's window; the workload trained on after it."""
    n = notice(6.0)
    state = next_step(RUNNING, obs(T0, n), POLICY).state
    state = next_step(state, obs(state.event["checkpoint_due_at"], n, step=95), POLICY).state
    acked = next_step(state, obs(T0 + 5.5, n, step=99, committed=96, ack=96, state="running"), POLICY)
    assert acked.state.phase is Phase.AWAITING_RESTART and acked.actions == ()
    return acked.state


def test_a_hold_at_a_later_commit_of_its_own_starts_the_maintenance_early_once() -> None:
    """After answering our request the workload trains on and holds at its own commit before the window (its
    margin): from then on no step is trained, so the hold is the natural pause that starts the window now."""
    n = notice(6.0)
    state = _acked_while_training()
    training = next_step(state, obs(T0 + 5.6, n, step=102, committed=96, ack=96, state="running"), POLICY)
    assert training.actions == () and not training.differs_from(state)
    held = next_step(state, obs(T0 + 5.8, n, step=104, committed=104, ack=96, state="holding"), POLICY)
    assert held.actions == (Action.START_MAINTENANCE,) and held.state.phase is Phase.AWAITING_RESTART
    assert held.state.event["early_start_at"] == T0 + 5.8 and held.state.event["checkpoint_step"] == 96
    again = next_step(held.state, obs(T0 + 5.85, n, step=104, committed=104, ack=96, state="holding"), POLICY)
    assert again.actions == ()  # asked once: the notice reads PENDING until a poll sees the window open


@pytest.mark.parametrize(
    ("n", "step", "committed", "state", "limits"),
    [
        (notice(6.0), 104, 100, "holding", POLICY),  # holds at a step not (yet) seen committed
        (notice(6.0), 95, 95, "holding", POLICY),  # a commit older than the one answering our request
        (notice(6.0), 104, 104, "running", POLICY),
        (notice(6.0, can=False), 104, 104, "holding", POLICY),  # Google does not allow moving it
        (notice(6.0, status="ONGOING"), 104, 104, "holding", POLICY),
        (notice(6.0), 104, 104, "holding", OLD),  # checkpoint_at_notice never starts early
    ],
    ids=["uncommitted", "older-commit", "running", "not-reschedulable", "ongoing", "old-policy"],
)
def test_no_early_start_on_hold_unless_google_allows_it_and_nothing_is_lost(
    n: Notice, step: int, committed: int, state: str, limits: Limits
) -> None:
    t = next_step(
        _acked_while_training(), obs(T0 + 5.8, n, step=step, committed=committed, ack=96, state=state), limits
    )
    assert t.actions == ()


def test_the_trigger_looks_ten_times_as_often_only_while_a_hold_may_start_the_window() -> None:
    n = notice(6.0)
    state = _acked_while_training()
    near = obs(T0 + 5.5, n, step=99, committed=96, ack=96, state="running")
    assert watch_interval(state, near, POLICY, 0.5) == pytest.approx(0.05)
    assert watch_interval(state, near, POLICY, 30.0) == pytest.approx(3.0)  # Google's clock: a tenth of a poll
    assert watch_interval(state, near, POLICY, 0.2) == pytest.approx(0.05)  # never under 50 ms
    assert watch_interval(state, near, POLICY, 0.01) == pytest.approx(0.01)  # never over the poll itself
    started = replace(state, event={**state.event, "early_start_at": T0 + 5.8})
    down = replace(state, event={**state.event, "down_at": T0 + 5.9})
    for other, o, limits in [
        (started, near, POLICY),
        (down, near, POLICY),
        (state, near, OLD),
        (state, replace(near, notice=notice(6.0, can=False)), POLICY),
        (state, replace(near, machine=Machine.DOWN), POLICY),
        (RUNNING, obs(T0 + 5.5, n), POLICY),
        (state, replace(near, now=T0 + 5.5 - 3600.0), POLICY),  # an hour before the window (Google: 25 days)
    ]:
        assert watch_interval(other, o, limits, 0.5) == 0.5, (other.phase, other.event, o)
