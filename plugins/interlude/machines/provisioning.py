"""Provisioning and teardown: machine bodies as data, creates that adopt, deletes that always finish.

Names come from the run key, so a retry, a clear or a re-provision after a preemption asks for the
same resource and adopts it if it exists. The machine bodies are built here as plain JSON (the REST
shape Google documents) so the same body is logged, kept in XCom for a re-provision, and sent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from interlude import naming
from interlude.hooks.machines import machine_hooks
from interlude.naming import DAG_ID_METADATA, RUN_ID_METADATA, queued_resource_id

log = logging.getLogger(__name__)

DEFAULT_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
# Deep Learning VM images (project deeplearning-platform-release) by family; see
# plugins/interlude/runtimes/runtimes.yaml.
DLVM_PROJECT = "deeplearning-platform-release"


@dataclass(frozen=True)
class MachineRecord:
    """Everything a create needs, JSON-shaped (this is what XCom carries between tasks)."""

    kind: str  # tpu_node | gce_vm (a GPU VM, or a TPU VM of a Compute Engine TPU machine type)
    zone: str
    name: str
    accelerator_type: str
    accelerator_count: int
    machine_type: str | None
    runtime: str  # TPU runtime version, or GPU image family
    mode: str  # on_demand | spot | reservation | queued
    body: dict[str, Any] = field(default_factory=dict)
    reservation: str | None = None
    platform: str = ""  # tpu_api | compute (interlude.capacity.platforms); blank in records made before platforms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def startup_script(bucket: str, run_key: str, idle_poll: float = 1.0, fresh_token: str | None = None) -> str:
    """The script every boot runs: the workload agent, which resumes every planned stage.

    Every value is shell-quoted. On Google Cloud the image must provide a `python3` that can import
    `interlude_workload` (this repository installed, e.g. in a custom image); the script says so on
    the serial console and exits 3 when it cannot.
    """
    from interlude_workload.startup import render_agent

    return render_agent(bucket=bucket, run_key=run_key, idle_poll=idle_poll, fresh_token=fresh_token)


def tpu_node_body(
    *,
    accelerator_type: str,
    runtime: str,
    mode: str,
    labels: dict[str, str],
    script: str,
    network: str | None,
    subnetwork: str | None,
    service_account: str | None,
    reservation: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "acceleratorType": accelerator_type,
        "runtimeVersion": runtime,
        "networkConfig": {"enableExternalIps": False},
        "labels": labels,
        # guest attributes on: the startup script reports its end there, the TPU API reads it back
        "metadata": {"startup-script": script, "enable-guest-attributes": "TRUE"},
    }
    if network:
        body["networkConfig"]["network"] = network
    if subnetwork:
        body["networkConfig"]["subnetwork"] = subnetwork
    if service_account:
        body["serviceAccount"] = {"email": service_account, "scope": DEFAULT_SCOPES}
    if mode == "spot":
        body["schedulingConfig"] = {"spot": True}
    elif mode == "reservation":
        body["schedulingConfig"] = {"reserved": True}
    return body


def gce_vm_body(
    *,
    name: str,
    zone: str,
    accelerator_type: str,
    count: int,
    machine_type: str,
    image_family: str,
    mode: str,
    labels: dict[str, str],
    script: str,
    network: str | None,
    subnetwork: str | None,
    service_account: str | None,
    reservation: str | None = None,
    image_project: str = DLVM_PROJECT,
) -> dict[str, Any]:
    """A Compute Engine instance: a GPU VM (Deep Learning VM image, NVIDIA driver installed at boot), or a TPU VM
    of a TPU machine type (``ct6e-standard-8t``; its chips come with the machine type, its image from
    ``image_project``: https://cloud.google.com/compute/docs/tpus/create-tpu-vm-instance). Neither live-migrates."""
    spot = mode == "spot"
    tpu_vm = image_project != DLVM_PROJECT
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/{machine_type}",
        "labels": labels,
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {
                    "sourceImage": f"projects/{image_project}/global/images/family/{image_family}",
                    "diskSizeGb": "200",
                },
            }
        ],
        # No accessConfigs: no external IP. Egress goes through Cloud NAT / Private Google Access.
        "networkInterfaces": [
            {k: v for k, v in (("network", network or "global/networks/default"), ("subnetwork", subnetwork)) if v}
        ],
        # GPU and TPU VMs cannot live-migrate: they must stop for host maintenance and may come back by themselves.
        "scheduling": {
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": not spot,
            "provisioningModel": "SPOT" if spot else "STANDARD",
            **({"instanceTerminationAction": "STOP"} if spot else {}),
        },
        "metadata": {
            "items": [{"key": "startup-script", "value": script}]
            + ([] if tpu_vm else [{"key": "install-nvidia-driver", "value": "True"}])
        },
    }
    if machine_type.startswith("n1-"):  # A2/A3/G2/A4 carry their GPUs in the machine type
        body["guestAccelerators"] = [
            {"acceleratorType": f"zones/{zone}/acceleratorTypes/{accelerator_type}", "acceleratorCount": count}
        ]
    if service_account:
        body["serviceAccounts"] = [{"email": service_account, "scopes": DEFAULT_SCOPES}]
    if reservation:
        body["reservationAffinity"] = {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [reservation],
        }
    return body


