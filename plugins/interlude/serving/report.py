"""ServingReport: what serving looked like - pods per accelerator over time (every change the Kubernetes
watch delivered), time to first Ready, fallbacks, requests answered per accelerator (the pods' own access
logs) - rendered to text, saying what it could not count.

Why per accelerator: replicas on TPU and on GPU behave differently (the public recipe's caveat: TTFT and
TPOT differ within one Deployment), so one figure would hide exactly what an operator needs to see after a
fallback. Latency stays one figure (the load test's): a response does not name the replica that answered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from interlude.serving.policy import FallbackPlan, PodObs

ACCELERATORS = ("tpu", "gpu")


@dataclass(frozen=True)
class PodCountSample:
    at: float
    counts: tuple[tuple[str, int], ...]  # (accelerator, "unknown" or "pending", running pods), sorted
    rv: int = 0  # the resourceVersion of the change that led to these counts (0: not from a watch)


@dataclass(frozen=True)
class FallbackRecord:
    at: float
    plan: FallbackPlan


@dataclass(frozen=True)
class AcceleratorRequests:
    answered: int  # access-log lines with a 2xx status
    failed: int  # access-log lines with any other status


@dataclass(frozen=True)
class ServingReport:
    started_at: float
    samples: tuple[PodCountSample, ...]
    first_ready_seconds: float | None  # from start to the first Ready replica
    fallbacks: tuple[FallbackRecord, ...]
    per_accelerator: tuple[tuple[str, AcceleratorRequests], ...]
    notes: tuple[str, ...] = field(default=())

    def stats(self, accelerator: str) -> AcceleratorRequests:
        return dict(self.per_accelerator)[accelerator]

    def render_text(self) -> str:
        lines = ["Serving report"]
        first = "never" if self.first_ready_seconds is None else f"{self.first_ready_seconds:.1f} s"
        lines.append(f"  time to first Ready replica: {first}")
        lines.append("  pods over time (s since start: running pods per accelerator, after each change):")
        for sample in self.samples:
            counts = ", ".join(f"{k}={v}" for k, v in sample.counts) or "none"
            lines.append(f"    +{sample.at - self.started_at:7.1f}  {counts}")
        lines.append(f"  fallbacks: {len(self.fallbacks)}")
        for record in self.fallbacks:
            lines.append(
                f"    +{record.at - self.started_at:7.1f}  {record.plan.action} -> {record.plan.order}: "
                f"{record.plan.reason}"
            )
        lines.append("  requests answered per accelerator (the pods' access logs, smoke and load included):")
        for name, stats in self.per_accelerator:
            lines.append(f"    {name}: {stats.answered} answered 2xx, {stats.failed} answered otherwise")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def count_pods(pods: Sequence[PodObs], at: float) -> PodCountSample:
    """Running pods by accelerator ("unknown" when the node's is not known), plus those pending, at one moment."""
    counts: dict[str, int] = {}
    for pod in pods:
        key = (pod.accelerator or "unknown") if pod.phase == "Running" else "pending" if pod.phase == "Pending" else ""
        if key:
            counts[key] = counts.get(key, 0) + 1
    return PodCountSample(at, tuple(sorted(counts.items())))


def build_report(
    started_at: float,
    samples: Sequence[PodCountSample],
    pods: Sequence[PodObs],
    fallbacks: Sequence[FallbackRecord],
    requests: Mapping[str, tuple[int, int]],
    notes: Sequence[str] = (),
) -> ServingReport:
    """The report from what the watch, the pods' logs and the rollout recorded (all times epoch seconds).

    `requests`: accelerator -> (answered 2xx, answered otherwise); `notes`: what was not counted, and why."""
    ready = [p.ready_at for p in pods if p.ready_at is not None]
    first = None if not ready else min(ready) - started_at
    kinds = sorted(set(ACCELERATORS) | set(requests))
    per = tuple((k, AcceleratorRequests(*requests.get(k, (0, 0)))) for k in kinds)
    notes = list(notes)
    if len([name for name, stats in per if stats.answered]) > 1:
        notes.append(
            "replicas on different accelerators answered: their latency differs, the load test's p50/p99 mixes them"
        )
    return ServingReport(
        started_at,
        tuple(sorted(samples, key=lambda s: s.at)),
        first,
        tuple(sorted(fallbacks, key=lambda f: f.at)),
        per,
        tuple(notes),
    )
