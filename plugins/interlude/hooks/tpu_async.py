"""Non-blocking TPU API reads for triggers (nodes, guest attributes, queued resources) over raw REST.

Its own module so that the triggerer imports neither google-cloud-tpu nor the Google provider's
``GoogleBaseHook`` (the sync :class:`interlude.hooks.tpu.TpuHook`): see :mod:`interlude.hooks.async_base`.
Node dicts are Google's JSON, camelCase with enum names, including ``upcomingMaintenance``
(https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes).
"""

from __future__ import annotations

from typing import Any

from interlude.hooks.async_base import InterludeGoogleAsyncHook

TPU_PUBLIC_ENDPOINT = "https://tpu.googleapis.com"


class AsyncTpuHook(InterludeGoogleAsyncHook):
    """Non-blocking node reads for triggers; same arguments and return shapes as
    :class:`~interlude.hooks.tpu.TpuHook`."""

    sync_hook_path = "interlude.hooks.tpu:TpuHook"
    endpoint_extra = "tpu_endpoint"
    default_endpoint = TPU_PUBLIC_ENDPOINT

    def __init__(
        self,
        gcp_conn_id: str | None = "google_cloud_default",
        tpu_endpoint: str | None = None,
        project_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(gcp_conn_id, tpu_endpoint=tpu_endpoint, project_id=project_id, **kwargs)

    async def url(self, path: str, version: str = "v2") -> str:
        """``<endpoint>/<version>/projects/<project>/locations/<path>``."""
        return f"{await self.base_url()}/{version}/projects/{await self.project()}/locations/{path}"

    async def get_node(self, zone: str, node_id: str) -> dict[str, Any] | None:
        """Like :meth:`TpuHook.get_node`."""
        return await self.get_or_none(await self.url(f"{zone}/nodes/{node_id}"))

    async def get_guest_attributes(self, zone: str, node_id: str, query_path: str) -> list[dict[str, Any]]:
        """The node's guest attributes under ``query_path`` (``NAMESPACE/`` or ``NAMESPACE/KEY``), as
        ``{"namespace", "key", "value"}`` entries of every worker: what the guest wrote to its metadata server
        (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/getGuestAttributes)."""
        rest = await self.async_rest()
        url = await self.url(f"{zone}/nodes/{node_id}:getGuestAttributes")
        out = await rest.request("POST", url, json={"queryPath": query_path})
        return [
            dict(entry)
            for attrs in out.get("guestAttributes") or []
            for entry in (attrs.get("queryValue") or {}).get("items") or []
        ]

    async def list_nodes(self, zone: str, fields: str | None = None) -> list[dict[str, Any]]:
        """Like :meth:`TpuHook.list_nodes`; ``fields`` asks for a partial response (e.g. ``observe.list_fields``)."""
        rest = await self.async_rest()
        return await rest.list_all(await self.url(f"{zone}/nodes"), "nodes", {"fields": fields} if fields else None)

    async def get_queued_resource(self, zone: str, qr_id: str) -> dict[str, Any] | None:
        """Like :meth:`TpuHook.get_queued_resource`."""
        return await self.get_or_none(await self.url(f"{zone}/queuedResources/{qr_id}"))