def machine_record(
    decision: dict[str, Any],
    runtime: str,
    *,
    bucket: str,
    run_key: str,
    dag_id: str,
    run_id: str = "",
    network: str | None = None,
    subnetwork: str | None = None,
    service_account: str | None = None,
    idle_poll: float = 1.0,
    fresh_token: str | None = None,
) -> MachineRecord:
    """Build the create machine for the accelerator a decision names: a Cloud TPU node (platform ``tpu_api``, or
    none given) or a Compute Engine instance (``compute``: GPUs, and TPU machine types such as ct6e-standard-8t)."""
    script = startup_script(bucket, run_key, idle_poll, fresh_token)
    owner = {DAG_ID_METADATA: dag_id, RUN_ID_METADATA: run_id}
    labels = naming.labels(run_key, dag_id)
    zone, accel = decision["zone"], decision["accelerator_type"]
    mode = decision.get("mode") or "on_demand"
    reservation = decision.get("reservation")
    if decision["kind"] == "tpu" and decision.get("platform") in (None, "", "tpu_api"):
        name = naming.resource_name(run_key, "tpu")
        body = tpu_node_body(
            accelerator_type=accel,
            runtime=runtime,
            mode=mode,
            labels=labels,
            script=script,
            network=network,
            subnetwork=subnetwork,
            service_account=service_account,
            reservation=reservation,
        )
        body["metadata"].update(owner)
        return MachineRecord("tpu_node", zone, name, accel, 1, None, runtime, mode, body, reservation, "tpu_api")
    name = naming.resource_name(run_key, "vm")
    count = int(decision.get("count") or 1)
    machine_type = decision.get("machine_type") or "n1-standard-8"
    image_project = DLVM_PROJECT
    if decision["kind"] == "tpu":  # a TPU VM on Compute Engine: the TPU machine type carries the chips
        image_project, count, machine_type = _compute_tpu(accel)
    body = gce_vm_body(
        name=name,
        zone=zone,
        accelerator_type=accel,
        count=count,
        machine_type=machine_type,
        image_family=runtime,
        mode=mode,
        labels=labels,
        script=script,
        network=network,
        subnetwork=subnetwork,
        service_account=service_account,
        reservation=reservation,
        image_project=image_project,
    )
    body["metadata"]["items"] += [{"key": k, "value": v} for k, v in owner.items()]
    return MachineRecord("gce_vm", zone, name, accel, count, machine_type, runtime, mode, body, reservation, "compute")


