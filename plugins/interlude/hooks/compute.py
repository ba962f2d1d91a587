"""Compute Engine hook for GPU (and TPU7x) VMs: capacity facts, instances, maintenance; sync and async.

Every call is a raw REST JSON call of Compute Engine API v1
(https://cloud.google.com/compute/docs/reference/rest/v1) through the hook's ``RestClient`` (google.auth's
``AuthorizedSession``, our retries and error mapping), not the ``google.cloud.compute_v1`` client library:

- callers get Google's own camelCase JSON (the same shape as the TPU hook), including fields the library's
  messages may not carry yet, such as ``resourceStatus.upcomingMaintenance``;
- the library's generated message types cost every process that imports them ~1.2-1.6 CPU-s and ~93 MB of
  RSS (measured on the 2-core machine in a process that already holds google-cloud-storage): every Airflow
  task that probes GPU capacity (every run's first tasks) and every ``airflow dags test`` paid that for
  a few GET and POST calls;
- operations are polled with ``zoneOperations.get`` on the same endpoint (the library's
  ``ExtendedOperation.result()`` polls Google's public endpoint whatever ``client_options`` say).

A request body is sent as the caller wrote it: Compute Engine itself refuses an unknown field with a 400
("Invalid JSON payload received. Unknown name ..."), which becomes ``InvalidRequestError``. The async hook
(the triggerer's) is :mod:`interlude.hooks.compute_async`, re-exported here.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from interlude.hooks._ops import poll_until
from interlude.hooks.compute_async import COMPUTE_PUBLIC_ENDPOINT, AsyncComputeHook
from interlude.hooks.connection import InterludeGoogleHook
from interlude.hooks.errors import (
    AlreadyExistsError,
    InvalidRequestError,
    NotFoundError,
    error_from_compute_operation,
)

log = logging.getLogger(__name__)

#: Instance statuses during which an insert of that instance is still under way.
_SETTLING_STATUSES = frozenset({"PROVISIONING", "STAGING"})


def _short(name_or_url: str) -> str:
    """``.../zones/z/acceleratorTypes/nvidia-l4`` -> ``nvidia-l4``."""
    return name_or_url.rsplit("/", 1)[-1]


class ComputeHook(InterludeGoogleHook):
    """Compute Engine instances, accelerator/machine types, quotas, reservations, maintenance.

    :param gcp_conn_id: Airflow connection (``google_cloud_platform``); None = anonymous, no connection.
    :param compute_endpoint: base URL overriding the connection extra ``compute_endpoint``.
    :param project_id: project overriding the connection extra ``project``.
    """

    conn_name_attr = "gcp_conn_id"
    hook_name = "Interlude Compute Engine"
    endpoint_extra = "compute_endpoint"
    default_endpoint = COMPUTE_PUBLIC_ENDPOINT

    def __init__(
        self,
        gcp_conn_id: str | None = "google_cloud_default",
        compute_endpoint: str | None = None,
        project_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(gcp_conn_id, endpoint=compute_endpoint, project_id=project_id, **kwargs)

    # -- plumbing -------------------------------------------------------------------------------------

    @property
    def project_url(self) -> str:
        return f"{self.base_url}/compute/v1/projects/{self.project}"

    def zone_url(self, zone: str) -> str:
        return f"{self.project_url}/zones/{zone}"

    def instances_url(self, zone: str) -> str:
        return f"{self.zone_url(zone)}/instances"

    def wait_operation(self, zone: str, operation: str) -> dict[str, Any]:
        """Poll a zone operation until DONE (through our own client); raise its mapped error if any.

        An insert beyond capacity ends DONE with ``error.errors[0].code == ZONE_RESOURCE_POOL_EXHAUSTED``:
        that becomes ``StockoutError``.
        """

        def check() -> dict[str, Any] | None:
            op = self.rest.request("GET", f"{self.zone_url(zone)}/operations/{operation}")
            return op if op.get("status") == "DONE" else None

        result = poll_until(check, timeout=self.operation_timeout, max_interval=self.poll_interval, what=operation)
        if (result.get("error") or {}).get("errors"):
            raise error_from_compute_operation(result)
        return result

    def _instance_op(
        self, zone: str, name: str, verb: str | None, wait: bool, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """POST ``instances/{name}/{verb}`` (DELETE ``instances/{name}`` when ``verb`` is None): an operation."""
        url = f"{self.instances_url(zone)}/{name}"
        if verb is None:
            op = self.rest.request("DELETE", url, params=params)
        else:
            op = self.rest.request("POST", f"{url}/{verb}", params=params)
        return self.wait_operation(zone, str(op["name"])) if wait else op

    # -- catalog and capacity facts -------------------------------------------------------------------

    def list_accelerator_types(self, zone: str) -> list[str]:
        """Accelerator types offered in the zone, e.g. ``["nvidia-l4", "nvidia-tesla-t4"]``."""
        items = self.rest.list_all(f"{self.zone_url(zone)}/acceleratorTypes", "items")
        return sorted({str(a["name"]) for a in items})

    def list_machine_types(self, zone: str) -> list[str]:
        """Machine types offered in the zone, e.g. ``["g2-standard-8", ...]``."""
        items = self.rest.list_all(f"{self.zone_url(zone)}/machineTypes", "items")
        return sorted({str(m["name"]) for m in items})

    def get_region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        """Regional quotas: metric (e.g. ``NVIDIA_L4_GPUS``) -> (limit, usage)."""
        region_obj = self.rest.request("GET", f"{self.project_url}/regions/{region}")
        return {
            str(q["metric"]): (float(q.get("limit") or 0), float(q.get("usage") or 0))
            for q in region_obj.get("quotas") or []
        }

    def list_reservations(self, zone: str) -> list[dict[str, Any]]:
        """Reservations in the zone as Google's JSON (``specificReservation.count`` / ``inUseCount``...)."""
        return self.rest.list_all(f"{self.zone_url(zone)}/reservations", "items")

    # -- zones ----------------------------------------------------------------------------------------

    def get_zone(self, zone: str) -> dict[str, Any] | None:
        """The zone (``zones.get``), or None when the project cannot see a zone of that name."""
        try:
            return self.rest.request("GET", self.zone_url(zone))
        except NotFoundError:
            return None

    # -- instances ------------------------------------------------------------------------------------

    def get_instance(self, zone: str, name: str) -> dict[str, Any] | None:
        """The instance as raw JSON (incl. ``resourceStatus.upcomingMaintenance``), or None if missing."""
        try:
            return self.rest.request("GET", f"{self.instances_url(zone)}/{name}")
        except NotFoundError:
            return None

    def list_instances(self, zone: str, filter: str | None = None) -> list[dict[str, Any]]:
        """Instances of the zone (optionally Compute ``filter``, e.g. ``labels.run=abc``), raw JSON."""
        return self.rest.list_all(self.instances_url(zone), "items", {"filter": filter} if filter else None)

    def insert_instance(self, zone: str, body: dict[str, Any], wait: bool = True) -> dict[str, Any]:
        """Create a VM from a JSON body (``name``, ``machineType``, ...); return the instance.

        Idempotent on ``name``: an existing instance is returned (after PROVISIONING/STAGING when
        ``wait``). One ``requestId`` per call makes Google de-duplicate our own retried POSTs.
        Raises ``StockoutError`` (operation ends ZONE_RESOURCE_POOL_EXHAUSTED) or ``QuotaExceededError``
        (403 quotaExceeded at insert time) with Google's message.
        """
        name = body.get("name")
        if not name:
            raise InvalidRequestError("insert_instance: body needs a 'name'", 400, "INVALID_ARGUMENT")
        try:
            op = self.rest.request("POST", self.instances_url(zone), params={"requestId": str(uuid.uuid4())}, json=body)
        except AlreadyExistsError:
            log.info("instance %s/%s already exists; returning it", zone, name)
            return self._existing_instance(zone, name, wait)
        if wait:
            try:
                self.wait_operation(zone, str(op["name"]))
            except AlreadyExistsError:
                return self._existing_instance(zone, name, wait)
        return self.get_instance(zone, name) or {"name": name, "status": "PROVISIONING"}

    def _existing_instance(self, zone: str, name: str, wait: bool) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            inst = self.get_instance(zone, name)
            if inst is None:
                raise NotFoundError(f"instance {name} reported existing but is gone", 404, "NOT_FOUND")
            return None if wait and inst.get("status") in _SETTLING_STATUSES else inst

        return poll_until(check, timeout=self.operation_timeout, max_interval=self.poll_interval, what=name)

    def delete_instance(self, zone: str, name: str, wait: bool = True) -> None:
        """Delete a VM; one that does not exist (anymore) is fine."""
        try:
            self._instance_op(zone, name, None, wait)
        except NotFoundError:
            log.info("instance %s/%s already gone", zone, name)

    def start_instance(self, zone: str, name: str) -> None:
        self._instance_op(zone, name, "start", True)

    def stop_instance(self, zone: str, name: str) -> None:
        self._instance_op(zone, name, "stop", True)

    def simulate_maintenance_event(
        self, zone: str, name: str, wait: bool = False, with_extended_notifications: bool = True
    ) -> None:
        """Ask Google to simulate a host maintenance event on the VM.

        ``with_extended_notifications`` (on by default) asks for the notice first, as a GPU VM gets before
        real maintenance; without it a VM that cannot live-migrate (every GPU VM) is terminated or
        restarted at once per its ``onHostMaintenance`` policy, with no notice
        (https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance,
        https://cloud.google.com/compute/docs/reference/rest/v1/instances/simulateMaintenanceEvent).
        Not waited for by default: the notice (``resourceStatus.upcomingMaintenance``, the metadata
        server's ``maintenance-event``) and the VM going down are what the pipeline reacts to.
        """
        self._instance_op(
            zone,
            name,
            "simulateMaintenanceEvent",
            wait,
            {"withExtendedNotifications": "true" if with_extended_notifications else "false"},
        )

    def perform_maintenance(self, zone: str, name: str, wait: bool = False) -> None:
        """Start the VM's pending maintenance now."""
        self._instance_op(zone, name, "performMaintenance", wait)


__all__ = ["COMPUTE_PUBLIC_ENDPOINT", "AsyncComputeHook", "ComputeHook"]
