"""ServingReport: pods per accelerator over time, time to first Ready, fallbacks, requests per accelerator."""

from __future__ import annotations

import pytest

from interlude.serving.policy import FallbackPlan, PodObs
from interlude.serving.report import FallbackRecord, build_report, count_pods, percentile

T0 = 1_000.0


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([3.0], 99, 3.0),
        ([1, 2, 3, 4], 50, 2),
        ([1, 2, 3, 4], 99, 4),
        (list(range(1, 101)), 99, 99),
        (list(range(100, 0, -1)), 50, 50),
        ([5, 1], 0, 1),
    ],
)
def test_percentile_nearest_rank(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == expected


def test_count_pods_by_accelerator() -> None:
    pods = [
        PodObs("a", "Running", True, "n1", "tpu"),
        PodObs("b", "Running", False, "n2", "gpu"),
        PodObs("c", "Pending"),
        PodObs("d", "Succeeded", node="n1", accelerator="tpu"),
        PodObs("e", "Running", True, "gone-node"),
        PodObs("f", "Terminating", False, "n1", "tpu"),
    ]
    assert count_pods(pods, T0).counts == (("gpu", 1), ("pending", 1), ("tpu", 1), ("unknown", 1))


def test_report_figures_and_text() -> None:
    pods = [
        PodObs("a", "Running", True, "n1", "tpu", ready_at=T0 + 95.0),
        PodObs("b", "Running", True, "n2", "gpu", ready_at=T0 + 400.0),
    ]
    samples = [count_pods([PodObs("a", "Pending")], T0 + 10), count_pods(pods, T0 + 500)]
    fallback = FallbackRecord(T0 + 320, FallbackPlan("fall_back_to_gpu", "gpu_first", "stockout for 300 s"))
    requests = {"tpu": (10, 0), "gpu": (1, 1)}
    report = build_report(T0, samples[::-1], pods, [fallback], requests, ["pod x's log went unread"])
    assert report.first_ready_seconds == 95.0
    assert [s.at for s in report.samples] == [T0 + 10, T0 + 500]
    tpu, gpu = report.stats("tpu"), report.stats("gpu")
    assert (tpu.answered, tpu.failed, gpu.answered, gpu.failed) == (10, 0, 1, 1)
    text = report.render_text()
    for expected in (
        "time to first Ready replica: 95.0 s",
        "+  500.0  gpu=1, tpu=1",
        "+   10.0  pending=1",
        "fallbacks: 1",
        "fall_back_to_gpu -> gpu_first: stockout for 300 s",
        "tpu: 10 answered 2xx, 0 answered otherwise",
        "gpu: 1 answered 2xx, 1 answered otherwise",
        "replicas on different accelerators answered",
        "note: pod x's log went unread",
    ):
        assert expected in text, expected


def test_an_empty_report_still_renders() -> None:
    report = build_report(T0, [], [], [], {})
    assert report.first_ready_seconds is None and report.notes == ()
    text = report.render_text()
    assert "time to first Ready replica: never" in text and "tpu: 0 answered 2xx, 0 answered otherwise" in text
