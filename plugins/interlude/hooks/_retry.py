"""Bounded retries with exponential backoff and full jitter for 429/503 answers.

Google asks clients to back off on 429/503; many machines of one pipeline polling the same API at the
same moment would otherwise retry in lockstep, hence the jitter. The bound matters as much: after
``max_attempts`` the last ``TransientError`` goes to the caller, who decides (a task retry, a trigger's
next poll). Mutating calls are retried too: a create that succeeded before its answer was lost comes
back as 409 and the hooks turn that into "return the existing resource", a delete as 404 -> done.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from interlude.hooks.errors import TransientError

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a call that answered 429/503.

    The defaults wait at most about 1+2+4+8+16+30 s (~1 min) before giving up.
    """

    max_attempts: int = 7
    initial_delay: float = 1.0
    max_delay: float = 30.0
    multiplier: float = 2.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full-jitter delay before retry number ``attempt`` (1-based)."""
        ceiling = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        return (rng or random).uniform(ceiling / 2, ceiling)


DEFAULT_RETRY_POLICY = RetryPolicy()


def call_with_retries(fn: Callable[[], T], policy: RetryPolicy, what: str = "call") -> T:
    """Run ``fn``; on ``TransientError`` sleep and try again, at most ``policy.max_attempts`` times."""
    attempt = 1
    while True:
        try:
            return fn()
        except TransientError as exc:
            if attempt >= policy.max_attempts:
                log.warning("%s: giving up after %d attempts: %s", what, attempt, exc)
                raise
            delay = policy.delay(attempt)
            log.info("%s: transient error (%s), retry %d in %.2fs", what, exc.code, attempt, delay)
            time.sleep(delay)
            attempt += 1


async def acall_with_retries(fn: Callable[[], Awaitable[T]], policy: RetryPolicy, what: str = "call") -> T:
    """Async twin of :func:`call_with_retries`; waits with ``asyncio.sleep`` (never blocks the loop)."""
    attempt = 1
    while True:
        try:
            return await fn()
        except TransientError as exc:
            if attempt >= policy.max_attempts:
                log.warning("%s: giving up after %d attempts: %s", what, attempt, exc)
                raise
            delay = policy.delay(attempt)
            log.info("%s: transient error (%s), retry %d in %.2fs", what, exc.code, attempt, delay)
            await asyncio.sleep(delay)
            attempt += 1
