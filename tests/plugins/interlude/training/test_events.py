"""The run report: goodput and badput from recorded events and stage timings."""

from __future__ import annotations

import pytest

from interlude.training.events import build_report, render_report


def test_report_accounts_for_downtime_and_recomputation() -> None:
    stages = [
        {"stage": "train", "steps": 100, "started_at": 0.0, "finished_at": 70.0, "mean_step_seconds": 0.5},
        {"stage": "finetune", "steps": 20, "started_at": 75.0, "finished_at": 100.0, "mean_step_seconds": 0.5},
    ]
    events = [
        {
            "stage": "train",
            "kind": "maintenance",
            "notice_type": "SCHEDULED",
            "checkpoint_step": 40,
            "downtime_s": 10.0,
            "steps_recomputed": 0,
            "resumed_from_step": 40,
            "detected_at": 1,
        },
        {
            "stage": "finetune",
            "kind": "preemption",
            "downtime_s": 5.0,
            "steps_recomputed": 4,
            "resumed_from_step": 10,
            "detected_at": 2,
        },
    ]
    report = build_report(
        run_key="k",
        machine={"accelerator_type": "v6e-8", "zone": "z", "kind": "tpu_node"},
        stages=stages,
        events=events,
    )
    assert report["steps_recomputed"] == 4
    assert report["wall_seconds"] == 100.0
    assert report["goodput"] == 0.6  # 120 steps x 0.5 s of 100 s
    # Only the events' downtime lengths are recorded here (no down_at/up_at): all of it counts as the cloud's.
    assert report["badput_seconds"] == {
        "provisioning": 0.0,
        "stage_handoff": 5.0,
        "checkpoint_writes": 0.0,
        "waiting_for_window": 0.0,
        "drill_hold": 0.0,
        "cloud_downtime": 15.0,
        "restore": 0.0,
        "recomputed_steps": 2.0,
        "other": 18.0,
    }
    text = render_report(report)
    assert "steps recomputed: 4" in text and "preemption" in text and "SCHEDULED" in text


def test_the_restore_time_is_the_new_boots_resume_point_line() -> None:
    """Issue 32.5: the old boot's own "resume point" (an earlier boot) and a line past the poll are not this one."""
    from interlude.training.events import restore_finished

    log = "\n".join(
        [
            "2026-12-05T08:55:00.000Z [k/train] resume point: step 10 (gs://b/old/)",  # an earlier boot
            "2026-12-05T08:55:16.028Z [k/train] stopped by SIGTERM while holding at committed step 10",
            "2026-12-05T08:55:16.462Z [k/train] resume point: step 10 (gs://b/x/)",
            "2026-12-05T08:55:16.474Z [k/train] training train steps 11..60 on 1200 rows",
        ]
    )
    t0 = 1796460900.0  # 2026-12-05T08:55:00Z
    event = {"resumed_from_step": 10, "down_at": t0 + 16.028, "up_at": t0 + 16.3, "resumed_at": t0 + 16.6}
    assert restore_finished(log, event) == pytest.approx(t0 + 16.462)
    assert restore_finished(log, {**event, "resumed_from_step": 20}) is None
    # Held between the boot and the first step: a line before the boot (clock skew) is the boot.
    assert restore_finished(log, {**event, "up_at": t0 + 16.5}) == t0 + 16.5


def test_the_restore_time_falls_back_to_the_boots_own_progress_stamp() -> None:
    """The log's upload can trail the progress that closed the event (seen under load: the event went without its
    restore time): the SDK's ``restored_at_epoch`` of the same boot gives it, held between boot and first step."""
    from interlude.training.events import restore_stamped

    t0 = 1796460900.0
    event = {"boot_id": "b2", "resumed_from_step": 10, "up_at": t0 + 16.3, "resumed_at": t0 + 30.0}
    progress = {"boot_id": "b2", "restored_at_epoch": t0 + 29.5}
    assert restore_stamped(progress, event) == pytest.approx(t0 + 29.5)
    assert restore_stamped({**progress, "boot_id": "b3"}, event) is None  # a later boot's stamp is not this one's
    assert restore_stamped({"boot_id": "b2"}, event) is None
    assert restore_stamped({**progress, "restored_at_epoch": t0 + 40}, event) == t0 + 30.0
