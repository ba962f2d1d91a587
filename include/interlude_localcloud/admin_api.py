"""Admin endpoints under `/_localcloud/` (not Google's API): what tests and demos need to play God.

Preempt, crash or put a machine (or one worker of a multi-host TPU slice: body `{"worker": N}`) into
maintenance (its window on the scenario's clock, or held for the test to open: `:open-window`), pick the next
simulated maintenance, inject error
bursts, read the event log, list machines with their process ids, and list every machine's lifetime (when
it entered and left the cloud's machine table: how many were alive at once, without sampling).
"""

from __future__ import annotations

from typing import Any

from interlude_localcloud.catalog import tpu_shape
from interlude_localcloud.cloud import Cloud, Machine
from interlude_localcloud.errors import ApiError, invalid, not_found
from interlude_localcloud.machines import MachineTable
from interlude_localcloud.scenario import Fault
from interlude_localcloud.server import Request, Response, Router

M = r"/_localcloud/machines/(?P<kind>tpu|gce)/(?P<zone>[^/]+)/(?P<name>[^/:]+)"


class AdminApi:
    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud
        with cloud.lock:
            if not isinstance(cloud.machines, MachineTable):
                cloud.machines = MachineTable(cloud.machines)

    def register(self, r: Router) -> None:
        r.add("GET", "/_localcloud/health", lambda req: Response({"ok": True}))
        r.add("GET", "/_localcloud/events", self.events)
        r.add("GET", "/_localcloud/requests", self.requests)
        r.add("GET", "/_localcloud/machines", self.machines)
        r.add("GET", "/_localcloud/lifetimes", self.lifetimes)
        r.add("GET", "/_localcloud/violations", self.violations)
        r.add("POST", "/_localcloud/faults", self.add_fault)
        r.add("POST", "/_localcloud/next-maintenance", self.next_maintenance)
        r.add("POST", "/_localcloud/capacity", self.set_capacity)
        r.add("POST", M + ":preempt", self.preempt)
        r.add("POST", M + ":crash", self.crash)
        r.add("POST", M + ":maintenance", self.maintenance)
        r.add("POST", M + ":open-window", self.open_window)

    def _machine(self, req: Request) -> Machine:
        m = self.cloud.machines.get((req.params["kind"], req.params["zone"], req.params["name"]))
        if m is None:
            raise not_found(f"{req.params['kind']}/{req.params['zone']}/{req.params['name']}")
        return m

    @staticmethod
    def _worker(m: Machine, req: Request) -> int:
        """The body's `worker` (0 when absent), a 400 when the machine has no such worker."""
        raw = (req.body or {}).get("worker")
        worker = 0 if raw is None else raw
        if not isinstance(worker, int) or not 0 <= worker < len(m.hosts()):
            raise invalid(f"worker must be 0 to {len(m.hosts()) - 1} for {m.machine_id}")
        return worker

    def events(self, req: Request) -> Response:
        since = float(req.query.get("since", "0") or 0)
        with self.cloud.lock:
            return Response({"events": [e for e in self.cloud.events if e["t"] >= since]})

    def requests(self, req: Request) -> Response:
        """The Google API requests the cloud received at or after `since` (epoch seconds): {t, method, path}."""
        since = float(req.query.get("since", "0") or 0)
        with self.cloud.lock:
            return Response({"requests": [r for r in self.cloud.requests if r["t"] >= since]})

    def lifetimes(self, req: Request) -> Response:
        """Every machine alive at or after `since`: created and deleted times (deleted null while it lives)."""
        since = float(req.query.get("since", "0") or 0)
        with self.cloud.lock:
            table = self.cloud.machines
            return Response({"lifetimes": table.since(since) if isinstance(table, MachineTable) else []})

    def violations(self, req: Request) -> Response:
        """Strict-mode violations and internal errors so far (for a cloud running as a subprocess)."""
        with self.cloud.lock:
            return Response({"violations": list(self.cloud.violations)})

    def machines(self, req: Request) -> Response:
        with self.cloud.lock:
            out: list[dict[str, Any]] = []
            for m in self.cloud.machines.values():
                out.append(
                    {
                        "id": m.machine_id,
                        "kind": m.kind,
                        "zone": m.zone,
                        "name": m.name,
                        "state": m.resource.get("state") or m.resource.get("status"),
                        "pid": m.proc.pid(),
                        "boots": m.proc.boots,
                        "disk_dir": str(m.proc.disk_dir),
                        "spot": m.spot,
                        "holds_capacity": m.holds,
                        "maintenance": m.maintenance,
                        "maintenance_event": m.maintenance_event,
                        "preempted": m.preempted,
                        **(self._slice(m) if m.kind == "tpu" else {}),
                    }
                )
            return Response({"machines": out})

    @staticmethod
    def _slice(m: Machine) -> dict[str, Any]:
        """A TPU node's chips and hosts (Google's tables) and each worker's own process, disk and notice."""
        shape = tpu_shape(m.cap_type)
        return {
            "chips": shape.chips,
            "hosts": shape.hosts,
            "workers": [
                {
                    "worker": i,
                    "id": h.machine_id,
                    "pid": h.proc.pid(),
                    "boots": h.proc.boots,
                    "disk_dir": str(h.proc.disk_dir),
                    "port": h.port,
                    "maintenance": h.maintenance,
                    "maintenance_event": h.maintenance_event,
                }
                for i, h in enumerate(m.hosts())
            ],
        }

    def add_fault(self, req: Request) -> Response:
        b = req.body or {}
        if "path_regex" not in b:
            raise invalid("path_regex is required")
        with self.cloud.lock:
            self.cloud.faults.append(
                Fault(
                    path_regex=b["path_regex"],
                    status=int(b.get("status", 503)),
                    count=int(b.get("count", 1)),
                    method=b.get("method"),
                )
            )
        return Response({"ok": True})

    def set_capacity(self, req: Request) -> Response:
        """Change a zone's capacity for one type (0 = a stockout from now on; machines already up keep running)."""
        from interlude_localcloud.scenario import Tier

        b = req.body or {}
        zone, kind, cap_type = b.get("zone"), b.get("kind"), b.get("type")
        if kind not in ("tpu", "gpu") or not cap_type or zone not in self.cloud.scenario.zones:
            raise invalid("zone (a scenario zone), kind (tpu|gpu) and type are required")
        with self.cloud.lock:
            z = self.cloud.scenario.zones[zone]
            tiers = z.tpu_capacity if kind == "tpu" else z.gpu_capacity
            tiers[cap_type] = Tier(on_demand=int(b.get("on_demand", 0)), spot=int(b.get("spot", 0)))
            self.cloud.log(
                "capacity_set",
                zone=zone,
                family=kind,
                type=cap_type,
                on_demand=tiers[cap_type].on_demand,
                spot=tiers[cap_type].spot,
            )
        return Response({"ok": True})

    def _window(self, b: dict[str, Any], kinds: list[str]) -> tuple[bool, float | None]:
        """The body's `held` and `latest_start_after` (simulated seconds), checked for every kind it may apply to."""
        held = b.get("held", False)
        latest = b.get("latest_start_after")
        if not isinstance(held, bool) or (latest is not None and not isinstance(latest, int | float)):
            raise invalid("held must be a boolean and latest_start_after a number of simulated seconds")
        try:
            for kind in kinds:
                self.cloud.latest_start_after(kind, held, None if latest is None else float(latest))
        except ValueError as e:
            raise invalid(str(e)) from e
        return held, None if latest is None else float(latest)

    def next_maintenance(self, req: Request) -> Response:
        """The next simulateMaintenanceEvent's type and notice, and whether its window is held for the test."""
        b = req.body or {}
        mtype = b.get("type", "SCHEDULED")
        if mtype not in ("SCHEDULED", "UNSCHEDULED"):
            raise invalid("type must be SCHEDULED or UNSCHEDULED")
        kind = b.get("kind") or "*"
        held, latest = self._window(b, [kind] if kind != "*" else list(self.cloud.scenario.maintenance))
        with self.cloud.lock:
            self.cloud.next_maintenance[kind] = {
                "type": mtype,
                "notice_seconds": b.get("notice_seconds"),
                "held": held,
                "latest_start_after": latest,
            }
        return Response({"ok": True})

    def preempt(self, req: Request) -> Response:
        """Spot preemption; of one worker of a slice, which takes the whole slice (node PREEMPTED)."""
        with self.cloud.lock:
            m = self._machine(req)
            worker = self._worker(m, req)
            if not m.spot:
                raise ApiError(400, "only spot/preemptible machines can be preempted", "FAILED_PRECONDITION")
            if m.extra_workers:
                self.cloud.log("worker_preempted", machine=m.hosts()[worker].machine_id, worker=worker)
            self.cloud.preempt(m)
            if m.kind == "gce" and (m.resource.get("scheduling") or {}).get("instanceTerminationAction") == "DELETE":
                self.cloud.destroy(m)
        return Response({"ok": True})

    def crash(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._machine(req)
            self.cloud.crash(m, self._worker(m, req))
        return Response({"ok": True})

    def maintenance(self, req: Request) -> Response:
        """Host maintenance Google starts on its own (default UNSCHEDULED with the short notice); on a slice,
        one worker's host (the slice goes down when its window opens). `held: true` (with `latest_start_after`
        simulated seconds, or the scenario's) keeps the window for the test to open (`:open-window`)."""
        b = req.body or {}
        with self.cloud.lock:
            m = self._machine(req)
            worker = self._worker(m, req)
            held, latest = self._window(b, [m.kind])
            mtype = b.get("type", "UNSCHEDULED")
            notice = b.get("notice_seconds")
            if notice is None:
                key = "unscheduled_notice" if mtype == "UNSCHEDULED" else "scheduled_notice"
                notice = self.cloud.scenario.maintenance[m.kind][key]
            self.cloud.schedule_maintenance(
                m, mtype, float(notice), host=m.hosts()[worker], held=held, latest_after=latest
            )
        return Response({"ok": True})

    def open_window(self, req: Request) -> Response:
        """The test opens a held window: now, or at its windowStartTime if that is still ahead. 400 when the machine
        (worker) has no held PENDING notice. Answers {opens_at, window_start, latest_start} (epoch seconds)."""
        with self.cloud.lock:
            m = self._machine(req)
            try:
                return Response(self.cloud.open_window(m, self._worker(m, req)))
            except ValueError as e:
                raise ApiError(400, str(e), "FAILED_PRECONDITION") from e
