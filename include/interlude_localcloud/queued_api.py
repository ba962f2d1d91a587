"""Queued resources of the TPU API (v2/v2alpha1): the queue, Google's states and their transitions.

States as Google documents them (https://cloud.google.com/tpu/docs/queued-resources and the
QueuedResourceState reference): CREATING -> ACCEPTED -> WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE;
FAILED when the request cannot be met within its constraints (e.g. ``queueingPolicy.validUntilDuration``
passed while waiting); SUSPENDING -> SUSPENDED when the service takes the resources back (a spot TPU
preempted), the node deleted; DELETING on delete. A mixin of :class:`TpuApi`, which owns the nodes and
operations these methods use.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from interlude_localcloud.cloud import Cloud, Machine, rfc3339
from interlude_localcloud.errors import ApiError, already_exists, invalid, not_found
from interlude_localcloud.server import Request, Response

TYPE_URL = "type.googleapis.com/google.cloud.tpu.v2."


class QueuedResources:
    cloud: Cloud

    if TYPE_CHECKING:  # provided by TpuApi

        def _zone(self, req: Request) -> str: ...
        def _parent(self, zone: str) -> str: ...
        def _operation(self, zone: str, verb: str, target: str) -> dict[str, Any]: ...
        def _finish(
            self, op: dict[str, Any], response: dict[str, Any] | None = None, error: dict[str, Any] | None = None
        ) -> None: ...
        def _op_response(self, op: dict[str, Any], req: Request) -> Response: ...
        def _accelerator_type(self, zone: str, node: dict[str, Any]) -> str: ...
        def _make_node(self, zone: str, node_id: str, body: dict[str, Any], qr_name: str | None = None) -> Machine: ...
        def _node_ready(self, m: Machine) -> None: ...

    # queued resources --------------------------------------------------------------------------
    def _qr(self, req: Request) -> dict[str, Any]:
        zone = self._zone(req)
        qr = self.cloud.queued.get((zone, req.params["qr"]))
        if qr is None:
            raise not_found(f"{self._parent(zone)}/queuedResources/{req.params['qr']}")
        return qr

    @staticmethod
    def _render_qr(qr: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in qr.items() if not k.startswith("_")}

    def get_qr(self, req: Request) -> Response:
        with self.cloud.lock:
            return Response(self._render_qr(self._qr(req)), "QueuedResource")

    def list_qr(self, req: Request) -> Response:
        with self.cloud.lock:
            zone = self._zone(req)
            qrs = [self._render_qr(q) for (z, _), q in sorted(self.cloud.queued.items()) if z == zone]
            return Response({"queuedResources": qrs} if qrs else {}, "ListQueuedResourcesResponse")

    def create_qr(self, req: Request) -> Response:
        qr_id = req.query.get("queuedResourceId", "")
        body = req.body or {}
        with self.cloud.lock:
            zone = self._zone(req)
            if not qr_id:
                raise invalid("Field queuedResourceId is required")
            if (zone, qr_id) in self.cloud.queued:
                raise already_exists(f"{self._parent(zone)}/queuedResources/{qr_id}")
            specs = ((body.get("tpu") or {}).get("nodeSpec")) or []
            if not specs:
                raise invalid("Field tpu.nodeSpec is required")
            spot = "spot" in body
            for s in specs:
                if not s.get("nodeId") or not s.get("node"):
                    raise invalid("Each nodeSpec needs nodeId and node")
                self._accelerator_type(zone, s["node"])
                if ("tpu", zone, s["nodeId"]) in self.cloud.machines:
                    raise already_exists(f"{self._parent(zone)}/nodes/{s['nodeId']}")
            name = f"{self._parent(zone)}/queuedResources/{qr_id}"
            qr: dict[str, Any] = {
                k: v for k, v in body.items() if k in ("tpu", "spot", "guaranteed", "queueingPolicy", "reservationName")
            }
            qr.update(
                name=name,
                createTime=rfc3339(),
                state={"state": "CREATING", "stateInitiator": "USER"},
                _zone=zone,
                _id=qr_id,
                _spot=spot,
                _nodes=[],
                _valid_until=self._valid_until(body.get("queueingPolicy") or {}),
            )
            self.cloud.queued[(zone, qr_id)] = qr
            op = self._operation(zone, "create", name)
            self.cloud.log("queued_resource_create", queued_resource=name)

            def accepted() -> None:
                if qr.get("_deleted"):
                    return
                qr["state"] = {"state": "ACCEPTED", "stateInitiator": "USER", "acceptedData": {}}
                self._finish(op, {"@type": TYPE_URL + "QueuedResource", **self._render_qr(qr)})
                self.cloud.log("queued_resource_state", queued_resource=name, state="ACCEPTED")

            self.cloud.after(min(self.cloud.scenario.delay("queue_accept"), 1.0), accepted)
            return self._op_response(op, req)

    def _valid_until(self, policy: dict[str, Any]) -> float | None:
        """The real (wall-clock) time a waiting request expires, from Google-time `validUntil*` fields."""
        scale = self.cloud.scenario.time_scale
        now = time.time()
        if policy.get("validUntilDuration"):
            return now + float(str(policy["validUntilDuration"]).rstrip("s")) / scale
        if policy.get("validUntilTime"):
            until = datetime.fromisoformat(str(policy["validUntilTime"]).replace("Z", "+00:00")).timestamp()
            return now + (until - now) / scale
        return None

    def _fail(self, qr: dict[str, Any], message: str) -> None:
        qr["state"] = {
            "state": "FAILED",
            "stateInitiator": "SERVICE",
            "failedData": {"error": {"code": 8, "message": message}},  # 8 = RESOURCE_EXHAUSTED
        }
        self.cloud.log("queued_resource_state", queued_resource=qr["name"], state="FAILED")

    def suspend_on_preemption(self, m: Machine) -> None:
        """Preempt hook: a spot node of an ACTIVE queued resource taken back means SUSPENDING, then
        SUSPENDED with its nodes deleted (the request does not come back by itself)."""
        qr = next((q for q in self.cloud.queued.values() if q["name"] == m.resource.get("queuedResource")), None)
        if qr is None or qr["state"]["state"] != "ACTIVE":
            return
        qr["state"] = {"state": "SUSPENDING", "stateInitiator": "SERVICE", "suspendingData": {}}
        self.cloud.log("queued_resource_state", queued_resource=qr["name"], state="SUSPENDING")

        def suspended() -> None:
            if qr.get("_deleted"):
                return
            for node in qr["_nodes"]:
                if not node.deleted:
                    self.cloud.destroy(node)
            qr["state"] = {"state": "SUSPENDED", "stateInitiator": "SERVICE", "suspendedData": {}}
            self.cloud.log("queued_resource_state", queued_resource=qr["name"], state="SUSPENDED")

        self.cloud.after(self.cloud.scenario.delay("tpu_delete"), suspended)

    def _retry_waiting(self) -> None:
        """Tick hook: ACCEPTED/WAITING_FOR_RESOURCES queued resources take capacity when it exists, or
        fail once their `validUntil` has passed."""
        for qr in list(self.cloud.queued.values()):
            state = qr["state"]["state"]
            if state not in ("ACCEPTED", "WAITING_FOR_RESOURCES"):
                continue
            if qr.get("_valid_until") is not None and time.time() > qr["_valid_until"]:
                self._fail(qr, "The queued resource could not be provisioned before its validUntil time")
                continue
            zone = qr["_zone"]
            specs = qr["tpu"]["nodeSpec"]
            need: dict[str, int] = {}
            for s in specs:
                at = self._accelerator_type(zone, s["node"])
                need[at] = need.get(at, 0) + 1
            if all(self.cloud.has_capacity(zone, at, qr["_spot"], "tpu", n) for at, n in need.items()):
                self._provision(qr)
            elif state == "ACCEPTED":
                qr["state"] = {"state": "WAITING_FOR_RESOURCES", "stateInitiator": "SERVICE"}
                self.cloud.log("queued_resource_state", queued_resource=qr["name"], state="WAITING_FOR_RESOURCES")

    def _provision(self, qr: dict[str, Any]) -> None:
        zone = qr["_zone"]
        qr["state"] = {"state": "PROVISIONING", "stateInitiator": "SERVICE", "provisioningData": {}}
        self.cloud.log("queued_resource_state", queued_resource=qr["name"], state="PROVISIONING")
        nodes: list[Machine] = []
        for s in qr["tpu"]["nodeSpec"]:
            node = dict(s["node"])
            if qr["_spot"]:
                node["schedulingConfig"] = {**(node.get("schedulingConfig") or {}), "spot": True}
            m = self._make_node(zone, s["nodeId"], node, qr["name"])
            m.holds = True
            nodes.append(m)
        qr["_nodes"] = nodes

        def active() -> None:
            if qr.get("_deleted"):
                return
            for m in nodes:
                if not m.deleted:
                    self._node_ready(m)
            qr["state"] = {"state": "ACTIVE", "stateInitiator": "SERVICE", "activeData": {}}
            self.cloud.log("queued_resource_state", queued_resource=qr["name"], state="ACTIVE")

        self.cloud.after(self.cloud.scenario.delay("tpu_create"), active)

    def delete_qr(self, req: Request) -> Response:
        force = req.query.get("force", "").lower() in ("true", "1")
        with self.cloud.lock:
            qr = self._qr(req)
            live = [m for m in qr["_nodes"] if not m.deleted]
            if live and not force:
                raise ApiError(
                    400,
                    f"Queued resource {qr['name']} has nodes; delete them first or use force=true",
                    "FAILED_PRECONDITION",
                )
            op = self._operation(qr["_zone"], "delete", qr["name"])
            qr["state"] = {"state": "DELETING", "stateInitiator": "USER", "deletingData": {}}
            qr["_deleted"] = True
            for m in live:
                m.resource["state"] = "DELETING"
                m.generation += 1
                self.cloud.take_down(m, "delete")

            def done() -> None:
                for m in live:
                    if not m.deleted:
                        self.cloud.destroy(m)
                self.cloud.queued.pop((qr["_zone"], qr["_id"]), None)
                self._finish(op)
                self.cloud.log("queued_resource_deleted", queued_resource=qr["name"])

            self.cloud.after(self.cloud.scenario.delay("tpu_delete"), done)
            return self._op_response(op, req)
