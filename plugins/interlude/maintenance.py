"""The training stage as a state machine: what to do next, given what the cloud and GCS show now.

Pure and JSON-shaped on purpose. The trigger only observes (machine status, maintenance notice,
checkpoints, progress, the serial console) and the operator only acts (request a checkpoint,
restart the workload, re-provision, send a drill, record an event); this module is the decision in
between. Because the whole state travels in the trigger's arguments and every decision is
re-derived from a fresh observation, a triggerer restart or a duplicate trigger copy lands on the
same answer instead of trusting memory.

    RUNNING --notice--> [NOTICED --checkpoint due-->] CHECKPOINT_REQUESTED --committed--> AWAITING_RESTART
    --machine back--> RESUMING --progress past the checkpoint--> RUNNING ... --final step committed--> DONE
    RUNNING --machine down, no notice--> RECOVERING (restart or re-provision) --> RESUMING
    any --no progress on a READY machine / startup script failed--> restart once, then FAILED
    any --control plane silent--> (same phase) until the outage budget is spent, then FAILED

The watchdog rules (stall, startup failure, outage, drill) live in :mod:`interlude.watchdog`.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any


class Phase(StrEnum):
    RUNNING = "RUNNING"
    NOTICED = "NOTICED"  # a long notice: training goes on until the checkpoint is due (interlude.notice_wait)
    CHECKPOINT_REQUESTED = "CHECKPOINT_REQUESTED"
    AWAITING_RESTART = "AWAITING_RESTART"
    RESUMING = "RESUMING"
    RECOVERING = "RECOVERING"
    DONE = "DONE"
    FAILED = "FAILED"


class Machine(StrEnum):
    """What the control plane can tell about the machine, folded to what matters here."""

    READY = "READY"  # running and healthy: the workload can make progress
    DOWN = "DOWN"  # exists but not ready: unhealthy, REPAIRING, STOPPED, TERMINATED, ONGOING, booting
    GONE = "GONE"  # will not come back by itself: deleted, TPU PREEMPTED, spot VM terminated
    UNKNOWN = "UNKNOWN"  # the control plane (API or GCS) did not answer this poll


class Action(StrEnum):
    REQUEST_CHECKPOINT = "request_checkpoint"
    RESTART_WORKLOAD = "restart_workload"
    REPROVISION = "reprovision"
    DRILL = "drill"
    START_MAINTENANCE = "start_maintenance"  # performMaintenance: start the pending window now
    RECORD_EVENT = "record_event"
    COMPLETE = "complete"
    FAIL = "fail"


class Drill(StrEnum):
    PENDING = "pending"  # asked for; waiting for the workload to hold at the drill step
    SENT = "sent"  # simulateMaintenanceEvent sent; waiting for the maintenance to show
    DONE = "done"  # a maintenance event was opened after the drill was sent


@dataclass(frozen=True)
class Notice:
    kind: str  # SCHEDULED | UNSCHEDULED | ...
    status: str  # PENDING | ONGOING
    window_start: str | None = None
    window_end: str | None = None
    can_reschedule: bool = False


@dataclass(frozen=True)
class Observation:
    """One poll's worth of facts, taken fresh from the cloud and GCS."""

    now: float
    machine: Machine
    notice: Notice | None
    committed_step: int  # latest committed, verified checkpoint of this stage (0 = none)
    progress_step: int  # the workload's latest reported step (0 = none yet)
    resumed_from: int | None = None  # step the running workload resumed from at its current boot
    boot_id: str | None = None  # the machine's boot the workload runs in (changes on every boot)
    request_ack_step: int | None = None  # committed step answering our checkpoint request
    request_ack_at: float | None = None  # when the workload answered it (its own clock)
    workload_error: str | None = None  # the workload gave up (bad input, crash loop): retrying cannot help
    workload_state: str | None = None  # running | holding | stopped | ... as the workload reports it
    boot_started_at: float | None = None  # when the workload's current boot started (its own clock)
    previous_boot_ended_at: float | None = None  # last report of the boot before (its own clock)
    startup_failure: str | None = None  # the startup script's last words, when it ended on this boot
    startup_boot: str | None = None  # which boot that failure belongs to (its "begin" line)
    api_error: str | None = None  # why the machine is UNKNOWN
    commit_seconds: float | None = None  # what getting a checkpoint committed costs (a step + a commit)
    progress_at: float | None = None  # when the workload wrote the progress seen (its own clock)
    mean_step_seconds: float | None = None  # its mean step time on this boot, by its own clock


