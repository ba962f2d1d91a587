"""What to do with a host maintenance notice, by accelerator kind and notice length (pure, table-driven).

A long notice is training time, not an alarm: keep training and take the last checkpoint just before the
window, with a margin sized from how long a checkpoint commit really takes. At a natural pause (between
training and fine-tuning, or right after a checkpoint when the window is near) start the maintenance early
with ``performMaintenance`` when Google allows it (``canReschedule`` and PENDING), so a surprise becomes a
planned pause. Re-provisioning starts only when Google says the machine is gone (TERMINATED without a
restart, PREEMPTED, deleted) or the window's end is past with a margin: a machine in maintenance comes
back, and a second machine would double the bill and race the first for the same checkpoint.

Durations are Google-real seconds; the local cloud runs faster by its scenario ``time_scale`` and
:func:`scaled` maps one to the other. Sources (Google's documentation):

- TPU: https://cloud.google.com/tpu/docs/maintenance-events and
  https://cloud.google.com/tpu/docs/view-maintenance-notifications (SCHEDULED gets seven days' notice,
  UNSCHEDULED is critical and short), https://cloud.google.com/tpu/docs/manually-start-maintenance
  (``canReschedule`` + PENDING may start early; large slices can be unavailable for up to a few hours).
- GPU VMs: https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance (no live migration: terminate,
  optionally restart; about an hour's notice), AI Hypercomputer clusters about ten minutes;
  https://cloud.google.com/compute/docs/instances/monitor-plan-host-maintenance-event (the notice fields)
  and https://cloud.google.com/compute/docs/instances/trigger-host-maintenance-event (starting early).
- Spot: https://cloud.google.com/compute/docs/instances/spot (preempted with no notice beyond a 30 s
  shutdown, never restarted by maintenance: re-provision at once).

Entry points: :func:`plan_for_notice` when a notice appears, :func:`start_early_now` at each natural pause,
:func:`machine_gone`, :func:`reprovision_deadline` and :func:`reprovision_due` while the machine is away
(the stage's use of them: :mod:`interlude.stage.down_wait`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any


class MaintenanceKind(enum.StrEnum):
    """How Google treats the machine during host maintenance (what sets the notice and the downtime)."""

    TPU = "tpu"
    TPU_MULTI_HOST = "tpu_multi_host"
    GPU = "gpu"
    AI_HYPERCOMPUTER = "ai_hypercomputer"
    SPOT = "spot"


class NoticeType(enum.StrEnum):
    SCHEDULED = "SCHEDULED"
    UNSCHEDULED = "UNSCHEDULED"
    MULTIPLE = "MULTIPLE"  # Compute only: several maintenances in one window
    UNKNOWN_TYPE = "UNKNOWN_TYPE"


class Pause(enum.StrEnum):
    """Natural pauses in a run, where starting the maintenance early costs no training."""

    PHASE_BOUNDARY = "phase_boundary"  # training done, fine-tuning not started
    AFTER_CHECKPOINT = "after_checkpoint"  # a checkpoint just committed


@dataclass(frozen=True)
class KindRow:
    """Google's figures for one kind: the notice to expect and how long the machine is away."""

    scheduled_notice_s: float
    unscheduled_notice_s: float
    down_budget_s: float
    source: str


HOUR = 3600.0
DAY = 24 * HOUR

# Expected notice per kind and type, and the down budget used when a notice has no windowEndTime.
KINDS: Mapping[MaintenanceKind, KindRow] = {
    MaintenanceKind.TPU: KindRow(7 * DAY, 60.0, HOUR, "https://cloud.google.com/tpu/docs/maintenance-events"),
    MaintenanceKind.TPU_MULTI_HOST: KindRow(
        7 * DAY, 60.0, 3 * HOUR, "https://cloud.google.com/tpu/docs/manually-start-maintenance"
    ),
    MaintenanceKind.GPU: KindRow(HOUR, 60.0, HOUR, "https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance"),
    MaintenanceKind.AI_HYPERCOMPUTER: KindRow(
        600.0, 60.0, HOUR, "https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance"
    ),
    MaintenanceKind.SPOT: KindRow(0.0, 0.0, 0.0, "https://cloud.google.com/compute/docs/instances/spot"),
}

