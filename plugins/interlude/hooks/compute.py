"""Compute Engine hook for GPU (and TPU7x) VMs: capacity facts, instances, maintenance; sync and async.

Calls go through the ``google.cloud.compute_v1`` clients (REST-only, synchronous) with our endpoint in
``client_options``. Operations are polled with our own ``ZoneOperationsClient`` on the same endpoint:
the library's ``ExtendedOperation.result()`` would poll Google's public endpoint whatever
``client_options`` say. Instances are read as raw REST JSON so callers get Google's
camelCase shape (same as the TPU hook) including ``resourceStatus.upcomingMaintenance``. The async hook
(the triggerer's) is :mod:`interlude.hooks.compute_async`, re-exported here.
"""

from __future__ import annotations

import functools
import logging
import uuid
from typing import Any

from google.cloud import compute_v1

from interlude.hooks._ops import CALL_TIMEOUT, client_call, dict_to_message, message_to_dict, poll_until
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

    def _client(self, cls: type[Any]) -> Any:
        return cls(credentials=self.get_credentials(), transport="rest", client_options=self.client_options())

    @functools.cached_property
    def instances(self) -> compute_v1.InstancesClient:
        return self._client(compute_v1.InstancesClient)

    @functools.cached_property
    def zone_operations(self) -> compute_v1.ZoneOperationsClient:
        return self._client(compute_v1.ZoneOperationsClient)

    @functools.cached_property
    def accelerator_types(self) -> compute_v1.AcceleratorTypesClient:
        return self._client(compute_v1.AcceleratorTypesClient)

    @functools.cached_property
    def machine_types(self) -> compute_v1.MachineTypesClient:
        return self._client(compute_v1.MachineTypesClient)

    @functools.cached_property
    def regions(self) -> compute_v1.RegionsClient:
        return self._client(compute_v1.RegionsClient)

    @functools.cached_property
    def reservations(self) -> compute_v1.ReservationsClient:
        return self._client(compute_v1.ReservationsClient)

    def instances_url(self, zone: str) -> str:
        return f"{self.base_url}/compute/v1/projects/{self.project}/zones/{zone}/instances"

    def _call(self, fn: Any, what: str) -> Any:
        return client_call(fn, self.retry_policy, what)

    def wait_operation(self, zone: str, operation: str) -> dict[str, Any]:
        """Poll a zone operation until DONE (through our own client); raise its mapped error if any.

        An insert beyond capacity ends DONE with ``error.errors[0].code == ZONE_RESOURCE_POOL_EXHAUSTED``:
        that becomes ``StockoutError``.
        """

        def check() -> dict[str, Any] | None:
            op = self._call(
                lambda: self.zone_operations.get(
                    project=self.project, zone=zone, operation=operation, retry=None, timeout=CALL_TIMEOUT
                ),
                f"zoneOperations.get {operation}",
            )
            as_dict = message_to_dict(op)
            return as_dict if as_dict.get("status") == "DONE" else None

        result = poll_until(check, timeout=self.operation_timeout, max_interval=self.poll_interval, what=operation)
        if (result.get("error") or {}).get("errors"):
            raise error_from_compute_operation(result)
        return result

    def _instance_op(self, zone: str, name: str, verb: str, wait: bool, **extra: Any) -> dict[str, Any]:
        method = getattr(self.instances, f"{verb}_unary")
        # a request mapping: query parameters such as withExtendedNotifications are not flattened arguments
        request = {"project": self.project, "zone": zone, "instance": name, **extra}
        op = self._call(
            lambda: method(request=request, retry=None, timeout=CALL_TIMEOUT),
            f"instances.{verb} {zone}/{name}",
        )
        return self.wait_operation(zone, op.name) if wait else message_to_dict(op)

    # -- catalog and capacity facts -------------------------------------------------------------------

    def list_accelerator_types(self, zone: str) -> list[str]:
        """Accelerator types offered in the zone, e.g. ``["nvidia-l4", "nvidia-tesla-t4"]``."""
        names = self._call(
            lambda: [a.name for a in self.accelerator_types.list(project=self.project, zone=zone, retry=None)],
            f"acceleratorTypes.list {zone}",
        )
        return sorted(set(names))

    def list_machine_types(self, zone: str) -> list[str]:
        """Machine types offered in the zone, e.g. ``["g2-standard-8", ...]``."""
        names = self._call(
            lambda: [m.name for m in self.machine_types.list(project=self.project, zone=zone, retry=None)],
            f"machineTypes.list {zone}",
        )
        return sorted(set(names))

    def get_region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        """Regional quotas: metric (e.g. ``NVIDIA_L4_GPUS``) -> (limit, usage)."""
        region_obj = self._call(
            lambda: self.regions.get(project=self.project, region=region, retry=None, timeout=CALL_TIMEOUT),
            f"regions.get {region}",
        )
        return {q.metric: (float(q.limit), float(q.usage)) for q in region_obj.quotas}

    def list_reservations(self, zone: str) -> list[dict[str, Any]]:
        """Reservations in the zone as Google's JSON (``specificReservation.count`` / ``inUseCount``...)."""
        return self._call(
            lambda: [message_to_dict(r) for r in self.reservations.list(project=self.project, zone=zone, retry=None)],
            f"reservations.list {zone}",
        )

    # -- zones ----------------------------------------------------------------------------------------

    def get_zone(self, zone: str) -> dict[str, Any] | None:
        """The zone (``zones.get``), or None when the project cannot see a zone of that name."""
        try:
            return self.rest.request("GET", f"{self.base_url}/compute/v1/projects/{self.project}/zones/{zone}")
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
        instance = dict_to_message(compute_v1.Instance, body)
        request = compute_v1.InsertInstanceRequest(
            project=self.project, zone=zone, instance_resource=instance, request_id=str(uuid.uuid4())
        )
        try:
            op = self._call(
                lambda: self.instances.insert_unary(request=request, retry=None, timeout=CALL_TIMEOUT),
                f"instances.insert {zone}/{name}",
            )
        except AlreadyExistsError:
            log.info("instance %s/%s already exists; returning it", zone, name)
            return self._existing_instance(zone, name, wait)
        if wait:
            try:
                self.wait_operation(zone, op.name)
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
            self._instance_op(zone, name, "delete", wait)
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
            zone, name, "simulate_maintenance_event", wait, with_extended_notifications=with_extended_notifications
        )

    def perform_maintenance(self, zone: str, name: str, wait: bool = False) -> None:
        """Start the VM's pending maintenance now."""
        self._instance_op(zone, name, "perform_maintenance", wait)


__all__ = ["COMPUTE_PUBLIC_ENDPOINT", "AsyncComputeHook", "ComputeHook"]
