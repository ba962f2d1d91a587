"""GKE host maintenance of nodes that don't live migrate (TPU/GPU), and spot preemption, as a timeline.

Google's page "Manage disruption to GKE nodes that don't live migrate"
(https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu) and "Monitor
maintenance events" describe what a node shows:

1. At the notice, the node gets ``cloud.google.com/scheduled-maintenance-time`` (Unix epoch seconds of the
   window start) and ``cloud.google.com/scheduled-maintenance-time-latest`` (the latest start). Pods can
   stay off such nodes with a required node affinity ``...scheduled-maintenance-time DoesNotExist``.
   The labels hold wall-clock epoch seconds as on Google, not the scenario's faster clock the timeline runs
   on: a notice carries both (``window_epoch``), so a client comparing the label with ``time.time()`` sees
   the real seconds left, as a client of Google's GKE does.
2. Labelling the node ``cloud.google.com/perform-maintenance=true`` starts the maintenance now instead of
   at the window.
3. When it starts, the node gets ``cloud.google.com/active-node-maintenance=true`` and the taint
   ``cloud.google.com/impending-node-termination:NoSchedule``; pods are terminated gracefully.
4. The host goes down (node NotReady) for the maintenance, then the node comes back without the labels
   and taint (or, when the VM is replaced, the node object goes and the pool brings a new one).

Spot nodes get no notice: the taint, a short grace period (Compute Engine gives Spot VMs 30 s), and the
node is gone. Every function here maps (node, notice, now) to what the node should look like now; the
caller keeps the notice and the moment it saw ``perform-maintenance`` and applies the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from interlude_localcloud.gke.policy.model import Node, Taint

LABEL_SCHEDULED = "cloud.google.com/scheduled-maintenance-time"
LABEL_SCHEDULED_LATEST = "cloud.google.com/scheduled-maintenance-time-latest"
LABEL_PERFORM = "cloud.google.com/perform-maintenance"
LABEL_ACTIVE = "cloud.google.com/active-node-maintenance"
TAINT_TERMINATION = Taint("cloud.google.com/impending-node-termination", "NoSchedule")
MAINTENANCE_LABELS = (LABEL_SCHEDULED, LABEL_SCHEDULED_LATEST, LABEL_PERFORM, LABEL_ACTIVE)
SPOT_GRACE_SECONDS = 30.0

Phase = Literal["none", "scheduled", "terminating", "down", "done", "preempting", "preempted"]


@dataclass(frozen=True)
class MaintenanceNotice:
    notice_at: float  # when the maintenance becomes known (labels appear)
    window_start: float
    latest_start: float | None = None  # default: the window start
    drain_seconds: float = 60.0  # from the taint to the host going down: pods' graceful termination
    duration_seconds: float = 600.0  # host down
    replaces_node: bool = False  # the VM comes back as a new node
    # The window's start and latest start as Unix epoch seconds of the wall clock (what the labels hold, as on
    # Google); None: the same numbers as window_start / latest_start (a clock that is the wall clock).
    window_epoch: float | None = None
    latest_epoch: float | None = None

    def __post_init__(self) -> None:
        if self.window_start < self.notice_at:
            raise ValueError("the maintenance window cannot start before its notice")

    def label_times(self) -> tuple[int, int]:
        """(scheduled-maintenance-time, scheduled-maintenance-time-latest): whole epoch seconds."""
        start = self.window_start if self.window_epoch is None else self.window_epoch
        if self.latest_epoch is not None:
            latest = self.latest_epoch
        elif self.window_epoch is None:
            latest = self.latest_start or self.window_start
        else:  # the latest start, as far after the window's start on the wall clock as on the scenario's
            latest = self.window_epoch
        return int(start), int(max(latest, start))


@dataclass(frozen=True)
class NodeMaintenance:
    phase: Phase
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    ready: bool
    evict_pods: bool  # terminate the node's pods (gracefully) now
    delete_node: bool
    started_at: float | None  # when maintenance started (store it: a perform request counts from here)
    next_change_at: float | None  # when to look again
    reason: str


def _base(node: Node) -> tuple[dict[str, str], tuple[Taint, ...]]:
    labels = {k: v for k, v in node.labels.items() if k not in MAINTENANCE_LABELS}
    taints = tuple(t for t in node.taints if t.key != TAINT_TERMINATION.key)
    return labels, taints


def start_time(node: Node, notice: MaintenanceNotice, now: float, perform_seen_at: float | None) -> float:
    """The window start, or earlier when the user asked for maintenance now (after the notice)."""
    if node.labels.get(LABEL_PERFORM) == "true":
        requested = perform_seen_at if perform_seen_at is not None else now
        return min(notice.window_start, max(requested, notice.notice_at))
    return notice.window_start


def maintenance_status(
    node: Node, notice: MaintenanceNotice | None, now: float, perform_seen_at: float | None = None
) -> NodeMaintenance:
    labels, taints = _base(node)
    if notice is None or now < notice.notice_at:
        later = notice.notice_at if notice is not None else None
        return NodeMaintenance("none", labels, taints, True, False, False, None, later, "no maintenance known")
    start = start_time(node, notice, now, perform_seen_at)
    down_at = start + notice.drain_seconds
    back_at = down_at + notice.duration_seconds
    if now >= back_at:
        why = "maintenance done; the VM was replaced" if notice.replaces_node else "maintenance done; node back"
        return NodeMaintenance("done", labels, taints, True, False, notice.replaces_node, start, None, why)
    scheduled, latest = notice.label_times()
    labels[LABEL_SCHEDULED] = str(scheduled)
    labels[LABEL_SCHEDULED_LATEST] = str(latest)
    if node.labels.get(LABEL_PERFORM) == "true":
        labels[LABEL_PERFORM] = "true"
    if now < start:
        return NodeMaintenance(
            "scheduled", labels, taints, True, False, False, None, start, f"maintenance scheduled at {start:.0f}"
        )
    labels[LABEL_ACTIVE] = "true"
    taints = (*taints, TAINT_TERMINATION)
    if now < down_at:
        return NodeMaintenance(
            "terminating", labels, taints, True, True, False, start, down_at, "maintenance started: draining pods"
        )
    return NodeMaintenance("down", labels, taints, False, True, False, start, back_at, "host in maintenance")


def preemption_status(
    node: Node, preempt_at: float | None, now: float, grace_seconds: float = SPOT_GRACE_SECONDS
) -> NodeMaintenance:
    """Spot preemption: no labels ahead of time, the taint and pod termination, then the node is gone."""
    labels, taints = _base(node)
    if preempt_at is None or now < preempt_at:
        return NodeMaintenance("none", labels, taints, True, False, False, None, preempt_at, "not preempted")
    gone_at = preempt_at + grace_seconds
    taints = (*taints, TAINT_TERMINATION)
    if now < gone_at:
        return NodeMaintenance(
            "preempting", labels, taints, True, True, False, preempt_at, gone_at, "spot VM preempted: terminating pods"
        )
    return NodeMaintenance("preempted", labels, taints, False, True, True, preempt_at, None, "spot VM reclaimed")
