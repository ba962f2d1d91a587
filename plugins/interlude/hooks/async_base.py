"""Base of the async hooks (the triggerer's): credentials, project and endpoint, then HTTP on the event loop.

Not a ``GoogleBaseAsyncHook``: that class lives in the provider's ``base_google`` module, whose imports
(googleapiclient, httplib2, gcloud-aio/aiohttp, the Secret Manager client) cost every trigger-runner process
~17 MB that no watch uses. The connection is read by :func:`interlude.hooks.credentials.load_connection`, the
provider's way for the common forms and by the provider itself for the rest. ``sync_hook()`` still builds the
matching sync hook (``GoogleBaseHook``) for callers that want one, importing it only then.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any, ClassVar

from interlude.hooks._rest import AsyncRestClient
from interlude.hooks._retry import DEFAULT_RETRY_POLICY, RetryPolicy
from interlude.hooks.credentials import ConnectionSettings, load_connection
from interlude.hooks.errors import NotFoundError


class InterludeGoogleAsyncHook:
    """Non-blocking REST calls with the connection's credentials; subclasses name their endpoint extra.

    Keyword arguments are the sync hook's (``<api>_endpoint``, ``project_id``, ``impersonation_chain``,
    ``retry_policy``, ...): ``sync_hook()`` gets them all.
    """

    sync_hook_path: ClassVar[str] = ""  # "module:Class" of the matching sync hook
    endpoint_extra: ClassVar[str] = ""  # connection extra and constructor argument naming the endpoint
    default_endpoint: ClassVar[str] = ""

    def __init__(self, gcp_conn_id: str | None = "google_cloud_default", **kwargs: Any) -> None:
        self.gcp_conn_id = gcp_conn_id
        self._hook_kwargs = {"gcp_conn_id": gcp_conn_id, **kwargs}
        self._endpoint_override: str | None = kwargs.get(self.endpoint_extra)
        self._project_override: str | None = kwargs.get("project_id")
        self._impersonation_chain: str | list[str] | None = kwargs.get("impersonation_chain")
        self.retry_policy: RetryPolicy = kwargs.get("retry_policy", DEFAULT_RETRY_POLICY)
        self._settings: ConnectionSettings | None = None
        self._loading: tuple[asyncio.AbstractEventLoop, asyncio.Future[ConnectionSettings]] | None = None
        self._sync: Any = None
        self._rest: AsyncRestClient | None = None

    async def settings(self) -> ConnectionSettings:
        """The connection's credentials, project and extras: looked up once, in a worker thread, however many
        callers ask at once (a thousand triggers starting together share one hook and must share one lookup:
        each is a round trip to the triggerer's supervisor)."""
        if self._settings is not None:
            return self._settings
        loop = asyncio.get_running_loop()
        if self._loading is None or self._loading[0] is not loop:
            lookup = asyncio.to_thread(load_connection, self.gcp_conn_id, self._impersonation_chain)
            self._loading = (loop, asyncio.ensure_future(lookup))
        future = self._loading[1]
        try:
            self._settings = await asyncio.shield(future)
        except BaseException:
            if self._loading is not None and self._loading[1] is future and future.done():
                self._loading = None  # a failed lookup is tried afresh by the next caller
            raise
        return self._settings

    async def base_url(self) -> str:
        """Scheme + host[:port] of the API: the constructor's endpoint, the connection's extra, else Google's."""
        value = self._endpoint_override or (await self.settings()).field(self.endpoint_extra)
        return str(value).rstrip("/") if value else self.default_endpoint

    async def project(self) -> str:
        """The project all calls address: constructor ``project_id``, else the connection's project."""
        project = self._project_override or (await self.settings()).project
        if not project:
            why = "no project; pass project_id= or set the connection extra 'project'"
            raise ValueError(f"{type(self).__name__}: {why}")
        return project

    async def async_rest(self) -> AsyncRestClient:
        if self._rest is None:
            settings = await self.settings()
            await self.project()  # fail early, before the first call, when there is none
            self._rest = self._rest or AsyncRestClient(settings.credentials, self.retry_policy)
        return self._rest

    async def get_or_none(self, url: str) -> dict[str, Any] | None:
        """GET a resource; None when Google says it does not exist (404), as the sync hooks' ``get_*`` do."""
        rest = await self.async_rest()
        try:
            return await rest.request("GET", url)
        except NotFoundError:
            return None

    async def sync_hook(self) -> Any:
        """The matching sync hook, built (and its module imported) in a worker thread on first use."""
        if self._sync is None:
            module_name, _, name = self.sync_hook_path.partition(":")

            def build() -> Any:
                return getattr(importlib.import_module(module_name), name)(**self._hook_kwargs)

            self._sync = await asyncio.to_thread(build)
        return self._sync

    async def aclose(self) -> None:
        """Close the HTTP connections (optional; a trigger may call it when it ends)."""
        if self._rest is not None:
            await self._rest.aclose()

    async def __aenter__(self) -> InterludeGoogleAsyncHook:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
