"""A stage on GKE: one look at the JobSet's pods, their nodes and the stage's GCS facts, and what it means.

GKE, not Interlude, takes a TPU node through host maintenance
(https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu): at the notice the node
gets ``cloud.google.com/scheduled-maintenance-time`` (Unix epoch seconds of the window); at the window it gets
``cloud.google.com/active-node-maintenance`` and the taint ``cloud.google.com/impending-node-termination``, and
its pods are terminated gracefully (SIGTERM, then SIGKILL after the grace period). The JobSet controller then
recreates the slice's pods, which run once the node (or its replacement) is schedulable again.

So the stage here does what the VM stage does at a notice, and leaves the rest to GKE: it asks the workload
for a checkpoint through the run's control requests (the same objects a VM's notice writes), lets GKE drain
the node at the window (the workload commits its current step on SIGTERM), waits for the recreated pod and
checks, from the workload's own progress (its boot id is the pod's uid), that it resumed from the checkpoint.
The event it records is the VM stage's (interlude.training.events): checkpoint, downtime, steps recomputed.

A maintenance drill (``drill_maintenance``) is the VM stage's: the workload holds at the drill step, and the
stage has Compute Engine simulate a host maintenance on the VM under the pod's node (a GKE node is a Compute
Engine instance of that name; https://cloud.google.com/compute/docs/instances/simulating-host-maintenance); GKE
then shows it as it shows a real one, and the event it opens is the drill's.

When the pool cannot get its node back (the host was replaced and the zone is out of the machine type), the
cluster autoscaler says so on the pending pod: a ``FailedScaleUp`` Event "... failed: GCE out of resources"
(its ``scale.up.error.out.of.resources``; https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-autoscaler-visibility).
Waiting would be waiting on a stockout, so the stage asks the operator to MOVE: the tree is walked again without
that place (a GPU pool, for a portable model) and the run resumes there from its committed checkpoint.

Pure: typed observations in, the next state and the operator's actions out (mypy strict, tested without
Airflow). The trigger (interlude.triggers.gke_stage) reads the cluster and GCS.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from interlude.stage.model import Drill

LABEL_SCHEDULED = "cloud.google.com/scheduled-maintenance-time"
LABEL_ACTIVE = "cloud.google.com/active-node-maintenance"
TAINT_TERMINATION = "cloud.google.com/impending-node-termination"
RUNNING, NOTICED, DRAINING = "running", "noticed", "draining"
REQUEST_CHECKPOINT, RECORD_EVENT, COMPLETE, FAIL = "request_checkpoint", "record_event", "complete", "fail"
MOVE, DRILL = "move", "drill"
#: A drill's states are the VM stage's (interlude.stage.model.Drill), as the plain strings the state travels in.
DRILL_PENDING, DRILL_SENT, DRILL_DONE = Drill.PENDING.value, Drill.SENT.value, Drill.DONE.value
ZONE_LABEL = "topology.kubernetes.io/zone"
#: The cluster autoscaler's pod Event when a scale-up failed for lack of capacity (the zone's stockout).
OUT_OF_RESOURCES = ("FailedScaleUp", "out of resources")


@dataclass(frozen=True)
class PodSeen:
    name: str
    uid: str
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    node: str | None = None


@dataclass(frozen=True)
class NodeSeen:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    tainted: bool = False  # cloud.google.com/impending-node-termination

    def maintenance_at(self) -> float | None:
        """The window's start (epoch seconds) GKE announced, None when none (or an unreadable value)."""
        try:
            value = self.labels.get(LABEL_SCHEDULED)
            return None if value is None else float(value)
        except ValueError:
            return None

    @property
    def noticed(self) -> bool:
        return self.maintenance_at() is not None or self.tainted or self.labels.get(LABEL_ACTIVE) == "true"


@dataclass(frozen=True)
class GkeObservation:
    now: float
    pods: tuple[PodSeen, ...]
    nodes: Mapping[str, NodeSeen]
    committed_step: int
    progress: Mapping[str, Any]  # the workload's progress.json of this stage ({} before it starts)
    ack_step: int | None = None  # the workload's answer to the open checkpoint request
    jobset_failure: str | None = None  # the JobSet's Failed condition, said
    scale_up_failure: str | None = None  # the autoscaler's out-of-resources Event on a pending pod of the JobSet
    export_committed: bool = False  # the stage's Hugging Face export is in GCS (interlude_workload.hf_export)

    @property
    def boot_id(self) -> str | None:
        value = self.progress.get("boot_id")
        return str(value) if value else None

    @property
    def step(self) -> int:
        return int(self.progress.get("step") or 0)


