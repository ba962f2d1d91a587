"""Non-blocking Compute Engine instance reads for triggers, over raw REST.

Its own module so that the triggerer imports neither google-cloud-compute nor the Google provider's
``GoogleBaseHook`` (the sync :class:`interlude.hooks.compute.ComputeHook`): see
:mod:`interlude.hooks.async_base`. Instances are Google's JSON, camelCase, including
``resourceStatus.upcomingMaintenance`` (https://cloud.google.com/compute/docs/reference/rest/v1/instances).
"""

from __future__ import annotations

from typing import Any

from interlude.hooks.async_base import InterludeGoogleAsyncHook

COMPUTE_PUBLIC_ENDPOINT = "https://compute.googleapis.com"


class AsyncComputeHook(InterludeGoogleAsyncHook):
    """Non-blocking instance reads for triggers; same arguments and return shapes as
    :class:`~interlude.hooks.compute.ComputeHook`."""

    sync_hook_path = "interlude.hooks.compute:ComputeHook"
    endpoint_extra = "compute_endpoint"
    default_endpoint = COMPUTE_PUBLIC_ENDPOINT

    def __init__(
        self,
        gcp_conn_id: str | None = "google_cloud_default",
        compute_endpoint: str | None = None,
        project_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(gcp_conn_id, compute_endpoint=compute_endpoint, project_id=project_id, **kwargs)

    async def instances_url(self, zone: str) -> str:
        return f"{await self.base_url()}/compute/v1/projects/{await self.project()}/zones/{zone}/instances"

    async def get_instance(self, zone: str, name: str) -> dict[str, Any] | None:
        """Like :meth:`ComputeHook.get_instance`."""
        return await self.get_or_none(f"{await self.instances_url(zone)}/{name}")

    async def list_instances(
        self, zone: str, filter: str | None = None, fields: str | None = None
    ) -> list[dict[str, Any]]:
        """Like :meth:`ComputeHook.list_instances`; ``fields`` asks for a partial response."""
        rest = await self.async_rest()
        params = {k: v for k, v in (("filter", filter), ("fields", fields)) if v}
        return await rest.list_all(await self.instances_url(zone), "items", params or None)

    async def serial_port_output(self, zone: str, name: str, start: int) -> dict[str, Any]:
        """The instance's serial port 1 output from byte ``start`` (``contents``, ``next``)
        (https://cloud.google.com/compute/docs/reference/rest/v1/instances/getSerialPortOutput)."""
        rest = await self.async_rest()
        url = f"{await self.instances_url(zone)}/{name}/serialPort"
        return await rest.request("GET", url, params={"start": str(start)})
