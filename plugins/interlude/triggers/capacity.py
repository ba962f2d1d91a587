"""CapacityTrigger: re-evaluate capacity until the decision tree leaves `wait`.

Waiting for capacity can take hours, so it happens in the triggerer, not on a worker slot. Each poll
is a read-only capacity probe plus a walk of the tree (both blocking, so both in a worker thread);
the first walk that ends anywhere but `wait` (a placement, or `stuck` once the deadline has passed)
is the one event this trigger yields.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


def walk_again(spec: dict[str, Any], decision: dict[str, Any]) -> dict[str, Any]:
    """One fresh probe and walk, carrying the wait state (when waiting started) forward."""
    from interlude.capacity.decisions import Decision
    from interlude.training import tasks as lifecycle
    from interlude.training.spec import RunSpec

    wait = Decision.from_dict(decision).wait_state()
    run = RunSpec.from_dict(spec)
    return lifecycle.decide(run, lifecycle.evaluate_capacity(run), wait)


class CapacityTrigger(BaseTrigger):
    """Walk the decision tree again every ``poll_interval`` until it leaves ``wait``; yield that decision.

    The wait's start travels in ``decision`` (its wait state), so the profile's wait deadline holds across
    deferrals and triggerer restarts. A probe or walk that raises ends the wait with an ``error`` event.

    :param spec: the run's RunSpec as a dict.
    :param decision: the decision that ended in ``wait``, as a dict (``Decision.to_dict``).
    :param poll_interval: seconds between two probe-and-walks (the operator's default: 5 x the run's poll_seconds).
    """

    def __init__(self, *, spec: dict[str, Any], decision: dict[str, Any], poll_interval: float = 60.0) -> None:
        super().__init__()
        self.spec = spec
        self.decision = decision
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"spec": self.spec, "decision": self.decision, "poll_interval": self.poll_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        decision = self.decision
        try:
            while decision["leaf"] == "wait":
                await asyncio.sleep(self.poll_interval)
                decision = await asyncio.to_thread(walk_again, self.spec, decision)
                self.log.info("Capacity re-evaluated: %s", decision["leaf"])
        except Exception as exc:  # noqa: BLE001 - execute_complete fails loudly with it
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
            return
        yield TriggerEvent({"status": "decided", "decision": decision})
