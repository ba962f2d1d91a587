"""The stage state machine's data: phases, actions, one poll's observation, the state that travels in the
trigger's arguments, the limits it acts within, and a transition.

Apart from the rules (:mod:`interlude.stage.machine` and the policies beside it) so that each rule module
imports the data it reads at its top, and none of them imports another to reach a type. The maintenance notice an
Observation carries is the policy's own :class:`~interlude.stage.notice_policy.Notice` (one class for both; the
policy module is the leaf this one imports), importable from here with the rest of the data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from interlude.stage.notice_policy import Notice, NoticePolicy


class Phase(StrEnum):
    RUNNING = "RUNNING"
    NOTICED = "NOTICED"  # a long notice: training goes on until the checkpoint is due (interlude.stage.notice_wait)
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
    stepping_at: float | None = None  # when the current boot's workload began stepping (its own clock)
    mean_step_seconds: float | None = None  # its mean step time on this boot, by its own clock
    export_committed: bool = False  # the stage's Hugging Face export is in GCS, its marker last


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
    # watchdog bookkeeping (see interlude.stage.watchdog)
    progress_mark: str | None = None  # what the workload last showed (boot, step, state)
    progress_seen_at: float | None = None  # when that mark last changed, on the control plane's clock
    workload_restarts: int = 0
    restarted_for: str | None = None  # the startup failure already acted on
    outage_since: float | None = None
    drill: Drill | None = None
    drill_step: int | None = None
    drill_sent_at: float | None = None
    awaits_export: bool = False  # done only once the export is in too (interlude_workload.hf_export.exports)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def finished(self, committed_step: int, export_committed: bool) -> bool:
        """The final step committed and, for a stage that exports, its export with it."""
        return committed_step >= self.target_step and (export_committed or not self.awaits_export)

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
    notice_policy: NoticePolicy | None = None  # None: checkpoint at every notice at once


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
