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
from pathlib import Path
from typing import Any

from interlude_localcloud.machines import Devices, MachineProcess
from interlude_localcloud.maintenance import Maintenance
from interlude_localcloud.scenario import Fault, Scenario
from interlude_localcloud.slices import Worker, free_ports, slice_env, worker_id
from interlude_localcloud.timefmt import rfc3339

REQUESTS_KEPT = 100_000  # the request log keeps the newest this many (a long demo must not grow without end)

__all__ = ["Cloud", "Machine", "rfc3339"]


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
    extra_workers: list[Worker] = field(default_factory=list)  # workers 1..N-1 of a multi-host TPU slice
    port: int = 0  # worker 0's local port on a multi-host slice (slices.py)
    # attributes the platform sets for the guest that the API's metadata does not show (a TPU VM's accelerator-type)
    platform_attributes: dict[str, str] = field(default_factory=dict)

    @property
    def machine_id(self) -> str:
        return f"{self.kind}-{self.zone}-{self.name}"

    def hosts(self) -> list[Machine | Worker]:
        """The node's workers in order: the machine itself (worker 0), then a multi-host slice's others."""
        return [self, *self.extra_workers]

    def script(self) -> str | None:
        if self.kind == "tpu":
            return (self.resource.get("metadata") or {}).get("startup-script")
        return self.attributes().get("startup-script")

    def attributes(self) -> dict[str, str]:
        if self.kind == "tpu":
            return dict(self.resource.get("metadata") or {})
        items = (self.resource.get("metadata") or {}).get("items") or []
        return {**self.platform_attributes, **{i["key"]: i.get("value", "") for i in items}}


class Cloud(Maintenance):
    """Shared state and clock (maintenance lifecycle: the Maintenance mixin). API modules call into it
    holding `self.lock`."""

    def __init__(self, scenario: Scenario, state_dir: Path, api_endpoint: str = "", gcs_endpoint: str = "") -> None:
        self.scenario = scenario
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.api_endpoint = api_endpoint
        self.gcs_endpoint = gcs_endpoint
        self.lock = threading.RLock()
        # (zone, cap_type, spot, kind) -> accelerator units GKE nodes hold there; set by the GKE facet
        self.node_units: Callable[[str, str, bool, str], int] | None = None
        # GKE's nodes as Compute Engine instances (interlude_localcloud.gke.node_vms.GkeNodeVms); set by the GKE facet
        self.gke_nodes: Any = None
        self.changed = threading.Condition(self.lock)
        self.machines: dict[tuple[str, str, str], Machine] = {}
        self.operations: dict[str, dict[str, Any]] = {}  # TPU operations by full name
        self.gce_operations: dict[tuple[str, str], dict[str, Any]] = {}
        self.queued: dict[tuple[str, str], dict[str, Any]] = {}
        self.faults: list[Fault] = list(scenario.faults)
        self.next_maintenance: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        # every Google API request answered or refused (not the admin API): {t, method, path}, oldest first
        self.requests: list[dict[str, Any]] = []
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
            for h in m.hosts():
                h.proc.shutdown(grace=min(self.scenario.stop_grace_seconds, 2.0), reason="cloud stop", block=True)

    # bookkeeping ---------------------------------------------------------------------------
    def new_id(self) -> str:
        return str(next(self._ids) * 7919 + 4_000_000_000_000)

    def op_suffix(self) -> str:
        return f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}"

    def log(self, kind: str, **fields: Any) -> None:
        self.events.append({"time": rfc3339(), "t": time.time(), "event": kind, **fields})
        self.changed.notify_all()

    def log_request(self, method: str, path: str) -> None:
        """What the cloud was asked (method and path, at arrival): the request log tests read beside the event log."""
        with self.lock:
            self.requests.append({"t": time.time(), "method": method, "path": path})
            del self.requests[:-REQUESTS_KEPT]

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
        hosts: int = 1,
        devices: Devices | None = None,
    ) -> Machine:
        """A machine; a multi-host TPU slice (hosts > 1) gets one process per worker (slices.py)."""
        mid = f"{kind}-{zone}-{name}"
        ports = free_ports(hosts) if hosts > 1 else [0]
        procs = []
        for i in range(hosts):
            wid = worker_id(mid, i)
            env = {
                "INTERLUDE_METADATA_URL": f"{self.api_endpoint}/_machines/{wid}/computeMetadata/v1",
                "STORAGE_EMULATOR_HOST": self.gcs_endpoint,
                "INTERLUDE_MACHINE_ID": wid,
                **(slice_env(ports) if hosts > 1 else {}),
            }
            procs.append(MachineProcess(wid, self.state_dir / "machines" / wid, env, devices))
        m = Machine(kind, zone, name, resource, spot, cap_type, units, procs[0], port=ports[0])
        m.extra_workers = [Worker(i, procs[i].machine_id, procs[i], ports[i]) for i in range(1, hosts)]
        self.machines[(kind, zone, name)] = m
        return m

    def machine_by_id(self, mid: str) -> Machine | None:
        found = self.host_by_id(mid)
        return found[0] if found is not None else None

    def host_by_id(self, mid: str) -> tuple[Machine, Machine | Worker, int] | None:
        """(machine, worker, worker number) for a worker's machine id (worker 0's is the machine's)."""
        for m in self.machines.values():
            for i, h in enumerate(m.hosts()):
                if h.machine_id == mid:
                    return m, h, i
        return None

    def boot(self, m: Machine, only: Machine | Worker | None = None) -> None:
        """Every worker runs the startup script (or just `only`, a worker rebooting after a crash)."""
        multi = bool(m.extra_workers)
        for i, h in enumerate(m.hosts()):
            if only is None or h is only:
                h.proc.boot(m.script())
                self.log("machine_boot", machine=h.machine_id, boots=h.proc.boots, **({"worker": i} if multi else {}))

    def take_down(self, m: Machine, reason: str) -> None:
        multi = bool(m.extra_workers)
        for i, h in enumerate(m.hosts()):
            h.proc.shutdown(self.scenario.stop_grace_seconds, reason)
            self.log("machine_down", machine=h.machine_id, reason=reason, **({"worker": i} if multi else {}))

    def destroy(self, m: Machine) -> None:
        m.deleted = True
        m.holds = False
        self.machines.pop((m.kind, m.zone, m.name), None)
        for h in m.hosts():
            threading.Thread(target=h.proc.destroy, daemon=True).start()
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
