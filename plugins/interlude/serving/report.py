"""ServingReport: what serving looked like - pods per accelerator over time, time to first Ready,
fallbacks, requests and latency per accelerator - built from observations and rendered to text.

Why per accelerator: replicas on TPU and on GPU behave differently (the public recipe's caveat: TTFT and
TPOT differ within one Deployment), so one latency figure would hide exactly what an operator needs to
see after a fallback.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from interlude.serving.policy import FallbackPlan, PodObs

ACCELERATORS = ("tpu", "gpu")


@dataclass(frozen=True)
class PodCountSample:
    at: float
    counts: tuple[tuple[str, int], ...]  # (accelerator or "pending", ready-or-running pods), sorted


@dataclass(frozen=True)
class RequestSample:
    accelerator: str  # which kind of replica answered
    latency_seconds: float
    ok: bool = True


@dataclass(frozen=True)
class FallbackRecord:
    at: float
    plan: FallbackPlan


@dataclass(frozen=True)
class AcceleratorStats:
    requests: int
    errors: int
    p50_seconds: float | None
    p99_seconds: float | None


@dataclass(frozen=True)
class ServingReport:
    started_at: float
    samples: tuple[PodCountSample, ...]
    first_ready_seconds: float | None  # from start to the first Ready replica
    fallbacks: tuple[FallbackRecord, ...]
    per_accelerator: tuple[tuple[str, AcceleratorStats], ...]
    notes: tuple[str, ...] = field(default=())

    def stats(self, accelerator: str) -> AcceleratorStats:
        return dict(self.per_accelerator)[accelerator]

    def render_text(self) -> str:
        lines = ["Serving report"]
        first = "never" if self.first_ready_seconds is None else f"{self.first_ready_seconds:.1f} s"
        lines.append(f"  time to first Ready replica: {first}")
        lines.append("  pods over time (s since start: accelerator=count):")
        for sample in self.samples:
            counts = ", ".join(f"{k}={v}" for k, v in sample.counts) or "none"
            lines.append(f"    +{sample.at - self.started_at:7.1f}  {counts}")
        lines.append(f"  fallbacks: {len(self.fallbacks)}")
        for record in self.fallbacks:
            lines.append(
                f"    +{record.at - self.started_at:7.1f}  {record.plan.action} -> {record.plan.order}: "
                f"{record.plan.reason}"
            )
        lines.append("  requests per accelerator:")
        for name, stats in self.per_accelerator:
            p50 = "-" if stats.p50_seconds is None else f"{stats.p50_seconds * 1000:.0f} ms"
            p99 = "-" if stats.p99_seconds is None else f"{stats.p99_seconds * 1000:.0f} ms"
            lines.append(f"    {name}: {stats.requests} requests, {stats.errors} errors, p50 {p50}, p99 {p99}")
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
    """Running pods by accelerator, plus those still pending, at one moment."""
    counts: dict[str, int] = {}
    for pod in pods:
        if pod.phase == "Running" and pod.accelerator:
            counts[pod.accelerator] = counts.get(pod.accelerator, 0) + 1
        elif pod.phase == "Pending":
            counts["pending"] = counts.get("pending", 0) + 1
    return PodCountSample(at, tuple(sorted(counts.items())))


def _stats(samples: Sequence[RequestSample]) -> AcceleratorStats:
    good = [s.latency_seconds for s in samples if s.ok]
    return AcceleratorStats(
        len(samples), sum(1 for s in samples if not s.ok), percentile(good, 50), percentile(good, 99)
    )


def build_report(
    started_at: float,
    samples: Sequence[PodCountSample],
    pods: Sequence[PodObs],
    fallbacks: Sequence[FallbackRecord],
    requests: Sequence[RequestSample],
) -> ServingReport:
    """The report from what the rollout and smoke/load steps observed (all times epoch seconds)."""
    ready = [p.ready_at for p in pods if p.ready_at is not None]
    first = None if not ready else min(ready) - started_at
    kinds = sorted(set(ACCELERATORS) | {r.accelerator for r in requests})
    per = tuple((k, _stats([r for r in requests if r.accelerator == k])) for k in kinds)
    notes = []
    if len([name for name, stats in per if stats.requests]) > 1:
        notes.append("replicas on different accelerators answered: compare their latency before reading totals")
    return ServingReport(
        started_at,
        tuple(sorted(samples, key=lambda s: s.at)),
        first,
        tuple(sorted(fallbacks, key=lambda f: f.at)),
        per,
        tuple(notes),
    )
