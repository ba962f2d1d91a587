"""The watchdog rules of the stage state machine: stalls, startup failures, outages, drills, unseen reboots.

Pure: each test walks observations through `next_step` and checks the actions and the recorded event.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from interlude.stage.machine import next_step
from interlude.stage.model import Action, Drill, Limits, Machine, Notice, Observation, Phase, StageState, Transition
from interlude.stage.watchdog import NOTICE_GRACE

LIMITS = Limits(
    restart_timeout=100.0, max_reprovisions=2, stall_timeout=60.0, api_outage_budget=300.0, drill_timeout=120.0
)
PENDING = Notice(kind="SCHEDULED", status="PENDING", window_start="2026-12-02T12:00:00Z")


def obs(
    now: float,
    machine: Machine = Machine.READY,
    *,
    step: int = 0,
    committed: int = 0,
    boot: str | None = "b1",
    resumed: int | None = 0,
    notice: Notice | None = None,
    ack: int | None = None,
    state: str | None = "running",
    **more: object,
) -> Observation:
    return Observation(
        now=now,
        machine=machine,
        notice=notice,
        committed_step=committed,
        progress_step=step,
        resumed_from=resumed,
        boot_id=boot,
        request_ack_step=ack,
        workload_state=state,
        **more,
    )  # type: ignore[arg-type]


def walk(
    state: StageState, observations: list[Observation], limits: Limits = LIMITS
) -> tuple[StageState, list[Action], list[dict]]:
    actions: list[Action] = []
    events: list[dict] = []
    for o in observations:
        t = next_step(state, o, limits)
        actions.extend(t.actions)
        if t.event:
            events.append(t.event)
        state = t.state
    return state, actions, events


# ---------------------------------------------------------------------------------------------- stall
def test_a_stalled_workload_is_restarted_once_then_the_stage_fails() -> None:
    s, actions, _ = walk(
        StageState(target_step=100),
        [
            obs(0, step=5),
            obs(30, step=5),
            obs(61, step=5),  # 61 s without change: restart
            obs(62, Machine.DOWN, step=5),  # the restart takes the machine down
            obs(70, step=0, boot="b2", resumed=0, state="starting"),  # back, but the new boot makes no progress
            obs(100, step=0, boot="b2", resumed=0, state="starting"),
            obs(131, step=0, boot="b2", resumed=0, state="starting"),
        ],
    )
    assert actions == [Action.RESTART_WORKLOAD, Action.FAIL]
    assert s.phase is Phase.FAILED and "no progress for" in (s.failure or "") and "after restarting" in s.failure


def test_after_a_restart_the_old_boots_stale_progress_does_not_close_the_event() -> None:
    s, actions, _ = walk(
        StageState(target_step=100),
        [
            obs(0, step=18, committed=10),
            obs(61, step=18, committed=10),  # restart
            obs(63, step=18, committed=10),
            obs(70, step=18, committed=10),  # the old boot's progress.json, still
        ],
    )
    assert actions == [Action.RESTART_WORKLOAD] and s.phase is Phase.RECOVERING


def test_a_restart_that_helps_records_the_event_and_training_goes_on() -> None:
    s, actions, events = walk(
        StageState(target_step=100),
        [
            obs(0, step=5, committed=0),
            obs(61, step=5),
            obs(62, Machine.DOWN, step=5),
            obs(70, step=1, boot="b2", resumed=0),
            obs(71, step=3, boot="b2", resumed=0),
        ],
    )
    assert actions == [Action.RESTART_WORKLOAD, Action.RECORD_EVENT]
    assert events[0]["kind"] == "workload_restart" and events[0]["steps_recomputed"] == 5
    assert s.phase is Phase.RUNNING and s.workload_restarts == 1


def test_steady_progress_never_stalls() -> None:
    _, actions, _ = walk(StageState(target_step=10_000), [obs(t, step=t) for t in range(0, 1000, 7)])
    assert actions == []


def test_holding_under_a_notice_gets_the_notice_grace() -> None:
    held = [obs(t, step=50, committed=50, notice=PENDING, ack=50, state="holding") for t in (1, 2, 500, 1000)]
    s, actions, _ = walk(StageState(target_step=100), [obs(0, step=49), *held])
    assert actions == [Action.REQUEST_CHECKPOINT] and s.phase is Phase.AWAITING_RESTART
    late = next_step(
        s,
        obs(1 + LIMITS.stall_timeout + NOTICE_GRACE + 1, step=50, committed=50, notice=PENDING, state="holding"),
        LIMITS,
    )
    assert late.actions == (Action.RESTART_WORKLOAD,)


# -------------------------------------------------------------------------------------- startup failure
def test_a_failed_startup_script_is_restarted_once_then_fails_with_its_words() -> None:
    s, actions, _ = walk(
        StageState(target_step=100),
        [
            obs(0, step=0, boot=None, resumed=None, state=None),
            obs(1, boot=None, resumed=None, state=None, startup_failure="exit 3: cannot import", startup_boot="x1"),
            obs(
                2,
                Machine.DOWN,
                boot=None,
                resumed=None,
                state=None,
                startup_failure="exit 3: cannot import",
                startup_boot="x1",
            ),
            obs(3, boot=None, resumed=None, state=None, startup_failure="exit 3: cannot import", startup_boot="x1"),
            obs(4, boot=None, resumed=None, state=None, startup_failure="exit 3: cannot import", startup_boot="x2"),
        ],
    )
    assert actions == [Action.RESTART_WORKLOAD, Action.FAIL]
    assert "startup script ended: exit 3: cannot import" in (s.failure or "")


def test_a_startup_failure_of_a_boot_going_down_for_maintenance_is_not_acted_on() -> None:
    _, actions, _ = walk(
        StageState(target_step=100),
        [
            obs(0, step=10),
            obs(1, step=10, notice=PENDING, startup_failure="exit 143", startup_boot="x1"),
        ],
    )
    assert actions == [Action.REQUEST_CHECKPOINT]


# -------------------------------------------------------------------------------------------- outage
def test_an_outage_within_budget_is_ridden_out_without_telling_the_operator() -> None:
    state = StageState(target_step=100)
    t = next_step(state, obs(0, step=10), LIMITS)
    for now in range(1, 300, 5):
        t2 = next_step(t.state, obs(now, Machine.UNKNOWN, api_error="503"), LIMITS)
        assert not t2.differs_from(t.state) and t2.state.outage_since == 1
        t = Transition(t2.state)
    back = next_step(t.state, obs(301, step=200 // 2), LIMITS)
    assert back.actions == () and back.state.outage_since is None and back.state.phase is Phase.RUNNING


def test_an_outage_past_the_budget_fails_naming_the_budget_and_the_error() -> None:
    s, actions, _ = walk(
        StageState(target_step=100),
        [
            obs(0, step=10),
            obs(1, Machine.UNKNOWN, api_error="TransientError: 503"),
            obs(200, Machine.UNKNOWN, api_error="TransientError: 503"),
            obs(302, Machine.UNKNOWN, api_error="TransientError: 503"),
        ],
    )
    assert actions == [Action.FAIL]
    assert "api_outage_budget_seconds=300" in (s.failure or "") and "503" in s.failure


def test_after_an_outage_the_stall_clock_starts_afresh() -> None:
    _, actions, _ = walk(
        StageState(target_step=100),
        [
            obs(0, step=10),
            obs(1, Machine.UNKNOWN),
            obs(250, Machine.UNKNOWN),
            obs(251, step=10),
            obs(300, step=10),
        ],
    )
    assert actions == []


# ---------------------------------------------------------------------------------------------- drill
def drilling(step: int = 10) -> StageState:
    return StageState(target_step=30, drill=Drill.PENDING, drill_step=step)


def test_the_drill_fires_when_the_workload_holds_at_the_drill_step_and_is_recorded() -> None:
    s, actions, events = walk(
        drilling(),
        [
            obs(0, step=5, committed=0),
            obs(1, step=10, committed=10, state="holding"),  # held: send the drill
            obs(2, step=10, committed=10, state="holding", notice=PENDING),
            obs(3, step=10, committed=10, state="holding", notice=PENDING, ack=10),
            obs(5, Machine.DOWN, step=10, committed=10, state="stopped", notice=replace(PENDING, status="ONGOING")),
            obs(8, step=10, committed=10, boot="b2", resumed=10, state="running"),
            obs(9, step=12, committed=10, boot="b2", resumed=10),
        ],
    )
    assert actions == [Action.DRILL, Action.REQUEST_CHECKPOINT, Action.RECORD_EVENT]
    (event,) = events
    assert event["drill"] is True and event["checkpoint_step"] == 10 and event["resumed_from_step"] == 10
    assert event["downtime_s"] == 3 and event["steps_recomputed"] == 0  # down 5 -> up 8 (the restore is its own)
    # Held from the drill (sent at 1) to the checkpoint before the window (acked at 3):
    # interlude.training.badput's drill_hold.
    assert event["drill_sent_at"] == 1
    from interlude.training.badput import event_badput

    assert event_badput(event, 0.1).drill_hold == pytest.approx(2.0 - float(event.get("checkpoint_write_s") or 0))
    assert s.drill is Drill.DONE


def test_a_drill_that_never_held_fails_the_stage_at_completion() -> None:
    s, actions, _ = walk(drilling(), [obs(0, step=5), obs(1, step=30, committed=30)])
    assert actions == [Action.FAIL] and "could not run" in (s.failure or "")


def test_a_workload_that_cannot_hold_gets_the_drill_as_soon_as_it_passes_the_step() -> None:
    _, actions, _ = walk(drilling(), [obs(0, step=5), obs(1, step=11, committed=10)])
    assert actions == [Action.DRILL]


def test_a_drill_without_any_maintenance_fails_after_the_drill_timeout() -> None:
    s, actions, _ = walk(
        drilling(),
        [
            obs(0, step=10, committed=10, state="holding"),
            obs(60, step=10, committed=10, state="holding"),
            obs(121, step=10, committed=10, state="holding"),
        ],
    )
    assert actions == [Action.DRILL, Action.FAIL] and "did not happen" in (s.failure or "")


def test_a_drill_on_a_vm_whose_down_window_no_poll_saw_uses_the_workloads_own_times() -> None:
    """The GPU case: TERMINATED for a moment between two polls; the answer to our request came from the
    new boot. The record must say what the workload's log says: held at 10, resumed from 10."""
    s, actions, events = walk(
        drilling(),
        [
            obs(0, step=10, committed=10, state="holding"),  # DRILL
            obs(1, step=10, committed=10, state="holding", notice=PENDING),  # REQUEST_CHECKPOINT
            obs(
                9, step=14, committed=14, boot="b2", resumed=10, ack=14, boot_started_at=7.5, previous_boot_ended_at=6.0
            ),
        ],
    )
    assert actions == [Action.DRILL, Action.REQUEST_CHECKPOINT, Action.RECORD_EVENT]
    (event,) = events
    assert event["checkpoint_step"] == 10 and event["resumed_from_step"] == 10
    assert event["down_at"] == 6.0 and event["up_at"] == 7.5 and event["downtime_s"] == 1.5
    assert event["steps_recomputed"] == 0 and event["drill"] is True and s.boot_id == "b2"