@dataclass(frozen=True)
class StageState:
    target_step: int
    phase: Phase = Phase.RUNNING
    request_id: str | None = None
    event: dict[str, Any] | None = None  # the maintenance event being handled, if any
    last_step_seen: int = 0  # highest progress step seen while the machine was up
    boot_id: str | None = None
    reprovisions: int = 0
    failure: str | None = None
    # watchdog bookkeeping (see interlude.watchdog)
    progress_mark: str | None = None  # what the workload last showed (boot, step, state)
    progress_seen_at: float | None = None  # when that mark last changed, on the control plane's clock
    workload_restarts: int = 0
    restarted_for: str | None = None  # the startup failure already acted on
    outage_since: float | None = None
    drill: Drill | None = None
    drill_step: int | None = None
    drill_sent_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageState:
        drill = data.get("drill")
        return cls(**{**data, "phase": Phase(data["phase"]), "drill": Drill(drill) if drill else None})


BOOKKEEPING: dict[str, Any] = {
    "last_step_seen": 0,
    "progress_mark": None,
    "progress_seen_at": None,
    "outage_since": None,
}
"""Fields that change on ordinary polls: the trigger carries them, they never call the operator."""
_DECIDING = tuple(f.name for f in fields(StageState) if f.name not in BOOKKEEPING)


@dataclass(frozen=True)
class Limits:
    restart_timeout: float  # without a notice policy: seconds a machine may stay down before re-provisioning
    max_reprovisions: int = 3
    stall_timeout: float = 600.0  # seconds a READY machine may show no progress
    api_outage_budget: float = 900.0  # seconds the control plane may stay silent
    drill_timeout: float = 600.0  # seconds from simulateMaintenanceEvent to a visible maintenance
    notice_policy: Any = None  # interlude.notice_wait.NoticePolicy; None: checkpoint at every notice at once


@dataclass(frozen=True)
class Transition:
    state: StageState
    actions: tuple[Action, ...] = ()
    event: dict[str, Any] | None = None  # a finished event to record (with RECORD_EVENT)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def differs_from(self, before: StageState) -> bool:
        """Worth telling the operator: something to do, or a state to carry into the next trigger.

        Bookkeeping alone (the running step count, the stall clock, an outage being ridden out) is
        not: it changes every poll and the trigger carries it.
        """
        # Field by field (what comparing both with the bookkeeping blanked out would say, without building two
        # states: this runs at every poll of every watched stage, ~100 times a second for 1,000 of them).
        if self.actions:
            return True
        return self.state is not before and tuple(getattr(self.state, n) for n in _DECIDING) != tuple(
            getattr(before, n) for n in _DECIDING
        )


def fail(state: StageState, why: str) -> Transition:
    return Transition(replace(state, phase=Phase.FAILED, failure=why), (Action.FAIL,))


def rebooted(state: StageState, obs: Observation) -> bool:
    """The workload reports from another boot than the one this state last saw."""
    return obs.boot_id is not None and state.boot_id is not None and obs.boot_id != state.boot_id


def open_event(kind: str, obs: Observation, state: StageState, notice: Notice | None) -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4().hex[:12],
        "kind": kind,
        "notice_type": notice.kind if notice else None,
        "window_start": notice.window_start if notice else None,
        "window_end": notice.window_end if notice else None,
        "detected_at": obs.now,
        "step_at_detection": max(state.last_step_seen, obs.progress_step),
        "committed_at_detection": obs.committed_step,
        "checkpoint_step": None,
        "checkpoint_committed_at": None,
        "down_at": None,
        "up_at": None,
        "reprovisioned": False,
    }


