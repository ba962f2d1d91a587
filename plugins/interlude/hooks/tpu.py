"""Cloud TPU hook (TPU API v2, plus v2alpha1 maintenance actions), sync and async.

Mutations go through ``google.cloud.tpu_v2.TpuClient`` over REST; reads of nodes and queued resources
are raw REST JSON, because the client's ``Node`` has no ``upcomingMaintenance`` and would silently
drop it (the field is in the REST reference,
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes#UpcomingMaintenance).
Node dicts are Google's JSON: camelCase, enum names.
``simulateMaintenanceEvent`` / ``performMaintenance`` exist only in v2alpha1, whose python client is
gRPC-only, so they are plain REST POSTs. Long-running operations are polled by us (see ``_ops``).
The async hook (the triggerer's) is :mod:`interlude.hooks.tpu_async`, re-exported here.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import TYPE_CHECKING, Any

from interlude.hooks._ops import CALL_TIMEOUT, client_call, dict_to_message, poll_until
from interlude.hooks.connection import InterludeGoogleHook
from interlude.hooks.errors import AlreadyExistsError, NotFoundError, error_from_rpc_status
from interlude.hooks.tpu_async import TPU_PUBLIC_ENDPOINT, AsyncTpuHook

if TYPE_CHECKING:
    from google.cloud import tpu_v2

log = logging.getLogger(__name__)

#: Node states during which a create of that node is still under way.
_SETTLING_STATES = frozenset({"CREATING", "STATE_UNSPECIFIED"})


def _tpu_v2() -> Any:
    """google-cloud-tpu's v2 module, imported by the sync calls that build its messages: the async hook (the
    triggerer's) reads over raw REST and never needs it, and importing it costs a process ~14 MB."""
    return importlib.import_module("google.cloud.tpu_v2")


