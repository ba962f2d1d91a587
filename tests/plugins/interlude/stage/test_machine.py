"""The stage state machine, walked through every path a machine can take."""

from __future__ import annotations

from dataclasses import replace

import pytest

from interlude.stage.machine import next_step
from interlude.stage.model import Action, Limits, Machine, Notice, Observation, Phase, StageState

LIMITS = Limits(restart_timeout=100.0, max_reprovisions=2)
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
    )


def walk(state: StageState, observations: list[Observation]) -> tuple[StageState, list, list]:
    actions, events = [], []
    for o in observations:
        t = next_step(state, o, LIMITS)
        actions.extend(t.actions)
        if t.event:
            events.append(t.event)
        state = t.state
    return state, actions, events


def test_scheduled_maintenance_recomputes_nothing() -> None:
    s, actions, events = walk(
        StageState(target_step=100),
        [
            obs(1, step=40, committed=40),
            obs(2, step=50, committed=40, notice=PENDING),
            obs(3, step=52, committed=52, notice=PENDING, ack=52),
            obs(4, step=52, committed=52, notice=replace(PENDING, status="ONGOING")),  # held at 52
            obs(5, Machine.DOWN, step=52, committed=52, notice=replace(PENDING, status="ONGOING")),
            obs(9, Machine.READY, step=52, committed=52, boot="b2", resumed=52),
            obs(10, step=55, committed=52, boot="b2", resumed=52),
        ],
    )
    assert s.phase is Phase.RUNNING and s.boot_id == "b2"
    assert actions == [Action.REQUEST_CHECKPOINT, Action.RECORD_EVENT]
    (event,) = events
    assert event["kind"] == "maintenance" and event["notice_type"] == "SCHEDULED"
    assert event["checkpoint_step"] == 52 and event["steps_recomputed"] == 0
    assert event["downtime_s"] == 4 and event["detected_at"] == 2  # down 5 -> back 9


def test_notice_shorter_than_a_poll_is_handled_as_already_down() -> None:
    s, actions, _ = walk(
        StageState(target_step=100),
        [
            obs(1, step=10),
            obs(2, Machine.DOWN, step=10, notice=replace(PENDING, status="ONGOING")),
        ],
    )
    assert s.phase is Phase.AWAITING_RESTART and s.event["down_at"] == 2
    assert actions == [Action.REQUEST_CHECKPOINT]


def test_spot_preemption_reprovisions_and_counts_recomputed_steps() -> None:
    s, actions, events = walk(
        StageState(target_step=100),
        [
            obs(1, step=47, committed=40),
            obs(2, Machine.GONE, step=47, committed=40),
            obs(3, Machine.DOWN, committed=40, boot=None, resumed=None),  # re-provisioning
            obs(6, Machine.READY, step=40, committed=40, boot="b2", resumed=40),
            obs(7, Machine.READY, step=42, committed=40, boot="b2", resumed=40),
        ],
    )
    assert actions == [Action.REPROVISION, Action.RECORD_EVENT]
    assert events[0]["kind"] == "preemption" and events[0]["steps_recomputed"] == 7
    assert events[0]["reprovisioned"] is True and s.reprovisions == 1


def test_machine_that_never_comes_back_is_reprovisioned_then_fails() -> None:
    s, actions, _ = walk(
        StageState(target_step=100),
        [
            obs(0, step=5),
            obs(1, Machine.DOWN, step=5),
            obs(50, Machine.DOWN),
            obs(102, Machine.DOWN),
            obs(300, Machine.DOWN),
            obs(500, Machine.DOWN),
        ],
    )
    assert actions == [Action.REPROVISION, Action.REPROVISION, Action.FAIL]
    assert s.phase is Phase.FAILED and "re-provisions" in (s.failure or "")


