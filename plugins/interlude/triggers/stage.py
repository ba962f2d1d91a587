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
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from airflow.utils.net import get_hostname

from interlude.stage.facts import StageFactsReader, list_bucket_async
from interlude.stage.machine import next_step
from interlude.stage.model import Limits, Machine, Observation, Phase, StageState, Transition
from interlude.stage.notice_wait import watch_interval
from interlude.stage.observe import (
    StageFacts,
    StartupFailure,
    is_outage,
    list_fields,
    machine_view,
    observation,
    progress_line,
    startup_failure,
    unknown,
)
from interlude.stage.startup_looks import LookClock, LookPlan, after_look, look_due, look_plan, look_spread
from interlude.triggers.shared import SharedCalls, ZoneListCache

_ListFn = Callable[[], Awaitable[list[dict[str, Any]]]]
ZONE_LISTS = ZoneListCache()
SHARED_HOOKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], Any]] = (
    weakref.WeakKeyDictionary()
)
BUCKET_LISTS: SharedCalls[dict[str, dict[str, Any]]] = SharedCalls()


MACHINE_READS = 8
_READ_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _machine_reads() -> asyncio.Semaphore:
    """At most MACHINE_READS per-machine reads (serial console, guest attributes) in flight per event loop: a
    thousand quiet stages checking at once would otherwise queue in the shared HTTP client's pool, whose
    bookkeeping grows with the queue times the connections (most of a core at 1,000)."""
    loop = asyncio.get_running_loop()
    if loop not in _READ_SLOTS:
        _READ_SLOTS[loop] = asyncio.Semaphore(MACHINE_READS)
    return _READ_SLOTS[loop]


def _quiet_for(state: StageState, now: float) -> float:
    """Seconds since the workload last reported progress (0 before it ever has)."""
    return 0.0 if state.progress_seen_at is None else now - state.progress_seen_at


WATCH_RETRY: dict[str, Any] = {"max_attempts": 3, "initial_delay": 0.5, "max_delay": 4.0}
"""Per-poll retries of the trigger's API calls: short, because the outage budget rides out the rest."""
STOPPED_EXITS = (0, 143)  # the startup script's exits when the machine stopped it (the agent ends only on SIGTERM)
SERIAL_KEEP = 64 * 1024


