"""TrainingStageOperator: hand a stage to the machine, then watch it through maintenance to the end.

The operator acts, the trigger observes (see triggers/stage.py, maintenance.py). execute() writes
the stage plan the machine's agent runs (idempotent), then defers. Every event from the trigger
carries the new state and the actions it implies: request a checkpoint, re-provision, record a
maintenance event, start a pending maintenance early, complete, fail. After acting, the operator defers
again with the new state. How a notice is answered follows the run's ``maintenance_policy`` (see
interlude.stage.notice_wait): a long notice is training time, the last checkpoint lands a measured margin
before the window, and a natural pause starts the maintenance early when Google allows it.
Clearing and re-running the task starts from the checkpoints in GCS, never from step 0.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from interlude.hooks.machines import machine_hooks
from interlude.operators.conventions import default_deferrable
from interlude.operators.gke_stage import GkeStage
from interlude.operators.links import CheckpointsLink, MachineConsoleLink, TimelineLink
from interlude.operators.stage_actions import CapacityWait, StageActions
from interlude.stage.machine import next_step
from interlude.stage.model import Action, Drill, Limits, Observation, Phase, StageState
from interlude.stage.observe import (
    StartupFailure,
    is_outage,
    machine_view,
    observation,
    read_stage_facts,
    startup_failure,
    unknown,
)
from interlude.training.spec import RunSpec
from interlude.triggers.stage import SERIAL_KEEP, WATCH_RETRY, StageTrigger, stage_limits, transition_event
from interlude_workload import layout

MACHINE_FIELDS = ("kind", "name", "zone", "accelerator_type")
"""What a stage's result and the run report's return value say of the machine the run ended on."""


class TrainingStageOperator(GkeStage, StageActions, BaseOperator):
    """Run one stage (train, finetune) of a run on its machine and survive maintenance.

    Steps, checkpoint interval, poll and timeouts come from the RunSpec. Its ``drill_maintenance`` rehearses
    maintenance: the workload commits the drill step (the first periodic checkpoint, before the last step)
    and holds there; the trigger then asks Google for a simulated maintenance event
    (`simulateMaintenanceEvent`), recorded like a real one. A drill that could not run fails the stage
    saying why. ``stall_timeout_seconds`` and ``api_outage_budget_seconds`` bound every wait (interlude.stage.watchdog).
    A run on GKE (its machine record's kind ``gke_jobset``) takes the GKE path instead
    (interlude.operators.gke_stage: the same plan, watched in the run's JobSet through GKE's node maintenance).

    :param stage: the stage's name, e.g. ``train``; names its plan and checkpoints. ``finetune`` is the last.
    :param order: the stage's place in the run (1, 2, ...): the machine's agent runs the plans in this order.
    :param machine: the MachineRecord dict; None pulls ``machine_task_id``'s XCom, followed to where the
        run has moved since (templated).
    :param spec: the RunSpec as a dict; None pulls it from ``spec_task_id``'s XCom (templated).
    :param init_from_stage: a fresh stage starts from this stage's last committed weights (``train`` for
        finetune); None starts from fresh weights. A stage with checkpoints of its own resumes from them.
    :param spec_task_id: the task whose XCom holds the RunSpec.
    :param machine_task_id: the task whose XCom holds the provisioned MachineRecord.
    :param gcp_conn_id: the Google connection for the TPU and Compute APIs (its ``time_scale`` extra scales
        the maintenance policy's Google-real seconds); None: anonymous, no Airflow connection.
    :param deferrable: watch from the triggerer (StageTrigger); False watches on the worker with the same
        decisions. None: ``[operators] default_deferrable``, True if unset.
    """

    template_fields = ("machine", "spec")
    ui_color = "#d9ecff"
    operator_extra_links = (MachineConsoleLink(), CheckpointsLink(), TimelineLink())

    def __init__(
        self,
        *,
        stage: str,
        order: int,
        machine: Any = None,
        spec: Any = None,
        init_from_stage: str | None = None,
        spec_task_id: str = "resolve_run",
        machine_task_id: str = "provision",
        gcp_conn_id: str | None = "google_cloud_default",
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.machine = machine
        self.spec = spec
        self.spec_task_id = spec_task_id
        self.machine_task_id = machine_task_id
        self.stage = stage
        self.order = order
        self.init_from_stage = init_from_stage
        self.gcp_conn_id = gcp_conn_id
        # [operators] default_deferrable when the deployment sets it, True otherwise (operators/conventions.py):
        # a deployment without a triggerer watches stages from the worker instead.
        self.deferrable = default_deferrable() if deferrable is None else deferrable

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

    def limits(self) -> Limits:
        spec = self.run_spec
        return stage_limits(
            spec.restart_timeout_seconds, spec.stall_timeout_seconds, spec.api_outage_budget_seconds, self._policy()
        )

    def _policy(self) -> dict[str, Any] | None:
        """The stage's maintenance policy (None: checkpoint at every notice at once), on this cloud's clock."""
        from interlude.stage.notice_wait import policy_for

        time_scale = machine_hooks(self.gcp_conn_id).tpu.time_scale
        spec = self.run_spec
        policy = policy_for(
            self.machine,
            spec.maintenance_policy,
            time_scale,
            spec.policy_overrides(),
            poll_seconds=spec.poll_seconds,
            stage_follows=not self.last_stage,
        )
        return policy.to_dict() if policy else None

    @property
    def last_stage(self) -> bool:
        """Nothing runs on the machine after this stage (the last of RunSpec.steps_for's stages)."""
        return self.stage == "finetune"

    # ------------------------------------------------------------------ helpers
    def _bind(self, context: Any) -> None:
        """Read the run spec and the machine record from their tasks' XCom when not given.

        Pulling here (rather than passing XComArgs) keeps the DAG's graph a straight lifecycle chain
        instead of a fan of data edges from `resolve_run` and `provision` to every later task.
        """
        if self.spec is None:
            self.spec = context["ti"].xcom_pull(task_ids=self.spec_task_id)
        if self.machine is None:
            from interlude.machines.relocate import current_machine

            provisioned = context["ti"].xcom_pull(task_ids=self.machine_task_id)
            self.machine = current_machine(self.run_spec, provisioned) if self.spec else provisioned
        if not self.spec or not self.machine:
            raise AirflowException(
                f"stage {self.stage}: no run spec ({self.spec_task_id}) or machine "
                f"({self.machine_task_id}) in XCom; clear the whole run"
            )

    @functools.cached_property
    def _store(self) -> Any:
        """One checkpoint store (and storage client) per operator run; the spec is rendered by now."""
        from interlude_workload.checkpoints import CheckpointStore

        return CheckpointStore(self.bucket, self.run_key, self.stage)

    def _drill_step(self) -> int | None:
        """The step the workload holds at for the drill (None: no drill, or this stage already drilled).

        The first periodic checkpoint, but always before the last step: the stage must reach it and
        still have steps to resume after the maintenance.
        """
        if not self.drill_maintenance:
            return None
        if self._store.bucket.blob(layout.drill_marker(self.run_key, self.stage)).exists():
            return None
        if self.steps < 2:
            raise AirflowException(
                f"stage {self.stage}: drill_maintenance needs at least 2 steps (a step to hold "
                f"at before the last); this stage has {self.steps}"
            )
        return min(self.checkpoint_every, self.steps - 1)

    def _plan(self, hold_at_step: int | None) -> Any:
        from interlude_workload.plan import StagePlan

        spec = self.run_spec
        return StagePlan(
            order=self.order,
            stage=self.stage,
            steps=self.steps,
            checkpoint_every=self.checkpoint_every,
            seed=spec.seed,
            step_seconds=spec.step_seconds,
            init_from_stage=self.init_from_stage,
            data_date=spec.data_date if self.init_from_stage else None,
            fresh_token=spec.fresh_token,
            hold_at_step=hold_at_step,
            model_size=spec.model_size,
            command=list(spec.workload_command) or None,
            **self._hold_margins(),
        )

    def _hold_margins(self) -> dict[str, float | None]:
        """The workload holds where the policy puts the last checkpoint (see interlude.stage.notice_wait)."""
        from interlude.stage.notice_policy import NoticePolicy
        from interlude.stage.notice_wait import workload_margins

        seconds, commits = workload_margins(NoticePolicy.from_dict(self._policy()))
        return {"hold_margin_seconds": seconds, "hold_margin_commits": commits}

    def _trigger(self, state: StageState) -> StageTrigger:
        spec = self.run_spec
        return StageTrigger(
            machine=self.machine,
            bucket=self.bucket,
            run_key=self.run_key,
            stage=self.stage,
            state=state.to_dict(),
            restart_timeout=self.restart_timeout,
            poll_interval=self.poll_interval,
            stall_timeout=spec.stall_timeout_seconds,
            api_outage_budget=spec.api_outage_budget_seconds,
            gcp_conn_id=self.gcp_conn_id,
            notice_policy=self._policy(),
        )

    @property
    def awaits_export(self) -> bool:
        """Whether this stage is done only with its Hugging Face export in (the reference trainer's fine-tune)."""
        from interlude_workload import hf_export

        return hf_export.exports(self.stage, self.run_spec.workload_command)

    def _summary(self) -> dict[str, Any]:
        latest = self._store.latest().checkpoint
        if latest is None or latest.step < self.steps:
            raise AirflowException(f"stage {self.stage} reported done but no committed final checkpoint exists")
        from interlude_workload import hf_export

        marker = hf_export.read_marker(self._store.client, self.bucket, self.run_key, self.stage)
        export = (
            hf_export.uri(self.bucket, self.run_key, self.stage) if marker and marker["step"] == latest.step else None
        )
        return {
            "stage": self.stage,
            "steps": self.steps,
            "final_step": latest.step,
            "final_uri": latest.uri,
            "metrics": latest.metrics,
            **({"export_uri": export} if export else {}),
            # Where the stage finished: a failover may have moved it off `provision`'s machine (the Runs page's zone).
            "machine": {k: self.machine.get(k) for k in MACHINE_FIELDS},
        }

    def _publish(self, context: Any, result: dict[str, Any]) -> dict[str, Any]:
        """The committed final checkpoint into this task's checkpoint Asset outlets (interlude.training.assets): Airflow
        records the event when the task succeeds, and DAGs scheduled on the Asset (serving) follow."""
        from interlude.training.assets import CheckpointEvent, publish

        event = CheckpointEvent(
            result["final_uri"], int(result["final_step"]), self.run_key, self.stage, result.get("export_uri")
        )
        for name in publish(context["outlet_events"], self.outlets, event):
            self.log.info(
                "Asset %s: checkpoint %s (step %d), Hugging Face export %s",
                name,
                event.checkpoint_uri,
                event.step,
                event.export_uri or "none (the workload wrote none: serving needs one)",
            )
        return result

    def _act(self, context: Any, payload: dict[str, Any]) -> tuple[StageState, dict[str, Any] | None]:
        """Carry out what the state machine asked for. Returns the state and, when done, the result."""
        state = StageState.from_dict(payload["state"])
        actions = [Action(a) for a in payload.get("actions", [])]
        if payload.get("progress_line"):
            self.log.info("%s", payload["progress_line"])
        self.log.info(
            "stage %s: %s%s",
            self.stage,
            state.phase.value,
            f" -> {', '.join(a.value for a in actions)}" if actions else "",
        )
        if state.phase is Phase.NOTICED and not actions:
            self._log_notice_plan(state)
        simple = {
            Action.REQUEST_CHECKPOINT: self._request_checkpoint,
            Action.START_MAINTENANCE: self._start_maintenance,
            Action.DRILL: self._drill,
            Action.RESTART_WORKLOAD: self._restart_workload,
        }
        for action in actions:
            if action in simple:
                simple[action](state)
            elif action is Action.REPROVISION:
                self._reprovision((state.event or {}).get("reprovision_reason"))
            elif action is Action.RECORD_EVENT and payload.get("event"):
                self._record(payload["event"], payload.get("watcher"))
            elif action is Action.FAIL:
                raise AirflowException(
                    f"stage {self.stage} failed: {state.failure}\n{self._log_tail(payload.get('log_tail'))}"
                )
            elif action is Action.COMPLETE:
                return state, self._summary()
        return state, None

    # ------------------------------------------------------------------ Airflow entry points
    def execute(self, context: Any) -> dict[str, Any]:
        from interlude_workload.plan import write_plan

        self._bind(context)
        if self.machine.get("kind") == "gke_jobset":  # a JobSet on GKE: interlude.operators.gke_stage
            return self.execute_gke(context)
        drill_step = self._drill_step()
        uri = write_plan(self.bucket, self.run_key, self._plan(drill_step))
        self.log.info(
            "Stage %s handed to %s (%s): %s%s",
            self.stage,
            self.machine["name"],
            self.machine["zone"],
            uri,
            f" (maintenance drill at step {drill_step})" if drill_step else "",
        )
        state = StageState(
            target_step=self.steps,
            drill=Drill.PENDING if drill_step else None,
            drill_step=drill_step,
            awaits_export=self.awaits_export,
        )
        if not self.deferrable:
            return self._run_sync(context, state)
        self.defer(trigger=self._trigger(state), method_name="execute_complete")
        raise AssertionError("unreachable")  # defer() raises

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        self._bind(context)
        status = event.get("status")
        if status == "error":
            raise AirflowException(f"stage {self.stage}: watching failed: {event.get('message')}")
        if status != "transition":
            raise AirflowException(f"stage {self.stage}: unexpected trigger event status {status!r}")
        try:
            state, result = self._act(context, event)
        except CapacityWait as wait:
            self._wait_for_capacity(StageState.from_dict(event["state"]), wait, since=time.time())
        if result is not None:
            self.log.info("Stage %s complete: %s", self.stage, result["final_uri"])
            return self._publish(context, result)
        self.defer(trigger=self._trigger(state), method_name="execute_complete")
        raise AssertionError("unreachable")

    def _run_sync(self, context: Any, state: StageState) -> dict[str, Any]:
        """The same observations and decisions as the trigger, on a worker, for deferrable=False."""
        from interlude.hooks._retry import RetryPolicy

        policy = RetryPolicy(**WATCH_RETRY)
        trigger = self._trigger(state)
        limits = self.limits()
        zone, name = self.machine["zone"], self.machine["name"]
        tpu, compute = machine_hooks(self.gcp_conn_id)
        tpu.retry_policy = compute.retry_policy = policy
        serial = SyncSerial(compute, zone, name) if self.machine["kind"] == "gce_vm" else None
        get = (lambda: compute.get_instance(zone, name)) if serial else (lambda: tpu.get_node(zone, name))
        while True:
            obs, progress = self._observe_sync(get, serial, state, trigger)
            t = next_step(state, obs, limits)
            if t.differs_from(state):
                payload = transition_event(self.stage, t, progress, serial.text if serial else "", obs)
                try:
                    state, result = self._act(context, payload)
                except CapacityWait as wait:
                    self._wait_for_capacity_sync(wait)
                    state, result = t.state, None
                if result is not None:
                    return self._publish(context, result)
            else:
                state = t.state
            time.sleep(self.poll_interval)

    def _observe_sync(
        self, get: Any, serial: SyncSerial | None, state: StageState, trigger: StageTrigger
    ) -> tuple[Observation, dict[str, Any]]:
        try:
            resource = get()
            facts = read_stage_facts(
                self.bucket, self.run_key, self.stage, state.request_id, self.steps if state.awaits_export else None
            )
            machine, _ = machine_view(self.machine["kind"], resource)
            failure = serial.failure() if serial and trigger.suspect(state, machine, time.time()) else None
            return observation(self.machine["kind"], resource, facts, failure=failure), facts.progress
        except Exception as exc:
            if not is_outage(exc):
                raise
            self.log.warning("[%s] the control plane did not answer (%s); riding it out", self.stage, exc)
            return unknown(time.time(), f"{type(exc).__name__}: {exc}"[:300]), {}


class SyncSerial:
    """A GCE VM's serial console, read incrementally (the sync twin of the trigger's reader)."""

    def __init__(self, compute: Any, zone: str, name: str) -> None:
        self.compute, self.url = compute, f"{compute.instances_url(zone)}/{name}/serialPort"
        self.text, self.next = "", 0

    def failure(self) -> StartupFailure | None:
        out = self.compute.rest.request("GET", self.url, params={"start": str(self.next)})
        self.text = (self.text + str(out.get("contents") or ""))[-SERIAL_KEEP:]
        self.next = int(out.get("next") or self.next)
        return startup_failure(self.text)
