"""Compute Engine v1's read-only catalog: accelerator and machine types (GPU and TPU), reservations, zones and
regions with their quotas, as compute.googleapis.com/compute/v1 serves them."""

from __future__ import annotations

from typing import Any

from interlude_localcloud.catalog import GPU_DESCRIPTIONS
from interlude_localcloud.compute_base import DOC, ComputeBase, P, Z
from interlude_localcloud.compute_tpu_catalog import TPU_QUOTA_METRICS, machine_info
from interlude_localcloud.errors import ApiError
from interlude_localcloud.server import Request, Response, Router

CLOUD_QUOTAS_ONLY = {metric for pair in TPU_QUOTA_METRICS.values() for metric in pair}


class ComputeCatalogApi(ComputeBase):
    def register(self, r: Router) -> None:
        r.add("GET", Z + "/acceleratorTypes", self.list_accelerator_types, DOC)
        r.add("GET", Z + "/machineTypes", self.list_machine_types, DOC)
        r.add("GET", Z + "/reservations", self.list_reservations, DOC)
        r.add("GET", Z, self.get_zone, DOC)
        r.add("GET", P + r"/regions/(?P<region>[^/]+)", self.get_region, DOC)

    def list_accelerator_types(self, req: Request) -> Response:
        zone = self.zone_of(req)
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
        zone = self.zone_of(req)
        items = []
        z = self.cloud.scenario.zones[zone]
        for i, name in enumerate(z.machine_types + z.tpu_machine_types):
            info = machine_info(name)
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
        zone = self.zone_of(req)
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
        zone = self.zone_of(req)
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
        quotas = [  # TPU VM chip quotas are Cloud Quotas metrics: enforced at insert, not listed here (as Google)
            {"metric": k, "limit": v, "usage": usage.get(k, 0.0)}
            for k, v in sorted((self.cloud.scenario.quotas.get(region) or {}).items())
            if k not in CLOUD_QUOTAS_ONLY
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