@dataclass(frozen=True)
class GkeStageState:
    target_step: int
    phase: str = RUNNING
    pod_uid: str | None = None  # the pod the workload runs in now
    boot_id: str | None = None  # the workload's boot (its pod's uid) this state last saw
    last_step_seen: int = 0
    last_change_at: float | None = None  # when progress last moved (stall watch)
    request_id: str | None = None
    event: dict[str, Any] | None = None
    drill: str | None = None  # DRILL_PENDING | DRILL_SENT | DRILL_DONE; None: no drill in this stage
    drill_step: int | None = None  # the step the workload holds at for it
    drill_sent_at: float | None = None
    drill_node: str | None = None  # the node (its Compute Engine instance) the drill went to, and its zone
    drill_zone: str | None = None
    awaits_export: bool = False  # done only once the export is in too (interlude_workload.hf_export.exports)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GkeStageState:
        return cls(**dict(data))


@dataclass(frozen=True)
class GkeStep:
    state: GkeStageState
    actions: tuple[str, ...] = ()
    event: dict[str, Any] | None = None  # the event to record (RECORD_EVENT)
    reason: str = ""


def running_pod(pods: Sequence[PodSeen]) -> PodSeen | None:
    return next((p for p in sorted(pods, key=lambda p: p.name) if p.phase == "Running"), None)


def _noticed_node(obs: GkeObservation) -> NodeSeen | None:
    for pod in obs.pods:
        node = obs.nodes.get(pod.node or "")
        if node is not None and pod.phase in ("Pending", "Running") and node.noticed:
            return node
    return None


def _open_event(obs: GkeObservation, state: GkeStageState, node: NodeSeen, kind: str) -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4().hex[:12],
        "kind": kind,
        "platform": "gke",
        "node": node.name,
        "notice_type": "SCHEDULED" if node.maintenance_at() is not None else None,
        "window_start": node.maintenance_at(),
        "detected_at": obs.now,
        "step_at_detection": max(state.last_step_seen, obs.step),
        "committed_at_detection": obs.committed_step,
        "checkpoint_step": None,
        "checkpoint_committed_at": None,
        "down_at": None,
        "up_at": None,
        "reprovisioned": False,
    }


def _close(state: GkeStageState, obs: GkeObservation, pod: PodSeen | None) -> GkeStep:
    """The recreated pod's workload stepped past its resume point: the event, from the workload's own words."""
    from interlude.training.badput import workload_times

    event = dict(state.event or {})
    resumed_from = int(obs.progress.get("resumed_from") or 0)
    reached = max(int(event.get("step_at_down") or 0), int(event.get("step_at_detection") or 0))
    event["checkpoint_step"] = resumed_from
    stepping = obs.progress.get("stepping_at_epoch")
    event.update(
        workload_times(
            event,
            obs.now,
            stopped=obs.progress.get("previous_boot_ended_at"),
            booted=obs.progress.get("boot_started_at"),
            stepping=stepping,
        )
    )
    event.update(
        resumed_from_step=resumed_from,
        boot_id=obs.boot_id,
        pod=pod.name if pod else None,
        steps_recomputed=max(0, reached - resumed_from),
    )
    new = replace(
        state,
        phase=RUNNING,
        event=None,
        request_id=None,
        boot_id=obs.boot_id,
        pod_uid=pod.uid if pod else state.pod_uid,
        last_step_seen=obs.step,
        last_change_at=obs.now,
    )
    return GkeStep(new, (RECORD_EVENT,), event, f"resumed from step {resumed_from} in pod {pod.name if pod else '?'}")


