"""The training stage as a state machine: what to do next, given what the cloud and GCS show now.

Pure and JSON-shaped on purpose. The trigger only observes (machine status, maintenance notice,
checkpoints, progress, the serial console) and the operator only acts (request a checkpoint,
restart the workload, re-provision, send a drill, record an event); this module is the decision in
between. Because the whole state travels in the trigger's arguments and every decision is
re-derived from a fresh observation, a triggerer restart or a duplicate trigger copy lands on the
same answer instead of trusting memory.

    RUNNING --notice--> [NOTICED --checkpoint due-->] CHECKPOINT_REQUESTED --committed--> AWAITING_RESTART
    --machine back--> RESUMING --progress past the checkpoint--> RUNNING ... --final step committed--> DONE
    (a stage that exports: --final step and its export committed--> DONE; its export failing after the final
    commit is the workload's error: FAILED with the final step kept)
    RUNNING --machine down, no notice--> RECOVERING (restart or re-provision) --> RESUMING
    any --no progress on a READY machine / startup script failed--> restart once, then FAILED
    any --control plane silent--> (same phase) until the outage budget is spent, then FAILED

The watchdog rules (stall, startup failure, outage, drill) live in :mod:`interlude.stage.watchdog`.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from interlude.stage import notice_wait, watchdog
from interlude.stage.model import Action, Drill, Limits, Machine, Observation, Phase, StageState, Transition
from interlude.stage.notice_policy import Pause
from interlude.stage.transitions import close, down, fail, maybe_reprovision, open_event, rebooted, resumed


def _finish(state: StageState, obs: Observation, limits: Limits) -> Transition:
    if state.drill in (Drill.PENDING, Drill.SENT):
        why = (
            "the drill could not run: the stage reached its final step before the workload held at drill "
            f"step {state.drill_step}"
            if state.drill is Drill.PENDING
            else f"the drill did not happen: simulateMaintenanceEvent was sent at step {state.drill_step} but no "
            "maintenance showed before the stage finished"
        )
        return fail(state, why)
    actions: tuple[Action, ...] = (Action.COMPLETE,)
    event = None
    if state.phase is Phase.NOTICED:  # the window is still ahead: it belongs to what runs next
        state = replace(state, event=None)
    if state.event is None and notice_wait.start_early(obs, limits, Pause.PHASE_BOUNDARY):
        early = notice_wait.boundary_event(state, obs)
        return Transition(
            replace(state, phase=Phase.DONE), (Action.START_MAINTENANCE, Action.RECORD_EVENT, Action.COMPLETE), early
        )
    if state.event is not None:  # the last stretch finished while an event was open
        closing = close(state, replace(obs, resumed_from=obs.resumed_from or obs.committed_step))
        actions, event = (Action.RECORD_EVENT, Action.COMPLETE), closing.event
    return Transition(replace(state, phase=Phase.DONE, event=None), actions, event)


def _track(state: StageState, obs: Observation) -> StageState:
    same_boot = state.boot_id is None or obs.boot_id == state.boot_id
    if obs.machine is Machine.READY and same_boot and state.phase not in (Phase.RESUMING, Phase.RECOVERING):
        state = replace(
            state, last_step_seen=max(state.last_step_seen, obs.progress_step), boot_id=state.boot_id or obs.boot_id
        )
    return state


def next_step(state: StageState, obs: Observation, limits: Limits) -> Transition:
    """Decide what the operator does after this observation. No action = keep watching."""
    if state.phase in (Phase.DONE, Phase.FAILED):
        return Transition(state)
    if obs.machine is Machine.UNKNOWN:
        return watchdog.outage(state, obs, limits)
    state = watchdog.answered(state)
    if state.finished(obs.committed_step, obs.export_committed):
        return _finish(state, obs, limits)
    if obs.workload_error:
        return fail(state, f"the workload failed: {obs.workload_error}")
    state = watchdog.track_progress(_track(state, obs), obs)
    guarded = watchdog.guard(state, obs, limits)
    if guarded is not None:
        return guarded
    return watchdog.mark_drill(state, _phase_step(state, obs, limits))


def _phase_step(state: StageState, obs: Observation, limits: Limits) -> Transition:
    phase = state.phase
    if phase is Phase.RUNNING:
        return _running(state, obs, limits)
    if phase is Phase.NOTICED:
        return notice_wait.noticed(state, obs, limits)
    if phase is Phase.CHECKPOINT_REQUESTED:
        return _checkpoint_requested(state, obs, limits)
    if phase is Phase.AWAITING_RESTART:
        return _awaiting_restart(state, obs, limits)
    # RESUMING or RECOVERING: wait for the workload to step past the checkpoint it resumed from.
    if resumed(state, obs):
        return close(state, obs)
    if obs.machine is not Machine.READY:
        return maybe_reprovision(down(state, obs), obs, limits)
    return Transition(state)


def _running(state: StageState, obs: Observation, limits: Limits) -> Transition:
    if obs.notice is not None and obs.machine is not Machine.GONE:
        rid = uuid.uuid4().hex[:12]
        event = open_event("maintenance", obs, state, obs.notice)
        if obs.machine is Machine.READY:
            waiting = notice_wait.on_notice(state, obs, limits, event)
            if waiting is not None:
                return waiting
        new = replace(state, phase=Phase.CHECKPOINT_REQUESTED, request_id=rid, event=event)
        if obs.machine is Machine.DOWN:  # notice shorter than one poll: already going down
            new = down(replace(new, phase=Phase.AWAITING_RESTART), obs)
        return Transition(new, (Action.REQUEST_CHECKPOINT,))
    if obs.machine is not Machine.READY:
        kind = "preemption" if obs.machine is Machine.GONE else "no_notice_loss"
        event = open_event(kind, obs, state, None)
        new = down(replace(state, phase=Phase.RECOVERING, event=event), obs)
        return maybe_reprovision(new, obs, limits)
    if rebooted(state, obs):
        # The machine went down and came back between two polls (or while no trigger watched):
        # re-derive the event from what the workload says about its boots.
        event = open_event("unobserved_restart", obs, state, None)
        event.update(step_at_detection=state.last_step_seen, down_at=None)
        opened = replace(state, event=event, phase=Phase.RESUMING)
        return close(opened, obs) if resumed(opened, obs) else Transition(opened)
    return Transition(state)


def _checkpoint_requested(state: StageState, obs: Observation, limits: Limits) -> Transition:
    if obs.machine is Machine.READY and rebooted(state, obs):
        # Down and back between two polls: whatever answered our request after the reboot is not this
        # event's checkpoint; the workload's resume point is (see _close).
        new = replace(state, phase=Phase.RESUMING, event={**(state.event or {}), "checkpoint_step": None})
        return close(new, obs) if resumed(new, obs) else Transition(new)
    if obs.request_ack_step is not None:
        event = {
            **(state.event or {}),
            "checkpoint_step": obs.request_ack_step,
            # The workload's answer time, not this poll's (a poll is up to an interval late); never after the poll.
            "checkpoint_committed_at": min(obs.request_ack_at or obs.now, obs.now),
            "checkpoint_write_s": obs.commit_seconds,  # the workload's own measure (interlude.training.badput)
        }
        new = replace(state, phase=Phase.AWAITING_RESTART, event=event)
        if obs.machine is not Machine.READY:
            return Transition(down(new, obs))
        if notice_wait.start_early(obs, limits, Pause.AFTER_CHECKPOINT):
            return Transition(replace(new, event={**event, "early_start_at": obs.now}), (Action.START_MAINTENANCE,))
        return Transition(new)
    if obs.machine is not Machine.READY:
        # Down before our request was answered: the workload's own notice/SIGTERM checkpoint
        # (or the last periodic one) is what it will resume from.
        event = {**(state.event or {}), "checkpoint_step": obs.committed_step}
        return Transition(down(replace(state, phase=Phase.AWAITING_RESTART, event=event), obs))
    return Transition(state)


def _awaiting_restart(state: StageState, obs: Observation, limits: Limits) -> Transition:
    if obs.machine is Machine.READY and (obs.notice is None or rebooted(state, obs)):
        new = replace(state, phase=Phase.RESUMING, event={**(state.event or {}), "up_at": obs.now})
        if rebooted(state, obs) and not (state.event or {}).get("down_at"):
            new = replace(new, event={**(new.event or {}), "up_at": None})  # from the workload (see _close)
        return close(new, obs) if resumed(new, obs) else Transition(new)
    if obs.machine is not Machine.READY:
        return maybe_reprovision(down(state, obs), obs, limits)
    if notice_wait.start_early_on_hold(state, obs, limits):  # it holds now, after training on past our checkpoint
        return Transition(
            replace(state, event={**(state.event or {}), "early_start_at": obs.now}), (Action.START_MAINTENANCE,)
        )
    return Transition(state)
