"""Kubernetes objects of one GKE cluster through the provider's GKEKubernetesHook client: server-side
apply, delete, existence and the Service proxy. Typed results so the operators log and return facts.

Why server-side apply: the API server merges and tracks field ownership (managedFields), so applying the
same manifests again is a no-op - no new resourceVersion - and fields others own (the HPA's replicas) are
left alone (https://kubernetes.io/docs/reference/using-api/server-side-apply/).
Why the Service proxy: it reaches a ClusterIP Service from outside the cluster through the API server, with
the same credentials, and no port-forward or public address
(https://kubernetes.io/docs/tasks/access-application-cluster/access-cluster-services/).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

FIELD_MANAGER = "interlude"
UNAVAILABLE_RETRY_SECONDS = 30.0  # a Service's endpoints lag its pods' readiness by seconds, not minutes
UNAVAILABLE_RETRY_INTERVAL = 1.0

Ref = tuple[str, str, str | None, str]  # (apiVersion, kind, namespace or None, name)


@dataclass(frozen=True)
class Applied:
    """One object after an apply: what it is and whether the apply changed it (resourceVersion moved)."""

    api_version: str
    kind: str
    namespace: str | None
    name: str
    resource_version_before: str | None  # None: the apply created it
    resource_version_after: str

    @property
    def outcome(self) -> str:
        if self.resource_version_before is None:
            return "created"
        return "unchanged" if self.resource_version_before == self.resource_version_after else "configured"

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "outcome": self.outcome}


class KubeObjects:
    """The objects of one cluster, through a `kubernetes.client.ApiClient` (from GKEKubernetesHook.get_conn())."""

    def __init__(self, api_client: client.ApiClient, field_manager: str = FIELD_MANAGER) -> None:
        self.api_client = api_client
        self.dyn = DynamicClient(api_client)
        self.field_manager = field_manager

    def _resource(self, api_version: str, kind: str) -> Any:
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def get(self, ref: Ref) -> dict[str, Any] | None:
        api_version, kind, namespace, name = ref
        try:
            return dict(self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict())
        except NotFoundError:
            return None

    def apply(self, manifest: dict[str, Any]) -> Applied:
        """Server-side apply one manifest (force: Interlude owns what it renders), reporting the change."""
        meta = manifest["metadata"]
        ref: Ref = (manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"])
        before = self.get(ref)
        res = self._resource(ref[0], ref[1])
        after = res.server_side_apply(
            body=manifest,
            name=ref[3],
            namespace=ref[2],
            field_manager=self.field_manager,
            force_conflicts=True,
        ).to_dict()
        rv_before = None if before is None else str(before["metadata"]["resourceVersion"])
        return Applied(*ref, rv_before, str(after["metadata"]["resourceVersion"]))

    def delete(self, ref: Ref) -> bool:
        """Delete (background propagation, so the Deployment's pods go too); False when it was not there."""
        api_version, kind, namespace, name = ref
        try:
            self._resource(api_version, kind).delete(
                name=name, namespace=namespace, body={"propagationPolicy": "Background"}
            )
        except NotFoundError:
            return False
        return True

    def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """The objects as the API returns them (its own camelCase field names)."""
        res = self._resource(api_version, kind)
        return list(res.get(namespace=namespace, label_selector=label_selector or None).to_dict()["items"])

    def service_call(
        self,
        namespace: str,
        service: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float = 120,
        unavailable_for: float = UNAVAILABLE_RETRY_SECONDS,
    ) -> Any:
        """GET (body None) or POST JSON to `path` of a Service through the API server's proxy; the JSON answer.

        `service` is `name` or `name:port`; `path` is a fixed route of the server (never from a param).
        A 503 is retried for `unavailable_for` seconds: a Service's endpoints follow its pods' Ready condition
        a moment later (the endpoints controller, then kube-proxy), so right after a rollout reports its
        replicas available the proxy can still answer "no endpoints available for service".
        """
        deadline = time.monotonic() + unavailable_for
        while True:
            try:
                resp = self.api_client.call_api(
                    f"/api/v1/namespaces/{namespace}/services/{service}/proxy/{path.lstrip('/')}",
                    "GET" if body is None else "POST",
                    header_params={"Accept": "application/json", "Content-Type": "application/json"},
                    body=body,
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=timeout,
                )
            except client.ApiException as e:
                if e.status != 503 or time.monotonic() >= deadline:
                    raise
                time.sleep(UNAVAILABLE_RETRY_INTERVAL)
                continue
            return json.loads(resp.data)
