"""TrainingStageOperator: hand a stage to the machine, then watch it through maintenance to the end.

The operator acts, the trigger observes (see triggers/stage.py, maintenance.py). execute() writes
the stage plan the machine's agent runs (idempotent), then defers. Every event from the trigger
carries the new state and the actions it implies: request a checkpoint, re-provision, record a
maintenance event, complete, fail. After acting, the operator defers again with the new state.
Clearing and re-running the task starts from the checkpoints in GCS, never from step 0.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from interlude import events, provisioning
from interlude.maintenance import Action, Limits, Machine, Phase, StageState, next_step
from interlude.observe import observation, progress_line, read_stage_facts
from interlude.operators.links import CheckpointsLink, MachineConsoleLink
from interlude.spec import RunSpec
from interlude.triggers.stage import StageTrigger
from interlude_workload import layout


class TrainingStageOperator(BaseOperator):
    """Run one stage (train, finetune) of a run on its machine and survive maintenance.

    :param machine: the MachineRecord dict the provisioning task returned (XCom).
    :param drill_maintenance: after the first committed checkpoint, ask Google for a simulated
        maintenance event on the machine (`simulateMaintenanceEvent`): a rehearsal of the real thing.
    """

    template_fields = ("machine", "spec")
    ui_color = "#d9ecff"
    operator_extra_links = (MachineConsoleLink(), CheckpointsLink())

    def __init__(self, *, stage: str, order: int, machine: Any = None, spec: Any = None,
                 init_from_stage: str | None = None, spec_task_id: str = "resolve_run",
                 machine_task_id: str = "provision", gcp_conn_id: str | None = "google_cloud_default",
                 deferrable: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.machine = machine
        self.spec = spec
        self.spec_task_id = spec_task_id
        self.machine_task_id = machine_task_id
        self.stage = stage
        self.order = order
        self.init_from_stage = init_from_stage
        self.gcp_conn_id = gcp_conn_id
        self.deferrable = deferrable

    # Everything else comes from the run's spec (rendered from XCom before execute and on resume).
    @property
    def run_spec(self) -> RunSpec:
        return RunSpec.from_dict(self.spec)

    @property
    def bucket(self) -> str:
        return self.run_spec.bucket

    @property
    def run_key(self) -> str:
        return self.run_spec.run_key

    @property
    def steps(self) -> int:
        return self.run_spec.steps_for(self.stage)

    @property
    def checkpoint_every(self) -> int:
        return self.run_spec.checkpoint_every

    @property
    def poll_interval(self) -> float:
        return self.run_spec.poll_seconds

    @property
    def restart_timeout(self) -> float:
        return self.run_spec.restart_timeout_seconds

    @property
    def drill_maintenance(self) -> bool:
        return self.run_spec.drill_maintenance

    # ------------------------------------------------------------------ helpers
    def _bind(self, context: Any) -> None:
        """Read the run spec and the machine record from their tasks' XCom when not given.

        Pulling here (rather than passing XComArgs) keeps the DAG's graph a straight lifecycle chain
        instead of a fan of data edges from `resolve_run` and `provision` to every later task.
        """
        if self.spec is None:
            self.spec = context["ti"].xcom_pull(task_ids=self.spec_task_id)
        if self.machine is None:
            self.machine = context["ti"].xcom_pull(task_ids=self.machine_task_id)
        if not self.spec or not self.machine:
            raise AirflowException(f"stage {self.stage}: no run spec ({self.spec_task_id}) or machine "
                                   f"({self.machine_task_id}) in XCom; clear the whole run")

    @functools.cached_property
    def _store(self) -> Any:
        """One checkpoint store (and storage client) per operator run; the spec is rendered by now."""
        from interlude_workload.checkpoints import CheckpointStore

        return CheckpointStore(self.bucket, self.run_key, self.stage)

    def _drill_pending(self) -> bool:
        if not self.drill_maintenance:
            return False
        return not self._store.bucket.blob(layout.drill_marker(self.run_key, self.stage)).exists()

    def _trigger(self, state: StageState) -> StageTrigger:
        drill_at = self.checkpoint_every if self._drill_pending() else None
        return StageTrigger(machine=self.machine, bucket=self.bucket, run_key=self.run_key, stage=self.stage,
                            state=state.to_dict(), restart_timeout=self.restart_timeout,
                            poll_interval=self.poll_interval, drill_at_step=drill_at,
                            gcp_conn_id=self.gcp_conn_id)

    def _drill(self) -> None:
        from interlude.hooks.compute import ComputeHook
        from interlude.hooks.tpu import TpuHook

        store = self._store
        store.bucket.blob(layout.drill_marker(self.run_key, self.stage)).upload_from_string(
            '{"drill": "simulateMaintenanceEvent"}', content_type="application/json")
        zone, name = self.machine["zone"], self.machine["name"]
        self.log.info("Maintenance drill: simulateMaintenanceEvent on %s in %s", name, zone)
        if self.machine["kind"] == "gce_vm":
            ComputeHook(gcp_conn_id=self.gcp_conn_id).simulate_maintenance_event(zone, name)
        else:
            TpuHook(gcp_conn_id=self.gcp_conn_id).simulate_maintenance_event(zone, name)

    def _summary(self) -> dict[str, Any]:
        latest = self._store.latest().checkpoint
        if latest is None or latest.step < self.steps:
            raise AirflowException(f"stage {self.stage} reported done but no committed final checkpoint exists")
        return {"stage": self.stage, "steps": self.steps, "final_step": latest.step, "final_uri": latest.uri,
                "metrics": latest.metrics}

    def _act(self, context: Any, payload: dict[str, Any]) -> tuple[StageState, dict[str, Any] | None]:
        """Carry out what the state machine asked for. Returns the state and, when done, the result."""
        state = StageState.from_dict(payload["state"])
        actions = [Action(a) for a in payload.get("actions", [])]
        if payload.get("progress"):
            self.log.info("%s", progress_line(self.stage, payload["progress"]))
        self.log.info("stage %s: %s%s", self.stage, state.phase.value,
                      f" -> {', '.join(a.value for a in actions)}" if actions else "")
        for action in actions:
            if action is Action.REQUEST_CHECKPOINT:
                assert state.request_id
                notice = (state.event or {}).get("notice_type")
                self._store.request_checkpoint(state.request_id, reason=f"maintenance notice ({notice})")
                self.log.info("Maintenance notice (%s, window %s): checkpoint requested (%s)", notice,
                              (state.event or {}).get("window_start"), state.request_id)
            elif action is Action.REPROVISION:
                self.log.warning("Machine %s is gone or did not come back: re-provisioning it", self.machine["name"])
                provisioning.reprovision(self.machine, self.gcp_conn_id)
            elif action is Action.RECORD_EVENT and payload.get("event"):
                uri = events.record_event(self.bucket, self.run_key, self.stage, payload["event"])
                e = payload["event"]
                self.log.info("Maintenance event recorded (%s): checkpoint step %s, downtime %.1fs, steps "
                              "recomputed %s -> %s", e.get("kind"), e.get("checkpoint_step"),
                              float(e.get("downtime_s") or 0), e.get("steps_recomputed"), uri)
            elif action is Action.FAIL:
                raise AirflowException(f"stage {self.stage} failed: {state.failure}")
            elif action is Action.COMPLETE:
                return state, self._summary()
        return state, None

    # ------------------------------------------------------------------ Airflow entry points
    def execute(self, context: Any) -> dict[str, Any]:
        from interlude_workload.plan import StagePlan, write_plan

        self._bind(context)
        spec = self.run_spec
        plan = StagePlan(order=self.order, stage=self.stage, steps=self.steps,
                         checkpoint_every=self.checkpoint_every, seed=spec.seed, step_seconds=spec.step_seconds,
                         init_from_stage=self.init_from_stage,
                         data_date=spec.data_date if self.init_from_stage else None, fresh_token=spec.fresh_token)
        uri = write_plan(self.bucket, self.run_key, plan)
        self.log.info("Stage %s handed to %s (%s): %s", self.stage, self.machine["name"], self.machine["zone"], uri)
        state = StageState(target_step=self.steps)
        if not self.deferrable:
            return self._run_sync(context, state)
        self.defer(trigger=self._trigger(state), method_name="execute_complete")
        raise AssertionError("unreachable")  # defer() raises

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        self._bind(context)
        status = event.get("status")
        if status == "error":
            raise AirflowException(f"stage {self.stage}: watching failed: {event.get('message')}")
        if status == "drill":
            self._drill()
            state = StageState.from_dict(event["state"])
        elif status == "transition":
            state, result = self._act(context, event)
            if result is not None:
                self.log.info("Stage %s complete: %s", self.stage, result["final_uri"])
                return result
        else:
            raise AirflowException(f"stage {self.stage}: unexpected trigger event {event!r}")
        self.defer(trigger=self._trigger(state), method_name="execute_complete")
        raise AssertionError("unreachable")

    def _run_sync(self, context: Any, state: StageState) -> dict[str, Any]:
        """The same observations and decisions as the trigger, on a worker, for deferrable=False."""
        from interlude.hooks.compute import ComputeHook
        from interlude.hooks.tpu import TpuHook

        limits = Limits(restart_timeout=self.restart_timeout)
        zone, name = self.machine["zone"], self.machine["name"]
        if self.machine["kind"] == "gce_vm":
            compute = ComputeHook(gcp_conn_id=self.gcp_conn_id)
            get = lambda: compute.get_instance(zone, name)  # noqa: E731
        else:
            tpu = TpuHook(gcp_conn_id=self.gcp_conn_id)
            get = lambda: tpu.get_node(zone, name)  # noqa: E731
        drill = self._drill_pending()
        while True:
            resource = get()
            facts = read_stage_facts(self.bucket, self.run_key, self.stage, state.request_id)
            if drill and state.phase is Phase.RUNNING and facts.committed_step >= self.checkpoint_every:
                self._drill()
                drill = False
            obs = observation(self.machine["kind"], resource, facts)
            t = next_step(state, obs, limits)
            if t.differs_from(state):
                state, result = self._act(context, {"state": t.state.to_dict(), "actions": [a.value for a in t.actions],
                                                    "event": t.event, "progress": facts.progress})
                if result is not None:
                    return result
            else:
                state = t.state
            if obs.machine is Machine.READY and state.phase is Phase.RUNNING:
                self.log.debug("%s", progress_line(self.stage, facts.progress))
            time.sleep(self.poll_interval)
