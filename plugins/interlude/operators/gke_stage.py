"""A training stage on GKE: the TrainingStageOperator's path when the run's machine is its JobSet.

The operator acts, the trigger observes (interlude.triggers.gke_stage). ``execute`` writes the stage plan the
JobSet's agent runs (the same object a TPU VM's agent reads) and defers; each event carries the state and what
to do: request a checkpoint (the control request a VM's notice writes), record the maintenance event, complete
with the committed final checkpoint, or fail saying why. GKE itself drains the node at the maintenance window
and the JobSet recreates the pod, so there is nothing to restart or re-provision here, unless the pool cannot get
its node back (a stockout: MOVE): then the run moves where the tree says (interlude.machines.relocate.move_run: a
GPU pool for a portable model) and the stage watches its JobSet there, resuming from the committed checkpoint.
``deferrable=False`` runs the same trigger loop on the worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

from airflow.sdk.exceptions import AirflowException

from interlude.stage.gke_observe import (
    COMPLETE,
    DRILL,
    DRILL_PENDING,
    FAIL,
    MOVE,
    RECORD_EVENT,
    REQUEST_CHECKPOINT,
    GkeStageState,
)

#: Google's figure for a TPU VM's host maintenance (~1 h; interlude.stage.notice_policy), in Google-real seconds:
#: a drained workload not back after this (scaled to the cloud's clock) plus the stall timeout fails the stage.
DOWN_BUDGET_SECONDS = 3600.0


class GkeStage:
    """Mixed into TrainingStageOperator (which provides the spec, the store, _bind, _plan, _summary, _publish,
    _record and the Airflow plumbing)."""

    machine: Any
    stage: str
    log: Any

    def _gke_trigger(self, state: GkeStageState) -> Any:
        from interlude.hooks.machines import machine_hooks
        from interlude.triggers.gke_stage import GkeStageTrigger

        spec = self.run_spec  # type: ignore[attr-defined]
        scale = machine_hooks(self.gcp_conn_id).tpu.time_scale  # type: ignore[attr-defined]
        return GkeStageTrigger(
            machine=self.machine,
            bucket=spec.bucket,
            run_key=spec.run_key,
            stage=self.stage,
            state=state.to_dict(),
            poll_interval=spec.poll_seconds,
            stall_timeout=spec.stall_timeout_seconds,
            down_timeout=spec.stall_timeout_seconds + DOWN_BUDGET_SECONDS / scale,
            gcp_conn_id=self.gcp_conn_id or "google_cloud_default",  # type: ignore[attr-defined]
        )

    def execute_gke(self, context: Any) -> Any:
        from interlude_workload.plan import write_plan

        drill_step = self._drill_step()  # type: ignore[attr-defined]
        uri = write_plan(self.bucket, self.run_key, self._plan(drill_step))  # type: ignore[attr-defined]
        self.log.info(
            "Stage %s handed to JobSet %s on node pool %s (cluster %s): %s%s",
            self.stage,
            self.machine["jobset"],
            self.machine["node_pool"],
            self.machine["cluster"],
            uri,
            f" (maintenance drill at step {drill_step})" if drill_step else "",
        )
        state = GkeStageState(
            target_step=self.steps,  # type: ignore[attr-defined]
            drill=DRILL_PENDING if drill_step else None,
            drill_step=drill_step,
            awaits_export=self.awaits_export,  # type: ignore[attr-defined]
        )
        if not self.deferrable:  # type: ignore[attr-defined]
            return self._gke_sync(context, state)
        self.defer(trigger=self._gke_trigger(state), method_name="execute_gke_complete")  # type: ignore[attr-defined]
        raise AssertionError("unreachable")

    def execute_gke_complete(self, context: Any, event: dict[str, Any]) -> Any:
        self._bind(context)  # type: ignore[attr-defined]
        state, result = self._gke_act(context, event)
        if result is not None:
            return result
        self.defer(trigger=self._gke_trigger(state), method_name="execute_gke_complete")  # type: ignore[attr-defined]
        raise AssertionError("unreachable")

    def _gke_sync(self, context: Any, state: GkeStageState) -> Any:
        """deferrable=False: the trigger's loop on the worker, acting on each event as execute_gke_complete does."""
        while True:
            event = asyncio.run(_first_event(self._gke_trigger(state)))
            state, result = self._gke_act(context, event)
            if result is not None:
                return result

    def _gke_act(self, context: Any, event: dict[str, Any]) -> tuple[GkeStageState, Any]:
        status = event.get("status")
        if status == "error":
            raise AirflowException(f"stage {self.stage}: watching the JobSet failed: {event.get('message')}")
        if status != "transition":
            raise AirflowException(f"stage {self.stage}: unexpected trigger event status {status!r}")
        state = GkeStageState.from_dict(event["state"])
        actions = list(event.get("actions") or [])
        self.log.info("stage %s on GKE: %s -> %s", self.stage, event.get("reason"), ", ".join(actions))
        for action in actions:
            if action in (REQUEST_CHECKPOINT, DRILL):
                self._gke_ask(action, state)
            elif action == RECORD_EVENT and event.get("event"):
                self._record(event["event"])  # type: ignore[attr-defined]
            elif action == MOVE:
                self._gke_move(str(event.get("reason")))
                if self.machine.get("kind") != "gke_jobset":  # moved off GKE: the VM stage from here on
                    return state, self.execute(context)  # type: ignore[attr-defined]
            elif action == FAIL:
                raise AirflowException(f"stage {self.stage} failed on GKE: {event.get('reason')}")
            elif action == COMPLETE:
                result = self._summary()  # type: ignore[attr-defined]
                self.log.info("Stage %s complete: %s", self.stage, result["final_uri"])
                return state, self._publish(context, result)  # type: ignore[attr-defined]
        return state, None

    def _gke_ask(self, action: str, state: GkeStageState) -> None:
        """Ask the workload for a checkpoint (the control request a VM's notice writes), or send the drill to the VM
        under the pod's node (GKE then shows the maintenance on the node)."""
        if action == REQUEST_CHECKPOINT:
            assert state.request_id
            node = (state.event or {}).get("node")
            self._store.request_checkpoint(state.request_id, reason=f"GKE maintenance notice on {node}")  # type: ignore[attr-defined]
            self.log.info("Checkpoint requested (%s); GKE drains the node at its window", state.request_id)
        else:
            assert state.drill_zone and state.drill_node
            self._send_drill(state.drill_step, state.drill_zone, state.drill_node, "gce_vm")  # type: ignore[attr-defined]

    def _gke_move(self, reason: str) -> None:
        """The pool cannot get its node back: walk the tree again without this place and go there (or fail/wait)."""
        from interlude.capacity.failover import Why
        from interlude.machines.relocate import MoveRefused, move_run

        self.log.warning("Stage %s: %s: looking for another place", self.stage, reason)
        try:
            spec, conn = self.run_spec, self.gcp_conn_id  # type: ignore[attr-defined]
            self.machine = move_run(spec, self.machine, Why.STOCKOUT, self.stage, conn)
        except MoveRefused as exc:
            raise AirflowException(str(exc)) from exc
        self.log.warning(
            "Stage %s continues on %s (node pool %s) from its latest committed checkpoint",
            self.stage,
            self.machine["accelerator_type"],
            self.machine.get("node_pool") or self.machine.get("name"),
        )


async def _first_event(trigger: Any) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AirflowException("the GKE stage trigger ended without an event")
