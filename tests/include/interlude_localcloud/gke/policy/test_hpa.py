"""The HPA algorithm against the worked examples of the Kubernetes docs
(https://kubernetes.io/docs/concepts/workloads/autoscaling/horizontal-pod-autoscale/) and its rules."""

from __future__ import annotations

import pytest

from interlude_localcloud.gke.policy.hpa import (
    HpaSpec,
    HpaState,
    PodSample,
    ScalingPolicy,
    ScalingRules,
    metric_replicas,
    reconcile,
)


def pods(*values: float | None, phase: str = "Running") -> list[PodSample]:
    return [PodSample(f"p{i}", v, phase) for i, v in enumerate(values)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("current", "samples", "expected"),
    [
        # docs: current 200m, desired 100m -> doubled; 50m -> halved
        (3, pods(0.2, 0.2, 0.2), 6),
        (4, pods(0.05, 0.05, 0.05, 0.05), 2),
        # tolerance 0.1: ratio 1.05 keeps, 1.11 moves
        (10, pods(*[0.105] * 10), 10),
        (10, pods(*[0.111] * 10), 12),
        (10, pods(*[0.091] * 10), 10),
        (10, pods(*[0.089] * 10), 9),
        # missing metrics: count as 0 when scaling up...
        (3, pods(0.3, 0.3, None), 6),
        # ... and as the target when scaling down
        (3, pods(0.02, 0.02, None), 2),
        # missing pods reversing the direction: no change
        (4, pods(0.12, None, None, None), 4),
        # pending (not yet ready) pods count as 0 on a scale-up
        (3, pods(0.3, 0.3) + [PodSample("new", None, "Pending")], 6),
        # ... and are simply set aside on a scale-down
        (3, pods(0.02, 0.02) + [PodSample("new", None, "Pending")], 1),
        # deleted and failed pods are ignored
        (2, pods(0.2) + [PodSample("gone", 5.0, deleting=True), PodSample("dead", 9.0, "Failed")], 2),
        # nothing measured: keep
        (2, pods(None, None), 2),
    ],
)
def test_metric_proposal(current: int, samples: list[PodSample], expected: int) -> None:
    assert metric_replicas(current, samples, 0.1, 0.1, 0.1)[0] == expected


def test_guide_hpa_scales_on_waiting_requests() -> None:
    spec = HpaSpec(1, 4, 1.0)  # vllm:num_requests_waiting, averageValue 1
    decision = reconcile(spec, 1, pods(35.0), HpaState(), 0.0)
    assert decision.desired == 4 and decision.metric_average == 35.0  # max 4 (the default limit allows 5)
    assert "TooManyReplicas" in decision.reason


def test_default_scale_up_rate_is_max_of_double_and_four_pods_per_15s() -> None:
    spec = HpaSpec(1, 100, 1.0)
    first = reconcile(spec, 1, pods(100.0), HpaState(), 0.0)
    assert first.desired == 5 and "ScaleUpLimit" in first.reason
    assert reconcile(spec, 5, pods(*[100.0] * 5), first.state, 10.0).desired == 5  # same 15 s period
    assert reconcile(spec, 5, pods(*[100.0] * 5), first.state, 16.0).desired == 10  # 5 doubled


def test_scale_down_waits_for_the_300s_stabilization_window() -> None:
    spec = HpaSpec(1, 10, 1.0)
    state = HpaState()
    for now in (0.0, 100.0, 200.0, 299.0):
        decision = reconcile(spec, 4, pods(0.5, 0.5, 0.5, 0.5), state, now)
        assert decision.desired == 4, now
        state = decision.state
    assert reconcile(spec, 4, pods(0.5, 0.5, 0.5, 0.5), state, 301.0).desired == 2


def test_scale_down_window_keeps_the_highest_recent_recommendation() -> None:
    spec = HpaSpec(1, 10, 1.0, scale_down=ScalingRules(60, (ScalingPolicy("Percent", 100, 15),)))
    state = reconcile(spec, 4, pods(*[1.0] * 4), HpaState(), 0.0).state
    state = reconcile(spec, 4, pods(*[1.5] * 4), state, 30.0).state  # proposes 6, but metric spike
    d = reconcile(spec, 4, pods(*[0.25] * 4), state, 70.0)  # proposes 1; the 6 of t=30 is in the window
    assert d.desired == 4
    assert reconcile(spec, 4, pods(*[0.25] * 4), d.state, 95.0).desired == 1  # t=30 has left the window


def test_docs_scale_down_policy_example_80_replicas() -> None:
    """Docs: Pods 4/60s and Percent 10/60s, Max: 80 -> 72 -> 64 (10% of 72 rounds to 8); <=40: 4 at a time."""
    rules = ScalingRules(0, (ScalingPolicy("Pods", 4, 60), ScalingPolicy("Percent", 10, 60)))
    spec = HpaSpec(1, 100, 1.0, scale_down=rules)
    low = 0.1
    d1 = reconcile(spec, 80, pods(*[low] * 80), HpaState(), 0.0)
    assert d1.desired == 72 and "ScaleDownLimit" in d1.reason
    assert reconcile(spec, 72, pods(*[low] * 72), d1.state, 30.0).desired == 72  # same period
    d2 = reconcile(spec, 72, pods(*[low] * 72), d1.state, 62.0)
    assert d2.desired == 64
    assert reconcile(spec, 40, pods(*[low] * 40), HpaState(), 1.0).desired == 36


@pytest.mark.parametrize(("select", "expected"), [("Max", 72), ("Min", 76), ("Disabled", 80)])
def test_select_policy(select: str, expected: int) -> None:
    rules = ScalingRules(0, (ScalingPolicy("Pods", 4, 60), ScalingPolicy("Percent", 10, 60)), select)  # type: ignore[arg-type]
    spec = HpaSpec(1, 100, 1.0, scale_down=rules)
    assert reconcile(spec, 80, pods(*[0.1] * 80), HpaState(), 0.0).desired == expected


def test_min_max_and_disabled() -> None:
    spec = HpaSpec(2, 5, 1.0)
    assert reconcile(spec, 0, [], HpaState(), 0.0).desired == 0  # 0 replicas: autoscaling off
    assert reconcile(spec, 9, pods(*[0.0] * 9), HpaState(), 0.0).desired == 5
    assert reconcile(spec, 1, pods(0.0), HpaState(), 0.0).desired == 2
    state = reconcile(spec, 3, pods(0.0, 0.0, 0.0), HpaState(), 0.0).state
    assert reconcile(spec, 3, pods(0.0, 0.0, 0.0), state, 400.0).desired == 2  # never below min
    with pytest.raises(ValueError):
        HpaSpec(3, 2, 1.0)
    with pytest.raises(ValueError):
        HpaSpec(1, 2, 0.0)


def test_configurable_tolerance_per_direction() -> None:
    up = ScalingRules(0, (ScalingPolicy("Percent", 100, 15),), tolerance=0.0)
    spec = HpaSpec(1, 100, 1.0, scale_up=up)
    assert reconcile(spec, 10, pods(*[1.05] * 10), HpaState(), 0.0).desired == 11
    assert reconcile(HpaSpec(1, 100, 1.0), 10, pods(*[1.05] * 10), HpaState(), 0.0).desired == 10
