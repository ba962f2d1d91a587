"""Cloud TPU API v2 (and the v2alpha1 maintenance methods) over REST, as tpu.googleapis.com serves it."""

from __future__ import annotations

import time
from typing import Any

from interlude_localcloud.catalog import TPU_FAMILIES, tpu_family, tpu_shape
from interlude_localcloud.cloud import Cloud, Machine, rfc3339
from interlude_localcloud.errors import ApiError, already_exists, invalid, not_found
from interlude_localcloud.queued_api import QueuedResources
from interlude_localcloud.server import Request, Response, Router
from interlude_localcloud.slices import Worker, network_endpoints

LOC = r"/(?P<ver>v2|v2alpha1)/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
NODE = LOC + r"/nodes/(?P<node>[^/:]+)"
QR = LOC + r"/queuedResources/(?P<qr>[^/:]+)"
TYPE_URL = "type.googleapis.com/google.cloud.tpu.v2."
EMPTY_URL = "type.googleapis.com/google.protobuf.Empty"
FAMILY_BY_ENUM = {v: k for k, v in TPU_FAMILIES.items()}


def stockout_message(zone: str) -> str:
    return (
        f'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud '
        "TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) "
        f"[EID: 0x{abs(hash((zone, time.time()))) % (1 << 48):012x}]"
    )


def render_operation(op: dict[str, Any], alpha: bool) -> dict[str, Any]:
    """An operation as the asking API version shows it (operations are shared by v2 and v2alpha1).

    Packed types name the version asked through (google.cloud.tpu.v2alpha1.Node), and a Node seen
    through v2alpha1 has no `apiVersion: V2` (tpu.v2alpha1.json's ApiVersion enum stops at V2_ALPHA1).
    """
    src, dst = (".v2.", ".v2alpha1.") if alpha else (".v2alpha1.", ".v2.")
    out = dict(op)
    for key in ("metadata", "response"):
        packed = op.get(key)
        if isinstance(packed, dict) and "@type" in packed:
            packed = {**packed, "@type": packed["@type"].replace(src, dst)}
            if alpha and packed["@type"].endswith(".Node"):
                packed.pop("apiVersion", None)
            out[key] = packed
    return out


