"""The report's counts from the cluster's records: watch events -> pods over time, access logs -> requests."""

from __future__ import annotations

from typing import Any

from interlude.serving.observed import (
    PodChange,
    Served,
    nodes_of,
    pod_change,
    ran,
    requests_per_accelerator,
    timeline,
    uncounted,
)

T0 = 1_800_000_000.0
KINDS = {"tpu-1": "tpu", "l4-1": "gpu", "l4-2": "gpu"}


def _stamp(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, rv: int, phase: str = "Pending", node: str | None = None, ready_at: float | None = None) -> Any:
    conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": _stamp(ready_at)}] if ready_at else []
    return {
        "metadata": {"name": name, "resourceVersion": str(rv), "creationTimestamp": _stamp(T0)},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "conditions": conditions},
    }


def test_pod_change_takes_the_pods_own_newest_stamp_and_deleted_when_received() -> None:
    up = pod_change("MODIFIED", pod("a", 7, "Running", "tpu-1", ready_at=T0 + 30), received=T0 + 100)
    assert (up.rv, up.at, up.node, up.phase, up.ready) == (7, T0 + 30, "tpu-1", "Running", True)
    gone = pod_change("DELETED", pod("a", 9, "Running", "tpu-1", ready_at=T0 + 30), received=T0 + 120)
    assert (gone.phase, gone.ready, gone.at) == ("Deleted", False, T0 + 120)
    fresh = pod_change("ADDED", pod("b", 3), received=T0 - 5)  # a clock behind the API's: never later than seen
    assert fresh.at == T0 - 5
    assert PodChange.from_dict(up.to_dict()) == up


def test_the_timeline_holds_every_change_of_the_counts_in_resource_version_order() -> None:
    changes = [
        pod_change("ADDED", pod("a", 2), T0 + 1),
        pod_change("MODIFIED", pod("a", 3, "Pending", "tpu-1"), T0 + 2),  # bound: counts unchanged
        pod_change("MODIFIED", pod("a", 4, "Running", "tpu-1"), T0 + 3),
        pod_change("ADDED", pod("b", 5), T0 + 4),
        pod_change("MODIFIED", pod("b", 6, "Running", "l4-1"), T0 + 5),
        pod_change("DELETED", pod("b", 8, "Running", "l4-1"), T0 + 7),
        pod_change("MODIFIED", pod("c", 7, "Running", "gone"), T0 + 6),
    ]
    samples = timeline(T0, [], changes[::-1] + changes[:2], KINDS)  # any order, replays counted once
    assert [(s.rv, dict(s.counts)) for s in samples] == [
        (0, {}),
        (2, {"pending": 1}),
        (4, {"tpu": 1}),
        (5, {"tpu": 1, "pending": 1}),
        (6, {"tpu": 1, "gpu": 1}),
        (7, {"tpu": 1, "gpu": 1, "unknown": 1}),
        (8, {"tpu": 1, "unknown": 1}),
    ]


def test_requests_per_accelerator_subtract_what_a_log_held_before_the_run() -> None:
    served = {"a": Served(10, 1), "b": Served(5, 0), "old": Served(7, 0), "lost": Served(2, 0)}
    baseline = {"old": Served(4, 0)}
    nodes = {"a": "tpu-1", "b": "l4-1", "old": "l4-2"}
    assert requests_per_accelerator(served, baseline, nodes, KINDS) == {
        "tpu": Served(10, 1),
        "gpu": Served(8, 0),
        "unknown": Served(2, 0),
    }


def test_pods_that_ran_but_whose_log_was_not_read_are_named() -> None:
    changes = [
        PodChange(2, T0, "a", "tpu-1", "Running", True),
        PodChange(3, T0, "b", "l4-1", "Running", False),
        PodChange(4, T0, "p", None, "Pending", False),
    ]
    assert ran(changes) == {"a", "b"}
    assert nodes_of(changes) == {"a": "tpu-1", "b": "l4-1"}
    assert uncounted(ran(changes), {"a": Served(1, 0)}) == ["b"]
