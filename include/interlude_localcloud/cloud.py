"""The local cloud's state: machines, operations, capacity, maintenance and the clock that moves them.

All state lives in memory under one lock. Time-based transitions (an operation finishing, a
maintenance window opening) are scheduled events that a background ticker fires; every mutation
notifies a condition so metadata-server long-polls and `zoneOperations.wait` wake up.
"""

from __future__ import annotations

import heapq
import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from interlude_localcloud.machines import Devices, MachineProcess
from interlude_localcloud.scenario import Fault, Scenario


def rfc3339(t: float | None = None) -> str:
    """Wall-clock time as Google prints it (UTC, milliseconds, Z)."""
    dt = datetime.fromtimestamp(time.time() if t is None else t, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


@dataclass
class Machine:
    """A TPU node or GCE instance: its API resource plus what the API does not show."""

    kind: str  # "tpu" | "gce"
    zone: str
    name: str
    resource: dict[str, Any]
    spot: bool
    cap_type: str  # accelerator type counted against zone capacity ("" = uncounted)
    units: int
    proc: MachineProcess
    holds: bool = False  # currently consumes capacity
    maintenance: dict[str, Any] | None = None
    maintenance_event: str = "NONE"
    preempted: bool = False
    generation: int = 0  # bumped on every state change that invalidates scheduled events
    deleted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    guest_attributes: dict[str, str] = field(default_factory=dict)  # "namespace/key" -> value, set by the guest
    # attributes the platform sets for the guest that the API's metadata does not show (a TPU VM's accelerator-type)
    platform_attributes: dict[str, str] = field(default_factory=dict)

    @property
    def machine_id(self) -> str:
        return f"{self.kind}-{self.zone}-{self.name}"

    def script(self) -> str | None:
        if self.kind == "tpu":
            return (self.resource.get("metadata") or {}).get("startup-script")
        return self.attributes().get("startup-script")

    def attributes(self) -> dict[str, str]:
        if self.kind == "tpu":
            return dict(self.resource.get("metadata") or {})
        items = (self.resource.get("metadata") or {}).get("items") or []
        return {**self.platform_attributes, **{i["key"]: i.get("value", "") for i in items}}


class Cloud:
    """Shared state and clock. API modules call into it holding `self.lock`."""

    def __init__(self, scenario: Scenario, state_dir: Path, api_endpoint: str = "", gcs_endpoint: str = "") -> None:
        self.scenario = scenario
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.api_endpoint = api_endpoint
        self.gcs_endpoint = gcs_endpoint
        self.lock = threading.RLock()
        # (zone, cap_type, spot, kind) -> accelerator units GKE nodes hold there; set by the GKE facet
        self.node_units: Callable[[str, str, bool, str], int] | None = None
        self.changed = threading.Condition(self.lock)
        self.machines: dict[tuple[str, str, str], Machine] = {}
        self.operations: dict[str, dict[str, Any]] = {}  # TPU operations by full name
        self.gce_operations: dict[tuple[str, str], dict[str, Any]] = {}
        self.queued: dict[tuple[str, str], dict[str, Any]] = {}
        self.faults: list[Fault] = list(scenario.faults)
        self.next_maintenance: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        # Strict-mode schema violations and server bugs (filled by the HTTP front, read by tests).
        self.violations: list[str] = []
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._ids = itertools.count(1000)
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.tick_hooks: list[Callable[[], None]] = []
        self.preempt_hooks: list[Callable[[Machine], None]] = []  # after a spot preemption, under the lock

    # clock ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._ticker = threading.Thread(target=self._run_ticker, name="localcloud-ticker", daemon=True)
        self._ticker.start()

    def _run_ticker(self) -> None:
        while not self._stop.wait(0.05):
            self.advance()

    def advance(self) -> None:
        """Fire every due event, then let waiting requests (queued resources) retry."""
        with self.lock:
            fired = False
            while self._timers and self._timers[0][0] <= time.time():
                _, _, fn = heapq.heappop(self._timers)
                fn()
                fired = True
            for hook in self.tick_hooks:
                hook()
            if fired:
                self.changed.notify_all()

    def after(self, seconds: float, fn: Callable[[], None]) -> None:
        """Run fn (under the lock) after `seconds` real seconds."""
        with self.lock:
            heapq.heappush(self._timers, (time.time() + seconds, next(self._seq), fn))

    def after_for(self, m: Machine, seconds: float, fn: Callable[[], None]) -> None:
        """Like after(), but dropped if the machine changed state (generation) or was deleted."""
        gen = m.generation

        def guarded() -> None:
            if not m.deleted and m.generation == gen:
                fn()

        self.after(seconds, guarded)

    def stop(self) -> None:
        """Stop the ticker and every machine process (waits for the groups to die)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        with self.lock:
            machines = list(self.machines.values())
        for m in machines:
            m.proc.shutdown(grace=min(self.scenario.stop_grace_seconds, 2.0), reason="cloud stop", block=True)

    # bookkeeping ---------------------------------------------------------------------------
    def new_id(self) -> str:
        return str(next(self._ids) * 7919 + 4_000_000_000_000)

    def op_suffix(self) -> str:
        return f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}"

    def log(self, kind: str, **fields: Any) -> None:
        self.events.append({"time": rfc3339(), "t": time.time(), "event": kind, **fields})
        self.changed.notify_all()

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.count > 0 and (f.method is None or f.method.upper() == method) and re.search(f.path_regex, path):
                    f.count -= 1
                    self.log("fault_injected", method=method, path=path, status=f.status)
                    return f
            self.faults = [f for f in self.faults if f.count > 0]
            return None

    # machines ------------------------------------------------------------------------------
    def new_machine(
        self,
        kind: str,
        zone: str,
        name: str,
        resource: dict[str, Any],
        spot: bool,
        cap_type: str,
        units: int,
        devices: Devices | None = None,
    ) -> Machine:
        mid = f"{kind}-{zone}-{name}"
        env = {
            "INTERLUDE_METADATA_URL": f"{self.api_endpoint}/_machines/{mid}/computeMetadata/v1",
            "STORAGE_EMULATOR_HOST": self.gcs_endpoint,
            "INTERLUDE_MACHINE_ID": mid,
        }
        proc = MachineProcess(mid, self.state_dir / "machines" / mid, env, devices)
        m = Machine(kind, zone, name, resource, spot, cap_type, units, proc)
        self.machines[(kind, zone, name)] = m
        return m

    def machine_by_id(self, mid: str) -> Machine | None:
        for m in self.machines.values():
            if m.machine_id == mid:
                return m
        return None

    def boot(self, m: Machine) -> None:
        m.proc.boot(m.script())
        self.log("machine_boot", machine=m.machine_id, boots=m.proc.boots)

    def take_down(self, m: Machine, reason: str) -> None:
        m.proc.shutdown(self.scenario.stop_grace_seconds, reason)
        self.log("machine_down", machine=m.machine_id, reason=reason)

    def destroy(self, m: Machine) -> None:
        m.deleted = True
        m.holds = False
        self.machines.pop((m.kind, m.zone, m.name), None)
        threading.Thread(target=m.proc.destroy, daemon=True).start()
        self.log("machine_deleted", machine=m.machine_id)

    # capacity ------------------------------------------------------------------------------
    def capacity(self, zone: str, cap_type: str, spot: bool, kind: str) -> int:
        z = self.scenario.zones.get(zone)
        if z is None:
            return 0
        tiers = z.tpu_capacity if kind == "tpu" else z.gpu_capacity
        tier = tiers.get(cap_type)
        if tier is None:
            return 0
        return tier.spot if spot else tier.on_demand

    def used(self, zone: str, cap_type: str, spot: bool, kind: str) -> int:
        """Units held in the zone by TPU VMs and Compute instances, and by GKE nodes (one capacity engine:
        on Google a GKE TPU node pool draws on the same zonal TPU capacity as a TPU VM)."""
        nodes = self.node_units(zone, cap_type, spot, kind) if self.node_units is not None else 0
        return self.machine_units(zone, cap_type, spot, kind) + nodes

    def machine_units(self, zone: str, cap_type: str, spot: bool, kind: str) -> int:
        return sum(
            m.units
            for m in self.machines.values()
            if m.holds and m.kind == kind and m.zone == zone and m.cap_type == cap_type and m.spot == spot
        )

    def has_capacity(self, zone: str, cap_type: str, spot: bool, kind: str, units: int) -> bool:
        if not cap_type:
            return True
        return self.used(zone, cap_type, spot, kind) + units <= self.capacity(zone, cap_type, spot, kind)

    # maintenance ---------------------------------------------------------------------------
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

    def schedule_maintenance(self, m: Machine, mtype: str, notice: float) -> None:
        """Notice: upcomingMaintenance PENDING now, window opens after notice/time_scale seconds.

        Google orders the times windowStartTime <= latestWindowStartTime <= windowEndTime: the window
        starts no later than latestWindowStartTime and the disruption is over by windowEndTime. Here the
        window opens at its start, so the latest start is the start."""
        ts = self.scenario.time_scale
        duration = self.scenario.maintenance[m.kind]["duration"]
        start = time.time() + notice / ts
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

    def begin_maintenance(self, m: Machine, mtype: str = "SCHEDULED") -> None:
        """Window opens: the machine goes down (status per kind) until the restart duration passes.

        With no notice before (a drill without extended notifications) the maintenance starts ONGOING.
        Once ONGOING it cannot be moved: canReschedule is false. A Compute VM passes STOPPING on its
        way to TERMINATED, as on Google."""
        ts = self.scenario.time_scale
        duration = self.scenario.maintenance[m.kind]["duration"]
        now = time.time()
        if m.maintenance is None:
            m.maintenance = {"type": mtype, "start": now, "latest": now}
        m.maintenance.update(status="ONGOING", start=now, latest=now, end=now + duration / ts, can_reschedule=False)
        m.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
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
        self.log("maintenance_start", machine=m.machine_id, type=m.maintenance["type"])
        self.after_for(m, duration / ts, lambda: self.end_maintenance(m))

    def end_maintenance(self, m: Machine) -> None:
        """Host serviced: a TPU node is READY again; a Compute VM with automaticRestart passes STAGING to
        RUNNING (and boots), one without stays TERMINATED and releases its capacity."""
        m.maintenance = None
        m.maintenance_event = "NONE"
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
        """Spot preemption, no notice: down at once, capacity released."""
        m.generation += 1
        m.maintenance = None
        m.maintenance_event = "NONE"
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

    def crash(self, m: Machine) -> None:
        """SIGKILL the guest; the machine reboots (runs its startup script again) shortly after."""
        m.proc.crash()
        self.log("machine_crash", machine=m.machine_id)
        self.after_for(m, 0.2, lambda: self.boot(m))

    def upcoming(self, m: Machine) -> dict[str, Any] | None:
        """upcomingMaintenance as the API shows it (camelCase, enum names)."""
        mt = m.maintenance
        if mt is None:
            return None
        return {
            "type": mt["type"],
            "canReschedule": mt["can_reschedule"],
            "windowStartTime": rfc3339(mt["start"]),
            "windowEndTime": rfc3339(mt["end"]),
            "latestWindowStartTime": rfc3339(max(mt["latest"], mt["start"])),
            "maintenanceStatus": mt["status"],
        }
