"""Compute Engine v1 instances, the subset GPU and TPU VMs need, as compute.googleapis.com/compute/v1 serves them
(changes to an instance: compute_updates.py; zones, regions and types: compute_catalog_api.py).

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

from interlude_localcloud.cloud import Machine, rfc3339
from interlude_localcloud.compute_base import DOC, INST, ComputeBase, Z, last
from interlude_localcloud.compute_catalog_api import ComputeCatalogApi
from interlude_localcloud.compute_network import (
    addresses_in_use,
    assign_ephemeral,
    ephemeral_nats,
    network_interfaces,
    release_ephemeral,
)
from interlude_localcloud.compute_tpu_catalog import machine_info
from interlude_localcloud.compute_updates import (
    ComputeUpdatesApi,
    devices_for,
    metadata_fingerprint,
    register_unimplemented,
)
from interlude_localcloud.errors import ApiError, already_exists, invalid
from interlude_localcloud.gke.node_vms import gke_node_maintenance
from interlude_localcloud.server import Request, Response, Router


class ComputeApi(ComputeBase):
    """Instances and zone operations; registers the other Compute modules' routes, then the catch-all 501."""

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
        self.cloud.preempt_hooks.append(self._stopped)  # a preempted spot VM is stopped: its ephemeral natIP goes
        ComputeUpdatesApi(self.cloud).register(r)
        ComputeCatalogApi(self.cloud).register(r)
        register_unimplemented(r)

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

    # instances ---------------------------------------------------------------------------------
    def get_instance(self, req: Request) -> Response:
        with self.cloud.lock:
            return Response(self.render(self.instance_of(req)), "Instance")

    def list_instances(self, req: Request) -> Response:
        with self.cloud.lock:
            zone = self.zone_of(req)
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
            zone = self.zone_of(req)
            name = body.get("name", "")
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
                raise invalid(
                    f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                    "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
                )
            if ("gce", zone, name) in self.cloud.machines:
                raise already_exists(f"projects/{self.cloud.scenario.project}/zones/{zone}/instances/{name}")
            mt_name, gpu, count = self.accelerators(zone, body)
            sched, spot = _scheduling(body, bool(gpu))
            info = machine_info(mt_name)
            self.quota_check(zone, gpu, count, spot, info.cpus if info else 0)
            res = self._new_resource(zone, body, mt_name, sched)
            devices, platform = devices_for(mt_name, gpu, count)
            m = self.cloud.new_machine("gce", zone, name, res, spot, gpu, count, devices=devices)
            m.platform_attributes = platform
            m.extra["ephemeral_nats"] = ephemeral_nats(body.get("networkInterfaces"))
            op = self.new_op(zone, "insert", m, name)
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
                    self.finish_op(op, self.stockout(zone), 503)
                    return
                self._running(m)
                self.finish_op(op)

            # PROVISIONING for the create delay, then STAGING (booting) for a start delay, then RUNNING
            create, boot = self.cloud.scenario.delay("gce_create"), self.cloud.scenario.delay("gce_start")
            self.cloud.after(create, staging)
            self.cloud.after(create + boot, done)
            return Response(dict(op), "Operation")

    def _new_resource(self, zone: str, body: dict[str, Any], mt_name: str, sched: dict[str, Any]) -> dict[str, Any]:
        """The Instance resource of an insert: the body's fields plus what Google sets (ids, links, network)."""
        iid = self.cloud.new_id()
        name = body["name"]
        res: dict[str, Any] = {
            k: v
            for k, v in body.items()
            if k not in ("id", "status", "selfLink", "zone", "creationTimestamp", "kind", "resourceStatus")
        }
        used = addresses_in_use(m.resource for m in self.cloud.machines.values() if m.kind == "gce")
        region = self.cloud.scenario.zones[zone].region
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
            networkInterfaces=network_interfaces(body.get("networkInterfaces"), self.base, region, used),
        )
        if body.get("guestAccelerators"):
            res["guestAccelerators"] = [
                {
                    "acceleratorType": f"{self.base}/zones/{zone}/acceleratorTypes/{last(a['acceleratorType'])}",
                    "acceleratorCount": int(a.get("acceleratorCount", 1)),
                }
                for a in body["guestAccelerators"]
            ]
        md = {k: v for k, v in (body.get("metadata") or {}).items() if k != "fingerprint"}
        md.update(kind="compute#metadata", fingerprint=metadata_fingerprint(iid, 0))
        res["metadata"] = md
        return res

    def _stopped(self, m: Machine) -> None:
        if m.kind == "gce":
            release_ephemeral(m.resource, m.extra.get("ephemeral_nats", []))

    def _running(self, m: Machine) -> None:
        used = addresses_in_use(x.resource for x in self.cloud.machines.values() if x.kind == "gce")
        assign_ephemeral(m.resource, m.extra.get("ephemeral_nats", []), used)
        m.resource["status"] = "RUNNING"
        m.resource["lastStartTimestamp"] = rfc3339()
        m.preempted = False
        self.cloud.boot(m)

    def delete_instance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self.instance_of(req)
            op = self.new_op(m.zone, "delete", m, m.name)
            m.resource["status"] = "STOPPING"
            m.generation += 1
            m.maintenance = None
            self.cloud.take_down(m, "delete")

            def done() -> None:
                if not m.deleted:
                    self.cloud.destroy(m)
                self.finish_op(op)

            self.cloud.after(self.cloud.scenario.delay("gce_delete"), done)
            return Response(dict(op), "Operation")

    def stop_instance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self.instance_of(req)
            op = self.new_op(m.zone, "stop", m, m.name)
            if m.resource["status"] == "TERMINATED":
                self.finish_op(op)
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
                self._stopped(m)
                self.finish_op(op)

            self.cloud.after_for(m, self.cloud.scenario.delay("gce_stop"), done)
            return Response(dict(op), "Operation")

    def start_instance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self.instance_of(req)
            op = self.new_op(m.zone, "start", m, m.name)
            if m.resource["status"] in ("RUNNING", "STAGING", "PROVISIONING"):
                self.finish_op(op)
                return Response(dict(op), "Operation")
            if m.resource["status"] != "TERMINATED":
                raise ApiError(
                    400,
                    f"The instance is in state {m.resource['status']} and cannot be started.",
                    reason="resourceNotReady",
                )
            if not m.holds:
                info = machine_info(last(m.resource["machineType"]))
                self.quota_check(m.zone, m.cap_type, m.units, m.spot, info.cpus if info else 0)
                if not self.cloud.has_capacity(m.zone, m.cap_type, m.spot, "gce", m.units):
                    self.finish_op(op, self.stockout(m.zone), 503)
                    return Response(dict(op), "Operation")
            m.holds = True
            m.resource["status"] = "STAGING"
            m.generation += 1

            def done() -> None:
                self._running(m)
                self.finish_op(op)

            self.cloud.after_for(m, self.cloud.scenario.delay("gce_start"), done)
            return Response(dict(op), "Operation")

    def simulate_maintenance(self, req: Request) -> Response:
        extended = req.query.get("withExtendedNotifications", "").lower() == "true"
        node = gke_node_maintenance(self, req, extended)
        if node is not None:
            return node
        with self.cloud.lock:
            m = self.instance_of(req)
            if m.resource["status"] != "RUNNING":
                raise ApiError(
                    400, "The instance must be RUNNING to simulate a maintenance event.", reason="resourceNotReady"
                )
            op = self.new_op(m.zone, "simulateMaintenanceEvent", m, m.name)
            policy = (m.resource.get("scheduling") or {}).get("onHostMaintenance", "MIGRATE")
            if extended:  # the notice first, as before real maintenance
                choice = self.cloud.choose_maintenance_window("gce")
                self.cloud.schedule_maintenance(
                    m, choice.type, choice.notice, held=choice.held, latest_after=choice.latest_start_after
                )
            elif policy == "TERMINATE":  # no notice: terminated now, restarted per automaticRestart
                self.cloud.begin_maintenance(m, cause="simulated")
            else:  # live migration: the VM keeps running
                self.cloud.log("live_migrated", machine=m.machine_id)
            self.finish_op(op)
            return Response(dict(op), "Operation")

    def perform_maintenance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self.instance_of(req)
            if m.maintenance is None or m.maintenance["status"] != "PENDING":
                raise ApiError(400, "There is no pending maintenance for this instance.", reason="conditionNotMet")
            if not m.maintenance.get("can_reschedule"):  # Google: only a reschedulable maintenance starts early
                raise ApiError(
                    400, "The pending maintenance for this instance cannot be rescheduled.", reason="conditionNotMet"
                )
            op = self.new_op(m.zone, "performMaintenance", m, m.name)
            self.cloud.log("perform_maintenance", machine=m.machine_id)
            self.cloud.begin_maintenance(m, cause="performMaintenance")
            self.finish_op(op)
            return Response(dict(op), "Operation")

    def serial_port(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self.instance_of(req)
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
        zone = self.zone_of(req)
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
            zone = self.zone_of(req)
            items = [dict(o) for (z, _), o in self.cloud.gce_operations.items() if z == zone]
            out: dict[str, Any] = {
                "kind": "compute#operationList",
                "id": f"{zone}/operations",
                "selfLink": f"{self.base}/zones/{zone}/operations",
            }
            if items:
                out["items"] = items
            return Response(out, "OperationList")


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
            got = last(got)
        ok = re.fullmatch(want, got) is not None if op in ("eq", "ne") else got == want
        if (op == "=" and not ok) or (op == "!=" and ok):
            return False
    return True


def _scheduling(body: dict[str, Any], accelerated: bool) -> tuple[dict[str, Any], bool]:
    """The instance's scheduling with Google's defaults: GPU and TPU VMs cannot live-migrate (TERMINATE on host
    maintenance; MIGRATE is a 400), spot VMs neither; automaticRestart unless spot."""
    sched = dict(body.get("scheduling") or {})
    if accelerated and sched.get("onHostMaintenance") == "MIGRATE":
        raise invalid("Instances with guest accelerators do not support live migration.")
    spot = sched.get("provisioningModel") == "SPOT" or bool(sched.get("preemptible"))
    sched.setdefault("onHostMaintenance", "TERMINATE" if accelerated or spot else "MIGRATE")
    sched.setdefault("automaticRestart", not spot)
    sched.setdefault("provisioningModel", "SPOT" if spot else "STANDARD")
    sched.setdefault("preemptible", bool(spot and sched.get("preemptible")))
    return sched, spot
