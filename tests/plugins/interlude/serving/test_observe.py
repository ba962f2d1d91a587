"""Kubernetes JSON -> observations, and the fallback decision from what the API would return."""

from __future__ import annotations

from typing import Any

from interlude.serving.observe import epoch, event_obs, node_obs, pod_obs
from interlude.serving.policy import ServingObservation, fallback_decision
from interlude.serving.spec import ServeSpec

T = "2026-12-02T16:00:00Z"


def _pod(name: str, node: str | None, phase: str, conditions: list[dict[str, str]], **meta: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": T, **meta},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "conditions": conditions},
    }


NODES = [
    {
        "metadata": {
            "name": "tpu-1",
            "labels": {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/scheduled-maintenance-time": "1796227200",
            },
        },
        "spec": {"unschedulable": True},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    },
    {
        "metadata": {"name": "l4-1", "labels": {"cloud.google.com/gke-accelerator": "nvidia-l4"}},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    },
    {"metadata": {"name": "cpu-1"}},
]


def test_epoch() -> None:
    assert epoch(T) == 1796227200.0
    assert epoch("2026-12-02T16:00:00.500000Z") == 1796227200.5
    assert epoch(None) is None and epoch("") is None


def test_nodes() -> None:
    tpu, l4, cpu = (node_obs(n) for n in NODES)
    assert (tpu.accelerator, tpu.ready, tpu.cordoned, tpu.maintenance_at()) == ("tpu", True, True, 1796227200.0)
    assert (l4.accelerator, l4.ready, l4.cordoned, l4.maintenance_at()) == ("gpu", False, False, None)
    assert (cpu.accelerator, cpu.ready) == (None, False)


def test_pods() -> None:
    kinds = {n.name: n.accelerator for n in map(node_obs, NODES)}
    ready = _pod(
        "a", "tpu-1", "Running", [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-02T16:01:35Z"}]
    )
    stuck = _pod(
        "b",
        None,
        "Pending",
        [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": "2026-12-02T16:00:05Z",
            }
        ],
    )
    gated = _pod("c", None, "Pending", [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}])
    leaving = _pod("d", "l4-1", "Running", [], deletionTimestamp="2026-12-02T16:02:00Z")
    a, b, c, d = (pod_obs(p, kinds) for p in (ready, stuck, gated, leaving))
    assert (a.phase, a.ready, a.node, a.accelerator, a.ready_at) == ("Running", True, "tpu-1", "tpu", 1796227295.0)
    assert (b.phase, b.node, b.accelerator, b.unschedulable_since) == ("Pending", None, None, 1796227205.0)
    assert c.unschedulable_since is None
    assert (d.phase, d.accelerator) == ("Terminating", "gpu")


def test_events_of_both_api_groups() -> None:
    core = {
        "reason": "FailedScaleUp",
        "message": "GCE out of resources",
        "involvedObject": {"kind": "Pod", "name": "b"},
        "lastTimestamp": T,
    }
    new = {
        "reason": "NotTriggerScaleUp",
        "note": "in backoff after failed scale-up",
        "regarding": {"name": "b"},
        "eventTime": "2026-12-02T16:00:10.000000Z",
    }
    assert event_obs(core) == event_obs(core) and event_obs(core).involved == "b" and event_obs(core).at == epoch(T)
    assert (event_obs(new).message, event_obs(new).at) == ("in backoff after failed scale-up", 1796227210.0)


def test_fallback_from_api_json() -> None:
    kinds = {n.name: n.accelerator for n in map(node_obs, NODES)}
    stuck = _pod(
        "b",
        None,
        "Pending",
        [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": T}],
    )
    event = {
        "reason": "FailedScaleUp",
        "involvedObject": {"name": "b"},
        "lastTimestamp": T,
        "message": "Node scale up in zones us-central2-b associated with this pod failed: GCE out of resources.",
    }
    obs = ServingObservation((pod_obs(stuck, kinds),), (event_obs(event),))
    spec = ServeSpec(checkpoint_uri="gs://b-1/c/")
    assert fallback_decision(obs, 1796227200.0 + 299, spec).action == "none"
    assert fallback_decision(obs, 1796227200.0 + 300, spec).action == "fall_back_to_gpu"