def test_an_unseen_reboot_while_awaiting_restart_is_closed_from_the_workloads_times() -> None:
    _, actions, events = walk(
        StageState(target_step=100),
        [
            obs(0, step=20, committed=20),
            obs(1, step=20, committed=20, notice=PENDING, state="holding"),
            obs(2, step=20, committed=20, notice=PENDING, ack=20, state="holding"),
            obs(6, step=23, committed=20, boot="b2", resumed=20, boot_started_at=4.0, previous_boot_ended_at=3.0),
        ],
    )
    assert actions == [Action.REQUEST_CHECKPOINT, Action.RECORD_EVENT]
    assert events[0]["downtime_s"] == 1.0 and events[0]["checkpoint_step"] == 20


def test_every_event_has_its_own_id() -> None:
    _, _, events = walk(
        StageState(target_step=100),
        [
            obs(1, step=33, committed=30),
            obs(2, Machine.DOWN, step=33, committed=30),
            obs(3, step=31, committed=30, boot="b2", resumed=30),
            obs(4, step=40, committed=40, boot="b2", resumed=30),
            obs(5, Machine.DOWN, step=40, committed=40, boot="b2"),
            obs(6, step=41, committed=40, boot="b3", resumed=40),
        ],
    )
    assert len(events) == 2 and events[0]["event_id"] != events[1]["event_id"]