# Machine series Google runs as AI Hypercomputer clusters (the short ~10 minute notice).
AI_HYPERCOMPUTER_PREFIXES = ("a3-ultragpu-", "a3-megagpu-", "a4-", "a4x-")


def kind_for(
    accelerator: str, *, machine_type: str | None = None, hosts: int = 1, spot: bool = False
) -> MaintenanceKind:
    """The maintenance kind of a machine: ``accelerator`` is "tpu" or "gpu"."""
    if spot:
        return MaintenanceKind.SPOT
    if accelerator == "tpu":
        return MaintenanceKind.TPU_MULTI_HOST if hosts > 1 else MaintenanceKind.TPU
    if machine_type and machine_type.startswith(AI_HYPERCOMPUTER_PREFIXES):
        return MaintenanceKind.AI_HYPERCOMPUTER
    return MaintenanceKind.GPU


def scaled(seconds: float, time_scale: float) -> float:
    """Google-real seconds as real seconds in a cloud whose clock runs ``time_scale`` times faster."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, not {time_scale}")
    return seconds / time_scale


@dataclass(frozen=True)
class PolicyParams:
    """Knobs; the defaults are right for Google. All durations in Google-real seconds."""

    commit_margin_factor: float = 3.0  # checkpoint this many measured commits before the window
    min_margin_s: float = 60.0  # never less than this, however fast the commit
    near_window_s: float = 15 * 60.0  # after a checkpoint, start early if the window opens within this
    reprovision_margin_s: float = 10 * 60.0  # past the window's end by this before giving up on the machine
    down_budget_s: Mapping[str, float] = field(default_factory=dict)  # per kind, overrides KINDS

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> PolicyParams:
        """From run params (unknown keys are an error: a typo must not silently keep a default)."""
        data = dict(data or {})
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown maintenance policy params: {sorted(unknown)}")
        budgets = {str(k): float(v) for k, v in (data.pop("down_budget_s", None) or {}).items()}
        return cls(**{k: float(v) for k, v in data.items()}, down_budget_s=budgets)

    def budget(self, kind: MaintenanceKind) -> float:
        return float(self.down_budget_s.get(kind.value, KINDS[kind].down_budget_s))


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Notice:
    """A host maintenance notice as Google words it: a TPU node's ``upcomingMaintenance`` or a Compute instance's
    ``resourceStatus.upcomingMaintenance`` (:meth:`from_upcoming`).

    The stage's one notice class. The state machine carries it in each ``Observation`` (interlude.stage.model)
    and copies its words into the maintenance event, so the run report records what Google said (its type as
    sent, a new one included; its RFC 3339 times); the policy plans with its times in epoch seconds
    (:attr:`starts_at`, :attr:`ends_at`) and its :attr:`type`, parsed here on demand. It lives in this module,
    the stage's leaf (no interlude imports), because the model imports the policy's ``NoticePolicy`` for its
    ``Limits``: defined in the model, the policy would have to import it back.
    """

    kind: str  # Google's ``type``, as sent: SCHEDULED | UNSCHEDULED | MULTIPLE | ... (see :attr:`type`)
    status: str  # ``maintenanceStatus``: PENDING | ONGOING
    window_start: str | None = None  # ``windowStartTime`` (RFC 3339); None: no window to plan around
    window_end: str | None = None  # ``windowEndTime`` (RFC 3339)
    can_reschedule: bool = False  # ``canReschedule``: performMaintenance may start it early while PENDING

    @classmethod
    def from_upcoming(cls, data: Mapping[str, Any]) -> Notice:
        """From Google's JSON (camelCase, enum names, RFC 3339 times); absent fields take Google's defaults."""
        start, end = data.get("windowStartTime"), data.get("windowEndTime")
        return cls(
            kind=str(data.get("type") or NoticeType.UNKNOWN_TYPE.value),
            status=str(data.get("maintenanceStatus") or "PENDING"),
            window_start=str(start) if start else None,
            window_end=str(end) if end else None,
            can_reschedule=bool(data.get("canReschedule", False)),
        )

    @property
    def type(self) -> NoticeType:
        """The notice's type; one this module does not know yet is UNKNOWN_TYPE."""
        return NoticeType(self.kind) if self.kind in NoticeType.__members__ else NoticeType.UNKNOWN_TYPE

    @property
    def starts_at(self) -> float | None:
        """When the window opens, in epoch seconds (None: Google gave no start)."""
        return _epoch(self.window_start)

    @property
    def ends_at(self) -> float | None:
        """When the window closes, in epoch seconds (None: Google gave no end)."""
        return _epoch(self.window_end)


