"""Badput split into named causes from a recorded timeline (pure: no cloud, no Airflow)."""

from __future__ import annotations

import pytest

from interlude.training.badput import CAUSES, Badput, event_badput, split

# A run as the report sees it: provisioning from t=0, train 10..110 (0.5 s steps), a gate, fine-tune 120..160.
STAGES = [
    {"stage": "train", "steps": 150, "started_at": 10.0, "finished_at": 110.0, "mean_step_seconds": 0.5},
    {"stage": "finetune", "steps": 40, "started_at": 120.0, "finished_at": 160.0, "mean_step_seconds": 0.5},
]
# Scheduled maintenance in train: notice at 30, checkpoint committed at 40 (its write took 1.5 s), the workload
# holds until the machine goes down at 46, boots at 61, steps again at 64.
HELD = {
    "stage": "train",
    "detected_at": 30.0,
    "checkpoint_write_s": 1.5,
    "checkpoint_committed_at": 40.0,
    "down_at": 46.0,
    "up_at": 61.0,
    "resumed_at": 64.0,
    "steps_recomputed": 0,
}
# A preemption in fine-tune: no notice, no checkpoint asked; down at 130, up at 136, stepping at 138, 4 steps lost.
PREEMPTED = {
    "stage": "finetune",
    "detected_at": 130.0,
    "down_at": 130.0,
    "up_at": 136.0,
    "resumed_at": 138.0,
    "steps_recomputed": 4,
}


def test_every_second_of_the_run_has_a_cause() -> None:
    wall, productive, badput = split(STAGES, [HELD, PREEMPTED], provisioning_started_at=0.0)
    assert wall == 160.0 and productive == 95.0  # 190 steps x 0.5 s
    assert badput == Badput(
        provisioning=10.0,
        stage_handoff=10.0,
        checkpoint_writes=1.5,
        waiting_for_window=6.0,
        cloud_downtime=21.0,  # 15 + 6
        restore=5.0,  # 3 + 2
        recomputed_steps=2.0,  # 4 steps x 0.5 s
        other=9.5,
    )
    assert sum(badput.as_dict().values()) + productive == pytest.approx(wall)
    assert tuple(badput.as_dict()) == CAUSES


def test_steps_trained_after_the_checkpoint_are_recomputed_not_waited() -> None:
    # Checkpoint at notice, training goes on 6 s until down (12 steps), all of them recomputed after the restore.
    trained_on = {**HELD, "steps_recomputed": 12}
    cost = event_badput(trained_on, 0.5)
    assert (cost.waiting_for_window, cost.recomputed_steps) == (0.0, 6.0)
    assert cost.beyond_downtime == 1.5 + 3.0 + 6.0


def test_missing_timestamps_count_as_nothing_and_the_start_defaults_to_the_first_step() -> None:
    # A reboot no poll saw: no up_at (downtime runs to the resume), no checkpoint asked.
    quick = {"stage": "train", "down_at": 50.0, "resumed_at": 52.0, "steps_recomputed": 0}
    wall, _, badput = split(STAGES, [quick])
    assert wall == 150.0 and badput.provisioning == 0.0
    assert (badput.cloud_downtime, badput.restore, badput.checkpoint_writes, badput.waiting_for_window) == (
        2.0,
        0.0,
        0.0,
        0.0,
    )
    assert split([], [quick]) == (0.0, 0.0, Badput())


def test_a_drill_that_held_the_workload_is_named_drill_hold_not_other() -> None:
    """`make demo`'s shape: the drill is sent at 35 when the workload holds at step 10; it holds through the whole
    notice until the checkpoint before the window (40, written in 1.5 s) and the machine goes down at 46."""
    drill = {**HELD, "drill": True, "drill_step": 10, "drill_sent_at": 35.0, "step_at_down": 10}
    cost = event_badput(drill, 0.5)
    assert cost.drill_hold == 3.5 and cost.waiting_for_window == 6.0 and cost.checkpoint_write == 1.5
    assert cost.beyond_downtime == 1.5 + 6.0 + 3.0 + 3.5
    _, _, plain = split(STAGES, [HELD, PREEMPTED], provisioning_started_at=0.0)
    _, _, drilled = split(STAGES, [drill, PREEMPTED], provisioning_started_at=0.0)
    assert drilled.drill_hold == 3.5 and drilled.other == pytest.approx(plain.other - 3.5)
    # No checkpoint asked before the window: the hold runs to the machine going down, no write to take off.
    assert event_badput({**drill, "checkpoint_committed_at": None}, 0.5).drill_hold == 11.0
    # A workload that could not hold trained on past the drill step: it was not idle, nothing is a drill hold.
    assert event_badput({**drill, "step_at_down": 14}, 0.5).drill_hold == 0.0
    # Not a drill, or a drill recorded before drill_sent_at was kept: nothing to name.
    assert event_badput({**drill, "drill": False}, 0.5).drill_hold == 0.0
    assert event_badput({k: v for k, v in drill.items() if k != "drill_sent_at"}, 0.5).drill_hold == 0.0


def test_the_workloads_own_times_win_over_the_polls_and_the_polls_bound_them() -> None:
    """Issue 32.5: polls saw the machine down at 46.5, back at 62 and stepping at 66; the workload stopped at 46.0,
    booted at 61.0 and stepped again at 64.0. The report keeps the workload's times (the polls only in ``seen``)."""
    from interlude.training.badput import workload_times

    polled = {"down_at": 46.5, "up_at": 62.0}
    times = workload_times(polled, 66.0, stopped=46.0, booted=61.0, stepping=64.0)
    assert (times["down_at"], times["up_at"], times["resumed_at"], times["downtime_s"]) == (46.0, 61.0, 64.0, 15.0)
    assert times["seen"] == {"down_at": 46.5, "up_at": 62.0, "resumed_at": 66.0}
    cost = event_badput({**HELD, **times}, 0.5)
    assert (cost.cloud_downtime, cost.restore) == (15.0, 3.0)
    # Without stamps the polls stand; a stamp past the poll that saw it (a VM clock ahead) is held to the poll, and
    # no time comes before the one it follows.
    assert workload_times(polled, 66.0, None, None, None)["resumed_at"] == 66.0
    skewed = workload_times(polled, 66.0, stopped=46.0, booted=67.0, stepping=60.0)
    assert (skewed["up_at"], skewed["resumed_at"]) == (66.0, 66.0)
