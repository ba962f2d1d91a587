"""StageTrigger: watch one training stage's machine and checkpoints until something needs doing.

It only observes. Each poll it reads the machine (one list call per zone and interval, shared by
every trigger in this triggerer that watches that zone) and the stage's facts in GCS, asks the
pure state machine what that means, and yields exactly one event when the operator has to act or
carry a new state forward. Everything it knows is in its arguments plus a fresh look at the world,
so after a triggerer restart, or with two copies running, it reaches the same conclusion.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from interlude.maintenance import Limits, Machine, Phase, StageState, next_step
from interlude.observe import StageFacts, machine_view, observation, progress_line, read_stage_facts

_ListFn = Callable[[], Awaitable[list[dict[str, Any]]]]
GCS_EVERY = 3  # while calm, GCS facts are read every third poll (machine state every poll)


class ZoneListCache:
    """One in-flight or recent list call per (api, endpoint, zone), shared by all triggers.

    A thousand watched machines in one zone cost one list call per interval, not a thousand gets.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, ...], tuple[float, asyncio.Task[dict[str, dict[str, Any]]]]] = {}
        self.calls = 0

    async def get(self, key: tuple[str, ...], fetch: _ListFn, max_age: float) -> dict[str, dict[str, Any]]:
        """The zone's resources by short name (indexed once per fetch, not scanned by every watcher)."""
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is None or now - entry[0] > max_age or (entry[1].done() and entry[1].exception()):
            self.calls += 1

            async def fetch_indexed() -> dict[str, dict[str, Any]]:
                return {item.get("name", "").rsplit("/", 1)[-1]: item for item in await fetch()}

            entry = (now, asyncio.ensure_future(fetch_indexed()))
            self._entries[key] = entry
        return await asyncio.shield(entry[1])


ZONE_LISTS = ZoneListCache()


class StageTrigger(BaseTrigger):
    def __init__(
        self,
        *,
        machine: dict[str, Any],
        bucket: str,
        run_key: str,
        stage: str,
        state: dict[str, Any],
        restart_timeout: float,
        poll_interval: float = 5.0,
        drill_at_step: int | None = None,
        gcp_conn_id: str | None = "google_cloud_default",
        log_every: float = 30.0,
    ) -> None:
        super().__init__()
        self.machine = machine
        self.bucket = bucket
        self.run_key = run_key
        self.stage = stage
        self.state = state
        self.restart_timeout = restart_timeout
        self.poll_interval = poll_interval
        self.drill_at_step = drill_at_step
        self.gcp_conn_id = gcp_conn_id
        self.log_every = log_every

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "machine": self.machine,
                "bucket": self.bucket,
                "run_key": self.run_key,
                "stage": self.stage,
                "state": self.state,
                "restart_timeout": self.restart_timeout,
                "poll_interval": self.poll_interval,
                "drill_at_step": self.drill_at_step,
                "gcp_conn_id": self.gcp_conn_id,
                "log_every": self.log_every,
            },
        )

    async def _hook(self) -> Any:
        # The hook modules import Google's client libraries (a second or two): never on the event loop.
        if self.machine["kind"] == "gce_vm":
            module = await asyncio.to_thread(importlib.import_module, "interlude.hooks.compute")
            return module.AsyncComputeHook(gcp_conn_id=self.gcp_conn_id)
        module = await asyncio.to_thread(importlib.import_module, "interlude.hooks.tpu")
        return module.AsyncTpuHook(gcp_conn_id=self.gcp_conn_id)

    async def _machine(self, hook: Any) -> dict[str, Any] | None:
        zone, name = self.machine["zone"], self.machine["name"]
        if self.machine["kind"] == "gce_vm":
            fetch: _ListFn = lambda: hook.list_instances(zone)  # noqa: E731
        else:
            fetch = lambda: hook.list_nodes(zone)  # noqa: E731
        key = (self.machine["kind"], self.gcp_conn_id or "", zone)
        items = await ZONE_LISTS.get(key, fetch, max_age=self.poll_interval * 0.9)
        return items.get(name)

    async def on_kill(self) -> None:
        """The user marked the task failed/success or cleared it: ask the workload for a checkpoint now.

        Whatever happens next (a teardown deleting the machine, a retry provisioning a new one), the
        run resumes from this step instead of the last periodic checkpoint. The machine itself is never
        touched here; `cleanup()` (every trigger exit, triggerer restarts included) is not overridden.
        """
        request_id = f"kill{int(time.time())}"

        def request() -> None:  # imports and blocking GCS calls stay off the event loop
            from interlude_workload.checkpoints import CheckpointStore

            CheckpointStore(self.bucket, self.run_key, self.stage).request_checkpoint(request_id, "task killed")

        await asyncio.to_thread(request)
        self.log.info("Task killed: checkpoint requested from the workload (%s)", request_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        limits = Limits(restart_timeout=self.restart_timeout)
        hook: Any = None
        last_log = 0.0
        facts: StageFacts | None = None
        facts_at = 0.0
        try:
            state = StageState.from_dict(self.state)
            hook = await self._hook()
            while True:
                resource = await self._machine(hook)
                machine, notice = machine_view(self.machine["kind"], resource)
                # GCS is the expensive look: every poll while anything is happening, else every few.
                calm = state.phase is Phase.RUNNING and machine is Machine.READY and notice is None
                if facts is None or not calm or time.monotonic() - facts_at >= self.poll_interval * GCS_EVERY:
                    facts = await asyncio.to_thread(read_stage_facts, self.bucket, self.run_key, self.stage,
                                                    state.request_id)
                    facts_at = time.monotonic()
                obs = observation(self.machine["kind"], resource, facts)
                if time.monotonic() - last_log >= self.log_every:
                    self.log.info("%s  (%s, machine %s)", progress_line(self.stage, facts.progress),
                                  state.phase.value, obs.machine.value)
                    last_log = time.monotonic()
                if (self.drill_at_step is not None and state.phase is Phase.RUNNING
                        and facts.committed_step >= self.drill_at_step):
                    yield TriggerEvent({"status": "drill", "state": state.to_dict(), "actions": [],
                                        "event": None})
                    return
                t = next_step(state, obs, limits)
                if t.differs_from(state):
                    yield TriggerEvent({
                        "status": "transition",
                        "state": t.state.to_dict(),
                        "actions": [a.value for a in t.actions],
                        "event": t.event,
                        "progress": facts.progress,
                    })
                    return
                state = t.state  # carries the running step count between polls
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:  # noqa: BLE001 - reported to execute_complete, which fails loudly
            self.log.exception("stage trigger failed")
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}", "state": self.state})
        finally:
            close = getattr(hook, "aclose", None)
            if close is not None:
                await close()