def _resumed(state: StageState, obs: Observation) -> bool:
    """The workload runs again on a new boot and has stepped past the point it resumed from."""
    if obs.machine is not Machine.READY or obs.resumed_from is None:
        return False
    if obs.boot_id is not None and obs.boot_id != state.boot_id:
        return obs.progress_step > obs.resumed_from
    # Same boot and never seen down: the maintenance passed without stopping the workload. Not after a
    # restart we asked for: that always makes a new boot, and until it reports the old boot's words remain.
    # Nor when the workload says it was stopped (SIGTERM) or holds: the maintenance did reach it, only
    # faster than a poll could see; its next boot tells.
    event = state.event or {}
    if event.get("kind") == "workload_restart" or obs.workload_state not in (None, "running"):
        return False
    return event.get("down_at") is None and obs.progress_step > (event.get("checkpoint_step") or 0)


def _close(state: StageState, obs: Observation) -> Transition:
    """Finish the open event from what the workload itself says about its boots.

    When the machine rebooted, the checkpoint that mattered is the one the new boot resumed from, and the
    event's times are the workload's own (interlude.badput.workload_times): its old boot's last report, its
    new boot's start, its first step after the resume. A poll sees each of them up to a poll interval (and a
    trigger round trip) late, so the polls only bound them.
    """
    from interlude.badput import workload_times

    event = dict(state.event or {})
    resumed_from = obs.resumed_from or 0
    reached = max(event.get("step_at_down") or 0, event.get("step_at_detection") or 0)
    new_boot = obs.boot_id is not None and obs.boot_id != state.boot_id
    if new_boot:
        event["checkpoint_step"] = resumed_from
        if event.get("down_at") is None and obs.previous_boot_ended_at:
            event.update(down_seen_by="workload", step_at_down=max(event.get("step_at_down") or 0, reached))
    event.update(
        workload_times(
            event,
            obs.now,
            stopped=obs.previous_boot_ended_at if new_boot else None,
            booted=obs.boot_started_at if new_boot else None,
            stepping=_stepping_since(obs, resumed_from) if new_boot else None,
        )
    )
    event.update(resumed_from_step=resumed_from, boot_id=obs.boot_id, steps_recomputed=max(0, reached - resumed_from))
    new = replace(
        state, phase=Phase.RUNNING, event=None, request_id=None, boot_id=obs.boot_id, last_step_seen=obs.progress_step
    )
    return Transition(new, (Action.RECORD_EVENT,), event)


def _stepping_since(obs: Observation, resumed_from: int) -> float | None:
    """When the new boot started stepping, by the workload's clock: the time of its progress less the steps since
    its resume at its mean step time (the SDK measures that mean from this boot's first step). Later than the truth
    by at most one step, plus whatever the workload reported after that step (a commit's write)."""
    if obs.progress_at is None or obs.progress_step <= resumed_from:
        return None
    return obs.progress_at - (obs.mean_step_seconds or 0.0) * (obs.progress_step - resumed_from + 1)


def down(state: StageState, obs: Observation) -> StageState:
    event = dict(state.event or {})
    if event.get("down_at") is None:
        event["down_at"] = obs.now
        event["step_at_down"] = state.last_step_seen
    return replace(state, event=event)


