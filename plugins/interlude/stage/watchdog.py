"""The stage's watchdog rules: never wait forever on a paid machine, never fail on a blip.

Pure functions over (StageState, Observation), used by :func:`interlude.stage.machine.next_step`:

* **stall** - a READY machine (no drill in flight) whose workload shows no change (boot, step,
  state, checkpoint) for ``stall_timeout`` seconds (plus NOTICE_GRACE while a maintenance notice is
  up, when holding is right): restart the workload once, then fail. The clock is the control
  plane's own (when it last *saw* a change), so a machine with a wrong clock cannot hide a stall.
* **startup failure** - the startup script said it ended (serial console): restart once, then fail.
* **outage** - the control plane (the cloud's API or GCS) did not answer: nothing is known about
  the workload, which usually keeps running. Ride it out; fail only when the budget is spent.
* **drill** - the workload holds at the drill step; send simulateMaintenanceEvent then; a drill
  that shows no maintenance within ``drill_timeout`` fails the stage saying so.
"""

from __future__ import annotations

from dataclasses import replace

from interlude.stage.model import Action, Drill, Limits, Machine, Observation, Phase, StageState, Transition
from interlude.stage.transitions import fail, open_event


def outage(state: StageState, obs: Observation, limits: Limits) -> Transition:
    since = state.outage_since if state.outage_since is not None else obs.now
    if obs.now - since > limits.api_outage_budget:
        return fail(
            state,
            f"the control plane did not answer for {obs.now - since:.0f}s "
            f"(api_outage_budget_seconds={limits.api_outage_budget:.0f}); last error: {obs.api_error}. "
            "The machine may still be running: teardown deletes it",
        )
    return Transition(replace(state, outage_since=since))


def answered(state: StageState) -> StageState:
    """The control plane answered again: the outage is over, and the stall clock starts afresh
    (the workload could not report while GCS was down)."""
    if state.outage_since is None:
        return state
    return replace(state, outage_since=None, progress_seen_at=None)


def _mark(obs: Observation) -> str:
    return f"{obs.boot_id}|{obs.progress_step}|{obs.workload_state}|{obs.committed_step}"


NOTICE_GRACE = 3600.0
"""Extra stall allowance while a maintenance notice is up: the workload may hold at a committed step
until the window opens (Google gives GPU VMs 60 minutes of notice,
https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance)."""


def track_progress(state: StageState, obs: Observation) -> StageState:
    """Restart the stall clock on any visible change, and whenever the machine is not READY to work."""
    drill_in_flight = state.drill is Drill.SENT and state.event is None  # the drill timeout governs
    quiet = obs.machine is Machine.READY and not drill_in_flight
    mark = _mark(obs)
    if not quiet or mark != state.progress_mark or state.progress_seen_at is None:
        return replace(state, progress_mark=mark, progress_seen_at=obs.now)
    return state


def _restart_or_fail(state: StageState, obs: Observation, why: str, failure_id: str | None) -> Transition:
    if state.workload_restarts >= 1:
        return fail(state, f"{why}, also after restarting the workload once")
    event = {**open_event("workload_restart", obs, state, None), "reason": why}
    new = replace(
        state,
        phase=Phase.RECOVERING,
        event=event,
        request_id=None,
        workload_restarts=state.workload_restarts + 1,
        restarted_for=failure_id,
        progress_seen_at=obs.now,
    )
    return Transition(new, (Action.RESTART_WORKLOAD,))


def guard(state: StageState, obs: Observation, limits: Limits) -> Transition | None:
    """Stall, startup failure and the drill, checked before the phase's own rules; None = nothing to do."""
    if obs.machine is not Machine.READY:
        return None
    if obs.startup_failure and obs.notice is None and obs.startup_boot != state.restarted_for:
        return _restart_or_fail(
            state, obs, f"the machine's startup script ended: {obs.startup_failure}", obs.startup_boot
        )
    stalled = obs.now - (obs.now if state.progress_seen_at is None else state.progress_seen_at)
    if stalled > limits.stall_timeout + (NOTICE_GRACE if obs.notice is not None else 0.0):
        why = (
            f"no progress for {stalled:.0f}s on a READY machine (stall_timeout_seconds="
            f"{limits.stall_timeout:.0f}; the workload last showed step {obs.progress_step}, "
            f"state {obs.workload_state})"
        )
        return _restart_or_fail(state, obs, why, state.restarted_for)
    return _drill(state, obs, limits)


def _drill(state: StageState, obs: Observation, limits: Limits) -> Transition | None:
    if state.drill is Drill.PENDING and state.phase is Phase.RUNNING and obs.notice is None:
        step = state.drill_step or 0
        held = obs.workload_state == "holding" and obs.committed_step >= step and obs.progress_step >= step
        if held or obs.progress_step > step:  # a workload that cannot hold gets the drill as soon as it passes
            return Transition(replace(state, drill=Drill.SENT, drill_sent_at=obs.now), (Action.DRILL,))
    if state.drill is Drill.SENT and state.event is None and state.drill_sent_at is not None:
        waited = obs.now - state.drill_sent_at
        if waited > limits.drill_timeout:
            return fail(
                state,
                f"the drill did not happen: simulateMaintenanceEvent was sent at step "
                f"{state.drill_step} but no maintenance showed within {waited:.0f}s",
            )
    return None


def mark_drill(before: StageState, t: Transition) -> Transition:
    """An event opened (or recorded at once) after the drill was sent is the drill's event; it keeps when the drill
    was sent, where the workload's hold for it began to cost (interlude.training.badput's ``drill_hold``)."""
    if before.drill is not Drill.SENT:
        return t
    if t.state.event is not None and before.event is None:
        event = {**t.state.event, "drill": True, "drill_step": before.drill_step, "drill_sent_at": before.drill_sent_at}
        if event["kind"] in ("no_notice_loss", "unobserved_restart"):
            event["kind"] = "maintenance"
        return replace(t, state=replace(t.state, event=event, drill=Drill.DONE))
    if t.event is not None:
        event = {**t.event, "drill": True, "drill_step": before.drill_step, "drill_sent_at": before.drill_sent_at}
        if event["kind"] in ("no_notice_loss", "unobserved_restart"):
            event["kind"] = "maintenance"
        return replace(t, state=replace(t.state, drill=Drill.DONE), event=event)
    return t
