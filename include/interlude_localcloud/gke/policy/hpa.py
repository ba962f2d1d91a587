"""The HorizontalPodAutoscaler (autoscaling/v2) algorithm for a ``Pods`` metric with an ``AverageValue``
target - the vLLM guide scales on ``vllm:num_requests_waiting`` averaging 1 per pod.

Source: https://kubernetes.io/docs/concepts/workloads/autoscaling/horizontal-pod-autoscale/ ("Algorithm
details", "Configurable scaling behavior"), checked against the controller (pkg/controller/podautoscaler):

- ``desired = ceil(current * metric / target)``; no change while ``|metric / target - 1| <= tolerance``
  (0.1, per direction since the configurable-tolerance feature).
- Pods being deleted and failed pods are ignored. Pods still pending are set aside as not ready, pods
  without a metric as missing; the ratio is computed from the rest. (The docs speak of not-ready pods in
  general; the controller applies readiness only to CPU metrics, so a running pod's Pods-metric sample
  counts even before it is Ready - as here.) Then, if scaling up, missing pods
  count as 0 and not-ready pods as 0; if scaling down, missing pods count as the target. If that reverses
  the direction or lands within tolerance, the replica count stays.
- Outside ``[minReplicas, maxReplicas]`` the count is clamped first; ``0`` current replicas with a
  non-zero minimum means autoscaling is off.
- Stabilization: the recommendation is the highest of the last ``scaleDown.stabilizationWindowSeconds``
  (default 300 s) and the lowest of the last ``scaleUp.stabilizationWindowSeconds`` (default 0); a new
  HPA's window starts with the current replica count, so it never scales down on its first look.
- Rate policies (``Pods``/``Percent`` per ``periodSeconds``) limit the change against the replica count
  at the start of each period; ``selectPolicy`` Max (default), Min or Disabled. Defaults: scale up by
  max(100%, 4 pods) per 15 s, scale down by 100% per 15 s.

Pure: recommendations and scale events from earlier passes come in and go out as :class:`HpaState`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]
SelectPolicy = Literal["Max", "Min", "Disabled"]
DEFAULT_TOLERANCE = 0.1


@dataclass(frozen=True)
class ScalingPolicy:
    type: Literal["Pods", "Percent"]
    value: int
    period_seconds: int


@dataclass(frozen=True)
class ScalingRules:
    stabilization_window_seconds: int
    policies: tuple[ScalingPolicy, ...]
    select_policy: SelectPolicy = "Max"
    tolerance: float = DEFAULT_TOLERANCE


DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15)))
DEFAULT_SCALE_DOWN = ScalingRules(300, (ScalingPolicy("Percent", 100, 15),))


@dataclass(frozen=True)
class HpaSpec:
    min_replicas: int
    max_replicas: int
    target_average_value: float
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError("need 0 <= minReplicas <= maxReplicas and maxReplicas >= 1")
        if self.target_average_value <= 0:
            raise ValueError("the target average value must be > 0")


@dataclass(frozen=True)
class PodSample:
    """One pod of the scale target and its latest metric value (None: no sample)."""

    name: str
    value: float | None
    phase: PodPhase = "Running"
    deleting: bool = False


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int


@dataclass(frozen=True)
class ScaleEvent:
    at: float
    change: int  # positive: added replicas, negative: removed


@dataclass(frozen=True)
class HpaState:
    recommendations: tuple[Recommendation, ...] = ()
    events: tuple[ScaleEvent, ...] = ()


@dataclass(frozen=True)
class HpaDecision:
    desired: int
    reason: str
    metric_average: float | None  # what `kubectl get hpa` shows as the current value
    state: HpaState = field(default_factory=HpaState)


def _milli(value: float) -> int:
    return round(value * 1000)


def _usage_ratio(values: Sequence[float], target: float) -> float:
    """Kubernetes works in integer milli-units: average = total // count, ratio = average / target."""
    total = sum(_milli(v) for v in values)
    return (total // len(values)) / _milli(target)


def metric_replicas(
    current: int, pods: Sequence[PodSample], target: float, up_tol: float, down_tol: float
) -> tuple[int, float | None, str]:
    """The metric's proposal (before stabilization and rate limits), the observed average, and why."""
    live = [p for p in pods if not p.deleting and p.phase != "Failed"]
    unready = [p for p in live if p.phase == "Pending"]
    missing = [p for p in live if p.phase != "Pending" and p.value is None]
    measured = [float(p.value) for p in live if p.phase != "Pending" and p.value is not None]
    if not measured:
        return current, None, "no metrics for any ready pod: keeping the replica count"
    average = sum(measured) / len(measured)
    ratio = _usage_ratio(measured, target)

    def within(r: float) -> bool:
        return (1.0 - down_tol) <= r <= (1.0 + up_tol)

    if not missing and not (unready and ratio > 1.0):
        if within(ratio):
            return current, average, f"ratio {ratio:.3f} within tolerance"
        return math.ceil(ratio * len(measured)), average, f"ratio {ratio:.3f} over {len(measured)} pod(s)"
    values = measured + [target if ratio < 1.0 else 0.0] * len(missing)
    if ratio > 1.0:
        values += [0.0] * len(unready)
    new_ratio = _usage_ratio(values, target)
    if within(new_ratio) or (ratio > 1.0 > new_ratio) or (ratio < 1.0 < new_ratio):
        return current, average, f"ratio {new_ratio:.3f} after counting missing/not-ready pods: no change"
    proposal = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and proposal > current) or (new_ratio > 1.0 and proposal < current):
        return current, average, "the proposal would move against the metric: no change"
    return proposal, average, f"ratio {new_ratio:.3f} over {len(values)} pod(s) incl. missing/not-ready"