def _maybe_reprovision(state: StageState, obs: Observation, limits: Limits) -> Transition:
    """Provision another machine only when Google says this one is gone or it is still away at the deadline
    (the window's end with margin, else the kind's down budget: see interlude.down_wait)."""
    from interlude import down_wait

    event = state.event or {}
    down_at = event.get("down_at")
    down_at = obs.now if down_at is None else float(down_at)
    why = "Google says the machine is gone" if obs.machine is Machine.GONE else None
    why = why or down_wait.overdue(event, obs, limits, down_at)
    if why is not None:
        if state.reprovisions >= limits.max_reprovisions:
            return fail(state, f"machine did not come back after {state.reprovisions} re-provisions")
        new_event = {**event, "reprovisioned": True, "reprovision_reason": why, "down_at": down_at}
        new = replace(state, phase=Phase.RECOVERING, event=new_event, reprovisions=state.reprovisions + 1)
        return Transition(new, (Action.REPROVISION,))
    return Transition(state)


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
    from interlude import notice_wait
    from interlude.maintenance_policy import Pause

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
        closing = _close(state, replace(obs, resumed_from=obs.resumed_from or obs.committed_step))
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
    from interlude import watchdog

    if state.phase in (Phase.DONE, Phase.FAILED):
        return Transition(state)
    if obs.machine is Machine.UNKNOWN:
        return watchdog.outage(state, obs, limits)
    state = watchdog.answered(state)
    if obs.workload_error and obs.committed_step < state.target_step:
        return fail(state, f"the workload failed: {obs.workload_error}")
    if obs.committed_step >= state.target_step:
        return _finish(state, obs, limits)
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
        from interlude import notice_wait

        return notice_wait.noticed(state, obs, limits)
    if phase is Phase.CHECKPOINT_REQUESTED:
        return _checkpoint_requested(state, obs, limits)
    if phase is Phase.AWAITING_RESTART:
        return _awaiting_restart(state, obs, limits)
    # RESUMING or RECOVERING: wait for the workload to step past the checkpoint it resumed from.
    if _resumed(state, obs):
        return _close(state, obs)
    if obs.machine is not Machine.READY:
        return _maybe_reprovision(down(state, obs), obs, limits)
    return Transition(state)


def _running(state: StageState, obs: Observation, limits: Limits) -> Transition:
    if obs.notice is not None and obs.machine is not Machine.GONE:
        rid = uuid.uuid4().hex[:12]
        event = open_event("maintenance", obs, state, obs.notice)
        if obs.machine is Machine.READY:
            from interlude import notice_wait

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
        return _maybe_reprovision(new, obs, limits)
    if rebooted(state, obs):
        # The machine went down and came back between two polls (or while no trigger watched):
        # re-derive the event from what the workload says about its boots.
        event = open_event("unobserved_restart", obs, state, None)
        event.update(step_at_detection=state.last_step_seen, down_at=None)
        opened = replace(state, event=event, phase=Phase.RESUMING)
        return _close(opened, obs) if _resumed(opened, obs) else Transition(opened)
    return Transition(state)


def _checkpoint_requested(state: StageState, obs: Observation, limits: Limits) -> Transition:
    if obs.machine is Machine.READY and rebooted(state, obs):
        # Down and back between two polls: whatever answered our request after the reboot is not this
        # event's checkpoint; the workload's resume point is (see _close).
        new = replace(state, phase=Phase.RESUMING, event={**(state.event or {}), "checkpoint_step": None})
        return _close(new, obs) if _resumed(new, obs) else Transition(new)
    if obs.request_ack_step is not None:
        event = {
            **(state.event or {}),
            "checkpoint_step": obs.request_ack_step,
            # The workload's answer time, not this poll's (a poll is up to an interval late); never after the poll.
            "checkpoint_committed_at": min(obs.request_ack_at or obs.now, obs.now),
            "checkpoint_write_s": obs.commit_seconds,  # the workload's own measure (interlude.badput)
        }
        new = replace(state, phase=Phase.AWAITING_RESTART, event=event)
        if obs.machine is not Machine.READY:
            return Transition(down(new, obs))
        from interlude import notice_wait
        from interlude.maintenance_policy import Pause

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
        return _close(new, obs) if _resumed(new, obs) else Transition(new)
    if obs.machine is not Machine.READY:
        return _maybe_reprovision(down(state, obs), obs, limits)
    from interlude import notice_wait

    if notice_wait.start_early_on_hold(state, obs, limits):  # it holds now, after training on past our checkpoint
        return Transition(
            replace(state, event={**(state.event or {}), "early_start_at": obs.now}), (Action.START_MAINTENANCE,)
        )
    return Transition(state)
