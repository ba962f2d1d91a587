"""GKE through the Google provider's hooks, with the Container API endpoint from the connection.

The provider's ``GKEHook.get_cluster_manager_client()`` passes no endpoint override, so it can only
reach container.googleapis.com. ``GKEHook`` here reads the connection extra ``container_endpoint``
(like ``tpu_endpoint``/``compute_endpoint``, absent = Google's) and talks REST to it. The Kubernetes
API of a cluster is reached the provider's way, through ``GKEKubernetesHook``: the cluster's
``endpoint`` and ``masterAuth.clusterCaCertificate`` from the Container API, and a Google access
token as the bearer token (https://cloud.google.com/kubernetes-engine/docs/how-to/api-server-authentication).
With anonymous credentials (the local cloud) a fixed dummy bearer token is sent: GKE's API server
needs *a* token, and anonymous credentials cannot mint one.
"""

from __future__ import annotations

import asyncio
import base64
import tempfile
from dataclasses import dataclass
from typing import Any

from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook as ProviderGKEHook
from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook, GKEKubernetesHook
from airflow.providers.google.common.consts import CLIENT_INFO
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud.container_v1 import ClusterManagerClient
from google.oauth2.credentials import Credentials as TokenCredentials
from kubernetes_asyncio import client as async_client

ENDPOINT_EXTRA = "container_endpoint"
#: Bearer token sent with anonymous credentials (the local cloud accepts any token, GKE none of these).
ANONYMOUS_BEARER_TOKEN = "localcloud-anonymous"


def _token_credentials(credentials: Credentials) -> Credentials:
    """Credentials that yield a bearer token: the given ones, or a fixed dummy token when anonymous."""
    if isinstance(credentials, AnonymousCredentials):
        return TokenCredentials(token=ANONYMOUS_BEARER_TOKEN)
    return credentials


@dataclass(frozen=True)
class ClusterAccess:
    """What a Kubernetes client needs for one cluster: its URL, CA (base64 PEM) and a bearer token."""

    url: str
    ca_base64: str
    token: str

    def ca_file(self) -> str:
        """The CA written to a private temporary file (clients take a path)."""
        with tempfile.NamedTemporaryFile("wb", prefix="gke-ca-", suffix=".pem", delete=False) as f:
            f.write(base64.b64decode(self.ca_base64))
            return f.name


class LocalAwareGKEKubernetesHook(GKEKubernetesHook):
    """The provider's GKEKubernetesHook, sending a dummy bearer token when the connection is anonymous."""

    def get_credentials(self) -> Credentials:
        return _token_credentials(super().get_credentials())


class LocalAwareGKEKubernetesAsyncHook(GKEKubernetesAsyncHook):
    """The provider's async hook (kubernetes_asyncio, for triggers), with the same dummy token when anonymous.

    The provider's ``_load_config`` refreshes the credentials to mint a token, which anonymous
    credentials cannot do; with them the fixed token is sent instead.
    """

    sync_hook_class = LocalAwareGKEKubernetesHook

    async def _load_config(self) -> async_client.ApiClient:
        sync_hook = await self.get_sync_hook()
        credentials = await asyncio.to_thread(sync_hook.get_credentials)
        if isinstance(credentials, TokenCredentials) and credentials.token == ANONYMOUS_BEARER_TOKEN:
            return async_client.ApiClient(
                self._get_config(), header_name="Authorization", header_value=f"Bearer {ANONYMOUS_BEARER_TOKEN}"
            )
        return await super()._load_config()


class GKEHook(ProviderGKEHook):
    """The provider's GKEHook whose ClusterManagerClient honours the ``container_endpoint`` extra.

    :param container_endpoint: overrides the connection extra (e.g. the local cloud's API endpoint).
    """

    def __init__(
        self,
        gcp_conn_id: str = "google_cloud_default",
        location: str | None = None,
        *,
        container_endpoint: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(gcp_conn_id=gcp_conn_id, location=location, **kwargs)
        self._endpoint_override = container_endpoint

    @property
    def container_endpoint(self) -> str | None:
        value = self._endpoint_override or self._get_field(ENDPOINT_EXTRA, None)
        return str(value).rstrip("/") if value else None

    def get_cluster_manager_client(self) -> ClusterManagerClient:
        if self._client is None and self.container_endpoint:
            self._client = ClusterManagerClient(
                credentials=self.get_credentials(),
                client_info=CLIENT_INFO,
                transport="rest",
                client_options=ClientOptions(api_endpoint=self.container_endpoint),
            )
        return super().get_cluster_manager_client()

    def cluster_access(self, cluster_name: str, project_id: str | None = None) -> ClusterAccess:
        """Endpoint + CA of a cluster from the Container API, and the bearer token to present."""
        cluster = self.get_cluster(name=cluster_name, project_id=project_id or self.project_id)
        creds = _token_credentials(self.get_credentials())
        if not creds.valid:
            import google.auth.transport.requests

            creds.refresh(google.auth.transport.requests.Request())
        return ClusterAccess(
            f"https://{cluster.endpoint}", cluster.master_auth.cluster_ca_certificate, str(creds.token)
        )

    def kubernetes_async_hook(self, cluster_name: str, project_id: str | None = None) -> GKEKubernetesAsyncHook:
        """The provider's GKEKubernetesAsyncHook for one cluster (kubernetes_asyncio; `async with hook.get_conn()`)."""
        cluster = self.get_cluster(name=cluster_name, project_id=project_id or self.project_id)
        return LocalAwareGKEKubernetesAsyncHook(
            cluster_url=f"https://{cluster.endpoint}",
            ssl_ca_cert=cluster.master_auth.cluster_ca_certificate,
            gcp_conn_id=self.gcp_conn_id,
            impersonation_chain=self.impersonation_chain,
        )

    def kubernetes_hook(self, cluster_name: str, project_id: str | None = None) -> GKEKubernetesHook:
        """The provider's GKEKubernetesHook for one cluster (same connection, endpoint and CA from GKE)."""
        cluster = self.get_cluster(name=cluster_name, project_id=project_id or self.project_id)
        return LocalAwareGKEKubernetesHook(
            cluster_url=f"https://{cluster.endpoint}",
            ssl_ca_cert=cluster.master_auth.cluster_ca_certificate,
            gcp_conn_id=self.gcp_conn_id,
            impersonation_chain=self.impersonation_chain,
        )
