"""A bounded load generator for serving drills, and the facts that judge it.

Why bounded twice: a drill must end even when the service stops answering, so the generator stops at
`count` requests or at `deadline` (epoch seconds), whichever comes first, with at most `concurrency` in
flight. It sends what `send` sends (the caller decides the route: the API server's Service proxy in the
serving DAG, so the traffic stays on the cluster's own path) and keeps each request's outcome and latency.

Which accelerator answered is not in a vLLM response; it is in the answering pod's log: vLLM's API server
prints uvicorn's access log line (`"POST /v1/completions HTTP/1.1" 200 OK`) for every request unless
`--disable-uvicorn-access-log` (https://docs.vllm.ai/en/latest/cli/serve.html). `served_completions` counts
those lines, so requests per accelerator come from the servers, not from the generator's own account
(`interlude.serving.observed`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from interlude.serving.report import percentile

#: A prompt of the drill: fixed (never from a param), short.
LOAD_PROMPT = "Interlude load drill:"
LOAD_MAX_TOKENS = 4
REQUEST_TIMEOUT_SECONDS = 60.0  # one completion of LOAD_MAX_TOKENS tokens; longer is a failure
_ACCESS = re.compile(r'"POST /v1/completions HTTP/1\.[01]" (\d{3})')


@dataclass(frozen=True)
class Sample:
    started_at: float  # epoch seconds
    latency_seconds: float
    ok: bool
    detail: str = ""  # why it failed ("" when ok)


@dataclass(frozen=True)
class LoadResult:
    samples: tuple[Sample, ...]
    planned: int  # requests the generator was asked to send

    @property
    def sent(self) -> int:
        return len(self.samples)

    @property
    def failed(self) -> int:
        return sum(1 for s in self.samples if not s.ok)

    def latency(self, q: float) -> float | None:
        return percentile([s.latency_seconds for s in self.samples if s.ok], q)

    def to_dict(self) -> dict[str, object]:
        return {
            "planned": self.planned,
            "sent": self.sent,
            "failed": self.failed,
            "p50_seconds": self.latency(50),
            "p99_seconds": self.latency(99),
            "failures": [f"at {s.started_at:.3f}: {s.detail}" for s in self.samples if not s.ok][:20],
        }


@dataclass
class _Budget:
    count: int
    deadline: float
    request_timeout: float
    issued: int = 0
    samples: list[Sample] = field(default_factory=list)

    def take(self) -> bool:
        if self.issued >= self.count or time.time() >= self.deadline:
            return False
        self.issued += 1
        return True


async def _worker(send: Callable[[], Awaitable[None]], budget: _Budget) -> None:
    while budget.take():
        started, t0 = time.time(), time.monotonic()
        try:
            await asyncio.wait_for(send(), timeout=budget.request_timeout)
        except Exception as exc:  # noqa: BLE001 - every failure is a sample, the drill judges them
            budget.samples.append(Sample(started, time.monotonic() - t0, False, f"{type(exc).__name__}: {exc}"[:300]))
        else:
            budget.samples.append(Sample(started, time.monotonic() - t0, True))


async def run_load(
    send: Callable[[], Awaitable[None]],
    *,
    count: int,
    concurrency: int,
    deadline: float,
    request_timeout: float = REQUEST_TIMEOUT_SECONDS,
) -> LoadResult:
    """Send up to `count` requests, `concurrency` at a time, none started after `deadline`; each may take up to
    `request_timeout` (so the load ends by deadline + request_timeout); `send` raises on a failure."""
    budget = _Budget(count, deadline, request_timeout)
    await asyncio.gather(*(_worker(send, budget) for _ in range(max(1, min(concurrency, count)))))
    return LoadResult(tuple(sorted(budget.samples, key=lambda s: s.started_at)), count)


def served_completions(log_text: str) -> tuple[int, int]:
    """(answered 2xx, answered otherwise) /v1/completions requests in one vLLM container's log."""
    codes = [int(m.group(1)) for m in _ACCESS.finditer(log_text)]
    ok = sum(1 for c in codes if 200 <= c < 300)
    return ok, len(codes) - ok


def summary_lines(load: Mapping[str, object]) -> Sequence[str]:
    """The report's load-test line: sent, failed, p50/p99 (over every replica: a response does not name its
    replica; requests per accelerator are the report's own, from the pods' access logs)."""

    def ms(value: object) -> str:
        return "-" if value is None else f"{float(str(value)) * 1000:.0f} ms"

    return (
        f"  load test: {load.get('sent')}/{load.get('planned')} requests sent, {load.get('failed')} failed, "
        f"p50 {ms(load.get('p50_seconds'))}, p99 {ms(load.get('p99_seconds'))} (all replicas)",
    )
