"""The rollout trigger's fallback step: Kubernetes JSON on the wall clock -> fallback_decision on the cluster clock."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from interlude.serving.fallback import FallbackState, decide, observation
from interlude.serving.policy import FallbackPlan
from interlude.serving.spec import ServeSpec

T0 = 1_800_000_000.0  # wall clock when the class order was applied
SPEC = ServeSpec(checkpoint_uri="gs://b/ckpt", fallback_after_seconds=300, tpu_retry_seconds=900)


def stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pending(name: str, since: float) -> dict[str, Any]:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": stamp(since)}
    return {"metadata": {"name": name, "creationTimestamp": stamp(since)}, "spec": {}, "status": {"conditions": [cond]}}


def failed_scale_up(pod: str, at: float) -> dict[str, Any]:
    return {
        "reason": "FailedScaleUp",
        "message": "Node scale up in zones us-central1-a associated with this pod failed: GCE out of resources.",
        "involvedObject": {"kind": "Pod", "name": pod},
        "lastTimestamp": stamp(at),
    }


@pytest.mark.parametrize(
    ("scale", "waited", "action"),
    [
        (1.0, 299, "none"),  # Google: 299 s pending < 300 s
        (1.0, 300, "fall_back_to_gpu"),
        (600.0, 0, "none"),  # local cloud: the same second
        (600.0, 1, "fall_back_to_gpu"),  # one real second is 600 cluster seconds
        (10.0, 29, "none"),
        (10.0, 30, "fall_back_to_gpu"),
    ],
)
def test_ages_are_on_the_cluster_clock(scale: float, waited: float, action: str) -> None:
    state = FallbackState("tpu_first", T0, scale)
    plan = decide([pending("p1", T0)], [failed_scale_up("p1", T0)], [], state, T0 + waited, SPEC)
    assert plan.action == action, plan
    assert plan.order == ("gpu_first" if action != "none" else "tpu_first")


def test_pending_without_stockout_evidence_never_falls_back() -> None:
    state = FallbackState("tpu_first", T0, 1.0)
    plan = decide([pending("p1", T0)], [], [], state, T0 + 10_000, SPEC)
    assert plan.action == "none" and "without stockout evidence" in plan.reason


def test_an_event_about_another_pod_is_no_evidence() -> None:
    state = FallbackState("tpu_first", T0, 1.0)
    plan = decide([pending("p1", T0)], [failed_scale_up("other", T0)], [], state, T0 + 10_000, SPEC)
    assert plan.action == "none"


def test_gpu_first_returns_to_tpu_after_the_retry_time_without_new_stockouts() -> None:
    state = FallbackState("gpu_first", T0, 1.0)
    old = failed_scale_up("p1", T0 - 2000)
    assert decide([], [old], [], state, T0 + 899, SPEC).action == "none"
    assert decide([], [old], [], state, T0 + 900, SPEC).action == "return_to_tpu"
    assert decide([], [failed_scale_up("p1", T0 + 800)], [], state, T0 + 900, SPEC).action == "none"


def test_state_round_trips_and_records_each_decision() -> None:
    state = FallbackState("tpu_first", T0, 600.0)
    plan = FallbackPlan("fall_back_to_gpu", "gpu_first", "why", ("p1",))
    after = state.after(plan, T0 + 5)
    assert after.order == "gpu_first" and after.order_since == T0 + 5 and after.time_scale == 600.0
    assert after.records == (
        {"at": T0 + 5, "action": "fall_back_to_gpu", "order": "gpu_first", "reason": "why", "stuck_pods": ["p1"]},
    )
    assert FallbackState.from_dict(after.to_dict()) == after


def test_observation_reads_node_accelerators() -> None:
    node = {"metadata": {"name": "n1", "labels": {"cloud.google.com/gke-accelerator": "nvidia-l4"}}}
    pod = {"metadata": {"name": "p1"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    obs, now = observation([pod], [], [node], FallbackState("tpu_first", T0, 2.0), T0 + 3)
    assert obs.pods[0].accelerator == "gpu" and now == T0 + 6
