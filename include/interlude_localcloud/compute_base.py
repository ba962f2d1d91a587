"""What every Compute Engine v1 handler shares: paths, resource lookups, zone operations, capacity and quota.

The handlers live in modules by concern (compute_api.py instance lifecycle, compute_updates.py setMetadata /
setMachineType, compute_catalog_api.py zones, regions and types); each is a ComputeBase over the one Cloud.
"""

from __future__ import annotations

from typing import Any

from interlude_localcloud.catalog import GPU_QUOTA_METRICS
from interlude_localcloud.cloud import Cloud, Machine, rfc3339
from interlude_localcloud.compute_tpu_catalog import TPU_QUOTA_METRICS, machine_info
from interlude_localcloud.errors import ApiError, invalid
from interlude_localcloud.server import Request

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


def quota_metric(accelerator: str, spot: bool) -> str | None:
    """The regional quota metric an accelerator (GPU type or TPU machine types' accelerator) counts against."""
    pair = TPU_QUOTA_METRICS.get(accelerator) or GPU_QUOTA_METRICS.get(accelerator, (None, None))
    return pair[1 if spot else 0]


def last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


class ComputeBase:
    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    @property
    def base(self) -> str:
        return f"{self.cloud.api_endpoint}/compute/v1/projects/{self.cloud.scenario.project}"

    def zone_of(self, req: Request) -> str:
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

    def instance_of(self, req: Request) -> Machine:
        zone = self.zone_of(req)
        m = self.cloud.machines.get(("gce", zone, req.params["name"]))
        if m is None:
            raise ApiError(
                404,
                f"The resource 'projects/{self.cloud.scenario.project}/zones/{zone}/instances/"
                f"{req.params['name']}' was not found",
                reason="notFound",
            )
        return m

    # zone operations -----------------------------------------------------------------------------
    def new_op(self, zone: str, op_type: str, m: Machine | None, target_name: str) -> dict[str, Any]:
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

    def finish_op(self, op: dict[str, Any], error: dict[str, Any] | None = None, http: int | None = None) -> None:
        op.update(status="DONE", progress=100, endTime=rfc3339())
        if error is not None:
            op["error"] = {"errors": [error]}
            op["httpErrorStatusCode"] = http or 400
            op["httpErrorMessage"] = {503: "SERVICE UNAVAILABLE", 400: "BAD REQUEST"}.get(http or 400, "ERROR")
        self.cloud.log("gce_operation_done", operation=op["name"], type=op["operationType"], error=error)
        self.cloud.changed.notify_all()

    def stockout(self, zone: str) -> dict[str, Any]:
        return {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": stockout_message(self.cloud.scenario.project, zone)}

    # machine types, capacity and quota -----------------------------------------------------------
    def accelerators(self, zone: str, body: dict[str, Any]) -> tuple[str, str, int]:
        """(machine type name, accelerator (GPU type or TPU accelerator) or "", count) for an instance body,
        validated against the zone's offer: GPUs and TPU chips are capacity alike (units of that accelerator)."""
        z = self.cloud.scenario.zones[zone]
        mt_name = last(body.get("machineType", ""))
        if not mt_name:
            raise invalid("Invalid value for field 'resource.machineType': ''. Machine type is required.")
        info = machine_info(mt_name)
        if info is None or mt_name not in z.machine_types + z.tpu_machine_types:
            raise invalid(
                f"Invalid value for field 'resource.machineType': '{body['machineType']}'. "
                f"Machine type with name '{mt_name}' does not exist in zone '{zone}'."
            )
        gpu, count = info.gpu_type or "", info.gpu_count
        for acc in body.get("guestAccelerators") or []:
            at = last(acc.get("acceleratorType", ""))
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
        if gpu and gpu not in z.gpu_types and mt_name not in z.tpu_machine_types:
            raise invalid(f"Accelerator type '{gpu}' is not available in zone '{zone}'.")
        return mt_name, gpu, count

    def quota_check(self, zone: str, accelerator: str, count: int, spot: bool, cpus: int) -> None:
        """403 quotaExceeded at request time, as Google answers a regional quota (CPUS, GPUs, TPU chips)."""
        region = self.cloud.scenario.zones[zone].region
        quotas = self.cloud.scenario.quotas.get(region) or {}
        checks: list[tuple[str, float]] = [("CPUS", cpus)]
        metric = quota_metric(accelerator, spot) if accelerator else None
        if metric:
            checks.append((metric, count))
        usage = self.region_usage(region)
        for name, need in checks:
            if name in quotas and usage.get(name, 0.0) + need > quotas[name]:
                raise ApiError(403, quota_message(name, quotas[name], region), "PERMISSION_DENIED", "quotaExceeded")

    def region_usage(self, region: str) -> dict[str, float]:
        usage: dict[str, float] = {}
        for m in self.cloud.machines.values():
            if m.kind != "gce" or not m.holds or self.cloud.scenario.zones[m.zone].region != region:
                continue
            info = machine_info(last(m.resource["machineType"]))
            usage["CPUS"] = usage.get("CPUS", 0.0) + (info.cpus if info else 0)
            metric = quota_metric(m.cap_type, m.spot) if m.cap_type else None
            if metric:
                usage[metric] = usage.get(metric, 0.0) + m.units
        return usage
