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
from typing import TYPE_CHECKING, Any

from interlude_localcloud.scenario import Scenario
from interlude_localcloud.slices import Worker
from interlude_localcloud.timefmt import rfc3339

if TYPE_CHECKING:
    from interlude_localcloud.cloud import Machine


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
        override = self.next_maintenance.pop(kind, None) or self.next_maintenance.pop("*", None)
        mt = self.scenario.maintenance[kind]
        mtype = (override or {}).get("type", "SCHEDULED")
        notice = (override or {}).get("notice_seconds")
        if notice is None:
            notice = mt["unscheduled_notice"] if mtype == "UNSCHEDULED" else mt["scheduled_notice"]
        return mtype, float(notice)

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

    def schedule_maintenance(self, m: Machine, mtype: str, notice: float, host: Machine | Worker | None = None) -> None:
        """Notice: upcomingMaintenance PENDING now, window opens after notice/time_scale seconds.

        Google orders the times windowStartTime <= latestWindowStartTime <= windowEndTime: the window
        starts no later than latestWindowStartTime and the disruption is over by windowEndTime. Here the
        window opens at its start, so the latest start is the start.

        On a multi-host slice the notice is one worker's (`host`): only its metadata server shows it, the
        node shows it, and other workers' notices keep their own windows."""
        ts = self.scenario.time_scale
        duration = self.scenario.maintenance[m.kind]["duration"]
        start = time.time() + notice / ts
        h = host or m
        if m.extra_workers:
            self._schedule_worker_maintenance(m, h, mtype, notice, start, start + duration / ts)
            return
        m.maintenance = {
            "type": mtype,
            "status": "PENDING",
            "start": start,
            "end": start + duration / ts,
            "latest": start,
            "can_reschedule": self.can_start_early(m, mtype),
        }
        m.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
        m.generation += 1
        self.log(
            "maintenance_notice", machine=m.machine_id, type=mtype, notice_seconds=notice, window_start=rfc3339(start)
        )
        self.after_for(m, notice / ts, lambda: self.begin_maintenance(m))

    def _schedule_worker_maintenance(
        self, m: Machine, h: Machine | Worker, mtype: str, notice: float, start: float, end: float
    ) -> None:
        mt = {
            "type": mtype,
            "status": "PENDING",
            "start": start,
            "end": end,
            "latest": start,
            "can_reschedule": self.can_start_early(m, mtype),
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
        )

        def due() -> None:  # not after_for: another worker's notice must not cancel this one
            if (
                not m.deleted
                and h.maintenance is mt
                and mt["status"] == "PENDING"
                and m.resource.get("state") == "READY"
            ):
                self.begin_maintenance(m, host=h)

        self.after(start - time.time(), due)

    def begin_maintenance(self, m: Machine, mtype: str = "SCHEDULED", host: Machine | Worker | None = None) -> None:
        """Window opens: the machine goes down (status per kind) until the restart duration passes.

        With no notice before (a drill without extended notifications) the maintenance starts ONGOING.
        Once ONGOING it cannot be moved: canReschedule is false. A Compute VM passes STOPPING on its
        way to TERMINATED, as on Google.

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
        self.log("maintenance_start", machine=m.machine_id, type=h.maintenance["type"], **where)
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
