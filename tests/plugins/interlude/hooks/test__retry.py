"""Bounded backoff: transient errors are retried a fixed number of times, other errors never."""

from __future__ import annotations

import asyncio
import random

import pytest

from interlude.hooks._retry import RetryPolicy, acall_with_retries, call_with_retries
from interlude.hooks.errors import NotFoundError, TransientError

FAST = RetryPolicy(max_attempts=4, initial_delay=0.001, max_delay=0.004)


class Flaky:
    """Fails with ``exc`` the first ``failures`` calls, then answers "ok"."""

    def __init__(self, failures: int, exc: Exception) -> None:
        self.failures, self.exc, self.calls = failures, exc, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return "ok"


def test_transient_errors_are_retried_until_success() -> None:
    fn = Flaky(3, TransientError("busy", 503))
    assert call_with_retries(fn, FAST) == "ok" and fn.calls == 4


def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    fn = Flaky(10, TransientError("busy", 503))
    with pytest.raises(TransientError):
        call_with_retries(fn, FAST)
    assert fn.calls == FAST.max_attempts


def test_other_errors_are_not_retried() -> None:
    fn = Flaky(1, NotFoundError("gone", 404))
    with pytest.raises(NotFoundError):
        call_with_retries(fn, FAST)
    assert fn.calls == 1


def test_async_twin() -> None:
    fn = Flaky(2, TransientError("busy", 429))

    async def call() -> str:
        return fn()

    assert asyncio.run(acall_with_retries(call, FAST)) == "ok" and fn.calls == 3


def test_delay_grows_exponentially_with_jitter_and_is_capped() -> None:
    policy = RetryPolicy(initial_delay=1.0, max_delay=8.0, multiplier=2.0)
    rng = random.Random(7)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        delays = [policy.delay(attempt, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered
