"""Compute Engine v1, the subset GPU VMs need, as compute.googleapis.com/compute/v1 serves it.

Instance lifecycle: PROVISIONING -> STAGING -> RUNNING; stop: STOPPING -> TERMINATED; delete: STOPPING -> gone;
host maintenance: STOPPING -> TERMINATED -> (automaticRestart) STAGING -> RUNNING.
simulateMaintenanceEvent follows Google: with ``withExtendedNotifications=true`` a notice comes first;
without, a VM that cannot live-migrate is terminated (and restarted per automaticRestart) at once.
Zone operations finish after the scenario's delay; `zoneOperations.wait` long-polls until DONE.
"""

from __future__ import annotations

import re
import time
from typing import Any

from interlude_localcloud.catalog import GPU_DESCRIPTIONS, GPU_QUOTA_METRICS, machine_type
from interlude_localcloud.cloud import Cloud, Machine, rfc3339
from interlude_localcloud.errors import ApiError, already_exists, invalid
from interlude_localcloud.server import Request, Response, Router

DOC = "compute.v1"
P = r"/compute/v1/projects/(?P<project>[^/]+)"
Z = P + r"/zones/(?P<zone>[^/]+)"
INST = Z + r"/instances/(?P<name>[^/]+)"


def stockout_message(project: str, zone: str) -> str:
    """Google's ZONE_RESOURCE_POOL_EXHAUSTED text, byte for byte (two spaces before "Try")."""
    return (
        f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
        "fulfill the request.  Try a different zone, or try again later."
    )


def quota_message(metric: str, limit: float, region: str) -> str:
    """Google's regional quota text, byte for byte (two spaces before "Limit")."""
    return f"Quota '{metric}' exceeded.  Limit: {limit:.1f} in region {region}."


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


