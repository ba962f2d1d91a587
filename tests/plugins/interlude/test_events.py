"""The run report: goodput and badput from recorded events and stage timings."""

from __future__ import annotations

from interlude.events import build_report, render_report


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
