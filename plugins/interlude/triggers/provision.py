"""QueuedResourceTrigger: wait in the triggerer for a queued resource to hand over its TPU node.

A queued resource can sit in WAITING_FOR_RESOURCES for an hour or more
(https://cloud.google.com/tpu/docs/queued-resources); that wait must not hold a worker or a pool slot.
This trigger polls the queued resource and its node (async REST reads, nothing blocks the loop) and
yields exactly one event: ``ready`` (ACTIVE and the node READY), or ``error`` (FAILED, SUSPENDED,
gone, or the deadline passed). Seeing the event twice (triggerer failover) is harmless: the
operator's handler only reads it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

FAILED_STATES = frozenset({"FAILED", "SUSPENDED", "SUSPENDING"})


def verdict(
    qr: dict[str, Any] | None, node: dict[str, Any] | None, now: float, deadline: float
) -> dict[str, Any] | None:
    """The event to yield for one observation, or None to keep waiting (pure: tested without a cloud)."""
    if qr is None:
        return {"status": "error", "message": "the queued resource is gone"}
    state = (qr.get("state") or {}).get("state") or "STATE_UNSPECIFIED"
    if state in FAILED_STATES:
        return {"status": "error", "message": f"the queued resource is {state}: {qr.get('state')}"}
    if state == "ACTIVE" and node is not None and node.get("state") == "READY":
        return {"status": "ready", "node": node.get("name")}
    if now > deadline:
        return {"status": "error", "message": f"the queued resource is still {state} at its deadline"}
    return None


class QueuedResourceTrigger(BaseTrigger):
    """Wait for a queued resource to become ACTIVE with its TPU node READY; yield ``ready`` or ``error``.

    Everything the operator needs to go on travels in the event (``machine``): resuming from a deferral
    must not depend on anything but the event.

    :param zone: the zone of the queued resource and its node, e.g. ``us-central2-b``.
    :param queued_resource: the queued resource's ID (``interlude.naming.queued_resource_id``).
    :param node_id: the ID of the TPU node the queued resource creates.
    :param gcp_conn_id: the Google connection for the TPU API; None: anonymous, no Airflow connection.
    :param deadline: give up (``error``) after this time, in epoch seconds; the operator sets the run's
        ``queue_wait_seconds`` plus a grace beyond Google's own expiry.
    :param poll_interval: seconds between two looks.
    :param machine: the MachineRecord dict, returned unchanged in the event; None: an empty dict.
    """

    def __init__(
        self,
        *,
        zone: str,
        queued_resource: str,
        node_id: str,
        gcp_conn_id: str | None,
        deadline: float,
        poll_interval: float = 5.0,
        machine: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.machine = machine or {}
        self.zone, self.queued_resource, self.node_id = zone, queued_resource, node_id
        self.gcp_conn_id, self.deadline, self.poll_interval = gcp_conn_id, deadline, poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "zone": self.zone,
                "queued_resource": self.queued_resource,
                "node_id": self.node_id,
                "gcp_conn_id": self.gcp_conn_id,
                "deadline": self.deadline,
                "poll_interval": self.poll_interval,
                "machine": self.machine,
            },
        )

    async def _observe(self, hook: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        qr = await hook.get_queued_resource(self.zone, self.queued_resource)
        if qr is None:
            return None, None
        state = (qr.get("state") or {}).get("state")
        node = await hook.get_node(self.zone, self.node_id) if state == "ACTIVE" else None
        return qr, node

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from interlude.hooks.tpu_async import AsyncTpuHook

        hook = AsyncTpuHook(gcp_conn_id=self.gcp_conn_id)
        try:
            while True:
                qr, node = await self._observe(hook)
                event = verdict(qr, node, time.time(), self.deadline)
                if event is not None:
                    break
                self.log.info("Queued resource %s: %s", self.queued_resource, (qr or {}).get("state"))
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:  # noqa: BLE001 - the operator fails loudly with it
            event = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        yield TriggerEvent({**event, "machine": self.machine})


class QuotaWaitTrigger(BaseTrigger):
    """Wait out a quota error in the triggerer, then hand the provisioning state back to the operator.

    Also waits for a machine slot to free. It only sleeps: whether to try again is the operator's call.

    :param seconds: how long to wait, in seconds.
    :param state: the operator's provisioning state dict (decision, runtime, placements tried, quota deadline),
        returned unchanged in the ``waited`` event.
    """

    def __init__(self, *, seconds: float, state: dict[str, Any]) -> None:
        super().__init__()
        self.seconds, self.state = seconds, state

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"seconds": self.seconds, "state": self.state})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await asyncio.sleep(self.seconds)
        yield TriggerEvent({"status": "waited", "state": self.state})