# --------------------------------------------------------------------------------- never wait forever
@pytest.mark.parametrize(
    ("phase", "machine", "notice", "drill"),
    list(
        itertools.product(
            [p for p in Phase if p not in (Phase.DONE, Phase.FAILED)],
            [Machine.READY, Machine.DOWN, Machine.GONE, Machine.UNKNOWN],
            [None, PENDING],
            [None, Drill.PENDING, Drill.SENT],
        )
    ),
)
def test_no_phase_waits_forever_on_an_unchanging_world(
    phase: Phase, machine: Machine, notice: Notice | None, drill: Drill | None
) -> None:
    """Whatever the phase and however the world stays frozen, the stage acts within bounded time."""
    event = None if phase is Phase.RUNNING else {"kind": "maintenance", "down_at": None, "checkpoint_step": 10}
    state = StageState(
        target_step=100,
        phase=phase,
        boot_id="b1",
        request_id="r" if phase is not Phase.RUNNING else None,
        event=event,
        drill=drill,
        drill_step=10 if drill else None,
        drill_sent_at=0.0 if drill is Drill.SENT else None,
    )
    frozen = obs(0, machine, step=10, committed=10, notice=notice, state="holding")
    bound = LIMITS.stall_timeout + NOTICE_GRACE + LIMITS.api_outage_budget + LIMITS.restart_timeout * 4 + 10
    acted: list[Action] = []
    now = 0.0
    while now < bound and Action.FAIL not in acted:
        t = next_step(state, replace(frozen, now=now), LIMITS)
        acted.extend(t.actions)
        state = t.state
        if state.phase is Phase.DONE:
            break
        now += 5.0
    assert acted, f"{phase} {machine} {notice} {drill}: nothing happened in {bound:.0f}s"
    assert Action.FAIL in acted or machine is not Machine.UNKNOWN, "an endless outage must end in a failure"