class TpuApi(QueuedResources):
    """Handlers for /v2 and /v2alpha1. Node lifecycle: CREATING -> READY (HEALTHY) -> DELETING."""

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud
        cloud.tick_hooks.append(self._retry_waiting)
        cloud.preempt_hooks.append(self.suspend_on_preemption)

    def register(self, r: Router) -> None:
        for ver in ("v2", "v2alpha1"):
            doc = f"tpu.{ver}"
            loc = LOC.replace("(?P<ver>v2|v2alpha1)", ver)
            node = NODE.replace("(?P<ver>v2|v2alpha1)", ver)
            qr = QR.replace("(?P<ver>v2|v2alpha1)", ver)
            r.add("GET", node, self.get_node, doc)
            r.add("GET", loc + "/nodes", self.list_nodes, doc)
            r.add("POST", loc + "/nodes", self.create_node, doc, "Node")
            r.add("DELETE", node, self.delete_node, doc)
            r.add("PATCH", node, self.patch_node, doc, "Node")
            r.add("POST", node + ":stop", self.stop_node, doc)
            r.add("POST", node + ":start", self.start_node, doc)
            r.add("POST", node + ":getGuestAttributes", self.get_guest_attributes, doc, "GetGuestAttributesRequest")
            r.add("GET", loc + r"/operations/(?P<op>[^/:]+)", self.get_operation, doc)
            r.add("GET", loc + "/operations", self.list_operations, doc)
            r.add("GET", loc + "/acceleratorTypes", self.list_accelerator_types, doc)
            r.add("GET", loc + r"/acceleratorTypes/(?P<t>[^/]+)", self.get_accelerator_type, doc)
            r.add("GET", loc + "/runtimeVersions", self.list_runtime_versions, doc)
            r.add("GET", loc + r"/runtimeVersions/(?P<v>[^/]+)", self.get_runtime_version, doc)
            r.add("GET", qr, self.get_qr, doc)
            r.add("GET", loc + "/queuedResources", self.list_qr, doc)
            r.add("POST", loc + "/queuedResources", self.create_qr, doc, "QueuedResource")
            r.add("DELETE", qr, self.delete_qr, doc)
            if ver == "v2alpha1":
                r.add(
                    "POST",
                    node + ":simulateMaintenanceEvent",
                    self.simulate_maintenance,
                    doc,
                    "SimulateMaintenanceEventRequest",
                )
                r.add("POST", node + ":performMaintenance", self.perform_maintenance, doc, "PerformMaintenanceRequest")

    # helpers ---------------------------------------------------------------------------------
    def _zone(self, req: Request) -> str:
        zone = req.params["zone"]
        if req.params["project"] != self.cloud.scenario.project:
            raise ApiError(403, f"Permission denied on project {req.params['project']}", "PERMISSION_DENIED")
        if zone not in self.cloud.scenario.zones:
            raise not_found(f"projects/{req.params['project']}/locations/{zone}")
        return zone

    def _parent(self, zone: str) -> str:
        return f"projects/{self.cloud.scenario.project}/locations/{zone}"

    def _node(self, req: Request) -> Machine:
        zone = self._zone(req)
        m = self.cloud.machines.get(("tpu", zone, req.params["node"]))
        if m is None:
            raise not_found(f"{self._parent(zone)}/nodes/{req.params['node']}")
        return m

    def render_node(self, m: Machine, alpha: bool = False) -> dict[str, Any]:
        out = dict(m.resource)
        if alpha:
            out.pop("apiVersion", None)  # v2alpha1's enum has no V2
        up = self.cloud.upcoming(m)
        if up is not None:
            out["upcomingMaintenance"] = up
        return out

    def _operation(self, zone: str, verb: str, target: str) -> dict[str, Any]:
        name = f"{self._parent(zone)}/operations/{self.cloud.op_suffix()}"
        op = {
            "name": name,
            "metadata": {
                "@type": TYPE_URL + "OperationMetadata",
                "createTime": rfc3339(),
                "target": target,
                "verb": verb,
                "cancelRequested": False,
                "apiVersion": "v2",
            },
            "done": False,
        }
        self.cloud.operations[name] = op
        return op

    def _finish(
        self, op: dict[str, Any], response: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> None:
        op["done"] = True
        op["metadata"]["endTime"] = rfc3339()
        if error is not None:
            op["error"] = error
        else:
            op["response"] = response or {"@type": EMPTY_URL}
        self.cloud.log("tpu_operation_done", operation=op["name"], verb=op["metadata"]["verb"], error=error)

    def _op_response(self, op: dict[str, Any], req: Request) -> Response:
        return Response(render_operation(op, req.doc.endswith("alpha1")), "Operation")

    def _accelerator_type(self, zone: str, node: dict[str, Any]) -> str:
        at = node.get("acceleratorType")
        if not at and node.get("acceleratorConfig"):
            cfg = node["acceleratorConfig"]
            fam = FAMILY_BY_ENUM.get(cfg.get("type", ""))
            dims = [int(x) for x in str(cfg.get("topology", "")).split("x") if x.isdigit()]
            if fam is None or not dims:
                raise invalid("acceleratorConfig needs a type and a topology like 2x4")
            chips = 1
            for d in dims:
                chips *= d
            at = f"{fam}-{chips * (2 if fam in ('v4', 'v5p', 'v2', 'v3') else 1)}"
        if not at:
            raise invalid("Field acceleratorType or acceleratorConfig is required")
        if at not in self.cloud.scenario.zones[zone].tpu_types:
            raise invalid(f'Accelerator type "{at}" is not available in zone "{zone}"')
        return at

    def _quota_error(self, zone: str, at: str, spot: bool) -> dict[str, Any] | None:
        quotas = self.cloud.scenario.tpu_quotas.get(zone) or {}
        fam, _ = tpu_family(at)
        key = f"{fam}{'-spot' if spot else ''}"
        if key not in quotas:
            return None
        # Chips, as Google's TPU quotas count them (a v5litepod-16 takes 16 v5e chips, a v5p-16 8 v5p chips).
        used = sum(
            tpu_shape(m.cap_type).chips
            for m in self.cloud.machines.values()
            if m.kind == "tpu" and m.zone == zone and m.holds and m.spot == spot and tpu_family(m.cap_type)[0] == fam
        )
        if used + tpu_shape(at).chips <= quotas[key]:
            return None
        metric = f"TPU{TPU_FAMILIES[fam].replace('_', '')}{'Preemptible' if spot else ''}PerProjectPerZoneForTPUAPI"
        return {
            "code": 8,
            "message": f"Quota limit '{metric}' has been exceeded. Limit: {quotas[key]:g} in zone {zone}.",
        }

    def _make_node(self, zone: str, node_id: str, body: dict[str, Any], qr_name: str | None = None) -> Machine:
        at = self._accelerator_type(zone, body)
        rv = body.get("runtimeVersion")
        if not rv:
            raise invalid("Field runtimeVersion is required")
        if rv not in self.cloud.scenario.zones[zone].runtime_versions:
            raise invalid(f'Runtime version "{rv}" is not available in zone "{zone}"')
        sched = body.get("schedulingConfig") or {}
        spot = bool(sched.get("spot") or sched.get("preemptible"))
        fam, size = tpu_family(at)
        res: dict[str, Any] = {
            k: v
            for k, v in body.items()
            if k
            not in (
                "name",
                "state",
                "health",
                "healthDescription",
                "createTime",
                "id",
                "networkEndpoints",
                "upcomingMaintenance",
                "symptoms",
                "apiVersion",
                "multisliceNode",
                "queuedResource",
            )
        }
        shape = tpu_shape(at)
        topo = (
            shape.topology
            if shape.multi_host
            else {8: "2x4", 4: "2x2", 16: "4x4", 32: "4x8", 1: "1x1"}.get(
                size if fam in ("v5litepod", "v6e") else size // 2, "2x4"
            )
        )
        res.update(
            name=f"{self._parent(zone)}/nodes/{node_id}",
            acceleratorType=at,
            runtimeVersion=rv,
            state="CREATING",
            createTime=rfc3339(),
            id=self.cloud.new_id(),
            apiVersion="V2",
            acceleratorConfig=body.get("acceleratorConfig") or {"type": TPU_FAMILIES[fam], "topology": topo},
            networkConfig=body.get("networkConfig")
            or {
                "network": f"projects/{self.cloud.scenario.project}/global/networks/default",
                "subnetwork": f"projects/{self.cloud.scenario.project}/regions/"
                f"{self.cloud.scenario.zones[zone].region}/subnetworks/default",
                "enableExternalIps": False,
            },
            schedulingConfig=sched,
        )
        if qr_name:
            res["queuedResource"] = qr_name
        return self.cloud.new_machine("tpu", zone, node_id, res, spot, at, 1, hosts=shape.hosts)

    def _node_ready(self, m: Machine) -> None:
        n = self.cloud.machines.get(("tpu", m.zone, m.name))
        m.resource.update(state="READY", health="HEALTHY", networkEndpoints=network_endpoints(m))
        if n is m:
            self.cloud.boot(m)

    # nodes -----------------------------------------------------------------------------------
    def get_node(self, req: Request) -> Response:
        with self.cloud.lock:
            return Response(self.render_node(self._node(req), req.doc.endswith("alpha1")), "Node")

    def _workers(self, m: Machine, ids: list[Any]) -> list[Machine | Worker]:
        """The workers named by 0-based `workerIds` strings (a 400 for one the node does not have)."""
        hosts = m.hosts()
        out = []
        for raw in ids:
            if not str(raw).isdigit() or int(raw) >= len(hosts):
                raise invalid(f"Invalid worker ID {raw!r}: the node has workers 0 to {len(hosts) - 1}")
            out.append(hosts[int(raw)])
        return out

    def get_guest_attributes(self, req: Request) -> Response:
        """What the node's guests wrote to their metadata servers' guest attributes, filtered by queryPath
        ('' or '/' everything, 'NAMESPACE/' a namespace, 'NAMESPACE/KEY' one key): one GuestAttributes per
        worker asked for in `workerIds`, in that order, every worker in worker order when it is empty
        (tpu.v2.json GetGuestAttributesRequest). The answer names no worker (GuestAttributes has only
        queryPath and queryValue): the order is how a caller tells them apart."""
        body = req.body or {}
        path = str(body.get("queryPath") or "")
        want = path.strip("/")
        with self.cloud.lock:
            m = self._node(req)
            hosts = self._workers(m, list(body.get("workerIds") or [])) or m.hosts()
            out = []
            for h in hosts:
                entries = [
                    {"namespace": k.split("/", 1)[0], "key": k.split("/", 1)[1], "value": v}
                    for k, v in sorted(h.guest_attributes.items())
                    if not want or k == want or k.startswith(want + "/")
                ]
                out.append({"queryPath": path, "queryValue": {"items": entries} if entries else {}})
        return Response({"guestAttributes": out}, "GetGuestAttributesResponse")

    def list_nodes(self, req: Request) -> Response:
        with self.cloud.lock:
            zone = self._zone(req)
            alpha = req.doc.endswith("alpha1")
            nodes = [
                self.render_node(m, alpha)
                for (k, z, _), m in sorted(self.cloud.machines.items())
                if k == "tpu" and z == zone
            ]
            return Response({"nodes": nodes} if nodes else {}, "ListNodesResponse")

    def create_node(self, req: Request) -> Response:
        node_id = req.query.get("nodeId", "")
        body = req.body or {}
        with self.cloud.lock:
            zone = self._zone(req)
            if not node_id:
                raise invalid("Field nodeId is required")
            if ("tpu", zone, node_id) in self.cloud.machines:
                raise already_exists(f"{self._parent(zone)}/nodes/{node_id}")
            m = self._make_node(zone, node_id, body)
            op = self._operation(zone, "create", m.resource["name"])
            error = self._quota_error(zone, m.cap_type, m.spot)
            if error is None and not self.cloud.has_capacity(zone, m.cap_type, m.spot, "tpu", 1):
                error = {"code": 8, "message": stockout_message(zone)}
            if error is None:
                m.holds = True
            self.cloud.log(
                "tpu_node_create",
                node=m.resource["name"],
                accelerator=m.cap_type,
                spot=m.spot,
                outcome="ok" if error is None else error["message"],
            )

            def done() -> None:
                if m.deleted:
                    return
                if error is not None:
                    self.cloud.machines.pop(("tpu", zone, node_id), None)
                    m.deleted = True
                    self._finish(op, error=error)
                    return
                self._node_ready(m)
                self._finish(op, {"@type": TYPE_URL + "Node", **self.render_node(m)})

            self.cloud.after(self.cloud.scenario.delay("tpu_create"), done)
            return self._op_response(op, req)

    def delete_node(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._node(req)
            if m.resource.get("state") == "DELETING":
                op = self._operation(m.zone, "delete", m.resource["name"])
            else:
                op = self._operation(m.zone, "delete", m.resource["name"])
                m.resource["state"] = "DELETING"
                m.generation += 1
                for h in m.hosts():
                    h.maintenance = None
                self.cloud.take_down(m, "delete")
            self.cloud.log("tpu_node_delete", node=m.resource["name"])

            def done() -> None:
                if not m.deleted:
                    self.cloud.destroy(m)
                self._finish(op)

            self.cloud.after(self.cloud.scenario.delay("tpu_delete"), done)
            return self._op_response(op, req)

    def patch_node(self, req: Request) -> Response:
        mask = [f.strip() for f in req.query.get("updateMask", "").split(",") if f.strip()]
        if not mask:
            raise invalid("Field updateMask is required")
        body = req.body or {}
        with self.cloud.lock:
            m = self._node(req)
            allowed = {"labels", "metadata", "description", "tags", "networkConfig", "schedulingConfig"}
            for f in mask:
                top = f.split(".")[0]
                if top not in allowed:
                    raise invalid(f"Field {f} cannot be updated")
                if top in body:
                    m.resource[top] = body[top]
                else:
                    m.resource.pop(top, None)
            op = self._operation(m.zone, "update", m.resource["name"])
            self._finish(op, {"@type": TYPE_URL + "Node", **self.render_node(m)})
            return self._op_response(op, req)

    def stop_node(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._node(req)
            if m.resource.get("state") not in ("READY", "STOPPED"):
                raise ApiError(400, f"Node in state {m.resource.get('state')} cannot be stopped", "FAILED_PRECONDITION")
            op = self._operation(m.zone, "stop", m.resource["name"])
            m.resource["state"] = "STOPPING"
            m.generation += 1
            for h in m.hosts():
                h.maintenance = None
            self.cloud.take_down(m, "stop")

            def done() -> None:
                m.resource["state"] = "STOPPED"
                m.resource.pop("health", None)
                m.holds = False
                self._finish(op, {"@type": TYPE_URL + "Node", **self.render_node(m)})

            self.cloud.after_for(m, self.cloud.scenario.delay("tpu_stop"), done)
            return self._op_response(op, req)

    def start_node(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._node(req)
            if m.resource.get("state") not in ("STOPPED", "PREEMPTED", "TERMINATED"):
                raise ApiError(400, f"Node in state {m.resource.get('state')} cannot be started", "FAILED_PRECONDITION")
            op = self._operation(m.zone, "start", m.resource["name"])
            if not self.cloud.has_capacity(m.zone, m.cap_type, m.spot, "tpu", 1):
                self._finish(op, error={"code": 8, "message": stockout_message(m.zone)})
                return self._op_response(op, req)
            m.holds = True
            m.preempted = False
            m.resource["state"] = "STARTING"
            m.generation += 1

            def done() -> None:
                self._node_ready(m)
                self._finish(op, {"@type": TYPE_URL + "Node", **self.render_node(m)})

            self.cloud.after_for(m, self.cloud.scenario.delay("tpu_start"), done)
            return self._op_response(op, req)

    def simulate_maintenance(self, req: Request) -> Response:
        """A maintenance notice on one worker: the first of `workerIds`, worker 0 when empty ("a maintenance
        event will only be fired on the first specified worker ID", tpu.v2alpha1.json)."""
        with self.cloud.lock:
            m = self._node(req)
            hosts = self._workers(m, list((req.body or {}).get("workerIds") or [])) or [m]
            if m.resource.get("state") != "READY":
                raise ApiError(400, "Maintenance can only be simulated on a READY node", "FAILED_PRECONDITION")
            op = self._operation(m.zone, "simulateMaintenanceEvent", m.resource["name"])
            op["metadata"]["@type"] = op["metadata"]["@type"].replace(".v2.", ".v2alpha1.")
            choice = self.cloud.choose_maintenance_window("tpu")
            self.cloud.schedule_maintenance(
                m, choice.type, choice.notice, host=hosts[0], held=choice.held, latest_after=choice.latest_start_after
            )
            self._finish(op, {"@type": TYPE_URL.replace(".v2.", ".v2alpha1.") + "Node", **self.render_node(m, True)})
            return self._op_response(op, req)

    def perform_maintenance(self, req: Request) -> Response:
        with self.cloud.lock:
            m = self._node(req)
            pending = [h for h in m.hosts() if h.maintenance is not None and h.maintenance["status"] == "PENDING"]
            if not pending:
                raise ApiError(400, "There is no pending maintenance on this node", "FAILED_PRECONDITION")
            # On a slice it is the slice's maintenance: all its VMs go down together (cloud.begin_maintenance).
            host = next((h for h in pending if (h.maintenance or {}).get("can_reschedule")), pending[0])
            if not (host.maintenance or {}).get(
                "can_reschedule"
            ):  # canReschedule=false + PENDING: no manual start here
                raise ApiError(
                    400,
                    "The pending maintenance on this node cannot be started manually (canReschedule is false)",
                    "FAILED_PRECONDITION",
                )
            op = self._operation(m.zone, "performMaintenance", m.resource["name"])
            op["metadata"]["@type"] = op["metadata"]["@type"].replace(".v2.", ".v2alpha1.")
            self.cloud.log("perform_maintenance", machine=m.machine_id)
            self.cloud.begin_maintenance(m, host=host, cause="performMaintenance")
            self._finish(op, {"@type": TYPE_URL.replace(".v2.", ".v2alpha1.") + "Node", **self.render_node(m, True)})
            return self._op_response(op, req)

    # operations, catalog -----------------------------------------------------------------------
    def get_operation(self, req: Request) -> Response:
        with self.cloud.lock:
            zone = self._zone(req)
            name = f"{self._parent(zone)}/operations/{req.params['op']}"
            op = self.cloud.operations.get(name)
            if op is None:
                raise not_found(name)
            return self._op_response(op, req)

    def list_operations(self, req: Request) -> Response:
        with self.cloud.lock:
            zone = self._zone(req)
            alpha = req.doc.endswith("alpha1")
            ops = [
                render_operation(o, alpha)
                for n, o in self.cloud.operations.items()
                if n.startswith(self._parent(zone) + "/")
            ]
            return Response({"operations": ops} if ops else {}, "ListOperationsResponse")

    def _atype(self, zone: str, t: str) -> dict[str, Any]:
        fam, size = tpu_family(t)
        shape = tpu_shape(t)
        topology = shape.topology if shape.multi_host else ("2x4" if size == 8 else "1x1")
        return {
            "name": f"{self._parent(zone)}/acceleratorTypes/{t}",
            "type": t,
            "acceleratorConfigs": [{"type": TPU_FAMILIES[fam], "topology": topology}],
        }

    def list_accelerator_types(self, req: Request) -> Response:
        zone = self._zone(req)
        types = [self._atype(zone, t) for t in self.cloud.scenario.zones[zone].tpu_types]
        return Response({"acceleratorTypes": types} if types else {}, "ListAcceleratorTypesResponse")

    def get_accelerator_type(self, req: Request) -> Response:
        zone = self._zone(req)
        if req.params["t"] not in self.cloud.scenario.zones[zone].tpu_types:
            raise not_found(f"{self._parent(zone)}/acceleratorTypes/{req.params['t']}")
        return Response(self._atype(zone, req.params["t"]), "AcceleratorType")

    def list_runtime_versions(self, req: Request) -> Response:
        zone = self._zone(req)
        vs = [
            {"name": f"{self._parent(zone)}/runtimeVersions/{v}", "version": v}
            for v in self.cloud.scenario.zones[zone].runtime_versions
        ]
        return Response({"runtimeVersions": vs} if vs else {}, "ListRuntimeVersionsResponse")

    def get_runtime_version(self, req: Request) -> Response:
        zone = self._zone(req)
        v = req.params["v"]
        if v not in self.cloud.scenario.zones[zone].runtime_versions:
            raise not_found(f"{self._parent(zone)}/runtimeVersions/{v}")
        return Response({"name": f"{self._parent(zone)}/runtimeVersions/{v}", "version": v}, "RuntimeVersion")
