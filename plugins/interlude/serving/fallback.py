"""The stockout fallback as the rollout trigger runs it: Kubernetes JSON -> `policy.fallback_decision`.

Pure (no network, no Airflow). Kubernetes stamps pods' conditions and events with the wall clock; the spec's
`fallback_after_seconds`/`tpu_retry_seconds` are cluster seconds. On Google the two clocks are one
(`time_scale` 1); the local cloud runs `time_scale` times faster, so ages are stretched by it around
`order_since` (with Kubernetes' one-second stamps, a fallback there fires at most one real second late).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from interlude.serving.observe import accelerator_of, event_obs, pod_obs
from interlude.serving.policy import FallbackPlan, ServingObservation, fallback_decision
from interlude.serving.spec import ServeSpec


@dataclass(frozen=True)
class FallbackState:
    """What the rollout carries between deferrals: the class order applied, since when, and the decisions."""

    order: str = "tpu_first"
    order_since: float = 0.0  # wall clock
    time_scale: float = 1.0
    records: tuple[dict[str, Any], ...] = ()  # {"at": wall, "action", "order", "reason", "stuck_pods"}

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "order_since": self.order_since,
            "time_scale": self.time_scale,
            "records": [dict(r) for r in self.records],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FallbackState:
        return cls(
            str(raw["order"]),
            float(raw["order_since"]),
            float(raw.get("time_scale") or 1.0),
            tuple(dict(r) for r in raw.get("records") or ()),
        )

    def after(self, plan: FallbackPlan, at: float) -> FallbackState:
        """The state once `plan`'s class order is applied at `at` (wall clock)."""
        record = {
            "at": at,
            "action": plan.action,
            "order": plan.order,
            "reason": plan.reason,
            "stuck_pods": list(plan.stuck_pods),
        }
        return replace(self, order=plan.order, order_since=at, records=(*self.records, record))


def _stretch(t: float, origin: float, scale: float) -> float:
    """A wall-clock time on the cluster's clock (which runs `scale` times faster since `origin`)."""
    return origin + (t - origin) * scale


def observation(
    pods: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    state: FallbackState,
    now: float,
) -> tuple[ServingObservation, float]:
    """The policy's observation and `now`, both on the cluster's clock (see the module doc)."""
    origin, scale = state.order_since, state.time_scale
    accelerators = {n["metadata"]["name"]: accelerator_of((n.get("metadata") or {}).get("labels") or {}) for n in nodes}
    observed = tuple(
        replace(
            p,
            unschedulable_since=None
            if p.unschedulable_since is None
            else _stretch(p.unschedulable_since, origin, scale),
        )
        for p in (pod_obs(raw, accelerators) for raw in pods)
    )
    seen = tuple(replace(e, at=_stretch(e.at, origin, scale)) for e in map(event_obs, events))
    obs = ServingObservation(observed, seen, state.order, origin)
    return obs, _stretch(now, origin, scale)


def decide(
    pods: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    state: FallbackState,
    now: float,
    spec: ServeSpec,
) -> FallbackPlan:
    obs, cluster_now = observation(pods, events, nodes, state, now)
    return fallback_decision(obs, cluster_now, spec)
