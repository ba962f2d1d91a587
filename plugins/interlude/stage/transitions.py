"""The moves every phase of the stage state machine shares: fail, open and close an event, note the machine
down, re-provision when Google says it is gone or the wait is over.

Used by :mod:`interlude.stage.machine` and by the policies it hands phases to (notice_wait, watchdog); they
import these, never each other's privates.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from interlude.stage import down_wait
from interlude.stage.model import Action, Limits, Machine, Notice, Observation, Phase, StageState, Transition


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


def resumed(state: StageState, obs: Observation) -> bool:
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


def close(state: StageState, obs: Observation) -> Transition:
    """Finish the open event from what the workload itself says about its boots.

    When the machine rebooted, the checkpoint that mattered is the one the new boot resumed from, and the
    event's times are the workload's own (interlude.training.badput.workload_times): its old boot's last report, its
    new boot's start, its first step after the resume. A poll sees each of them up to a poll interval (and a
    trigger round trip) late, so the polls only bound them.
    """
    from interlude.training.badput import workload_times

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
            stepping=stepping_since(obs, resumed_from) if new_boot else None,
        )
    )
    event.update(resumed_from_step=resumed_from, boot_id=obs.boot_id, steps_recomputed=max(0, reached - resumed_from))
    new = replace(
        state, phase=Phase.RUNNING, event=None, request_id=None, boot_id=obs.boot_id, last_step_seen=obs.progress_step
    )
    return Transition(new, (Action.RECORD_EVENT,), event)


def stepping_since(obs: Observation, resumed_from: int) -> float | None:
    """When the new boot started stepping, by the workload's clock, once it has stepped: the SDK's own stamp (the
    moment its ``start`` handed the restored state to the loop). A workload that does not stamp it: the time of
    its progress less the steps since its resume at its mean step time, later than the truth by its first step's
    extra cost (a JIT compile: ~0.5 s measured) plus whatever it reported after that step."""
    if obs.progress_at is None or obs.progress_step <= resumed_from:
        return None
    if obs.stepping_at is not None:
        return obs.stepping_at
    return obs.progress_at - (obs.mean_step_seconds or 0.0) * (obs.progress_step - resumed_from + 1)


def down(state: StageState, obs: Observation) -> StageState:
    event = dict(state.event or {})
    if event.get("down_at") is None:
        event["down_at"] = obs.now
        event["step_at_down"] = state.last_step_seen
    return replace(state, event=event)


def maybe_reprovision(state: StageState, obs: Observation, limits: Limits) -> Transition:
    """Provision another machine only when Google says this one is gone or it is still away at the deadline
    (the window's end with margin, else the kind's down budget: see interlude.stage.down_wait)."""
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