def _compute_tpu(accelerator_type: str) -> tuple[str, int, str]:
    """(image project, count, machine type) of a TPU type on Compute Engine; refuses a type it does not sell."""
    from interlude.capacity.platforms import compute_tpu_shape, why_not

    shape = compute_tpu_shape(accelerator_type)
    if shape is None:
        raise ValueError(why_not("compute", accelerator_type))
    return shape.image_project, 1, shape.machine_type


QUEUE_GRACE_SECONDS = 300.0
"""Beyond a queued resource's own validUntilDuration (the `queue_wait_seconds` param), how long Interlude waits
for Google to say FAILED before giving up itself: the safety net, never the usual end."""


def create(machine: dict[str, Any], gcp_conn_id: str | None, queue_timeout: float = 3600.0) -> dict[str, Any]:
    """Create (or adopt) the machine. Raises the hooks' StockoutError / QuotaExceededError.

    Mode `queued` asks for the TPU through a queued resource: Google holds the machine in
    WAITING_FOR_RESOURCES instead of failing with a stockout, and creates the node when it can.
    """
    tpu, compute = machine_hooks(gcp_conn_id)
    if machine["kind"] == "gce_vm":
        return compute.insert_instance(machine["zone"], machine["body"])
    if machine.get("mode") != "queued":
        return tpu.create_node(machine["zone"], machine["name"], machine["body"])
    zone, qr_id = machine["zone"], queued_resource_id(machine)
    tpu.create_queued_resource(zone, qr_id, _queued_body(tpu, machine, queue_timeout))
    deadline = time.monotonic() + queue_timeout
    while True:
        qr = tpu.get_queued_resource(zone, qr_id) or {}
        state = (qr.get("state") or {}).get("state")
        if state == "ACTIVE":
            node = tpu.get_node(zone, machine["name"])
            if node and node.get("state") == "READY":
                return node
        elif state in ("FAILED", "SUSPENDED") or not qr:
            raise RuntimeError(f"queued resource {qr_id} is {state or 'gone'}: {qr.get('state')}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"queued resource {qr_id} still {state} after {queue_timeout:.0f}s")
        log.info("Queued resource %s: %s", qr_id, state)
        time.sleep(2.0)


def queue(machine: dict[str, Any], gcp_conn_id: str | None, valid_for: float = 3600.0) -> dict[str, Any]:
    """Ask for the TPU through a queued resource and return once Google accepted it (no waiting for
    capacity: the deferrable provision waits in the triggerer)."""
    tpu, _ = machine_hooks(gcp_conn_id)
    return tpu.create_queued_resource(
        machine["zone"], queued_resource_id(machine), _queued_body(tpu, machine, valid_for)
    )


def _queued_body(tpu: Any, machine: dict[str, Any], valid_for: float) -> dict[str, Any]:
    """The queued resource for one node. `validUntilDuration` makes Google itself fail a request that waited
    too long (FAILED), so no stale request can hand over a TPU after the run gave up on it
    (https://cloud.google.com/tpu/docs/queued-resources#request_a_queued_resource_before_a_specified_time)."""
    node_spec = {"parent": tpu.parent(machine["zone"]), "nodeId": machine["name"], "node": machine["body"]}
    return {"tpu": {"nodeSpec": [node_spec]}, "queueingPolicy": {"validUntilDuration": f"{int(valid_for)}s"}}


def delete(machine: dict[str, Any], gcp_conn_id: str | None) -> None:
    tpu, compute = machine_hooks(gcp_conn_id)
    if machine["kind"] == "gce_vm":
        compute.delete_instance(machine["zone"], machine["name"])
        return
    if machine.get("mode") == "queued":  # force: the queued resource takes its node with it
        tpu.delete_queued_resource(machine["zone"], queued_resource_id(machine), force=True)
    tpu.delete_node(machine["zone"], machine["name"])


def reprovision(machine: dict[str, Any], gcp_conn_id: str | None) -> dict[str, Any]:
    """The machine is gone or will not come back: replace it under the same name (same checkpoints)."""
    delete(machine, gcp_conn_id)
    return create(machine, gcp_conn_id)
