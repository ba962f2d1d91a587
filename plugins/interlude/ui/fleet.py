"""The Fleet page's rows: every machine and serving node Interlude watches, its upcoming maintenance, and what
Interlude will do about it, soonest window first.

Pure: Google's JSON (a TPU node's ``upcomingMaintenance``, a Compute instance's
``resourceStatus.upcomingMaintenance``, a GKE node's ``cloud.google.com/scheduled-maintenance-time`` label) in, rows
out. "What Interlude will do" is asked of the same policies the pipelines act on, never restated here: a machine's
plan from `interlude.stage.notice_policy.plan_for_notice`
(https://cloud.google.com/tpu/docs/maintenance-events, https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance),
a node's steps from `interlude.serving.policy.maintenance_plan`
(https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-upgrades#node-maintenance).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interlude.serving.observe import node_obs, pod_obs
from interlude.serving.policy import maintenance_plan
from interlude.serving.spec import ServeSpec
from interlude.stage.notice_policy import Notice, kind_for, plan_for_notice

WHAT = {"tpu_node": "TPU node", "gce_vm": "GPU VM"}


def what_machine(record: Mapping[str, Any]) -> str:
    """What the machine is and on which platform: a TPU VM created on Compute Engine (a TPU machine type such as
    ct6e-standard-8t, https://cloud.google.com/compute/docs/tpus/tpu-machines) is an instance like a GPU VM."""
    kind = str(record.get("kind"))
    if kind == "gce_vm" and not str(record.get("accelerator_type") or "").startswith("nvidia-"):
        return f"TPU VM (Compute Engine {record.get('machine_type') or ''})".replace(" )", ")")
    return WHAT.get(kind, kind)


@dataclass(frozen=True)
class FleetRow:
    what: str  # TPU node | GPU VM | TPU VM (Compute Engine ct6e-standard-8t) | GKE node
    name: str
    where: str  # zone, or cluster (location)
    accelerator: str
    run: str  # the Airflow run it serves: "dag_id / run_id"
    state: str
    window_start: float | None  # epoch seconds; None: no maintenance scheduled
    window_end: float | None
    notice: str  # Google's words: "SCHEDULED, PENDING, can start early" ...
    action: str  # what Interlude will do


def clock(at: float | None) -> str:
    return "" if at is None else dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _upcoming(record: Mapping[str, Any], raw: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if raw is None:
        return None
    if record.get("kind") == "gce_vm":
        return (raw.get("resourceStatus") or {}).get("upcomingMaintenance") or None
    return raw.get("upcomingMaintenance") or None


def machine_action(record: Mapping[str, Any], notice: Notice | None, now: float) -> str:
    """The stage's plan for this notice (`plan_for_notice`), as a sentence."""
    accelerator = "gpu" if record.get("kind") == "gce_vm" else "tpu"
    kind = kind_for(accelerator, machine_type=record.get("machine_type"), spot=record.get("mode") == "spot")
    if notice is None:
        if record.get("mode") == "spot":
            return "none scheduled; a Spot preemption comes without notice: resume from the last committed checkpoint"
        return "none scheduled: watched every poll"
    if notice.starts_at is None:
        return "notice without a window: checkpoint at once"
    plan = plan_for_notice(kind, notice, 0.0, now)
    early = "; then start the maintenance early at the next pause" if plan.start_early else "; hold until the window"
    return (
        f"checkpoint at {clock(plan.checkpoint_at)} ({plan.margin_s:.0f} s before the window: {plan.reason}){early}; "
        f"provision elsewhere if not back by {clock(plan.reprovision_after)}"
    )


def machine_row(run: str, record: Mapping[str, Any], raw: Mapping[str, Any] | None, now: float) -> FleetRow:
    """One training machine: its record (provision's, or the last move's) and the cloud's JSON for it (None: gone)."""
    upcoming = _upcoming(record, raw)
    notice = Notice.from_upcoming(upcoming) if upcoming else None
    state = "gone" if raw is None else str(raw.get("state") or raw.get("status") or "")
    words = ""
    if notice is not None:
        words = f"{notice.kind}, {notice.status}" + (", can start early" if notice.can_reschedule else "")
    return FleetRow(
        what=what_machine(record),
        name=str(record.get("name") or ""),
        where=str(record.get("zone") or ""),
        accelerator=str(record.get("accelerator_type") or ""),
        run=run,
        state=state,
        window_start=notice.starts_at if notice else None,
        window_end=notice.ends_at if notice else None,
        notice=words,
        action=machine_action(record, notice, now) if raw is not None else "gone: the stage provisions again",
    )


def node_rows(
    run: str, spec: ServeSpec, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], now: float
) -> list[FleetRow]:
    """The serving cluster's accelerator nodes, each with the maintenance watch's steps for it as of now."""
    obs = [node_obs(n) for n in nodes]
    kinds = {n.name: n.accelerator for n in obs}
    pod_list = [pod_obs(p, kinds) for p in pods]
    running = sum(1 for p in pod_list if p.phase in ("Pending", "Running"))
    steps = maintenance_plan(obs, pod_list, now, spec, desired_replicas=max(running, spec.replicas_min))
    rows = []
    for node in obs:
        if node.accelerator is None:
            continue
        at = node.maintenance_at()
        mine = [s for s in steps if s.node == node.name]
        if at is None:
            action = "none scheduled: watched while the serving run watches"
        else:
            action = "; ".join(f"{s.kind}: {s.reason}" for s in mine) or "wait: nothing to do yet"
        on = sum(1 for p in pod_list if p.node == node.name and p.phase == "Running")
        rows.append(
            FleetRow(
                what="GKE node",
                name=node.name,
                where=f"{spec.cluster} ({spec.location})",
                accelerator=f"{node.accelerator}: {_accelerator_type(node.labels)}",
                run=run,
                state=("Ready" if node.ready else "NotReady")
                + (", cordoned" if node.cordoned else "")
                + f", {on} pod(s)",
                window_start=at,
                window_end=None,
                notice="scheduled-maintenance-time" if at is not None else "",
                action=action,
            )
        )
    return rows


def _accelerator_type(labels: Mapping[str, str]) -> str:
    return labels.get("cloud.google.com/gke-tpu-accelerator") or labels.get("cloud.google.com/gke-accelerator") or ""


def soonest_first(rows: Sequence[FleetRow]) -> list[FleetRow]:
    """Rows with a window first, soonest first; the rest after, by name."""
    return sorted(rows, key=lambda r: (r.window_start is None, r.window_start or 0.0, r.what, r.name))