class ComputeApi:
    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    def register(self, r: Router) -> None:
        r.add("GET", INST, self.get_instance, DOC)
        r.add("GET", Z + "/instances", self.list_instances, DOC)
        r.add("POST", Z + "/instances", self.insert_instance, DOC, "Instance")
        r.add("DELETE", INST, self.delete_instance, DOC)
        r.add("POST", INST + "/stop", self.stop_instance, DOC)
        r.add("POST", INST + "/start", self.start_instance, DOC)
        r.add("POST", INST + "/simulateMaintenanceEvent", self.simulate_maintenance, DOC)
        r.add("POST", INST + "/performMaintenance", self.perform_maintenance, DOC)
        r.add("GET", INST + "/serialPort", self.serial_port, DOC)
        r.add("GET", Z + r"/operations/(?P<op>[^/]+)", self.get_operation, DOC)
        r.add("POST", Z + r"/operations/(?P<op>[^/]+)/wait", self.wait_operation, DOC)
        r.add("GET", Z + "/operations", self.list_operations, DOC)
        r.add("GET", Z + "/acceleratorTypes", self.list_accelerator_types, DOC)
        r.add("GET", Z + "/machineTypes", self.list_machine_types, DOC)
        r.add("GET", Z + "/reservations", self.list_reservations, DOC)
        r.add("GET", Z, self.get_zone, DOC)
        r.add("GET", P + r"/regions/(?P<region>[^/]+)", self.get_region, DOC)

    # helpers -----------------------------------------------------------------------------------
    @property
    def base(self) -> str:
        return f"{self.cloud.api_endpoint}/compute/v1/projects/{self.cloud.scenario.project}"

    def _zone(self, req: Request) -> str:
        if req.params["project"] != self.cloud.scenario.project:
            raise ApiError(
                403,
                f"Required 'compute.instances.get' permission for 'projects/{req.params['project']}'",
                reason="forbidden",
            )
        zone = req.params["zone"]
        if zone not in self.cloud.scenario.zones:
            raise ApiError(
                404, f"The resource 'projects/{req.params['project']}/zones/{zone}' was not found", reason="notFound"
            )
        return zone

    def _inst(self, req: Request) -> Machine:
        zone = self._zone(req)
        m = self.cloud.machines.get(("gce", zone, req.params["name"]))
        if m is None:
            raise ApiError(
                404,
                f"The resource 'projects/{self.cloud.scenario.project}/zones/{zone}/instances/"
                f"{req.params['name']}' was not found",
                reason="notFound",
            )
        return m

    def render(self, m: Machine) -> dict[str, Any]:
        out = dict(m.resource)
        up = self.cloud.upcoming(m)
        status = {k: v for k, v in (out.get("resourceStatus") or {}).items() if k != "upcomingMaintenance"}
        if up is not None:
            status["upcomingMaintenance"] = up
        if status:
            out["resourceStatus"] = status
        else:
            out.pop("resourceStatus", None)
        return out

    def _op(self, zone: str, op_type: str, m: Machine | None, target_name: str) -> dict[str, Any]:
        name = self.cloud.op_suffix()
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "id": self.cloud.new_id(),
            "name": name,
            "zone": f"{self.base}/zones/{zone}",
            "operationType": op_type,
            "targetLink": f"{self.base}/zones/{zone}/instances/{target_name}",
            "status": "RUNNING",
            "user": "anonymous@localcloud",
            "progress": 0,
            "insertTime": rfc3339(),
            "startTime": rfc3339(),
            "selfLink": f"{self.base}/zones/{zone}/operations/{name}",
        }
        if m is not None:
            op["targetId"] = m.resource["id"]
        self.cloud.gce_operations[(zone, name)] = op
        return op

    def _done(self, op: dict[str, Any], error: dict[str, Any] | None = None, http: int | None = None) -> None:
        op.update(status="DONE", progress=100, endTime=rfc3339())
        if error is not None:
            op["error"] = {"errors": [error]}
            op["httpErrorStatusCode"] = http or 400
            op["httpErrorMessage"] = {503: "SERVICE UNAVAILABLE", 400: "BAD REQUEST"}.get(http or 400, "ERROR")
        self.cloud.log("gce_operation_done", operation=op["name"], type=op["operationType"], error=error)
        self.cloud.changed.notify_all()

    def _gpus(self, zone: str, body: dict[str, Any]) -> tuple[str, str, int]:
        """(machine type name, gpu type or "", gpu count) after validating against the zone's offer."""
        z = self.cloud.scenario.zones[zone]
        mt_name = _last(body.get("machineType", ""))
        if not mt_name:
            raise invalid("Invalid value for field 'resource.machineType': ''. Machine type is required.")
        info = machine_type(mt_name)
        if info is None or mt_name not in z.machine_types:
            raise invalid(
                f"Invalid value for field 'resource.machineType': '{body['machineType']}'. "
                f"Machine type with name '{mt_name}' does not exist in zone '{zone}'."
            )
        gpu, count = info.gpu_type or "", info.gpu_count
        for acc in body.get("guestAccelerators") or []:
            at = _last(acc.get("acceleratorType", ""))
            if at not in z.gpu_types:
                raise invalid(
                    f"Invalid value for field 'resource.guestAccelerators[0].acceleratorType': "
                    f"'{acc.get('acceleratorType')}'. Accelerator type '{at}' does not exist "
                    f"in zone '{zone}'."
                )
            if gpu and gpu != at:
                raise invalid(f"Machine type {mt_name} does not support guest accelerators.")
            gpu = at
            count += int(acc.get("acceleratorCount", 1))
        if gpu and gpu not in z.gpu_types:
            raise invalid(f"Accelerator type '{gpu}' is not available in zone '{zone}'.")
        return mt_name, gpu, count

    def _quota_check(self, zone: str, gpu: str, count: int, spot: bool, cpus: int) -> None:
        region = self.cloud.scenario.zones[zone].region
        quotas = self.cloud.scenario.quotas.get(region) or {}
        checks: list[tuple[str, float]] = [("CPUS", cpus)]
        if gpu:
            metric = GPU_QUOTA_METRICS.get(gpu, (None, None))[1 if spot else 0]
            if metric:
                checks.append((metric, count))
        usage = self.region_usage(region)
        for metric, need in checks:
            if metric in quotas and usage.get(metric, 0.0) + need > quotas[metric]:
                raise ApiError(403, quota_message(metric, quotas[metric], region), "PERMISSION_DENIED", "quotaExceeded")

    def region_usage(self, region: str) -> dict[str, float]:
        usage: dict[str, float] = {}
        for m in self.cloud.machines.values():
            if m.kind != "gce" or not m.holds or self.cloud.scenario.zones[m.zone].region != region:
                continue
            info = machine_type(_last(m.resource["machineType"]))
            usage["CPUS"] = usage.get("CPUS", 0.0) + (info.cpus if info else 0)
            if m.cap_type:
                metric = GPU_QUOTA_METRICS.get(m.cap_type, (None, None))[1 if m.spot else 0]
                if metric:
                    usage[metric] = usage.get(metric, 0.0) + m.units
        return usage

    def _stockout(self, zone: str) -> dict[str, Any]:
        return {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": stockout_message(self.cloud.scenario.project, zone)}

    # instances ---------------------------------------------------------------------------------
    def get_instance(self, req: Request) -> Response:
        with self.cloud.lock:
            return Response(self.render(self._inst(req)), "Instance")

    def list_instances(self, req: Request) -> Response:
        with self.cloud.lock:
            zone = self._zone(req)
            flt = parse_filter(req.query.get("filter", ""))
            items = [self.render(m) for (k, z, _), m in sorted(self.cloud.machines.items()) if k == "gce" and z == zone]
            items = [i for i in items if matches(i, flt)]
            out: dict[str, Any] = {
                "kind": "compute#instanceList",
                "id": f"projects/{self.cloud.scenario.project}/zones/{zone}/instances",
                "selfLink": f"{self.base}/zones/{zone}/instances",
            }
            if items:
                out["items"] = items
            return Response(out, "InstanceList")

    def insert_instance(self, req: Request) -> Response:
        body = req.body or {}
        with self.cloud.lock:
            zone = self._zone(req)
            name = body.get("name", "")
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
                raise invalid(
                    f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                    "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
                )
            if ("gce", zone, name) in self.cloud.machines:
                raise already_exists(f"projects/{self.cloud.scenario.project}/zones/{zone}/instances/{name}")
            mt_name, gpu, count = self._gpus(zone, body)
            sched = dict(body.get("scheduling") or {})
            if gpu and sched.get("onHostMaintenance") == "MIGRATE":
                raise invalid("Instances with guest accelerators do not support live migration.")
            spot = sched.get("provisioningModel") == "SPOT" or bool(sched.get("preemptible"))
            sched.setdefault("onHostMaintenance", "TERMINATE" if gpu or spot else "MIGRATE")
            sched.setdefault("automaticRestart", not spot)
            sched.setdefault("provisioningModel", "SPOT" if spot else "STANDARD")
            sched.setdefault("preemptible", bool(spot and sched.get("preemptible")))
            info = machine_type(mt_name)
            self._quota_check(zone, gpu, count, spot, info.cpus if info else 0)
            iid = self.cloud.new_id()
            res: dict[str, Any] = {
                k: v
                for k, v in body.items()
                if k not in ("id", "status", "selfLink", "zone", "creationTimestamp", "kind", "resourceStatus")
            }
            res.update(
                kind="compute#instance",
                id=iid,
                name=name,
                creationTimestamp=rfc3339(),
                machineType=f"{self.base}/zones/{zone}/machineTypes/{mt_name}",
                status="PROVISIONING",
                zone=f"{self.base}/zones/{zone}",
                selfLink=f"{self.base}/zones/{zone}/instances/{name}",
                scheduling=sched,
                cpuPlatform="Intel Sapphire Rapids",
                labelFingerprint="42WmSpB8rSM=",
                networkInterfaces=[
                    {
                        "kind": "compute#networkInterface",
                        "name": "nic0",
                        "network": f"{self.base}/global/networks/default",
                        "networkIP": f"10.128.1.{2 + int(iid) % 250}",
                        "fingerprint": "abc123=",
                    }
                ],
            )
            if body.get("guestAccelerators"):
                res["guestAccelerators"] = [
                    {
                        "acceleratorType": f"{self.base}/zones/{zone}/acceleratorTypes/{_last(a['acceleratorType'])}",
                        "acceleratorCount": int(a.get("acceleratorCount", 1)),
                    }
                    for a in body["guestAccelerators"]
                ]
            md = dict(body.get("metadata") or {})
            md.update(kind="compute#metadata", fingerprint="fp-" + iid[-8:])
            res["metadata"] = md
            m = self.cloud.new_machine("gce", zone, name, res, spot, gpu, count)
            op = self._op(zone, "insert", m, name)
            ok = self.cloud.has_capacity(zone, gpu, spot, "gce", count)
            m.holds = ok
            self.cloud.log(
                "gce_instance_insert",
                instance=name,
                zone=zone,
                machine_type=mt_name,
                gpu=gpu,
                gpus=count,
                spot=spot,
                outcome="ok" if ok else "ZONE_RESOURCE_POOL_EXHAUSTED",
            )

            def staging() -> None:
                if not m.deleted and ok:
                    m.resource["status"] = "STAGING"

            def done() -> None:
                if m.deleted:
                    return
                if not ok:
                    self.cloud.machines.pop(("gce", zone, name), None)
                    m.deleted = True
                    self._done(op, self._stockout(zone), 503)
                    return
                self._running(m)
                self._done(op)

            # PROVISIONING for the create delay, then STAGING (booting) for a start delay, then RUNNING
            create, boot = self.cloud.scenario.delay("gce_create"), self.cloud.scenario.delay("gce_start")
            self.cloud.after(create, staging)
            self.cloud.after(create + boot, done)
            return Response(dict(op), "Operation")

    def _running(self, m: Machine) -> None:
        m.resource["status"] = "RUNNING"
        m.resource["lastStartTimestamp"] = rfc3339()
        m.preempted = False
        self.cloud.boot(m)

    def delete_instance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._inst(req)
            op = self._op(m.zone, "delete", m, m.name)
            m.resource["status"] = "STOPPING"
            m.generation += 1
            m.maintenance = None
            self.cloud.take_down(m, "delete")

            def done() -> None:
                if not m.deleted:
                    self.cloud.destroy(m)
                self._done(op)

            self.cloud.after(self.cloud.scenario.delay("gce_delete"), done)
            return Response(dict(op), "Operation")

    def stop_instance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._inst(req)
            op = self._op(m.zone, "stop", m, m.name)
            if m.resource["status"] == "TERMINATED":
                self._done(op)
                return Response(dict(op), "Operation")
            m.resource["status"] = "STOPPING"
            m.generation += 1
            m.maintenance = None
            m.maintenance_event = "NONE"
            self.cloud.take_down(m, "stop")

            def done() -> None:
                m.resource["status"] = "TERMINATED"
                m.resource["lastStopTimestamp"] = rfc3339()
                m.holds = False
                self._done(op)

            self.cloud.after_for(m, self.cloud.scenario.delay("gce_stop"), done)
            return Response(dict(op), "Operation")

    def start_instance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._inst(req)
            op = self._op(m.zone, "start", m, m.name)
            if m.resource["status"] in ("RUNNING", "STAGING", "PROVISIONING"):
                self._done(op)
                return Response(dict(op), "Operation")
            if m.resource["status"] != "TERMINATED":
                raise ApiError(
                    400,
                    f"The instance is in state {m.resource['status']} and cannot be started.",
                    reason="resourceNotReady",
                )
            if not m.holds:
                info = machine_type(_last(m.resource["machineType"]))
                self._quota_check(m.zone, m.cap_type, m.units, m.spot, info.cpus if info else 0)
                if not self.cloud.has_capacity(m.zone, m.cap_type, m.spot, "gce", m.units):
                    self._done(op, self._stockout(m.zone), 503)
                    return Response(dict(op), "Operation")
            m.holds = True
            m.resource["status"] = "STAGING"
            m.generation += 1

            def done() -> None:
                self._running(m)
                self._done(op)

            self.cloud.after_for(m, self.cloud.scenario.delay("gce_start"), done)
            return Response(dict(op), "Operation")

    def simulate_maintenance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._inst(req)
            if m.resource["status"] != "RUNNING":
                raise ApiError(
                    400, "The instance must be RUNNING to simulate a maintenance event.", reason="resourceNotReady"
                )
            op = self._op(m.zone, "simulateMaintenanceEvent", m, m.name)
            extended = req.query.get("withExtendedNotifications", "").lower() == "true"
            policy = (m.resource.get("scheduling") or {}).get("onHostMaintenance", "MIGRATE")
            if extended:  # the notice first, as before real maintenance
                mtype, notice = self.cloud.choose_maintenance("gce")
                self.cloud.schedule_maintenance(m, mtype, notice)
            elif policy == "TERMINATE":  # no notice: terminated now, restarted per automaticRestart
                self.cloud.begin_maintenance(m)
            else:  # live migration: the VM keeps running
                self.cloud.log("live_migrated", machine=m.machine_id)
            self._done(op)
            return Response(dict(op), "Operation")

    def perform_maintenance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._inst(req)
            if m.maintenance is None or m.maintenance["status"] != "PENDING":
                raise ApiError(400, "There is no pending maintenance for this instance.", reason="conditionNotMet")
            if not m.maintenance.get("can_reschedule"):  # Google: only a reschedulable maintenance starts early
                raise ApiError(
                    400, "The pending maintenance for this instance cannot be rescheduled.", reason="conditionNotMet"
                )
            op = self._op(m.zone, "performMaintenance", m, m.name)
            self.cloud.log("perform_maintenance", machine=m.machine_id)
            self.cloud.begin_maintenance(m)
            self._done(op)
            return Response(dict(op), "Operation")

    def serial_port(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._inst(req)
            path = m.proc.serial_log
        data = path.read_bytes() if path.exists() else b""
        start = int(req.query.get("start", "0") or 0)
        return Response(
            {
                "kind": "compute#serialPortOutput",
                "contents": data[start:].decode(errors="replace"),
                "start": str(start),
                "next": str(len(data)),
                "selfLink": f"{self.base}/zones/{m.zone}/instances/{m.name}/serialPort",
            },
            "SerialPortOutput",
        )

    # operations --------------------------------------------------------------------------------
    def _operation(self, req: Request) -> dict[str, Any]:
        zone = self._zone(req)
        op = self.cloud.gce_operations.get((zone, req.params["op"]))
        if op is None:
            raise ApiError(
                404,
                f"The resource 'projects/{self.cloud.scenario.project}/zones/{zone}/operations/"
                f"{req.params['op']}' was not found",
                reason="notFound",
            )
        return op

    def get_operation(self, req: Request) -> Response:
        with self.cloud.lock:
            return Response(dict(self._operation(req)), "Operation")

    def wait_operation(self, req: Request) -> Response:
        """Block until DONE or about 2 minutes, as zoneOperations.wait does."""
        deadline = time.time() + 120
        with self.cloud.lock:
            op = self._operation(req)
            while op["status"] != "DONE" and time.time() < deadline:
                self.cloud.changed.wait(timeout=0.5)
            return Response(dict(op), "Operation")

    def list_operations(self, req: Request) -> Response:
        with self.cloud.lock:
            zone = self._zone(req)
            items = [dict(o) for (z, _), o in self.cloud.gce_operations.items() if z == zone]
            out: dict[str, Any] = {
                "kind": "compute#operationList",
                "id": f"{zone}/operations",
                "selfLink": f"{self.base}/zones/{zone}/operations",
            }
            if items:
                out["items"] = items
            return Response(out, "OperationList")

    # catalog -----------------------------------------------------------------------------------
    def list_accelerator_types(self, req: Request) -> Response:
        zone = self._zone(req)
        items = [
            {
                "kind": "compute#acceleratorType",
                "id": str(10000 + i),
                "name": t,
                "creationTimestamp": "2020-01-01T00:00:00.000-07:00",
                "description": GPU_DESCRIPTIONS.get(t, t),
                "zone": f"{self.base}/zones/{zone}",
                "maximumCardsPerInstance": 8,
                "selfLink": f"{self.base}/zones/{zone}/acceleratorTypes/{t}",
            }
            for i, t in enumerate(self.cloud.scenario.zones[zone].gpu_types)
        ]
        out: dict[str, Any] = {
            "kind": "compute#acceleratorTypeList",
            "id": f"{zone}/acceleratorTypes",
            "selfLink": f"{self.base}/zones/{zone}/acceleratorTypes",
        }
        if items:
            out["items"] = items
        return Response(out, "AcceleratorTypeList")

    def list_machine_types(self, req: Request) -> Response:
        zone = self._zone(req)
        items = []
        for i, name in enumerate(self.cloud.scenario.zones[zone].machine_types):
            info = machine_type(name)
            if info is None:
                continue
            item: dict[str, Any] = {
                "kind": "compute#machineType",
                "id": str(20000 + i),
                "name": name,
                "creationTimestamp": "2020-01-01T00:00:00.000-07:00",
                "description": f"{info.cpus} vCPUs, {info.memory_mb // 1024} GB RAM",
                "guestCpus": info.cpus,
                "memoryMb": info.memory_mb,
                "zone": zone,
                "maximumPersistentDisks": 128,
                "maximumPersistentDisksSizeGb": "263168",
                "imageSpaceGb": 0,
                "isSharedCpu": False,
                "architecture": "X86_64",
                "selfLink": f"{self.base}/zones/{zone}/machineTypes/{name}",
            }
            if info.gpu_type:
                item["accelerators"] = [
                    {"guestAcceleratorType": info.gpu_type, "guestAcceleratorCount": info.gpu_count}
                ]
            items.append(item)
        out: dict[str, Any] = {
            "kind": "compute#machineTypeList",
            "id": f"{zone}/machineTypes",
            "selfLink": f"{self.base}/zones/{zone}/machineTypes",
        }
        if items:
            out["items"] = items
        return Response(out, "MachineTypeList")

    def list_reservations(self, req: Request) -> Response:
        zone = self._zone(req)
        items = []
        for i, r in enumerate(self.cloud.scenario.zones[zone].reservations):
            items.append(
                {
                    "kind": "compute#reservation",
                    "id": str(30000 + i),
                    "name": r["name"],
                    "creationTimestamp": "2026-01-01T00:00:00.000-07:00",
                    "zone": f"{self.base}/zones/{zone}",
                    "status": "READY",
                    "specificReservationRequired": bool(r.get("specific", True)),
                    "selfLink": f"{self.base}/zones/{zone}/reservations/{r['name']}",
                    "specificReservation": {
                        "count": str(r.get("count", 1)),
                        "inUseCount": str(r.get("in_use", 0)),
                        "instanceProperties": {
                            "machineType": r.get("machine_type", "g2-standard-4"),
                            **(
                                {
                                    "guestAccelerators": [
                                        {
                                            "acceleratorType": r["accelerator_type"],
                                            "acceleratorCount": int(r.get("accelerator_count", 1)),
                                        }
                                    ]
                                }
                                if r.get("accelerator_type")
                                else {}
                            ),
                        },
                    },
                }
            )
        out: dict[str, Any] = {
            "kind": "compute#reservationList",
            "id": f"{zone}/reservations",
            "selfLink": f"{self.base}/zones/{zone}/reservations",
        }
        if items:
            out["items"] = items
        return Response(out, "ReservationList")

    def get_zone(self, req: Request) -> Response:
        zone = self._zone(req)
        region = self.cloud.scenario.zones[zone].region
        return Response(
            {
                "kind": "compute#zone",
                "id": str(abs(hash(zone)) % 10**12),
                "name": zone,
                "status": "UP",
                "region": f"{self.base}/regions/{region}",
                "creationTimestamp": "2020-01-01T00:00:00.000-07:00",
                "description": zone,
                "selfLink": f"{self.base}/zones/{zone}",
            },
            "Zone",
        )

    def get_region(self, req: Request) -> Response:
        if req.params["project"] != self.cloud.scenario.project:
            raise ApiError(403, "Permission denied", reason="forbidden")
        region = req.params["region"]
        regions = self.cloud.scenario.regions()
        if region not in regions:
            raise ApiError(
                404,
                f"The resource 'projects/{self.cloud.scenario.project}/regions/{region}' was not found",
                reason="notFound",
            )
        with self.cloud.lock:
            usage = self.region_usage(region)
        quotas = [
            {"metric": k, "limit": v, "usage": usage.get(k, 0.0)}
            for k, v in sorted((self.cloud.scenario.quotas.get(region) or {}).items())
        ]
        return Response(
            {
                "kind": "compute#region",
                "id": str(abs(hash(region)) % 10**12),
                "name": region,
                "description": region,
                "status": "UP",
                "creationTimestamp": "2020-01-01T00:00:00.000-07:00",
                "zones": [f"{self.base}/zones/{z}" for z in regions[region]],
                "quotas": quotas,
                "selfLink": f"{self.base}/regions/{region}",
            },
            "Region",
        )


_TERM = re.compile(r"\(?\s*([A-Za-z0-9_.\-]+)\s*(=|!=|:|\beq\b|\bne\b)\s*\"?([^\s\")]*)\"?\s*\)?")


def parse_filter(text: str) -> list[tuple[str, str, str]]:
    """`labels.run = abc AND status != TERMINATED` -> [(field, op, value)]; terms are ANDed."""
    text = text.strip()
    if not text:
        return []
    terms = []
    for part in re.split(r"\s+AND\s+|\)\s*\(", text):
        m = _TERM.fullmatch(part.strip()) or _TERM.search(part)
        if not m:
            raise invalid(f"Invalid value for field 'filter': '{text}'. Invalid list filter expression.")
        op = {"eq": "=", "ne": "!=", ":": "="}.get(m[2], m[2])
        terms.append((m[1], op, m[3]))
    return terms


def matches(item: dict[str, Any], terms: list[tuple[str, str, str]]) -> bool:
    for fld, op, want in terms:
        cur: Any = item
        for part in fld.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        got = "" if cur is None else str(cur).lower() if isinstance(cur, bool) else str(cur)
        if cur is not None and fld in ("machineType", "zone"):
            got = _last(got)
        ok = re.fullmatch(want, got) is not None if op in ("eq", "ne") else got == want
        if (op == "=" and not ok) or (op == "!=" and ok):
            return False
    return True