def _changed_within(events: Sequence[ScaleEvent], now: float, period: int, sign: int) -> int:
    return sum(abs(e.change) for e in events if e.at > now - period and (e.change > 0) == (sign > 0) and e.change)


def _period_start(current: int, events: Sequence[ScaleEvent], now: float, period: int) -> int:
    return current - _changed_within(events, now, period, 1) + _changed_within(events, now, period, -1)


def _up_limit(current: int, events: Sequence[ScaleEvent], now: float, rules: ScalingRules) -> int:
    if rules.select_policy == "Disabled" or not rules.policies:
        return current
    proposals = []
    for policy in rules.policies:
        start = _period_start(current, events, now, policy.period_seconds)
        if policy.type == "Pods":
            proposals.append(start + policy.value)
        else:
            proposals.append(math.ceil(start * (1 + policy.value / 100)))
    return max(proposals) if rules.select_policy == "Max" else min(proposals)


def _down_limit(current: int, events: Sequence[ScaleEvent], now: float, rules: ScalingRules) -> int:
    if rules.select_policy == "Disabled" or not rules.policies:
        return current
    proposals = []
    for policy in rules.policies:
        start = _period_start(current, events, now, policy.period_seconds)
        if policy.type == "Pods":
            proposals.append(start - policy.value)
        else:
            proposals.append(int(start * (1 - policy.value / 100)))
    return min(proposals) if rules.select_policy == "Max" else max(proposals)


def _stabilize(spec: HpaSpec, current: int, proposal: int, state: HpaState, now: float) -> int:
    up_cutoff = now - spec.scale_up.stabilization_window_seconds
    down_cutoff = now - spec.scale_down.stabilization_window_seconds
    up = min([proposal] + [r.replicas for r in state.recommendations if r.at > up_cutoff])
    down = max([proposal] + [r.replicas for r in state.recommendations if r.at > down_cutoff])
    return min(max(current, up), down)


def _rate_limit(spec: HpaSpec, current: int, desired: int, state: HpaState, now: float) -> tuple[int, str]:
    if desired > current:
        limit = max(_up_limit(current, state.events, now, spec.scale_up), current)
        if desired > min(limit, spec.max_replicas):
            why = "ScaleUpLimit" if limit < spec.max_replicas else "TooManyReplicas"
            return min(limit, spec.max_replicas), why
    elif desired < current:
        limit = min(_down_limit(current, state.events, now, spec.scale_down), current)
        if desired < max(limit, spec.min_replicas):
            why = "ScaleDownLimit" if limit > spec.min_replicas else "TooFewReplicas"
            return max(limit, spec.min_replicas), why
    return desired, "DesiredWithinRange"


def _remember(state: HpaState, spec: HpaSpec, now: float, proposal: int, current: int, desired: int) -> HpaState:
    keep_for = max(spec.scale_up.stabilization_window_seconds, spec.scale_down.stabilization_window_seconds)
    recs = tuple(r for r in state.recommendations if r.at > now - keep_for) + (Recommendation(now, proposal),)
    longest = max((p.period_seconds for p in spec.scale_up.policies + spec.scale_down.policies), default=0)
    events = tuple(e for e in state.events if e.at > now - longest)
    if desired != current:
        events += (ScaleEvent(now, desired - current),)
    return HpaState(recs, events)


def reconcile(spec: HpaSpec, current: int, pods: Sequence[PodSample], state: HpaState, now: float) -> HpaDecision:
    """One HPA sync: the replica count to set now, why, and the state for the next sync."""
    if current == 0 and spec.min_replicas != 0:
        return HpaDecision(0, "ScalingDisabled: the target has 0 replicas", None, state)
    if current > spec.max_replicas:
        return HpaDecision(spec.max_replicas, "current replicas above maxReplicas", None, state)
    if current < spec.min_replicas:
        return HpaDecision(spec.min_replicas, "current replicas below minReplicas", None, state)
    proposal, average, why = metric_replicas(
        current, pods, spec.target_average_value, spec.scale_up.tolerance, spec.scale_down.tolerance
    )
    if not state.recommendations:  # a fresh controller starts its scale-down window at the current count
        state = HpaState((Recommendation(now, current),), state.events)
    stabilized = _stabilize(spec, current, proposal, state, now)
    desired, limit = _rate_limit(spec, current, stabilized, state, now)
    reason = f"metric proposes {proposal} ({why}); stabilized {stabilized}; {limit} -> {desired}"
    return HpaDecision(desired, reason, average, _remember(state, spec, now, proposal, current, desired))