def _window_start(notice: Notice) -> float:
    start = notice.starts_at
    if start is None:
        raise ValueError(f"a notice without windowStartTime has no window to plan around: {notice}")
    return start


@dataclass(frozen=True)
class NoticePlan:
    """What to do about one notice. Times are epoch seconds (Google-real)."""

    kind: MaintenanceKind
    checkpoint_at: float  # take the last checkpoint here (now, when the notice is shorter than the margin)
    margin_s: float  # checkpoint_at is this long before the window opens
    keep_training_s: float  # training time the notice still gives before that checkpoint
    start_early: bool  # performMaintenance is allowed: do it at the next natural pause
    down_budget_s: float  # how long the machine is expected to be away
    reprovision_after: float  # no machine back by then: provision another
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "checkpoint_at": self.checkpoint_at,
            "margin_s": self.margin_s,
            "keep_training_s": self.keep_training_s,
            "start_early": self.start_early,
            "down_budget_s": self.down_budget_s,
            "reprovision_after": self.reprovision_after,
            "reason": self.reason,
        }


def commit_margin(measured_commit_s: float, params: PolicyParams) -> float:
    """How long before the window the last checkpoint starts: a few measured commits, at least the floor."""
    return max(params.min_margin_s, params.commit_margin_factor * max(0.0, measured_commit_s))


def can_start_early(notice: Notice) -> bool:
    """Google's rule: ``canReschedule`` and PENDING (ONGOING or not reschedulable: it cannot move)."""
    return notice.can_reschedule and notice.status == "PENDING"


def plan_for_notice(
    kind: MaintenanceKind,
    notice: Notice | None,
    measured_commit_s: float,
    now: float,
    params: PolicyParams | None = None,
) -> NoticePlan:
    """The plan for a notice seen at ``now`` (None = no notice at all: a spot preemption or a surprise). A notice
    without a window start has nothing to plan around: ValueError (the stage checkpoints at once instead)."""
    params = params or PolicyParams()
    budget = params.budget(kind)
    if notice is None or kind == MaintenanceKind.SPOT:
        return NoticePlan(kind, now, 0.0, 0.0, False, budget, now + budget, "no notice: save what can be saved now")
    margin = commit_margin(measured_commit_s, params)
    start = _window_start(notice)
    lead = start - now
    if notice.status == "ONGOING" or lead <= margin:
        checkpoint_at, reason = now, f"notice of {max(0.0, lead):.0f}s is within the {margin:.0f}s margin"
    else:
        checkpoint_at, reason = start - margin, f"keep training {lead - margin:.0f}s, then checkpoint"
    end = notice.ends_at
    end = end if end is not None else start + budget
    return NoticePlan(
        kind=kind,
        checkpoint_at=checkpoint_at,
        margin_s=margin,
        keep_training_s=max(0.0, checkpoint_at - now),
        start_early=can_start_early(notice),
        down_budget_s=budget,
        reprovision_after=max(end, start) + params.reprovision_margin_s,
        reason=reason,
    )


def start_early_now(
    notice: Notice, pause: Pause, now: float, measured_commit_s: float, params: PolicyParams | None = None
) -> bool:
    """At a natural pause: call ``performMaintenance`` now? Between phases always (when allowed); right after
    a checkpoint when the window is near or the last checkpoint was due anyway."""
    params = params or PolicyParams()
    if not can_start_early(notice):
        return False
    if pause == Pause.PHASE_BOUNDARY:
        return True
    lead = _window_start(notice) - now
    return lead <= max(params.near_window_s, commit_margin(measured_commit_s, params))


