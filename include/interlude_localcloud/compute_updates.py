"""Changing an existing instance: instances.setMetadata and instances.setMachineType, and the answer to a Compute
method the local cloud does not implement.

- setMetadata replaces `metadata.items` when the request carries the instance's current `metadata.fingerprint`;
  a stale or missing one is 412 conditionNotMet, "Supplied fingerprint does not match current metadata
  fingerprint.", as Google answers (optimistic locking:
  https://cloud.google.com/compute/docs/metadata/setting-custom-metadata#update_metadata; clients retry on exactly
  that 412 and text, e.g. terraform-provider-google's IsFingerprintError). Each change gets a new fingerprint.
  The guest's metadata server reads the items live, so `instance/attributes/KEY` (and a
  `wait_for_change` long-poll on it) sees the new value at once.
- setMachineType works only on a stopped (TERMINATED) instance, else 400
  (https://cloud.google.com/compute/docs/instances/changing-machine-type-of-stopped-instance); the new type must
  exist in the zone; the accelerators (GPUs, TPU chips) it brings count at the next start.
- Both are zone operations like the other methods (done at once: no delay in the scenario).
- Any other method or path under /compute/v1/ answers 501 UNIMPLEMENTED in Compute's error shape, so a client
  does not read "not implemented here" as "no such instance" (404 stays for a missing resource).
"""

from __future__ import annotations

import base64
import hashlib

from interlude_localcloud.compute_base import DOC, INST, ComputeBase, last
from interlude_localcloud.compute_tpu_catalog import guest_attributes, tpu_machine_type
from interlude_localcloud.errors import ApiError, invalid
from interlude_localcloud.machines import Devices
from interlude_localcloud.server import Request, Response, Router

COMPUTE_PREFIX = r"/compute/v1/.*"


def metadata_fingerprint(instance_id: str, version: int) -> str:
    """A metadata fingerprint as Google prints one (8 bytes, base64), new for every version of the items."""
    return base64.b64encode(hashlib.sha256(f"{instance_id}/{version}".encode()).digest()[:8]).decode()


def devices_for(machine_type: str, accelerator: str, count: int) -> tuple[Devices, dict[str, str]]:
    """What the guest of an instance of this type sees: device files / nvidia-smi, and platform metadata."""
    tpu = tpu_machine_type(machine_type)
    if tpu is not None:
        return Devices(tpu_chips=tpu.chips), guest_attributes(tpu)
    return Devices(gpu=accelerator, gpu_count=count if accelerator else 0), {}


def register_unimplemented(r: Router) -> None:
    """Last in the router: whatever no Compute route matched (method or path) is 501, not 404."""
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        r.add(method, COMPUTE_PREFIX, unimplemented)


def unimplemented(req: Request) -> Response:
    raise ApiError(
        501,
        f"Method not implemented by the local cloud's Compute Engine: {req.method} {req.path}",
        "UNIMPLEMENTED",
        "notImplemented",
    )


class ComputeUpdatesApi(ComputeBase):
    def register(self, r: Router) -> None:
        r.add("POST", INST + "/setMetadata", self.set_metadata, DOC, "Metadata")
        r.add("POST", INST + "/setMachineType", self.set_machine_type, DOC, "InstancesSetMachineTypeRequest")

    def set_metadata(self, req: Request) -> Response:
        body = req.body or {}
        with self.cloud.lock:
            m = self.instance_of(req)
            current = m.resource.get("metadata") or {}
            if body.get("fingerprint") != current.get("fingerprint"):
                raise ApiError(
                    412,
                    "Supplied fingerprint does not match current metadata fingerprint.",
                    "FAILED_PRECONDITION",
                    "conditionNotMet",
                )
            version = int(m.extra.get("metadata_version", 0)) + 1
            m.extra["metadata_version"] = version
            items = [{"key": i["key"], "value": i.get("value", "")} for i in body.get("items") or []]
            m.resource["metadata"] = {
                "kind": "compute#metadata",
                "fingerprint": metadata_fingerprint(m.resource["id"], version),
                **({"items": items} if items else {}),
            }
            op = self.new_op(m.zone, "setMetadata", m, m.name)
            self.cloud.log("gce_set_metadata", machine=m.machine_id, keys=[i["key"] for i in items])
            self.finish_op(op)  # notifies: metadata-server long-polls see the new items
            return Response(dict(op), "Operation")

    def set_machine_type(self, req: Request) -> Response:
        body = req.body or {}
        with self.cloud.lock:
            m = self.instance_of(req)
            # TERMINATED by the user (stop, preemption): not one held through a host maintenance that restarts it
            if m.resource["status"] != "TERMINATED" or m.holds:
                raise ApiError(
                    400,
                    f"The instance must be stopped (TERMINATED) to change its machine type; it is "
                    f"{m.resource['status']}.",
                    "INVALID_ARGUMENT",
                    "resourceNotReady",
                )
            if not body.get("machineType"):
                raise invalid("Invalid value for field 'machineType': ''. Machine type is required.")
            new = {"machineType": body["machineType"], "guestAccelerators": m.resource.get("guestAccelerators")}
            mt_name, accelerator, count = self.accelerators(m.zone, new)
            m.resource["machineType"] = f"{self.base}/zones/{m.zone}/machineTypes/{mt_name}"
            m.cap_type, m.units = accelerator, count
            m.proc.devices, m.platform_attributes = devices_for(mt_name, accelerator, count)
            op = self.new_op(m.zone, "setMachineType", m, m.name)
            self.cloud.log("gce_set_machine_type", machine=m.machine_id, machine_type=last(mt_name))
            self.finish_op(op)
            return Response(dict(op), "Operation")