def test_no_notice_loss_recovers_in_place() -> None:
    s, actions, events = walk(
        StageState(target_step=100),
        [
            obs(1, step=33, committed=30),
            obs(2, Machine.DOWN, step=33, committed=30),
            obs(3, Machine.READY, step=30, committed=30, boot="b2", resumed=30),
            obs(4, Machine.READY, step=31, committed=30, boot="b2", resumed=30),
        ],
    )
    assert actions == [Action.RECORD_EVENT] and s.phase is Phase.RUNNING
    assert events[0]["kind"] == "no_notice_loss" and events[0]["steps_recomputed"] == 3


def test_restart_seen_only_afterwards_is_still_recorded() -> None:
    s, actions, events = walk(
        StageState(target_step=100),
        [
            obs(1, step=20, committed=20),
            obs(2, step=24, committed=20, boot="b9", resumed=20),
        ],
    )
    assert actions == [Action.RECORD_EVENT] and events[0]["kind"] == "unobserved_restart"
    assert events[0]["steps_recomputed"] == 0 and s.boot_id == "b9"


def test_completion_wins_and_closes_an_open_event() -> None:
    s, actions, events = walk(
        StageState(target_step=60),
        [
            obs(1, step=50, committed=50, notice=PENDING),
            obs(2, step=60, committed=60, notice=PENDING),
        ],
    )
    assert s.phase is Phase.DONE and actions == [Action.REQUEST_CHECKPOINT, Action.RECORD_EVENT, Action.COMPLETE]
    assert len(events) == 1


@pytest.mark.parametrize("phase", list(Phase))
def test_same_observation_twice_changes_nothing_the_second_time(phase: Phase) -> None:
    """Duplicate trigger copies see the same facts: the second look must be a no-op."""
    start = StageState(
        target_step=100,
        phase=phase,
        boot_id="b1",
        last_step_seen=10,
        event={"down_at": 1.0, "checkpoint_step": 10} if phase not in (Phase.RUNNING,) else None,
    )
    o = obs(5, Machine.DOWN, step=10, committed=10)
    first = next_step(start, o, LIMITS)
    second = next_step(first.state, o, LIMITS)
    assert not second.differs_from(first.state)


def test_state_round_trips_through_json() -> None:
    import json

    s = StageState(target_step=9, phase=Phase.RESUMING, request_id="r", event={"kind": "maintenance"})
    assert StageState.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_the_checkpoint_time_is_when_the_workload_answered_not_the_poll() -> None:
    answered = replace(obs(4, step=52, committed=52, notice=PENDING, ack=52), request_ack_at=3.2)
    late = replace(answered, request_ack_at=7.0)  # a VM clock ahead of the control plane's: held to the poll
    for o, expected in ((answered, 3.2), (late, 4.0)):
        s, _, _ = walk(StageState(target_step=100), [obs(1, step=40, committed=40), obs(2, step=50, notice=PENDING), o])
        assert s.phase is Phase.AWAITING_RESTART and (s.event or {})["checkpoint_committed_at"] == expected


@pytest.mark.parametrize("awaits", [False, True])
@pytest.mark.parametrize("exported", [False, True])
@pytest.mark.parametrize("error", [None, "prompt 'Today is': numpy logits differ from JAX by 0.4 > 0.0002"])
def test_a_stage_that_exports_is_done_only_with_its_export_and_fails_with_its_words(
    awaits: bool, exported: bool, error: str | None
) -> None:
    """Every combination at the committed final step: done when no export is awaited or it is in; else the
    workload's error (an export that failed after the final commit) fails the stage naming it; else keep watching."""
    state = StageState(target_step=10, awaits_export=awaits)
    seen = replace(obs(5, step=10, committed=10), export_committed=exported, workload_error=error)
    t = next_step(state, seen, LIMITS)
    if not awaits or exported:
        assert t.state.phase is Phase.DONE and t.actions == (Action.COMPLETE,)
    elif error:
        assert t.state.phase is Phase.FAILED and error in (t.state.failure or ""), t
    else:
        assert t.state.phase is Phase.RUNNING and t.actions == (), t
    assert StageState.from_dict(state.to_dict()) == state  # the flag travels in the trigger's arguments
