"""Serving decisions as pure functions over typed observations: stockout fallback and maintenance.

**Stockout fallback.** GKE's ComputeClass falls back from TPU to GPU only after the TPU scale-up has
failed long enough - up to ~10 hours after a GCE_STOCKOUT in the public TPU/GPU recipe. Interlude
watches for replicas Pending because the TPU scale-up fails for lack of capacity and, after
`fallback_after_seconds`, re-applies the ComputeClass GPU-first with active migration off: the cluster
autoscaler then scales GPU for the pending replicas within minutes, while running TPU replicas stay where
they are (no Deployment change, so no rollout). After `tpu_retry_seconds` without new stockout evidence,
or as soon as a capacity probe says TPU capacity is back, it re-applies TPU-first with
``activeMigration.optimizeRulePriority: true`` and GKE moves replicas back to TPU as TPU nodes come up
(https://cloud.google.com/kubernetes-engine/docs/concepts/about-custom-compute-classes#active-migration).

Stockout evidence is the cluster autoscaler's pod events (`FailedScaleUp`, `NotTriggerScaleUp`) whose
message names a capacity error (https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-autoscaler-visibility#scaleup-errors).
A pod merely Pending (slow provisioning, image pull) is not a stockout and does not move anything.

**Maintenance.** GKE labels a node with pending host maintenance
``cloud.google.com/scheduled-maintenance-time`` (epoch seconds) and starts maintenance then, or earlier
when the node is labelled ``cloud.google.com/perform-maintenance=true``
(https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu). Rather than lose a
replica at GKE's moment, Interlude cordons the node, surges replacements elsewhere, waits until they are
Ready, then - at a quiet moment, or at the latest `maintenance_margin_seconds` before the window - drains
the node and triggers the maintenance, and finally removes the surge. The label is Unix epoch seconds of the
wall clock, compared with the caller's `now` (epoch seconds); the margin is Google-real seconds, divided by
`time_scale` for a cloud whose clock runs faster (the local cloud's; 1 on Google).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from interlude.serving.spec import ServeSpec

STOCKOUT_REASONS = ("FailedScaleUp", "NotTriggerScaleUp")
STOCKOUT_MARKERS = (
    "GCE_STOCKOUT",
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "out of resources",
    "stockout",
    "resource pool exhausted",
    "in backoff after failed scale-up",
)
LABEL_SCHEDULED = "cloud.google.com/scheduled-maintenance-time"
LABEL_PERFORM = "cloud.google.com/perform-maintenance"
LABEL_ACTIVE = "cloud.google.com/active-node-maintenance"
#: On a node Interlude cordoned for its maintenance (so it uncordons only those), and on the HPA: the
#: replicas surged per node (JSON), so a restarted watcher knows what to undo.
CORDON_ANNOTATION = "interlude_dev.wiring/cordoned-for-maintenance"
SURGE_ANNOTATION = "interlude_dev.wiring/maintenance-surge"


# ---------------------------------------------------------------------- observations
@dataclass(frozen=True)
class PodObs:
    """One serving pod as the rollout/fallback triggers see it (times are epoch seconds)."""

    name: str
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ready: bool = False
    node: str | None = None
    accelerator: str | None = None  # "tpu" | "gpu" | None (not on a node yet)
    created_at: float = 0.0
    unschedulable_since: float | None = None  # PodScheduled=False, reason Unschedulable: lastTransitionTime
    ready_at: float | None = None


@dataclass(frozen=True)
class EventObs:
    reason: str
    message: str
    involved: str  # the pod (or node pool) the event is about
    at: float


@dataclass(frozen=True)
class NodeObs:
    name: str
    accelerator: str | None = None  # "tpu" | "gpu" | None
    ready: bool = True
    cordoned: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    cordoned_by_interlude: bool = False  # Interlude's maintenance step cordoned it (uncordoned when it is over)

    def maintenance_at(self) -> float | None:
        value = self.labels.get(LABEL_SCHEDULED)
        try:
            return None if value is None else float(value)
        except ValueError:
            return None


@dataclass(frozen=True)
class ServingObservation:
    pods: tuple[PodObs, ...]
    events: tuple[EventObs, ...] = ()
    order: str = "tpu_first"  # the ComputeClass order now applied
    order_since: float = 0.0  # when that order was applied
    tpu_capacity_available: bool | None = None  # a capacity probe's answer; None = not probed


# ---------------------------------------------------------------------- stockout fallback
@dataclass(frozen=True)
class FallbackPlan:
    action: str  # "none" | "fall_back_to_gpu" | "return_to_tpu"
    order: str  # the ComputeClass order to apply (render.compute_class(spec, order))
    reason: str
    stuck_pods: tuple[str, ...] = ()


def is_stockout(event: EventObs) -> bool:
    text = event.message.lower()
    return event.reason in STOCKOUT_REASONS and any(m.lower() in text for m in STOCKOUT_MARKERS)


def _stuck(obs: ServingObservation, now: float) -> list[tuple[PodObs, float]]:
    """Pending, unschedulable pods with stockout evidence, and for how long they have been unschedulable."""
    stockout_pods = {e.involved for e in obs.events if is_stockout(e)}
    out = []
    for pod in obs.pods:
        if pod.phase == "Pending" and pod.node is None and pod.unschedulable_since is not None:
            if pod.name in stockout_pods:
                out.append((pod, now - pod.unschedulable_since))
    return out


def _tpu_first_decision(obs: ServingObservation, now: float, spec: ServeSpec) -> FallbackPlan:
    stuck = _stuck(obs, now)
    pending = [p.name for p in obs.pods if p.phase == "Pending" and p.node is None]
    if not stuck:
        why = (
            f"{len(pending)} pod(s) pending without stockout evidence (provisioning, not capacity)"
            if pending
            else "no pod is waiting for capacity"
        )
        return FallbackPlan("none", "tpu_first", why)
    longest = max(age for _, age in stuck)
    names = tuple(sorted(p.name for p, _ in stuck))
    if longest < spec.fallback_after_seconds:
        return FallbackPlan(
            "none",
            "tpu_first",
            f"{len(stuck)} pod(s) pending on a TPU stockout for {longest:.0f} s; "
            f"falling back to GPU at {spec.fallback_after_seconds:.0f} s",
            names,
        )
    return FallbackPlan(
        "fall_back_to_gpu",
        "gpu_first",
        f"{len(stuck)} pod(s) pending on a TPU stockout for {longest:.0f} s "
        f"(>= {spec.fallback_after_seconds:.0f} s): new replicas go to {spec.gpu_type}; "
        "running TPU replicas stay",
        names,
    )


def _gpu_first_decision(obs: ServingObservation, now: float, spec: ServeSpec) -> FallbackPlan:
    if obs.tpu_capacity_available is True:
        return FallbackPlan(
            "return_to_tpu",
            "tpu_first",
            "the capacity probe reports TPU capacity again: TPU-first with active migration moves replicas back to TPU",
        )
    recent = [e for e in obs.events if is_stockout(e) and now - e.at < spec.tpu_retry_seconds]
    since = now - obs.order_since
    if obs.tpu_capacity_available is False:
        return FallbackPlan("none", "gpu_first", "the capacity probe reports no TPU capacity: staying GPU-first")
    if since < spec.tpu_retry_seconds:
        return FallbackPlan(
            "none", "gpu_first", f"GPU-first for {since:.0f} s; retrying TPU at {spec.tpu_retry_seconds:.0f} s"
        )
    if recent:
        return FallbackPlan(
            "none",
            "gpu_first",
            f"{len(recent)} stockout event(s) in the last {spec.tpu_retry_seconds:.0f} s: staying GPU-first",
        )
    return FallbackPlan(
        "return_to_tpu",
        "tpu_first",
        f"GPU-first for {since:.0f} s with no stockout since: trying "
        "TPU-first again (active migration moves replicas back when TPU nodes come up)",
    )


def fallback_decision(obs: ServingObservation, now: float, spec: ServeSpec) -> FallbackPlan:
    """What the ComputeClass order should be now, and why."""
    if obs.order == "gpu_first":
        return _gpu_first_decision(obs, now, spec)
    return _tpu_first_decision(obs, now, spec)


# ---------------------------------------------------------------------- maintenance
@dataclass(frozen=True)
class Step:
    kind: str  # cordon | surge | wait | drain | perform_maintenance | restore | uncordon | none
    node: str
    reason: str
    count: int = 0  # surge/restore: replicas added/removed


def _ours_on(node: str, pods: Sequence[PodObs]) -> list[PodObs]:
    return [p for p in pods if p.node == node and p.phase in ("Pending", "Running")]


def _ready_elsewhere(node: str, pods: Sequence[PodObs]) -> int:
    return sum(1 for p in pods if p.ready and p.node is not None and p.node != node)


@dataclass(frozen=True)
class MaintenanceContext:
    now: float
    waiting: float  # average vllm:num_requests_waiting per pod
    desired: int  # the Deployment's replicas, surges included
    surged: int  # replicas already added for this node
    time_scale: float = 1.0  # the cloud's clock vs Google's: the margin is Google-real seconds

    def margin(self, spec: ServeSpec) -> float:
        """The spec's drain margin in this clock's real seconds."""
        return spec.maintenance_margin_seconds / self.time_scale


def _evacuate(
    node: NodeObs, mine: list[PodObs], pods: Sequence[PodObs], at: float, ctx: MaintenanceContext, spec: ServeSpec
) -> list[Step]:
    needed = ctx.desired - len(mine)
    ready = _ready_elsewhere(node.name, pods)
    late = ctx.now >= at - ctx.margin(spec)
    quiet = ctx.waiting <= spec.quiet_waiting_requests
    if ready < needed and not late:
        return [Step("wait", node.name, f"{ready}/{needed} replicas Ready off {node.name}; waiting before draining")]
    if not quiet and not late:
        return [
            Step(
                "wait",
                node.name,
                f"{ctx.waiting:.1f} waiting requests per pod > {spec.quiet_waiting_requests}: "
                "waiting for a quiet moment",
            )
        ]
    if ready < needed:
        why = f"only {ready}/{needed} replicas Ready elsewhere, but the window is {at - ctx.now:.0f} s away"
    else:
        why = "quiet" if quiet else f"not quiet, but the window is {at - ctx.now:.0f} s away"
    drain = Step("drain", node.name, f"replacements Ready; {why}: evict {len(mine)} replica(s)", len(mine))
    if not spec.maintenance_perform_early:
        return [drain]
    return [drain, Step("perform_maintenance", node.name, "start the maintenance now, while serving elsewhere")]


def _node_steps(node: NodeObs, pods: Sequence[PodObs], ctx: MaintenanceContext, spec: ServeSpec) -> list[Step]:
    at = node.maintenance_at()
    assert at is not None
    mine = _ours_on(node.name, pods)
    if node.labels.get(LABEL_ACTIVE) == "true":
        return [Step("none", node.name, "maintenance already started on this node; GKE terminates its pods")]
    if not mine:
        steps = (
            [Step("restore", node.name, f"no replica left on {node.name}: remove the surge", ctx.surged)]
            if ctx.surged
            else []
        )
        if node.labels.get(LABEL_PERFORM) != "true" and spec.maintenance_perform_early:
            steps.append(Step("perform_maintenance", node.name, "no replica on the node: start its maintenance now"))
        if not steps and node.cordoned_by_interlude:
            steps.append(Step("wait", node.name, "no replica on the node; uncordon it once its maintenance is over"))
        return steps
    if not node.cordoned or ctx.surged == 0:
        cordon = (
            []
            if node.cordoned
            else [
                Step("cordon", node.name, f"maintenance at {_utc(at)} (in {at - ctx.now:.0f} s): no new replica here")
            ]
        )
        return cordon + [Step("surge", node.name, f"{len(mine)} replacement(s) elsewhere before draining", len(mine))]
    return _evacuate(node, mine, pods, at, ctx, spec)


def maintenance_plan(
    nodes: Sequence[NodeObs],
    pods: Sequence[PodObs],
    now: float,
    spec: ServeSpec,
    *,
    desired_replicas: int,
    waiting_requests: float = 0.0,
    surged: Mapping[str, int] | None = None,
    time_scale: float = 1.0,
) -> list[Step]:
    """The steps to take now for every node with scheduled maintenance (earliest window first).

    `desired_replicas` is the Deployment's replica count including surges already applied; a node is
    drained once `desired_replicas - (replicas on it)` replicas are Ready elsewhere. `waiting_requests` is
    the average vllm:num_requests_waiting per pod; `surged` maps node -> replicas already added for it (the
    caller keeps it, e.g. in the trigger's state). `now` and the nodes' labels are epoch seconds; `time_scale`
    maps the spec's Google-real margin to the cloud's clock (must be > 0). Steps are idempotent: the same inputs
    give the same steps.
    """
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, not {time_scale}")
    surged = surged or {}
    steps: list[Step] = []
    scheduled = sorted((n for n in nodes if n.maintenance_at() is not None), key=lambda n: (n.maintenance_at(), n.name))
    for node in scheduled:
        ctx = MaintenanceContext(now, waiting_requests, desired_replicas, surged.get(node.name, 0), time_scale)
        steps += _node_steps(node, pods, ctx, spec)
    for node in sorted(nodes, key=lambda n: n.name):
        if node.maintenance_at() is None and node.labels.get(LABEL_ACTIVE) != "true":
            steps += _after_steps(node, surged.get(node.name, 0))
    present = {n.name for n in nodes}
    for name, count in sorted(surged.items()):
        if count and name not in present:
            steps.append(Step("restore", name, f"{name} is gone (its VM was replaced): remove the surge", count))
    return steps


def _after_steps(node: NodeObs, surged: int) -> list[Step]:
    """A node whose maintenance is over (no schedule label, not active): back to the normal shape."""
    steps = []
    if surged:
        steps.append(Step("restore", node.name, f"maintenance of {node.name} is over: remove the surge", surged))
    if node.cordoned_by_interlude and not node.cordoned:
        steps.append(Step("uncordon", node.name, f"{node.name} is schedulable again: drop Interlude's cordon mark"))
    elif node.cordoned_by_interlude:
        if node.ready:
            steps.append(Step("uncordon", node.name, f"maintenance of {node.name} is over and it is Ready: uncordon"))
        else:
            steps.append(Step("wait", node.name, f"maintenance of {node.name} is over; waiting for it to be Ready"))
    return steps


def in_flight(steps: Sequence[Step]) -> bool:
    """Whether a maintenance is still being handled (a watch may end only when nothing is)."""
    return bool(steps)


def _utc(epoch: float) -> str:
    """The maintenance label's epoch seconds as a UTC time a person reads (``2026-12-06 09:33:28Z``)."""
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
