"""The drill's load generator: bounded by count and by time, every failure a sample; access-log counting."""

from __future__ import annotations

import asyncio
import time

import pytest

from interlude.serving.loadgen import run_load, served_completions, summary_lines

LOG = """INFO vLLM STAND-IN (not vLLM) loading gs://b/interlude/r/finetune/
INFO:     127.0.0.1:50412 - "GET /health HTTP/1.1" 200 OK
INFO:     127.0.0.1:50414 - "POST /v1/completions HTTP/1.1" 200 OK
INFO:     127.0.0.1:50416 - "POST /v1/completions HTTP/1.1" 200 OK
INFO:     127.0.0.1:50418 - "POST /v1/completions HTTP/1.1" 400 Bad Request
INFO:     127.0.0.1:50420 - "GET /metrics HTTP/1.1" 200 OK
"""


def test_served_completions_counts_access_log_lines_by_status() -> None:
    assert served_completions(LOG) == (2, 1)
    assert served_completions("") == (0, 0)


def test_the_count_bounds_the_load_and_concurrency_is_respected() -> None:
    in_flight, peak = 0, 0

    async def send() -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1

    result = asyncio.run(run_load(send, count=20, concurrency=3, deadline=time.time() + 60))
    assert (result.sent, result.failed, peak) == (20, 0, 3)
    p50, p99 = result.latency(50), result.latency(99)
    assert p50 is not None and p99 is not None and p99 >= p50


def test_the_deadline_bounds_a_hanging_service_and_failures_are_samples() -> None:
    """A service that never answers: each request is cut at its timeout (cancelled, a failure sample), and no
    request starts after the deadline, so the load ends well short of its count."""
    calls, cut = 0, 0

    async def send() -> None:
        nonlocal calls, cut
        calls += 1
        if calls == 1:
            raise RuntimeError("HTTP 503: no endpoints")
        try:
            await asyncio.sleep(30)  # never answers
        except asyncio.CancelledError:
            cut += 1
            raise

    result = asyncio.run(run_load(send, count=1000, concurrency=2, deadline=time.time() + 0.5, request_timeout=1))
    assert result.sent == calls < 1000 and result.failed == result.sent
    assert cut == calls - 1, (cut, calls)  # every hanging request ended by its timeout, none by answering
    assert [s.detail.split(":")[0] for s in result.samples[1:]] == ["TimeoutError"] * cut
    assert "HTTP 503" in str(result.to_dict()["failures"])
    assert result.latency(50) is None


@pytest.mark.parametrize("p50", [0.0123, None])
def test_summary_lines(p50: float | None) -> None:
    load = {"planned": 10, "sent": 10, "failed": 0, "p50_seconds": p50, "p99_seconds": 0.5}
    (line,) = summary_lines(load)
    assert "10/10 requests sent, 0 failed" in line and "p99 500 ms" in line
    assert ("p50 12 ms" if p50 else "p50 -") in line