def test_bookkeeping_alone_never_wakes_the_operator() -> None:
    before = StageState(target_step=100)
    after = replace(before, last_step_seen=5, progress_mark="x", progress_seen_at=3.0, outage_since=2.0)
    assert not Transition(after).differs_from(before)


@pytest.mark.parametrize(
    ("mean_step", "stamp", "resumed_at"),
    [
        # no stamp (a workload without the SDK's): 8.5 - 0.2 x 5 = 7.5, from its progress and its mean step
        (0.2, None, 7.5),
        # the SDK stamps when start() handed the restored state to the loop (stepping_at_epoch): that time wins
        # over the estimate (8.5 - 0.1 x 5 = 8.0), which a first step's JIT compile makes late (0.46 s in a CI run)
        (0.1, 7.4, 7.4),
    ],
)
def test_a_reboot_is_recorded_at_the_workloads_times_not_the_polls(
    mean_step: float, stamp: float | None, resumed_at: float
) -> None:
    """Issue 32.5: the new boot started at 7.0, resumed from 10 and reported step 14 at 8.5: it stepped again at
    ``resumed_at`` by its own clock; the poll that saw it was at 9."""
    _, _, events = walk(
        drilling(),
        [
            obs(0, step=10, committed=10, state="holding"),
            obs(1, step=10, committed=10, state="holding", notice=PENDING),
            obs(
                9,
                step=14,
                committed=10,
                boot="b2",
                resumed=10,
                boot_started_at=7.0,
                previous_boot_ended_at=6.0,
                progress_at=8.5,
                mean_step_seconds=mean_step,
                stepping_at=stamp,
            ),
        ],
    )
    (event,) = events
    assert (event["down_at"], event["up_at"], event["resumed_at"]) == (6.0, 7.0, pytest.approx(resumed_at))
    assert event["downtime_s"] == 1.0 and event["seen"]["resumed_at"] == 9