class StageTrigger(BaseTrigger):
    """Watch one training stage's machine and GCS facts from the triggerer; fire once when the operator must act.

    Each poll reads the machine from its zone's list (one call per zone and interval, shared by every trigger
    in the process) and the stage's facts from its bucket's listing (also shared: a download only for an object
    that changed), asks the pure state machine (:func:`interlude.stage.machine.next_step`) what that means, and
    yields one event for a transition. It never changes the machine: the operator acts on the event, and
    ``on_kill`` only asks the workload for a checkpoint. The operator builds it (``TrainingStageOperator``); the
    arguments carry everything it needs, so a triggerer restart or a second copy reaches the same conclusion.

    :param machine: the machine to watch: ``kind`` (``tpu_node`` or ``gce_vm``), ``zone`` and ``name``.
    :param bucket: the run's GCS bucket, where the workload writes progress, checkpoints and acknowledgements.
    :param run_key: the run's key, the prefix of its objects in ``bucket``.
    :param stage: the stage's name (``train``, ``finetune``), the next level of the prefix.
    :param state: the state machine's state carried between polls and triggers (``StageState.to_dict()``).
    :param restart_timeout: without a notice policy, seconds the machine may stay down before it is
        re-provisioned (the policy's own deadlines decide otherwise); also the floor of a drill's wait.
    :param poll_interval: seconds between polls (shorter in the moments before a maintenance window).
    :param stall_timeout: seconds a READY machine may show no progress before the workload is restarted
        once, then the stage fails.
    :param api_outage_budget: seconds the control plane (the cloud's API, GCS) may stay silent before the
        stage fails; until then the trigger rides it out and the workload keeps running.
    :param gcp_conn_id: the Google connection for the TPU and Compute APIs; None: anonymous, no Airflow
        connection.
    :param log_every: seconds between progress lines while nothing changes (a change is logged at once).
    :param notice_policy: the maintenance policy as a dict (``NoticePolicy.to_dict()``, on the cloud's clock);
        None checkpoints at every notice at once.
    """

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
        stall_timeout: float = 600.0,
        api_outage_budget: float = 900.0,
        gcp_conn_id: str | None = "google_cloud_default",
        log_every: float = 300.0,
        notice_policy: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.machine = machine
        self.bucket = bucket
        self.run_key = run_key
        self.stage = stage
        self.state = state
        self.restart_timeout = restart_timeout
        self.poll_interval = poll_interval
        self.stall_timeout = stall_timeout
        self.api_outage_budget = api_outage_budget
        self.gcp_conn_id = gcp_conn_id
        self.log_every = log_every
        self.notice_policy = notice_policy
        self._reader: StageFactsReader | None = None
        self._serial = ""
        self._serial_next = 0
        self._outage_logged = 0.0
        self._plan: LookPlan | None = None  # when this stage may look (set on first use: _look_plan)
        self._looks = (
            LookClock()
        )  # this stage's looks at its startup script's last words (interlude.stage.startup_looks)
        self._started = 0.0  # set when run() starts
        self._watch = poll_interval  # seconds to the next look (shorter while a hold before the window may begin)

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
                "stall_timeout": self.stall_timeout,
                "api_outage_budget": self.api_outage_budget,
                "gcp_conn_id": self.gcp_conn_id,
                "log_every": self.log_every,
                "notice_policy": self.notice_policy,
            },
        )

    def limits(self) -> Limits:
        return stage_limits(self.restart_timeout, self.stall_timeout, self.api_outage_budget, self.notice_policy)

    async def _hook(self) -> Any:
        """The process's hook for this machine kind and connection on this event loop, shared by every trigger:
        each hook holds an HTTP client (~1 MB with its TLS context), and whichever trigger's turn it is to fetch
        the shared zone list would otherwise leave one behind per trigger."""
        hooks = SHARED_HOOKS.setdefault(asyncio.get_running_loop(), {})
        key = (self.machine["kind"], self.gcp_conn_id or "")
        if key not in hooks:
            hook = await self._new_hook()
            hooks.setdefault(key, hook)
        return hooks[key]

    async def _new_hook(self) -> Any:
        # The async hook modules import google.auth and httpx (the sync hooks' Google client libraries and the
        # provider's GoogleBaseHook stay out of the triggerer): still imports, so never on the event loop.
        retry = await asyncio.to_thread(importlib.import_module, "interlude.hooks._retry")
        policy = retry.RetryPolicy(**WATCH_RETRY)
        if self.machine["kind"] == "gce_vm":
            module = await asyncio.to_thread(importlib.import_module, "interlude.hooks.compute_async")
            return module.AsyncComputeHook(gcp_conn_id=self.gcp_conn_id, retry_policy=policy)
        module = await asyncio.to_thread(importlib.import_module, "interlude.hooks.tpu_async")
        return module.AsyncTpuHook(gcp_conn_id=self.gcp_conn_id, retry_policy=policy)

    async def _machine(self, hook: Any) -> dict[str, Any] | None:
        zone, name = self.machine["zone"], self.machine["name"]
        fields = list_fields(self.machine["kind"])  # only what machine_view reads: most of the list's cost is parsing
        if self.machine["kind"] == "gce_vm":
            fetch: _ListFn = lambda: hook.list_instances(zone, fields=fields)  # noqa: E731
        else:
            fetch = lambda: hook.list_nodes(zone, fields=fields)  # noqa: E731
        key = (self.machine["kind"], self.gcp_conn_id or "", zone)
        items = await ZONE_LISTS.get(key, fetch, max_age=self.poll_interval * 0.9, not_before=self._started)
        if name in items:
            return items[name]
        # Absent from a shared list that may predate this machine (a list fetched just before a re-provision,
        # reused by the new watcher): "gone" re-creates a machine, so only the machine's own GET may say it.
        if self.machine["kind"] == "gce_vm":
            return await hook.get_instance(zone, name)
        return await hook.get_node(zone, name)

    async def _startup_failure(self, hook: Any, reported_boot: str | None = None) -> StartupFailure | None:
        """New serial console output of a GCE VM (only the bytes since the last read), then the verdict.

        TPU nodes have no serial console in the TPU API: there the startup script leaves the same last words
        in the guest attribute ``interlude/startup`` (written when it ends), read with getGuestAttributes.
        """
        if self.machine["kind"] == "tpu_node":
            return await self._tpu_startup_failure(hook, reported_boot)
        if self.machine["kind"] != "gce_vm":
            return None
        async with _machine_reads():
            out = await hook.serial_port_output(self.machine["zone"], self.machine["name"], self._serial_next)
        self._serial = (self._serial + str(out.get("contents") or ""))[-SERIAL_KEEP:]
        self._serial_next = int(out.get("next") or self._serial_next)
        return startup_failure(self._serial)

    async def _tpu_startup_failure(self, hook: Any, reported_boot: str | None) -> StartupFailure | None:
        """The guest attribute holds the latest boot's begin, then its last words once it ends. Only an end of
        the boot the workload last reported (or of a first boot that never reported) counts: an older boot's
        end is a machine that went down and came back. Exit 0 or 143 is the agent stopped by SIGTERM (the
        machine going down), not a failure."""
        async with _machine_reads():
            entries = await hook.get_guest_attributes(self.machine["zone"], self.machine["name"], "interlude/")
        words = "\n".join(str(e.get("value") or "") for e in entries if e.get("key") == "startup")
        failure = startup_failure(words)
        if failure is None or failure.exit_code in STOPPED_EXITS:
            return None
        if reported_boot is not None and failure.boot != reported_boot:
            return None
        self._serial = words[-SERIAL_KEEP:]
        return failure

    def suspect(self, state: StageState, machine: Machine, now: float) -> bool:
        """Quiet for a while on a READY machine: worth a look at the serial console."""
        return machine is Machine.READY and _quiet_for(state, now) >= self._look_plan().period

    def _look_due(self, state: StageState, machine: Machine, notice: Any) -> tuple[object, ...] | None:
        """The look's context when this quiet stage should read its startup script's last words now, else None:
        once quiet for a period, then backed off while nothing changes (interlude.stage.startup_looks)."""
        if machine is not Machine.READY:
            return None
        context = (state.progress_seen_at, machine.value, notice)
        plan = self._look_plan()
        return (
            context if look_due(self._looks, context, _quiet_for(state, time.time()), time.monotonic(), plan) else None
        )

    def _looked(self, context: tuple[object, ...]) -> None:
        self._looks = after_look(self._looks, context, time.monotonic(), self._look_plan())

    def _look_plan(self) -> LookPlan:
        """This stage's own plan: its looks spread by its identity (interlude.stage.startup_looks), the same after a
        triggerer restart, so a thousand stages deferred together do not all look at the same poll."""
        if self._plan is None:
            m = self.machine
            identity = "/".join((m["kind"], m["zone"], m["name"], self.run_key, self.stage))
            self._plan = look_plan(self.poll_interval, self.stall_timeout, look_spread(identity))
        return self._plan

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

    async def _shared_facts(self, state: StageState) -> StageFacts:
        """This stage's facts from the bucket's listing shared by every trigger in the process; a download
        only for what changed (off the event loop), else no GCS call of its own."""
        index = await BUCKET_LISTS.get(
            ("gcs", self.bucket), lambda: list_bucket_async(self.bucket), self._watch * 0.9, self._started
        )
        if self._reader is None:
            self._reader = StageFactsReader(self.bucket, self.run_key, self.stage)
        objects = self._reader.objects(index)
        if self._reader.needs_io(objects, state.request_id):
            return await asyncio.to_thread(self._reader.read, objects, state.request_id)
        return self._reader.read(objects, state.request_id)

    async def _progress_facts(self, facts: StageFacts) -> StageFacts:
        """The quick watch's look (a hold before the window may begin at any moment, see notice_wait.watch_interval):
        progress.json alone, one GET, over the last listing's facts (stage_facts.with_progress)."""
        if self._reader is None:
            self._reader = StageFactsReader(self.bucket, self.run_key, self.stage)
        return await asyncio.to_thread(self._reader.with_new_progress, facts)

    async def _read_facts(
        self, state: StageState, machine: Machine, notice: Any, facts: StageFacts | None, facts_at: float
    ) -> tuple[StageFacts, float]:
        """This poll's GCS facts and when they were read: the shared listing, or progress.json alone during the
        quick watch before a window. The one place the facts come from (a benchmark's subclass reads per stage,
        benchmarks/triggerer_watch_modes.py); ``machine`` and ``notice`` are this poll's view of the machine."""
        if facts is not None and self._watch < self.poll_interval:
            return await self._progress_facts(facts), time.monotonic()
        return await self._shared_facts(state), time.monotonic()

    async def _observe(
        self, hook: Any, state: StageState, facts: StageFacts | None, facts_at: float
    ) -> tuple[Observation, StageFacts | None, float]:
        """One look at the machine, GCS and (when quiet) the serial console. An outage is an observation too."""
        try:
            resource = await self._machine(hook)
            machine, notice = machine_view(self.machine["kind"], resource)
            facts, facts_at = await self._read_facts(state, machine, notice, facts, facts_at)
            boot = (facts.progress or {}).get("boot_id") if facts is not None else None
            # Quiet for long enough to look at the startup script's last words: once per period at first, then
            # less often while nothing changes (each look is one API call for this stage alone).
            failure = None
            if (context := self._look_due(state, machine, notice)) is not None:
                failure = await self._startup_failure(hook, str(boot) if boot else None)
                self._looked(context)
            return observation(self.machine["kind"], resource, facts, failure=failure), facts, facts_at
        except Exception as exc:
            if not is_outage(exc):
                raise
            obs = unknown(time.time(), f"{type(exc).__name__}: {exc}"[:300])
            since = state.outage_since or obs.now
            if time.monotonic() - self._outage_logged >= min(self.log_every, 10.0):
                self._outage_logged = time.monotonic()
                self.log.warning(
                    "[%s] the control plane did not answer (%s); riding it out: %.0fs of the %.0fs "
                    "budget used, the workload keeps running",
                    self.stage,
                    obs.api_error,
                    obs.now - since,
                    self.api_outage_budget,
                )
            return obs, facts, facts_at

    async def run(self) -> AsyncIterator[TriggerEvent]:
        limits = self.limits()
        last_log = 0.0
        last_seen: tuple[Any, ...] = ()
        facts: StageFacts | None = None
        facts_at = 0.0
        self._started = time.monotonic()  # shared lists older than this run may predate the worker's last look
        try:
            state = StageState.from_dict(self.state)
            hook = await self._hook()
            while True:
                obs, facts, facts_at = await self._observe(hook, state, facts, facts_at)
                progress = facts.progress if facts is not None else {}
                # One line per trigger goes through the supervisor to a file: on a change, else every log_every.
                seen = (state.phase, obs.machine, obs.notice is None)
                due = time.monotonic() - last_log >= self.log_every or seen != last_seen
                if due and obs.machine is not Machine.UNKNOWN:
                    last_seen = seen
                    self.log.info(
                        "%s  (%s, machine %s)",
                        progress_line(self.stage, progress),
                        state.phase.value,
                        obs.machine.value,
                    )
                    last_log = time.monotonic()
                if state.outage_since is not None and obs.machine is not Machine.UNKNOWN:
                    self.log.info(
                        "[%s] the control plane answers again after %.0fs", self.stage, obs.now - state.outage_since
                    )
                t = next_step(state, obs, limits)
                if t.differs_from(state):
                    payload = transition_event(self.stage, t, progress, self._serial, obs)
                    # Which process saw this transition: host (as Airflow names it on the triggerer's job), the
                    # trigger runner and its parent, the triggerer.
                    payload["watcher"] = {"host": get_hostname(), "pid": os.getpid(), "ppid": os.getppid()}
                    yield TriggerEvent(payload)
                    return
                state = t.state  # carries the running step count and the clocks between polls
                self._watch = watch_interval(state, obs, limits, self.poll_interval)
                await asyncio.sleep(self._watch)
        except Exception as exc:
            self.log.exception("stage trigger failed")
            yield TriggerEvent(
                {"status": "error", "message": f"{type(exc).__name__}: {exc}"[:1000], "state": self.state}
            )


def stage_limits(
    restart_timeout: float,
    stall_timeout: float,
    api_outage_budget: float,
    notice_policy: dict[str, Any] | None = None,
) -> Limits:
    """The state machine's limits from the run's params (the drill gets as long as a stall)."""
    from interlude.stage.notice_policy import NoticePolicy

    return Limits(
        restart_timeout=restart_timeout,
        stall_timeout=stall_timeout,
        api_outage_budget=api_outage_budget,
        drill_timeout=max(stall_timeout, restart_timeout),
        notice_policy=NoticePolicy.from_dict(notice_policy),
    )


def transition_event(
    stage: str, t: Transition, progress: dict[str, Any], serial: str, obs: Observation
) -> dict[str, Any]:
    """What the operator gets: small and JSON-safe (a progress line, a short log tail only on failure)."""
    payload: dict[str, Any] = {
        "status": "transition",
        "state": t.state.to_dict(),
        "actions": [a.value for a in t.actions],
        "event": t.event,
        "progress_line": progress_line(stage, progress) if progress else None,
    }
    if t.state.phase is Phase.FAILED and serial:
        payload["log_tail"] = "\n".join(serial.splitlines()[-20:])[-2000:]
    return payload
