"""The maintenance lifecycle of the local cloud's machines: notice, window, restart; spot preemption; crash.

A mixin of :class:`interlude_localcloud.cloud.Cloud` (which owns the state, the clock and the machine
processes these methods drive), kept apart so each module holds one concern. Google's rules are cited where
they apply; the README's "Maintenance lifecycle" gives the sequence as a user sees it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from interlude_localcloud.scenario import Scenario
from interlude_localcloud.slices import Worker
from interlude_localcloud.timefmt import rfc3339

if TYPE_CHECKING:
    from interlude_localcloud.cloud import Machine


@dataclass(frozen=True)
class MaintenanceChoice:
    """The next simulated maintenance of a kind (:meth:`Maintenance.choose_maintenance_window`)."""

    type: str  # SCHEDULED | UNSCHEDULED
    notice: float  # simulated seconds to windowStartTime
    held: bool = False  # the window waits for the test (Maintenance.schedule_maintenance)
    latest_start_after: float | None = None  # simulated seconds to latestWindowStartTime (None: the scenario's)


class Maintenance:
    scenario: Scenario
    next_maintenance: dict[str, dict[str, Any]]
    changed: threading.Condition

    if TYPE_CHECKING:  # provided by Cloud

        def after(self, seconds: float, fn: Callable[[], None]) -> None: ...
        def after_for(self, m: Machine, seconds: float, fn: Callable[[], None]) -> None: ...
        def log(self, kind: str, **fields: Any) -> None: ...
        def boot(self, m: Machine, only: Machine | Worker | None = None) -> None: ...
        def take_down(self, m: Machine, reason: str) -> None: ...

    def choose_maintenance(self, kind: str) -> tuple[str, float]:
        """Type and simulated notice seconds of the next simulated maintenance for this kind."""
        choice = self.choose_maintenance_window(kind)
        return choice.type, choice.notice

    def choose_maintenance_window(self, kind: str) -> MaintenanceChoice:
        """The next simulated maintenance for this kind: its type and notice, and how its window opens (admin
        `next-maintenance` may hold it for the test; see :meth:`schedule_maintenance`)."""
        override = self.next_maintenance.pop(kind, None) or self.next_maintenance.pop("*", None) or {}
        mt = self.scenario.maintenance[kind]
        mtype = override.get("type", "SCHEDULED")
        notice = override.get("notice_seconds")
        if notice is None:
            notice = mt["unscheduled_notice"] if mtype == "UNSCHEDULED" else mt["scheduled_notice"]
        latest = override.get("latest_start_after")
        return MaintenanceChoice(
            mtype, float(notice), bool(override.get("held", False)), None if latest is None else float(latest)
        )

    def can_start_early(self, m: Machine, mtype: str) -> bool:
        """canReschedule as Google sets it: SCHEDULED only, and on TPUs only where manual start exists
        (any v4/v5p; v5e/v6e from 2x4, i.e. 8 chips; https://cloud.google.com/tpu/docs/manually-start-maintenance)."""
        if mtype != "SCHEDULED":
            return False
        if m.kind != "tpu":
            return True
        m_type = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", str(m.resource.get("acceleratorType", "")))
        if m_type is None:
            return False
        family, size = m_type[1], int(m_type[2])
        return family in ("v4", "v5p") or (family in ("v5litepod", "v6e") and size >= 8)

    def latest_start_after(self, kind: str, held: bool, latest_after: float | None) -> float:
        """Simulated seconds from windowStartTime to latestWindowStartTime: the caller's, else the scenario's
        `maintenance.<kind>.latest_start_after` (0: the window opens at its start). A held window needs some."""
        spread = float(
            self.scenario.maintenance[kind].get("latest_start_after", 0.0) if latest_after is None else latest_after
        )
        if spread < 0:
            raise ValueError(f"latest_start_after must be >= 0, not {spread}")
        if held and spread <= 0:
            raise ValueError(
                "a held window needs latest_start_after > 0 (simulated seconds from windowStartTime to "
                "latestWindowStartTime: it opens in between, when the test says, at its latest start at the latest)"
            )
        return spread

    def schedule_maintenance(
        self,
        m: Machine,
        mtype: str,
        notice: float,
        host: Machine | Worker | None = None,
        held: bool = False,
        latest_after: float | None = None,
    ) -> None:
        """Notice: upcomingMaintenance PENDING now, window opens after notice/time_scale seconds.

        Google orders the times windowStartTime <= latestWindowStartTime <= windowEndTime: "the latest time for the
        planned maintenance window to start" and "the time by which the maintenance disruption will be completed"
        (the discovery documents' words). By default the window opens at its start, and the latest start is the
        start. `latest_after` (simulated seconds; default the scenario's `latest_start_after`) puts the latest start
        that much later and the end after it.

        A `held` window is the test's clock: it does not open at windowStartTime on the wall clock but when the test
        says (:meth:`open_window`, admin `:open-window`), never before its start, and at its latest start at the
        latest; ``performMaintenance`` still opens it at once, as on Google. What the control plane reads is the same
        as for any notice (PENDING, the three times, canReschedule), and the window opens within them: so a loaded
        machine, where the control plane or a commit is slow, cannot make the window arrive before what the test
        waits for.

        On a multi-host slice the notice is one worker's (`host`): only its metadata server shows it, the
        node shows it, and other workers' notices keep their own windows."""
        ts = self.scenario.time_scale
        duration = self.scenario.maintenance[m.kind]["duration"]
        spread = self.latest_start_after(m.kind, held, latest_after)
        start = time.time() + notice / ts
        latest = start + spread / ts
        h = host or m
        if m.extra_workers:
            self._schedule_worker_maintenance(m, h, mtype, notice, start, latest + duration / ts, latest, held)
            return
        m.maintenance = {
            "type": mtype,
            "status": "PENDING",
            "start": start,
            "end": latest + duration / ts,
            "latest": latest,
            "can_reschedule": self.can_start_early(m, mtype),
            **({"held": True} if held else {}),
        }
        m.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
        m.generation += 1
        self.log(
            "maintenance_notice",
            machine=m.machine_id,
            type=mtype,
            notice_seconds=notice,
            window_start=rfc3339(start),
            **({"held": True, "latest_start": rfc3339(latest)} if held else {}),
        )
        if held:
            self._hold_window(m, m, m.maintenance)
            return
        self.after_for(m, notice / ts, lambda: self.begin_maintenance(m))

    def _schedule_worker_maintenance(
        self,
        m: Machine,
        h: Machine | Worker,
        mtype: str,
        notice: float,
        start: float,
        end: float,
        latest: float,
        held: bool,
    ) -> None:
        mt = {
            "type": mtype,
            "status": "PENDING",
            "start": start,
            "end": end,
            "latest": latest,
            "can_reschedule": self.can_start_early(m, mtype),
            **({"held": True} if held else {}),
        }
        h.maintenance = mt
        h.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
        index = m.hosts().index(h)
        self.log(
            "maintenance_notice",
            machine=h.machine_id,
            node=m.machine_id,
            worker=index,
            type=mtype,
            notice_seconds=notice,
            window_start=rfc3339(start),
            **({"held": True, "latest_start": rfc3339(latest)} if held else {}),
        )
        if held:
            self._hold_window(m, h, mt)
            return

        def due() -> None:  # not after_for: another worker's notice must not cancel this one
            if (
                not m.deleted
                and h.maintenance is mt
                and mt["status"] == "PENDING"
                and m.resource.get("state") == "READY"
            ):
                self.begin_maintenance(m, host=h)

        self.after(start - time.time(), due)

    # held windows: the test's clock ------------------------------------------------------------
    def _window_may_open(self, m: Machine, h: Machine | Worker, mt: dict[str, Any]) -> bool:
        """The notice `mt` is still host `h`'s, PENDING, on a machine that is up (a stop, delete or preemption
        cleared it, or the machine is down for another reason)."""
        if m.deleted or h.maintenance is not mt or mt["status"] != "PENDING":
            return False
        return m.resource.get("state") == "READY" if m.kind == "tpu" else m.resource.get("status") == "RUNNING"

    def _hold_window(self, m: Machine, h: Machine | Worker, mt: dict[str, Any]) -> None:
        """A held window opens at its latest start unless the test (or performMaintenance) opened it before."""

        def latest() -> None:
            if self._window_may_open(m, h, mt):
                self.begin_maintenance(m, host=h if m.extra_workers else None, cause="latest_start")

        self.after(mt["latest"] - time.time(), latest)

    def open_window(self, m: Machine, worker: int = 0) -> dict[str, Any]:
        """The test's word on a held window: it opens now, or at its windowStartTime if that is still ahead (never
        before what the control plane was told). Answers {opens_at, window_start, latest_start} in epoch seconds.
        A notice that is not held, or not PENDING, is a ValueError: its window keeps Google's clock."""
        h = m.hosts()[worker]
        mt = h.maintenance
        if mt is None or mt["status"] != "PENDING" or not mt.get("held"):
            raise ValueError(f"{h.machine_id} has no held PENDING maintenance (its window keeps its own clock)")
        now = time.time()
        opens_at = max(now, float(mt["start"]))
        self.log("maintenance_window_released", machine=h.machine_id, opens_at=rfc3339(opens_at))

        def release() -> None:
            if self._window_may_open(m, h, mt):
                self.begin_maintenance(m, host=h if m.extra_workers else None, cause="released")

        self.after(opens_at - now, release)
        return {"opens_at": opens_at, "window_start": float(mt["start"]), "latest_start": float(mt["latest"])}

    def begin_maintenance(
        self, m: Machine, mtype: str = "SCHEDULED", host: Machine | Worker | None = None, cause: str = "window_start"
    ) -> None:
        """Window opens: the machine goes down (status per kind) until the restart duration passes.

        With no notice before (a drill without extended notifications) the maintenance starts ONGOING.
        Once ONGOING it cannot be moved: canReschedule is false. A Compute VM passes STOPPING on its
        way to TERMINATED, as on Google. `cause` goes into the event log's ``maintenance_start`` (what opened it:
        ``window_start``, ``performMaintenance``, ``simulated``, or for a held window ``released`` by the test or
        ``latest_start``), for tests to tell who started a window.

        On a multi-host slice one worker's maintenance is the slice's: the node goes REPAIRING and every
        worker's processes stop, and all restart together ("starting maintenance on a Cloud TPU slice
        starts maintenance for all the underlying TPU VMs",
        https://cloud.google.com/tpu/docs/manually-start-maintenance)."""
        ts = self.scenario.time_scale
        duration = self.scenario.maintenance[m.kind]["duration"]
        now = time.time()
        h = host or m
        if h.maintenance is None:
            h.maintenance = {"type": mtype, "start": now, "latest": now}
        h.maintenance.update(status="ONGOING", start=now, latest=now, end=now + duration / ts, can_reschedule=False)
        h.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
        m.generation += 1
        if m.kind == "tpu":
            m.resource.update(
                state="REPAIRING",
                health="UNHEALTHY_MAINTENANCE",
                healthDescription="The TPU node is undergoing host maintenance.",
            )
        else:
            m.resource["status"] = "STOPPING"

            def stopped() -> None:
                m.resource["status"] = "TERMINATED"
                m.resource["lastStopTimestamp"] = rfc3339()

            self.after_for(m, min(self.scenario.delay("gce_stop"), duration / ts / 2), stopped)
        self.take_down(m, "maintenance")
        where = {"worker": m.hosts().index(h)} if m.extra_workers else {}
        self.log("maintenance_start", machine=m.machine_id, type=h.maintenance["type"], cause=cause, **where)
        self.after_for(m, duration / ts, lambda: self.end_maintenance(m))

    def end_maintenance(self, m: Machine) -> None:
        """Host serviced: a TPU node is READY again; a Compute VM with automaticRestart passes STAGING to
        RUNNING (and boots), one without stays TERMINATED and releases its capacity. A slice comes back on
        serviced hosts: every worker's notice is cleared."""
        for h in m.hosts():
            h.maintenance = None
            h.maintenance_event = "NONE"
        m.generation += 1
        if m.kind == "tpu":
            m.resource.update(state="READY", health="HEALTHY")
            m.resource.pop("healthDescription", None)
            self.boot(m)
        elif (m.resource.get("scheduling") or {}).get("automaticRestart", True):
            m.resource["status"] = "STAGING"

            def running() -> None:
                m.resource["status"] = "RUNNING"
                m.resource["lastStartTimestamp"] = rfc3339()
                self.boot(m)
                self.changed.notify_all()

            self.after_for(m, min(self.scenario.delay("gce_start"), 0.5), running)
        else:
            m.resource["status"] = "TERMINATED"
            m.holds = False
        self.log("maintenance_end", machine=m.machine_id)

    def preempt(self, m: Machine) -> None:
        """Spot preemption, no notice: down at once, capacity released (a slice is preempted whole)."""
        m.generation += 1
        for h in m.hosts():
            h.maintenance = None
            h.maintenance_event = "NONE"
        m.preempted = True
        m.holds = False
        if m.kind == "tpu":
            m.resource.update(state="PREEMPTED")
            m.resource.pop("health", None)
        else:
            m.resource["status"] = "TERMINATED"
            m.resource["lastStopTimestamp"] = rfc3339()
        self.take_down(m, "preempted")
        self.log("preempted", machine=m.machine_id)
        for hook in self.preempt_hooks:
            hook(m)

    def crash(self, m: Machine, worker: int = 0) -> None:
        """SIGKILL the guest; the machine reboots (runs its startup script again) shortly after.

        On a multi-host slice the crash of one worker's VM is the slice's interruption: "Multi-host TPU slices
        require all instances in the slice to be recovered or rescheduled together", since the slice's ICI
        topology no longer holds until every instance is restarted
        (https://cloud.google.com/tpu/docs/failure-recovery). So the other workers are stopped too (SIGTERM, then
        SIGKILL after the grace, as any stop), the node shows REPAIRING, and every worker boots again together
        once they are all down."""
        h = m.hosts()[worker]
        h.proc.crash()
        self.log("machine_crash", machine=h.machine_id, **({"worker": worker} if m.extra_workers else {}))
        if not m.extra_workers:
            self.after_for(m, 0.2, lambda: self.boot(m))
            return
        for i, other in enumerate(m.hosts()):
            if other is not h:
                other.proc.shutdown(self.scenario.stop_grace_seconds, "slice recovery")
                self.log("machine_down", machine=other.machine_id, reason="slice_recovery", worker=i)
        m.resource.update(
            state="REPAIRING",
            healthDescription=f"Worker {worker} failed: the slice's VMs are being recovered together.",
        )

        def recovered() -> None:
            if m.resource.get("state") == "REPAIRING":  # not a maintenance or a preemption meanwhile
                m.resource.update(state="READY")
                m.resource.pop("healthDescription", None)
            self.boot(m)
            self.log("slice_recovered", machine=m.machine_id)

        self.after_for(m, self.scenario.stop_grace_seconds + 0.2, recovered)  # every old process is gone by then

    def upcoming(self, m: Machine) -> dict[str, Any] | None:
        """upcomingMaintenance as the API shows it (camelCase, enum names); on a slice, any worker's
        (an ongoing one first, else the earliest window)."""
        pending = [h.maintenance for h in m.hosts() if h.maintenance is not None]
        if not pending:
            return None
        mt = min(pending, key=lambda x: (x["status"] != "ONGOING", x["start"]))
        return {
            "type": mt["type"],
            "canReschedule": mt["can_reschedule"],
            "windowStartTime": rfc3339(mt["start"]),
            "windowEndTime": rfc3339(mt["end"]),
            "latestWindowStartTime": rfc3339(max(mt["latest"], mt["start"])),
            "maintenanceStatus": mt["status"],
        }