def next_gke_step(
    state: GkeStageState, obs: GkeObservation, stall_timeout: float, down_timeout: float, drill_timeout: float = 600.0
) -> GkeStep:
    """What one look means. ``stall_timeout``: real seconds without progress (no maintenance under way) before
    the stage fails; ``down_timeout``: real seconds the workload may stay gone after its pod was drained;
    ``drill_timeout``: real seconds from a drill's simulateMaintenanceEvent to its notice on the node."""
    if obs.jobset_failure:
        return GkeStep(replace(state), (FAIL,), None, f"the JobSet failed: {obs.jobset_failure}")
    pod = running_pod(obs.pods)
    new_boot = obs.boot_id is not None and state.boot_id is not None and obs.boot_id != state.boot_id
    if state.phase == DRAINING or (state.phase == NOTICED and new_boot):
        return _after_drain(state, obs, pod, new_boot, down_timeout)
    ended = _ended(state, obs)
    if ended is not None:
        return ended
    moved = obs.step != state.last_step_seen or obs.boot_id != state.boot_id
    seen = replace(
        state,
        pod_uid=pod.uid if pod is not None and state.phase == RUNNING else state.pod_uid,
        boot_id=obs.boot_id or state.boot_id,
        last_step_seen=max(obs.step, state.last_step_seen) if not new_boot else obs.step,
        last_change_at=obs.now if moved or state.last_change_at is None else state.last_change_at,
    )
    if state.phase == NOTICED:
        return _noticed(seen, obs, pod)
    node = _noticed_node(obs)
    if node is not None:
        event = _open_event(obs, state, node, "maintenance")
        if state.drill == DRILL_SENT:  # the drill's event: it keeps when the hold for it began to cost (badput)
            event.update(drill=True, drill_step=state.drill_step, drill_sent_at=state.drill_sent_at)
            seen = replace(seen, drill=DRILL_DONE)
        new = replace(seen, phase=NOTICED, request_id=uuid.uuid4().hex[:12], event=event)
        when = f"window at {node.maintenance_at():.0f}" if node.maintenance_at() is not None else "maintenance started"
        return GkeStep(new, (REQUEST_CHECKPOINT,), None, f"maintenance notice on node {node.name} ({when})")
    drill = _drill(seen, obs, pod, drill_timeout)
    if drill is not None:
        return drill
    if seen.last_change_at is not None and obs.now - seen.last_change_at > stall_timeout:
        return GkeStep(seen, (FAIL,), None, f"no progress for {obs.now - seen.last_change_at:.0f}s (stall)")
    return GkeStep(seen, (), None, f"running: step {obs.step}, committed {obs.committed_step}")


def _ended(state: GkeStageState, obs: GkeObservation) -> GkeStep | None:
    """Done (the final step committed, and the export with it for a stage that exports), or failed by the workload's
    own word (its progress ``failed``: bad input, or an export that does not reproduce the model); None: neither."""
    if obs.committed_step >= state.target_step and (obs.export_committed or not state.awaits_export):
        if state.drill in (DRILL_PENDING, DRILL_SENT):
            return GkeStep(replace(state), (FAIL,), None, _drill_missed(state))
        return GkeStep(replace(state, event=None), (COMPLETE,), None, f"final step {obs.committed_step} committed")
    if obs.progress.get("state") == "failed" and obs.progress.get("error"):
        return GkeStep(replace(state), (FAIL,), None, f"the workload failed: {obs.progress['error']}")
    return None


def _drill(state: GkeStageState, obs: GkeObservation, pod: PodSeen | None, drill_timeout: float) -> GkeStep | None:
    """The workload holds at the drill step (or passed it: one that cannot hold gets the drill as it passes):
    send it to the pod's node; a drill whose notice does not show within ``drill_timeout`` fails the stage."""
    if state.drill == DRILL_PENDING and pod is not None and pod.node:
        step = state.drill_step or 0
        held = obs.progress.get("state") == "holding" and obs.committed_step >= step and obs.step >= step
        zone = (obs.nodes[pod.node].labels.get(ZONE_LABEL) if pod.node in obs.nodes else None) or None
        if (held or obs.step > step) and zone:
            new = replace(state, drill=DRILL_SENT, drill_sent_at=obs.now, drill_node=pod.node, drill_zone=zone)
            return GkeStep(new, (DRILL,), None, f"the workload holds at drill step {step} on node {pod.node}")
    if state.drill == DRILL_SENT and state.drill_sent_at is not None:
        waited = obs.now - state.drill_sent_at
        if waited > drill_timeout:
            return GkeStep(
                state,
                (FAIL,),
                None,
                f"the drill did not happen: simulateMaintenanceEvent was sent to node {state.drill_node} at step "
                f"{state.drill_step} but no maintenance showed on it within {waited:.0f}s",
            )
    return None


