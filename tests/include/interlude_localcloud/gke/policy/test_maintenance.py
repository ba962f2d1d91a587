"""The node maintenance timeline: labels, taint, eviction, down and back; perform-maintenance; spot."""

from __future__ import annotations

from dataclasses import replace

import pytest

from interlude_localcloud.gke.policy.maintenance import (
    LABEL_ACTIVE,
    LABEL_PERFORM,
    LABEL_SCHEDULED,
    LABEL_SCHEDULED_LATEST,
    TAINT_TERMINATION,
    MaintenanceNotice,
    maintenance_status,
    preemption_status,
)
from interlude_localcloud.gke.policy.model import NodeSelectorRequirement, NodeSelectorTerm
from interlude_localcloud.gke.policy.scheduling import check

from .guide import GPU_POOL, TPU_POOL, vllm_pod

NOTICE = MaintenanceNotice(
    notice_at=1000.0, window_start=8200.0, latest_start=9000.0, drain_seconds=60.0, duration_seconds=600.0
)
NODE = GPU_POOL.new_node("l4-0")


@pytest.mark.parametrize(
    ("now", "phase", "scheduled", "active", "tainted", "ready", "evict"),
    [
        (999.0, "none", False, False, False, True, False),
        (1000.0, "scheduled", True, False, False, True, False),
        (8199.0, "scheduled", True, False, False, True, False),
        (8200.0, "terminating", True, True, True, True, True),
        (8259.0, "terminating", True, True, True, True, True),
        (8260.0, "down", True, True, True, False, True),
        (8859.0, "down", True, True, True, False, True),
        (8860.0, "done", False, False, False, True, False),
    ],
)
def test_timeline(
    now: float, phase: str, scheduled: bool, active: bool, tainted: bool, ready: bool, evict: bool
) -> None:
    status = maintenance_status(NODE, NOTICE, now)
    assert status.phase == phase
    assert (LABEL_SCHEDULED in status.labels) is scheduled
    assert (status.labels.get(LABEL_ACTIVE) == "true") is active
    assert (TAINT_TERMINATION in status.taints) is tainted
    assert (status.ready, status.evict_pods) == (ready, evict)
    assert status.labels["cloud.google.com/gke-nodepool"] == "l4"  # other labels stay
    assert set(status.taints) >= set(NODE.taints)


def test_labels_hold_epoch_seconds_and_next_change_is_given() -> None:
    status = maintenance_status(NODE, NOTICE, 5000.0)
    assert status.labels[LABEL_SCHEDULED] == "8200" and status.labels[LABEL_SCHEDULED_LATEST] == "9000"
    assert status.next_change_at == 8200.0
    assert maintenance_status(NODE, NOTICE, 500.0).next_change_at == 1000.0
    assert maintenance_status(NODE, None, 500.0).phase == "none"


def test_labels_hold_the_wall_clocks_epoch_when_the_timeline_runs_on_a_faster_clock() -> None:
    """Google's labels are Unix epoch seconds; the local cloud's timeline runs on the scenario's clock, so a
    notice carries the window's wall-clock epoch too and the labels show that one (the timeline stays scenario)."""
    fast = replace(NOTICE, window_epoch=1_796_000_123.7, latest_epoch=1_796_000_200.0)
    status = maintenance_status(NODE, fast, 5000.0)
    assert status.labels[LABEL_SCHEDULED] == "1796000123"
    assert status.labels[LABEL_SCHEDULED_LATEST] == "1796000200"
    assert status.next_change_at == 8200.0 and status.phase == "scheduled"
    only_start = replace(NOTICE, window_epoch=1_796_000_123.0)
    assert maintenance_status(NODE, only_start, 5000.0).labels[LABEL_SCHEDULED_LATEST] == "1796000123"


def test_perform_maintenance_label_starts_it_now() -> None:
    asked = replace(NODE, labels={**NODE.labels, LABEL_PERFORM: "true"})
    status = maintenance_status(asked, NOTICE, 3000.0, perform_seen_at=3000.0)
    assert status.phase == "terminating" and status.started_at == 3000.0 and status.evict_pods
    assert maintenance_status(asked, NOTICE, 3061.0, perform_seen_at=3000.0).phase == "down"
    done = maintenance_status(asked, NOTICE, 3661.0, perform_seen_at=3000.0)
    assert done.phase == "done" and LABEL_PERFORM not in done.labels
    # asked before the notice: it starts at the notice, not before
    assert maintenance_status(asked, NOTICE, 1000.0, perform_seen_at=10.0).phase == "terminating"


def test_maintenance_coming_keeps_affinity_pods_off_the_node() -> None:
    pod = replace(
        vllm_pod("p"),
        required_affinity=(NodeSelectorTerm((NodeSelectorRequirement(LABEL_SCHEDULED, "DoesNotExist"),)),),
    )
    for now, fits in ((900.0, True), (1000.0, False), (8900.0, True)):
        status = maintenance_status(NODE, NOTICE, now)
        node = replace(NODE, labels=status.labels, taints=status.taints, ready=status.ready)
        assert check(pod, node, {}).fits is fits, now
    tainted = maintenance_status(NODE, NOTICE, 8200.0)
    node = replace(NODE, labels=tainted.labels, taints=tainted.taints)
    assert "impending-node-termination" in check(vllm_pod("q"), node, {}).reason  # no affinity: the taint


def test_replaced_vm_and_bad_notice() -> None:
    assert maintenance_status(NODE, replace(NOTICE, replaces_node=True), 9000.0).delete_node is True
    with pytest.raises(ValueError):
        MaintenanceNotice(notice_at=10.0, window_start=5.0)


def test_spot_preemption_without_notice() -> None:
    spot = TPU_POOL.new_node("v6e-1-0")
    before = preemption_status(spot, 100.0, 99.0)
    assert before.phase == "none" and LABEL_SCHEDULED not in before.labels and before.next_change_at == 100.0
    going = preemption_status(spot, 100.0, 110.0)
    assert going.phase == "preempting" and going.evict_pods and TAINT_TERMINATION in going.taints
    assert LABEL_SCHEDULED not in going.labels  # no advance notice for spot
    gone = preemption_status(spot, 100.0, 130.0)
    assert gone.phase == "preempted" and gone.delete_node and not gone.ready
    assert preemption_status(spot, None, 130.0).phase == "none"