@dataclass(frozen=True)
class MachineState:
    """What Google says about the machine now (from the TPU node or the Compute instance)."""

    exists: bool
    state: str = ""  # TPU Node.state or Compute Instance.status
    automatic_restart: bool = True  # Compute scheduling.automaticRestart (TPU nodes come back by themselves)


GONE_STATES = frozenset({"PREEMPTED", "DELETING", "HIDING", "HIDDEN"})
"""TPU Node states from which the node does not come back by itself (preempted, being deleted, or hidden
by its queued resource being deleted): https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes#State
"""


def machine_gone(machine: MachineState) -> bool:
    """Google says the machine will not come back: deleted, PREEMPTED, or TERMINATED without a restart.

    A TPU node in maintenance is REPAIRING and returns READY; a GPU VM with ``automaticRestart`` passes
    TERMINATED on its way back, so TERMINATED alone is not gone.
    """
    if not machine.exists or machine.state in GONE_STATES:
        return True
    return machine.state == "TERMINATED" and not machine.automatic_restart


def reprovision_deadline(
    kind: MaintenanceKind, down_at: float, window_end: float | None, params: PolicyParams | None = None
) -> float:
    """When a machine that went down at ``down_at`` is given up on (Google has not said it is gone).

    Google's ``windowEndTime`` is its own word on when the disruption is over: past it by the margin, the
    machine is not coming back on time. Without a window end (no notice, or a stale one that ended before
    the machine went down) the kind's down budget from the moment it went down."""
    params = params or PolicyParams()
    if window_end is not None and window_end + params.reprovision_margin_s > down_at:
        return window_end + params.reprovision_margin_s
    return down_at + params.budget(kind)


def reprovision_due(machine: MachineState, deadline: float, now: float) -> bool:
    """Provision another machine: Google says this one is gone, or it is still away at the deadline."""
    if machine_gone(machine):
        return True
    healthy = machine.state in ("READY", "RUNNING")
    return not healthy and now >= deadline


def should_reprovision(plan: NoticePlan, machine: MachineState, now: float) -> bool:
    """Provision another machine: Google says this one is gone, or the window's end is past with margin."""
    return reprovision_due(machine, plan.reprovision_after, now)


@dataclass(frozen=True)
class NoticePolicy:
    """What a stage needs to plan around notices: its machine's kind, the knobs, the cloud's clock."""

    kind: MaintenanceKind
    params: PolicyParams = field(default_factory=PolicyParams)
    time_scale: float = 1.0
    poll_seconds: float = 0.0  # the control plane sees a due time this late at worst (real seconds)
    stage_follows: bool = False  # another stage runs on this machine: the boundary is a natural pause

    def real(self) -> PolicyParams:
        """The knobs in this cloud's real seconds."""
        p, ts = self.params, self.time_scale
        return replace(
            p,
            min_margin_s=scaled(p.min_margin_s, ts),
            near_window_s=scaled(p.near_window_s, ts),
            reprovision_margin_s=scaled(p.reprovision_margin_s, ts),
            down_budget_s={k.value: scaled(p.budget(k), ts) for k in MaintenanceKind},
        )

    def to_dict(self) -> dict[str, Any]:
        params = asdict(self.params)
        params["down_budget_s"] = dict(self.params.down_budget_s)
        return {
            "kind": self.kind.value,
            "params": params,
            "time_scale": self.time_scale,
            "poll_seconds": self.poll_seconds,
            "stage_follows": self.stage_follows,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> NoticePolicy | None:
        if not data:
            return None
        return cls(
            MaintenanceKind(data["kind"]),
            PolicyParams.from_mapping(data.get("params")),
            float(data["time_scale"]),
            float(data.get("poll_seconds") or 0.0),
            bool(data.get("stage_follows", False)),
        )