def _drill_missed(state: GkeStageState) -> str:
    if state.drill == DRILL_PENDING:
        return (
            "the drill could not run: the stage reached its final step before the workload held at drill "
            f"step {state.drill_step}"
        )
    return (
        f"the drill did not happen: simulateMaintenanceEvent was sent to node {state.drill_node} at step "
        f"{state.drill_step} but the stage finished without a maintenance"
    )


def _noticed(state: GkeStageState, obs: GkeObservation, pod: PodSeen | None) -> GkeStep:
    event = dict(state.event or {})
    if obs.ack_step is not None and event.get("checkpoint_step") is None:
        event.update(checkpoint_step=obs.ack_step, checkpoint_committed_at=obs.now)
    if pod is None or pod.uid != state.pod_uid:  # drained: GKE terminated the pod at the window
        event.update(down_at=obs.now, step_at_down=state.last_step_seen)
        return GkeStep(
            replace(state, phase=DRAINING, event=event), (), None, "the pod was drained; waiting for its successor"
        )
    return GkeStep(replace(state, event=event), (), None, f"notice: training on to the window (step {obs.step})")


def _after_drain(
    state: GkeStageState, obs: GkeObservation, pod: PodSeen | None, new_boot: bool, down_timeout: float
) -> GkeStep:
    event = dict(state.event or {})
    if event.get("down_at") is None:
        event.update(down_at=obs.now, step_at_down=state.last_step_seen)
    resumed_from = int(obs.progress.get("resumed_from") or 0)
    if new_boot and pod is not None and (obs.step > resumed_from or obs.committed_step >= state.target_step):
        return _close(replace(state, event=event), obs, pod)
    if pod is None and obs.scale_up_failure:  # the pool cannot get a node back: a stockout, move
        return GkeStep(
            replace(state, phase=DRAINING, event=event),
            (MOVE,),
            None,
            f"the node pool cannot get its node back: {obs.scale_up_failure}",
        )
    if obs.now - float(event["down_at"]) > down_timeout:
        return GkeStep(
            replace(state, event=event),
            (FAIL,),
            None,
            f"the workload did not come back within {down_timeout:.0f}s of its pod's drain",
        )
    return GkeStep(replace(state, phase=DRAINING, event=event), (), None, "waiting for the recreated pod to resume")


def observation_from(
    now: float,
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    committed_step: int,
    progress: Mapping[str, Any],
    ack_step: int | None,
    jobset: Mapping[str, Any] | None,
    pod_events: Sequence[Mapping[str, Any]] = (),
    *,
    export_committed: bool = False,
) -> GkeObservation:
    """Kubernetes objects (as dicts) and GCS facts -> an observation. ``pod_events``: core/v1 Events of the pods."""
    seen_pods = tuple(
        PodSeen(
            str(p["metadata"]["name"]),
            str(p["metadata"].get("uid") or ""),
            str((p.get("status") or {}).get("phase") or "Unknown"),
            (p.get("spec") or {}).get("nodeName") or (p.get("spec") or {}).get("node_name"),
        )
        for p in pods
        if not p["metadata"].get("deletionTimestamp") and not p["metadata"].get("deletion_timestamp")
    )
    seen_nodes = {
        str(n["metadata"]["name"]): NodeSeen(
            str(n["metadata"]["name"]),
            dict(n["metadata"].get("labels") or {}),
            any(t.get("key") == TAINT_TERMINATION for t in (n.get("spec") or {}).get("taints") or []),
        )
        for n in nodes
    }
    pending = {p.name for p in seen_pods if p.phase == "Pending"}
    failed = [
        f"{e.get('reason')}: {e.get('message')}"
        for e in pod_events
        if (e.get("involvedObject") or e.get("involved_object") or {}).get("name") in pending
        and e.get("reason") == OUT_OF_RESOURCES[0]
        and OUT_OF_RESOURCES[1] in str(e.get("message") or "")
    ]
    return GkeObservation(
        now,
        seen_pods,
        seen_nodes,
        committed_step,
        progress,
        ack_step,
        jobset_failure(jobset),
        failed[0] if failed else None,
        export_committed,
    )


def jobset_failure(jobset: Mapping[str, Any] | None) -> str | None:
    """The JobSet's Failed condition as a sentence; a missing JobSet is a failure too (someone deleted it)."""
    if jobset is None:
        return "the JobSet is gone (deleted outside the run)"
    for cond in (jobset.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return f"{cond.get('reason')}: {cond.get('message')}"
    return None