class TpuHook(InterludeGoogleHook):
    """Cloud TPU nodes, queued resources, accelerator types and maintenance for one project.

    :param gcp_conn_id: Airflow connection (``google_cloud_platform``); None = anonymous, no connection.
    :param tpu_endpoint: base URL overriding the connection extra ``tpu_endpoint`` (e.g. the local cloud).
    :param project_id: project overriding the connection extra ``project``.
    Further keyword arguments (``retry_policy``, ``poll_interval``, ``operation_timeout``) go to
    :class:`~interlude.hooks.connection.InterludeGoogleHook`.
    """

    conn_name_attr = "gcp_conn_id"
    hook_name = "Interlude Cloud TPU"
    endpoint_extra = "tpu_endpoint"
    default_endpoint = TPU_PUBLIC_ENDPOINT

    def __init__(
        self,
        gcp_conn_id: str | None = "google_cloud_default",
        tpu_endpoint: str | None = None,
        project_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(gcp_conn_id, endpoint=tpu_endpoint, project_id=project_id, **kwargs)

    # -- plumbing -------------------------------------------------------------------------------------

    @functools.cached_property
    def client(self) -> tpu_v2.TpuClient:
        """The google-cloud-tpu v2 client over REST, aimed at our endpoint."""
        return _tpu_v2().TpuClient(
            credentials=self.get_credentials(), transport="rest", client_options=self.client_options()
        )

    def parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def node_name(self, zone: str, node_id: str) -> str:
        return f"{self.parent(zone)}/nodes/{node_id}"

    def queued_resource_name(self, zone: str, qr_id: str) -> str:
        return f"{self.parent(zone)}/queuedResources/{qr_id}"

    def url(self, name: str, version: str = "v2") -> str:
        return f"{self.base_url}/{version}/{name}"

    def _call(self, fn: Any, what: str) -> Any:
        return client_call(fn, self.retry_policy, what)

    def get_operation(self, name: str, version: str = "v2") -> dict[str, Any]:
        """Raw JSON of a long-running operation."""
        return self.rest.request("GET", self.url(name, version))

    def wait_operation(self, name: str, version: str = "v2") -> dict[str, Any]:
        """Poll an operation until ``done``; raise the mapped error if it ended with one.

        A TPU create beyond capacity or quota ends ``done`` with ``error.code == 8``: that becomes
        ``StockoutError`` / ``QuotaExceededError`` here.
        """

        def check() -> dict[str, Any] | None:
            op = self.get_operation(name, version)
            return op if op.get("done") else None

        op = poll_until(check, timeout=self.operation_timeout, max_interval=self.poll_interval, what=name)
        if op.get("error"):
            raise error_from_rpc_status(op["error"])
        return op

    # -- catalog --------------------------------------------------------------------------------------

    def list_accelerator_types(self, zone: str) -> list[str]:
        """Accelerator types offered in the zone, e.g. ``["v5litepod-8", "v6e-8"]``."""

        def fetch() -> list[str]:
            pager = self.client.list_accelerator_types(parent=self.parent(zone), retry=None, timeout=CALL_TIMEOUT)
            return [t.type_ or t.name.rsplit("/", 1)[-1] for t in pager]

        return sorted(set(self._call(fetch, f"list_accelerator_types {zone}")))

    def list_runtime_versions(self, zone: str) -> list[str]:
        """TPU software versions offered in the zone, e.g. ``["v2-alpha-tpuv6e", ...]``."""

        def fetch() -> list[str]:
            pager = self.client.list_runtime_versions(parent=self.parent(zone), retry=None, timeout=CALL_TIMEOUT)
            return [v.version or v.name.rsplit("/", 1)[-1] for v in pager]

        return sorted(set(self._call(fetch, f"list_runtime_versions {zone}")))

    # -- nodes ----------------------------------------------------------------------------------------

    def get_node(self, zone: str, node_id: str) -> dict[str, Any] | None:
        """The node as Google's raw JSON (incl. ``upcomingMaintenance``), or None if it does not exist."""
        try:
            return self.rest.request("GET", self.url(self.node_name(zone, node_id)))
        except NotFoundError:
            return None

    def list_nodes(self, zone: str) -> list[dict[str, Any]]:
        """All nodes of the zone, raw JSON like :meth:`get_node`."""
        return self.rest.list_all(self.url(f"{self.parent(zone)}/nodes"), "nodes")

    def create_node(self, zone: str, node_id: str, body: dict[str, Any], wait: bool = True) -> dict[str, Any]:
        """Create a node and (``wait=True``) wait for the create to finish; return the node.

        Idempotent: if a node of that id exists (an earlier attempt, a retried task), it is returned as
        it is (after waiting out CREATING when ``wait``). A stockout / quota failure raises
        ``StockoutError`` / ``QuotaExceededError`` with Google's message.
        """
        node = dict_to_message(_tpu_v2().Node, body)
        name = self.node_name(zone, node_id)
        try:
            op = self._call(
                lambda: self.client.create_node(
                    parent=self.parent(zone), node_id=node_id, node=node, retry=None, timeout=CALL_TIMEOUT
                ),
                f"create_node {name}",
            )
        except AlreadyExistsError:
            log.info("TPU node %s already exists; returning it", name)
            return self._existing_node(zone, node_id, wait)
        if wait:
            try:
                self.wait_operation(op.operation.name)
            except AlreadyExistsError:
                return self._existing_node(zone, node_id, wait)
        return self.get_node(zone, node_id) or {"name": name, "state": "CREATING"}

    def _existing_node(self, zone: str, node_id: str, wait: bool) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            node = self.get_node(zone, node_id)
            if node is None:
                raise NotFoundError(f"node {node_id} reported existing but is gone", 404, "NOT_FOUND")
            return None if wait and node.get("state", "STATE_UNSPECIFIED") in _SETTLING_STATES else node

        return poll_until(
            check, timeout=self.operation_timeout, max_interval=self.poll_interval, what=f"create {node_id}"
        )

    def delete_node(self, zone: str, node_id: str, wait: bool = True) -> None:
        """Delete a node; a node that does not exist (anymore) is fine."""
        name = self.node_name(zone, node_id)
        try:
            op = self._call(
                lambda: self.client.delete_node(name=name, retry=None, timeout=CALL_TIMEOUT),
                f"delete_node {name}",
            )
            if wait:
                self.wait_operation(op.operation.name)
        except NotFoundError:
            log.info("TPU node %s already gone", name)

    def stop_node(self, zone: str, node_id: str) -> dict[str, Any]:
        """Stop a node, wait for it, return the node."""
        name = self.node_name(zone, node_id)
        op = self._call(
            lambda: self.client.stop_node(request={"name": name}, retry=None, timeout=CALL_TIMEOUT), f"stop {name}"
        )
        self.wait_operation(op.operation.name)
        return self.get_node(zone, node_id) or {}

    def start_node(self, zone: str, node_id: str) -> dict[str, Any]:
        """Start a stopped node, wait for it, return the node."""
        name = self.node_name(zone, node_id)
        op = self._call(
            lambda: self.client.start_node(request={"name": name}, retry=None, timeout=CALL_TIMEOUT), f"start {name}"
        )
        self.wait_operation(op.operation.name)
        return self.get_node(zone, node_id) or {}

    # -- queued resources -----------------------------------------------------------------------------

    def create_queued_resource(self, zone: str, qr_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Queue a request for TPU capacity; return the queued resource (idempotent on ``qr_id``).

        Waits for the create operation (Google accepts quickly; the resource then waits for capacity
        in ``WAITING_FOR_RESOURCES`` rather than failing with a stockout).
        """
        qr = dict_to_message(_tpu_v2().QueuedResource, body)
        name = self.queued_resource_name(zone, qr_id)
        try:
            op = self._call(
                lambda: self.client.create_queued_resource(
                    parent=self.parent(zone),
                    queued_resource_id=qr_id,
                    queued_resource=qr,
                    retry=None,
                    timeout=CALL_TIMEOUT,
                ),
                f"create_queued_resource {name}",
            )
            self.wait_operation(op.operation.name)
        except AlreadyExistsError:
            log.info("queued resource %s already exists; returning it", name)
        existing = self.get_queued_resource(zone, qr_id)
        if existing is None:
            raise NotFoundError(f"queued resource {name} vanished right after its create", 404, "NOT_FOUND")
        return existing

    def get_queued_resource(self, zone: str, qr_id: str) -> dict[str, Any] | None:
        """Raw JSON of a queued resource (``state.state`` is the name), or None."""
        try:
            return self.rest.request("GET", self.url(self.queued_resource_name(zone, qr_id)))
        except NotFoundError:
            return None

    def list_queued_resources(self, zone: str) -> list[dict[str, Any]]:
        return self.rest.list_all(self.url(f"{self.parent(zone)}/queuedResources"), "queuedResources")

    def delete_queued_resource(self, zone: str, qr_id: str, force: bool = True, wait: bool = True) -> None:
        """Delete a queued resource (``force`` also deletes its nodes); missing is fine."""
        request = _tpu_v2().DeleteQueuedResourceRequest(name=self.queued_resource_name(zone, qr_id), force=force)
        try:
            op = self._call(
                lambda: self.client.delete_queued_resource(request=request, retry=None, timeout=CALL_TIMEOUT),
                f"delete_queued_resource {request.name}",
            )
            if wait:
                self.wait_operation(op.operation.name)
        except NotFoundError:
            log.info("queued resource %s already gone", request.name)

    # -- maintenance (v2alpha1) -----------------------------------------------------------------------

    def simulate_maintenance_event(
        self, zone: str, node_id: str, worker_ids: list[str] | None = None, wait: bool = False
    ) -> dict[str, Any]:
        """Ask Google to simulate a host maintenance event on the node's workers (worker 0 by default).

        Returns the operation JSON. Not waited for by default: the interesting part (notice in
        ``upcomingMaintenance``, then the node going down) is what the pipeline watches.
        """
        return self._v2alpha1_action(
            zone, node_id, "simulateMaintenanceEvent", {"workerIds": list(worker_ids or [])}, wait
        )

    def perform_maintenance(self, zone: str, node_id: str, wait: bool = False) -> dict[str, Any]:
        """Start the node's pending maintenance now (allowed when ``upcomingMaintenance.canReschedule``)."""
        return self._v2alpha1_action(zone, node_id, "performMaintenance", {}, wait)

    def _v2alpha1_action(self, zone: str, node_id: str, verb: str, body: dict[str, Any], wait: bool) -> dict[str, Any]:
        url = self.url(f"{self.node_name(zone, node_id)}:{verb}", "v2alpha1")
        op = self.rest.request("POST", url, json=body)
        if op.get("done") and op.get("error"):
            raise error_from_rpc_status(op["error"])
        if wait and not op.get("done") and op.get("name"):
            op = self.wait_operation(op["name"], "v2alpha1")
        return op


__all__ = ["TPU_PUBLIC_ENDPOINT", "AsyncTpuHook", "TpuHook"]
