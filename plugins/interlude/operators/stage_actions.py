"""What the stage operator does to the world when the state machine asks (TrainingStageOperator's actions).

Kept apart from the operator's Airflow entry points (operators/stage.py): each action is one call
through a hook (re-provision, drill, restart the workload, start a maintenance early) or one record
(a maintenance event), and the failure message's log tail.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from interlude.hooks.machines import machine_hooks
from interlude.machines import provisioning
from interlude.stage.model import StageState
from interlude.training import events
from interlude.training import tasks as lifecycle
from interlude_workload import layout


class CapacityWait(Exception):
    """Nowhere to go now, and the profile lets the run wait: try again after a while, up to ``max_wait``."""

    def __init__(self, reason: str, max_wait: float, limit: str = "the model profile's max_wait") -> None:
        super().__init__(reason)
        self.reason, self.max_wait, self.limit = reason, max_wait, limit


CAPACITY_RETRY_SECONDS = 60.0
"""How often a stage waiting for capacity tries to re-provision (Google's capacity changes in minutes)."""


class StageActions:
    """Mixin for TrainingStageOperator: needs ``machine``, ``stage``, ``run_key``, ``bucket``, ``run_spec``,
    ``gcp_conn_id``, ``log``, ``_store`` and ``_plan``."""

    machine: Any
    stage: str
    gcp_conn_id: str | None
    log: Any
    _store: Any
    run_key: Any
    bucket: Any
    run_spec: Any

    def _plan(self, hold_at_step: int | None) -> Any:  # provided by the operator
        raise NotImplementedError

    if TYPE_CHECKING:  # provided by the operator and BaseOperator (declared here for the type checker only)

        @property
        def poll_interval(self) -> float: ...
        def _bind(self, context: Any) -> None: ...
        def _trigger(self, state: StageState) -> Any: ...
        def defer(self, **kwargs: Any) -> Any: ...

    def _wait_for_capacity(self, state: StageState, wait: CapacityWait, since: float) -> None:
        """Nowhere to go and the profile allows waiting: wait in the triggerer, then try again (defers)."""
        from interlude.triggers.provision import QuotaWaitTrigger

        waited = time.time() - since
        if waited > wait.max_wait:
            raise AirflowException(
                f"stage {self.stage}: no capacity came back in {waited:.0f}s (at most {wait.max_wait:.0f}s: "
                f"{wait.limit}): {wait.reason}"
            )
        retry = min(CAPACITY_RETRY_SECONDS, self.poll_interval * 10)
        self.log.warning(
            "Stage %s: %s. The model profile allows waiting: trying again in %.0fs (waited %.0fs of %.0fs)",
            self.stage,
            wait.reason,
            retry,
            waited,
            wait.max_wait,
        )
        trigger = QuotaWaitTrigger(seconds=retry, state={"stage_state": state.to_dict(), "since": since})
        self.defer(trigger=trigger, method_name="capacity_waited")

    def capacity_waited(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """After a wait for capacity: re-provision (in place, else a move); then watch the stage again."""
        self._bind(context)
        waiting = event["state"]
        state = StageState.from_dict(waiting["stage_state"])
        try:
            self._reprovision()
        except CapacityWait as wait:
            self._wait_for_capacity(state, wait, since=float(waiting["since"]))
        self.log.warning("Stage %s: capacity is back after %.0fs", self.stage, time.time() - float(waiting["since"]))
        self.defer(trigger=self._trigger(state), method_name="execute_complete")
        raise AssertionError("unreachable")

    def _wait_for_capacity_sync(self, wait: CapacityWait) -> None:
        """deferrable=False: the same waits on the worker (sleeping: that is what non-deferrable means)."""
        since = time.time()
        while True:
            if time.time() - since > wait.max_wait:
                raise AirflowException(
                    f"stage {self.stage}: no capacity came back in {wait.max_wait:.0f}s: {wait.reason}"
                )
            self.log.warning("Stage %s: %s. Waiting for capacity", self.stage, wait.reason)
            time.sleep(min(CAPACITY_RETRY_SECONDS, self.poll_interval * 10))
            try:
                self._reprovision()
                return
            except CapacityWait as again:
                wait = again

    def _reprovision(self, why: str | None = None) -> None:
        """Bring the machine back where it was; when that place is gone, move the run."""
        from interlude.capacity.failover import Why
        from interlude.hooks.errors import QuotaExceededError, StockoutError
        from interlude.machines.relocate import MoveRefused, move_run

        self.log.warning("Machine %s: %s: re-provisioning it", self.machine["name"], why or "gone or did not come back")
        # Every create holds a machine slot (interlude.machines.slots): the run's own while it lives (taking it
        # again is one list), a new one when its teardown already released it (a stage cleared on its own).
        held = lifecycle.take_machine_slot(self.run_spec, {})
        if held is not None:
            waiting = f"{held}: the machine is re-created when one frees"
            raise CapacityWait(waiting, self.run_spec.queue_wait_seconds, "queue_wait_seconds")
        try:
            provisioning.reprovision(self.machine, self.gcp_conn_id)
            return
        except (StockoutError, QuotaExceededError) as exc:
            cause = Why.QUOTA if isinstance(exc, QuotaExceededError) else Why.STOCKOUT
            self.log.warning("Cannot come back in %s (%s): looking for another place", self.machine["zone"], exc)
        try:
            self.machine = move_run(self.run_spec, self.machine, cause, self.stage, self.gcp_conn_id)
        except MoveRefused as exc:
            if exc.max_wait_seconds > 0:
                raise CapacityWait(str(exc), exc.max_wait_seconds) from exc
            raise AirflowException(str(exc)) from exc
        self.log.warning(
            "Stage %s continues on %s in %s from its latest committed checkpoint",
            self.stage,
            self.machine["accelerator_type"],
            self.machine["zone"],
        )

    def _drill(self, state: StageState) -> None:
        """simulateMaintenanceEvent while the workload holds at the drill step."""
        self._send_drill(state.drill_step, self.machine["zone"], self.machine["name"], self.machine["kind"])

    def _send_drill(self, step: int | None, zone: str, name: str, kind: str) -> None:
        """The drill marker, the plan without its hold (a later boot that resumes before the drill step does not
        hold again), then simulateMaintenanceEvent on the machine: a Compute Engine instance (``gce_vm``: a GPU or
        TPU VM, or a GKE node's VM) through Compute Engine, a TPU node (or a queued resource's) through the TPU API."""
        from interlude_workload.plan import write_plan

        self._store.bucket.blob(layout.drill_marker(self.run_key, self.stage)).upload_from_string(
            json.dumps({"drill": "simulateMaintenanceEvent", "step": step, "machine": name}),
            content_type="application/json",
        )
        write_plan(self.bucket, self.run_key, self._plan(None))
        self.log.info(
            "Maintenance drill: the workload holds at step %s; simulateMaintenanceEvent on %s in %s", step, name, zone
        )
        tpu, compute = machine_hooks(self.gcp_conn_id)
        if kind == "gce_vm":
            compute.simulate_maintenance_event(zone, name)
        else:
            tpu.simulate_maintenance_event(zone, name)

    def _restart_workload(self, state: StageState) -> None:
        """Stop and start the machine: its startup script (the agent) runs again on the new boot."""
        zone, name = self.machine["zone"], self.machine["name"]
        self.log.warning("Restarting the workload on %s (stop + start): %s", name, (state.event or {}).get("reason"))
        tpu, compute = machine_hooks(self.gcp_conn_id)
        if self.machine["kind"] == "gce_vm":
            compute.stop_instance(zone, name)
            compute.start_instance(zone, name)
        else:
            tpu.stop_node(zone, name)
            tpu.start_node(zone, name)

    def _log_tail(self, serial_tail: str | None) -> str:
        """The machine's last words for a failure message: its serial console (a TPU node's guest attribute
        interlude/startup), else the workload's own log."""
        if serial_tail:
            where = "guest attributes (interlude/startup)" if self.machine["kind"] == "tpu_node" else "serial console"
            return f"{where} tail:\n" + serial_tail
        parts: list[str] = []
        try:
            lines = self._store.read_log(tail_chunks=1).splitlines()[-15:]
            if lines:
                parts.append("workload log tail:\n" + "\n".join(lines))
            agent = self._store.bucket.blob(layout.agent_object(self.run_key))
            if agent.exists():
                parts.append("agent heartbeat: " + agent.download_as_text()[:500])
        except Exception as exc:  # noqa: BLE001 - the failure itself is what the user must see
            parts.append(f"(log tail unavailable: {exc})")
        return "\n".join(parts) or "(the machine left no log; see its serial console)"

    def _record(self, event: dict[str, Any], watcher: dict[str, Any] | None = None) -> None:
        """Store the event, with the triggerer process that saw it close (none when the worker watched)."""
        if watcher:
            event = {**event, "watcher": watcher}
        event = self._with_restore_time(event)
        uri = events.record_event(self.bucket, self.run_key, self.stage, event)
        self.log.info(
            "Maintenance event recorded (%s%s): checkpoint step %s, downtime %.1fs, resumed from %s, "
            "steps recomputed %s -> %s",
            event.get("kind"),
            ", drill" if event.get("drill") else "",
            event.get("checkpoint_step"),
            float(event.get("downtime_s") or 0),
            event.get("resumed_from_step"),
            event.get("steps_recomputed"),
            uri,
        )

    def _with_restore_time(self, event: dict[str, Any]) -> dict[str, Any]:
        """The event with ``restored_at``, when the new boot's log says its restore finished (events.restore_finished).
        Read here, once per event, not by the trigger: its polls read no logs. The last two chunks hold the new
        process's first lines (a process starts a chunk of its own); an unreadable log only leaves the time out."""
        if event.get("boot_id") is None or event.get("resumed_from_step") is None:
            return event
        try:
            log = self._store.read_log(tail_chunks=2)
            restored = events.restore_finished(log, event)
            if restored is None:  # the log's upload can trail the progress that closed the event (seen under load)
                restored = events.restore_stamped(self._store.read_progress() or {}, event)
        except Exception as exc:  # noqa: BLE001 - a detail of the record, not a reason to fail the stage
            self.log.info("Workload log unreadable (%s): the event is recorded without its restore time", exc)
            return event
        return event if restored is None else {**event, "restored_at": restored}

    def _request_checkpoint(self, state: StageState) -> None:
        assert state.request_id
        notice = (state.event or {}).get("notice_type")
        self._store.request_checkpoint(state.request_id, reason=f"maintenance notice ({notice})")
        self.log.info(
            "Maintenance notice (%s, window %s): checkpoint requested (%s)",
            notice,
            (state.event or {}).get("window_start"),
            state.request_id,
        )

    def _log_notice_plan(self, state: StageState) -> None:
        """A long notice: say in the task log how long training goes on and when the checkpoint is due."""
        event = state.event or {}
        plan = event.get("policy") or {}
        self.log.info(
            "Maintenance notice (%s, window %s): %s; the checkpoint is due at %s UTC",
            event.get("notice_type"),
            event.get("window_start"),
            plan.get("reason"),
            time.strftime("%H:%M:%S", time.gmtime(float(plan.get("checkpoint_at") or 0))),
        )

    def _start_maintenance(self, state: StageState) -> None:
        """performMaintenance: Google allows it (canReschedule, PENDING) and this is a natural pause, so the
        window is spent here instead of wherever it would have opened. A refusal (the window opened on its
        own meanwhile, or it cannot move after all) only means the maintenance comes on Google's schedule."""
        zone, name = self.machine["zone"], self.machine["name"]
        self.log.info(
            "Starting the pending maintenance early on %s (performMaintenance) at a natural pause: %s",
            name,
            "the workload holding at its checkpoint" if state.event else "between two stages",
        )
        tpu, compute = machine_hooks(self.gcp_conn_id)
        try:
            if self.machine["kind"] == "gce_vm":
                compute.perform_maintenance(zone, name)
            else:
                tpu.perform_maintenance(zone, name)
        except Exception as exc:  # noqa: BLE001 - an optimisation: Google starts the window anyway
            self.log.warning("performMaintenance was refused (%s); the window opens on Google's schedule", exc)
