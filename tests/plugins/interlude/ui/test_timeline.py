"""A run's timeline, report JSON -> model -> SVG, without Airflow.

The report is made by the project's own `interlude.training.events.build_report` (what `run_report` writes to
report.json), so the model is tested on the shape the pipeline really writes; the SVG is parsed as XML, so every
assertion is on the drawing's structure, never on a substring that could sit in a comment.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from interlude.training.events import build_report
from interlude.ui import svg
from interlude.ui.timeline import BAND_KINDS, from_serving_report, from_training_report

NS = {"s": "http://www.w3.org/2000/svg"}
T0 = 1_765_000_000.0

STAGES = [
    {"stage": "train", "steps": 60, "started_at": T0, "finished_at": T0 + 90, "mean_step_seconds": 0.5},
    {"stage": "finetune", "steps": 30, "started_at": T0 + 95, "finished_at": T0 + 140, "mean_step_seconds": 0.5},
]
MAINTENANCE = {  # a scheduled notice: trained on, checkpointed at step 30, down 8 s, restored in 2 s
    "stage": "train",
    "event_id": "m1",
    "kind": "maintenance",
    "notice_type": "SCHEDULED",
    "detected_at": T0 + 10,
    "checkpoint_step": 30,
    "checkpoint_committed_at": T0 + 20,
    "down_at": T0 + 21,
    "up_at": T0 + 29,
    "resumed_at": T0 + 31,
    "downtime_s": 8.0,
    "steps_recomputed": 0,
    "resumed_from_step": 30,
}
PREEMPTION = {  # Spot: no notice, 7 steps past the last commit (step 10 of finetune) are lost and trained again
    "stage": "finetune",
    "event_id": "p1",
    "kind": "preemption",
    "notice_type": None,
    "detected_at": T0 + 110,
    "down_at": T0 + 110,
    "up_at": T0 + 118,
    "resumed_at": T0 + 120,
    "downtime_s": 8.0,
    "steps_recomputed": 7,
    "checkpoint_step": 10,
    "step_at_down": 17,
    "resumed_from_step": 10,
}
MOVE = {
    "stage": "train",
    "kind": "move",
    "from": "us-central2-b/v4-8",
    "to": "us-east5-a/v6e-8",
    "why": "gone",
    "from_zone": "us-central2-b",
    "from_type": "v4-8",
    "event_id": "move-1",
    "detected_at": T0 + 50,
    "time_lost_s": 12.5,
    "reason": "the node was deleted",
}
COMMITS = {"train": [(10, T0 + 8), (30, T0 + 20), (60, T0 + 89)], "finetune": [(10, T0 + 105), (30, T0 + 139)]}


def report(*events: dict[str, Any], stages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    machine = {"kind": "tpu_node", "zone": "us-east5-a", "accelerator_type": "v6e-8", "name": "n", "mode": "spot"}
    return build_report(run_key="run-abc", machine=machine, stages=stages or STAGES, events=list(events))


def parse(text: str) -> ET.Element:
    return ET.fromstring(text)  # well-formed XML, or this raises


def groups(root: ET.Element, css: str) -> list[ET.Element]:
    return [g for g in root.iter() if css in (g.get("class") or "").split()]


def title(el: ET.Element) -> str:
    found = el.find("s:title", NS)
    assert found is not None and found.text, ET.tostring(el)
    return found.text


def test_a_lane_per_stage_in_run_order_with_its_steps_over_time() -> None:
    tl = from_training_report(report(MAINTENANCE), COMMITS)
    assert [lane.stage for lane in tl.lanes] == ["train", "finetune"]
    train = tl.lanes[0]
    assert train.points[0] == (T0, 0) and train.points[-1] == (T0 + 89, 60)  # the last commit is the last step
    root = parse(svg.render(tl))
    lanes = groups(root, "stage")
    assert [g.get("data-stage") for g in lanes] == ["train", "finetune"]
    for lane in lanes:
        polyline = lane.find("s:polyline", NS)
        assert polyline is not None and len(polyline.get("points", "").split()) >= 2
        assert "steps" in title(lane)


def test_a_band_per_leg_of_every_event_and_one_group_per_event() -> None:
    tl = from_training_report(report(MAINTENANCE, PREEMPTION), COMMITS)
    assert [e.event_id for e in tl.events] == ["m1", "p1"]
    assert [b.kind for b in tl.events[0].bands] == list(BAND_KINDS)  # notice -> down -> up(restore)
    maintenance = {b.kind: (b.start, b.end) for b in tl.events[0].bands}
    assert maintenance == {
        "notice": (T0 + 10, T0 + 21),
        "down": (T0 + 21, T0 + 29),
        "restore": (T0 + 29, T0 + 31),
    }
    # No notice: the preemption was detected as it went down, so it has no notice band.
    assert [b.kind for b in tl.events[1].bands] == ["down", "restore"]
    root = parse(svg.render(tl))
    events = groups(root, "event")
    assert [(g.get("data-event-id"), g.get("data-stage")) for g in events] == [("m1", "train"), ("p1", "finetune")]
    bands = groups(root, "band")
    assert [b.get("data-kind") for b in bands] == ["notice", "down", "restore", "down", "restore"]
    assert "down 8.0 s" in title(bands[1]) and "checkpoint step 30" in title(bands[1])


def test_a_tick_per_committed_checkpoint_with_its_step_in_the_hover_text() -> None:
    tl = from_training_report(report(), COMMITS)
    assert [(t.stage, t.step) for t in tl.ticks] == [
        ("train", 10),
        ("train", 30),
        ("train", 60),
        ("finetune", 10),
        ("finetune", 30),
    ]
    root = parse(svg.render(tl))
    ticks = groups(root, "tick")
    assert [t.get("data-step") for t in ticks] == ["10", "30", "60", "10", "30"]
    assert title(ticks[1]).startswith("train: checkpoint step 30 committed at +20.0 s")


def test_a_spot_preemption_shows_its_lost_steps_as_recomputed() -> None:
    rep = report(PREEMPTION)
    assert rep["steps_recomputed"] == 7
    tl = from_training_report(rep, COMMITS)
    (redo,) = tl.recomputes
    assert (redo.stage, redo.steps) == ("finetune", 7)
    assert (redo.start, redo.end) == (T0 + 120, T0 + 120 + 7 * 0.5)  # after the resume, 7 x the mean step
    root = parse(svg.render(tl))
    (rect,) = groups(root, "recompute")
    assert rect.get("data-steps") == "7" and "7 step(s) recomputed" in title(rect)
    assert "resuming from step 10" in title(rect)
    assert "7 step(s) recomputed" in tl.headline()
    # The steps-over-time line falls back from where the machine went down to the step it resumed from.
    finetune = tl.lanes[1].points
    assert finetune[finetune.index((T0 + 110, 17)) + 1] == (T0 + 120, 10), finetune


def test_the_goodput_figure_is_the_reports_and_its_hover_names_the_badput() -> None:
    rep = report(MAINTENANCE, PREEMPTION)
    tl = from_training_report(rep, COMMITS)
    assert tl.goodput == rep["goodput"]
    root = parse(svg.render(tl))
    (text,) = groups(root, "goodput")
    assert text.get("data-goodput") == f"{rep['goodput']:.4f}"
    assert (text.text or "").strip() == f"goodput {rep['goodput']:.1%}"
    assert "cloud_downtime 16.0 s" in title(text)


def test_a_failover_move_is_drawn_on_its_stage_with_from_and_to() -> None:
    tl = from_training_report(report(MAINTENANCE, MOVE), COMMITS)
    assert len(tl.events) == 1  # a move is not a maintenance event: no bands of its own
    (move,) = tl.moves
    assert (move.source, move.target) == ("us-central2-b/v4-8", "us-east5-a/v6e-8")
    root = parse(svg.render(tl))
    (g,) = groups(root, "move")
    assert g.get("data-to") == "us-east5-a/v6e-8" and "12.5 s lost" in title(g)


def test_the_legend_names_every_mark() -> None:
    root = parse(svg.render(from_training_report(report(MAINTENANCE), COMMITS)))
    keys = [g.get("data-key") for g in groups(root, "legend-item")]
    assert {"tick", "notice", "down", "restore", "recompute", "move", "pods"} <= set(keys)


def test_text_from_the_run_is_escaped() -> None:
    evil = [{**STAGES[0], "stage": "<script>alert(1)</script>"}]
    text = svg.render(from_training_report(report(stages=evil)))
    assert "<script>" not in text
    lane = groups(parse(text), "stage")[0]
    assert lane.get("data-stage") == "<script>alert(1)</script>"  # the attribute round-trips through escaping


def test_an_event_with_missing_times_draws_only_the_legs_it_has() -> None:
    partial = {**MAINTENANCE, "up_at": None, "resumed_at": None}
    tl = from_training_report(report(partial))
    assert [b.kind for b in tl.events[0].bands] == ["notice"]


SERVING = {
    "pods_over_time": [
        {"at": T0, "rv": 1, "counts": {"pending": 2}},
        {"at": T0 + 60, "rv": 5, "counts": {"pending": 1, "gpu": 1}},
        {"at": T0 + 90, "rv": 9, "counts": {"gpu": 2}},
        {"at": T0 + 300, "rv": 20, "counts": {"gpu": 1, "tpu": 1}},
    ],
    "fallbacks": [{"at": T0 + 45, "action": "fallback_to_gpu", "reason": "TPU pods unschedulable for 300 s"}],
    "notes": ["requests of 1 pod(s) not counted"],
}
DECISIONS = [
    {"at": T0 + 200, "kind": "wait", "node": "gke-tpu-1", "reason": "window far"},
    {"at": T0 + 210, "kind": "cordon", "node": "gke-gpu-1", "reason": "maintenance at ..."},
    {"at": T0 + 220, "kind": "drain", "node": "gke-gpu-1", "reason": "1 replica Ready elsewhere"},
]


def test_a_serving_run_shows_pods_per_accelerator_its_fallback_and_the_drain() -> None:
    tl = from_serving_report("interlude-vllm", SERVING, DECISIONS)
    assert [p.accelerator for p in tl.pods] == ["gpu", "pending", "tpu"]
    gpu = tl.pods[0]
    assert [n for _, n in gpu.points] == [0, 1, 2, 1]
    assert [text for _, text in tl.node_steps] == [
        "cordon gke-gpu-1: maintenance at ...",
        "drain gke-gpu-1: 1 replica Ready elsewhere",
    ]  # waits are not marks
    root = parse(svg.render(tl))
    lanes = groups(root, "pods")
    assert [g.get("data-accelerator") for g in lanes] == ["gpu", "pending", "tpu"]
    samples = [c.get("data-count") for c in lanes[0].iter(f"{{{NS['s']}}}circle")]
    assert samples == ["0", "1", "2", "1"]
    (fallback,) = groups(root, "fallback")
    assert "fallback_to_gpu: TPU pods unschedulable" in title(fallback)
    assert len(groups(root, "node-step")) == 2
    assert groups(root, "goodput") == []  # serving has no goodput figure to show


@pytest.mark.parametrize("rep", [report(), {"run_key": "x"}])
def test_a_report_without_events_or_stages_still_draws(rep: dict[str, Any]) -> None:
    tl = from_training_report(rep)
    root = parse(svg.render(tl))
    assert groups(root, "event") == [] and tl.end > tl.start
