"""Credentials, project and endpoint resolution shared by the TPU and Compute hooks.

One code path serves Google and the local cloud: the Airflow connection (``google_cloud_default``,
type ``google_cloud_platform``) gives credentials the Google provider's way, plus the extras
``project``, ``is_anonymous``, ``tpu_endpoint``, ``compute_endpoint`` and ``container_endpoint``
(GKE, read by ``interlude.hooks.gke``; absent = Google's public endpoints) and ``time_scale`` (absent =
1: Google's clock; the local cloud's dev environment sets its scenario's, so Google-real durations such
as a maintenance margin map to its faster clock). Constructor arguments override the extras;
``gcp_conn_id=None`` means anonymous credentials and no Airflow connection at all, so tests and the local
cloud need no metadata database. The async hooks (the triggerer's) read the same connection without the
provider's hook module: ``interlude.hooks.async_base`` and ``interlude.hooks.credentials``.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from airflow.providers.common.compat.sdk import BaseHook
from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
from google.api_core.client_options import ClientOptions
from google.auth.credentials import Credentials

from interlude.hooks._rest import RestClient
from interlude.hooks._retry import DEFAULT_RETRY_POLICY, RetryPolicy
from interlude.hooks.async_base import InterludeGoogleAsyncHook

DEFAULT_POLL_INTERVAL = 10.0
DEFAULT_OPERATION_TIMEOUT = 3600.0


class InterludeGoogleHook(GoogleBaseHook):
    """GoogleBaseHook plus an API endpoint, a project and the retry/poll settings of our hooks.

    Subclasses name the connection extra that holds their endpoint and Google's public default.
    """

    endpoint_extra: ClassVar[str] = ""
    default_endpoint: ClassVar[str] = ""

    def __init__(
        self,
        gcp_conn_id: str | None = "google_cloud_default",
        *,
        endpoint: str | None = None,
        project_id: str | None = None,
        impersonation_chain: str | list[str] | None = None,
        retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        if gcp_conn_id is None:
            # GoogleBaseHook.__init__ would look the connection up; anonymous needs none.
            BaseHook.__init__(self, **kwargs)
            self.gcp_conn_id = None  # type: ignore[assignment]
            self.impersonation_chain = impersonation_chain
            self.quota_project_id = None
            self.extras: dict[str, Any] = {"is_anonymous": True}
            self._cached_credentials = None
            self._cached_project_id = None
        else:
            super().__init__(gcp_conn_id=gcp_conn_id, impersonation_chain=impersonation_chain, **kwargs)
        self._endpoint_override = endpoint
        self._project_override = project_id
        self.retry_policy = retry_policy
        self.poll_interval = poll_interval
        self.operation_timeout = operation_timeout

    @functools.cached_property
    def custom_endpoint(self) -> str | None:
        """The configured endpoint (constructor, then connection extra), or None for Google's."""
        value = self._endpoint_override or self._get_field(self.endpoint_extra, None)
        return str(value).rstrip("/") if value else None

    @property
    def base_url(self) -> str:
        """Base URL for raw REST calls (scheme + host[:port], no path)."""
        return self.custom_endpoint or self.default_endpoint

    def client_options(self) -> ClientOptions:
        """``client_options`` for google-cloud-* clients: our endpoint when one is configured."""
        if self.custom_endpoint:
            return ClientOptions(api_endpoint=self.custom_endpoint)
        return self.get_client_options()

    @functools.cached_property
    def time_scale(self) -> float:
        """How much faster than Google's clock the cloud behind this connection runs (1 = Google)."""
        raw = self._get_field("time_scale", None)
        value = 1.0 if raw in (None, "") else float(raw)
        if value <= 0:
            raise ValueError(f"{type(self).__name__}: connection extra time_scale must be > 0, not {value}")
        return value

    @functools.cached_property
    def project(self) -> str:
        """The project all calls address: constructor ``project_id``, else the connection's project."""
        if self._project_override:
            return self._project_override
        _, project = self.get_credentials_and_project_id()
        if not project:
            raise ValueError(
                f"{type(self).__name__}: no project; pass project_id= or set the connection extra 'project'"
            )
        return project

    @functools.cached_property
    def rest(self) -> RestClient:
        """Raw JSON REST session with this hook's credentials and retry policy."""
        return RestClient(self.get_credentials(), self.retry_policy)

    def credentials(self) -> Credentials:
        return self.get_credentials()


__all__ = ["InterludeGoogleAsyncHook", "InterludeGoogleHook"]
