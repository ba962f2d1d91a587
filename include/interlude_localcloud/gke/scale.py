"""The `scale` subresource of Deployments (autoscaling/v1 Scale), what `kubectl scale` and HPA use
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/deployment-v1/#get-read-scale-of-the-specified-deployment)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from interlude_localcloud.gke.status import bad_request

Obj = dict[str, Any]


def to_scale(deployment: Obj) -> Obj:
    meta = deployment["metadata"]
    spec = deployment.get("spec") or {}
    labels = ((spec.get("selector") or {}).get("matchLabels")) or {}
    status = deployment.get("status") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
        },
        "spec": {"replicas": int(spec.get("replicas", 1))},
        "status": {
            "replicas": int(status.get("replicas", 0)),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }


def apply_scale(new_scale: Callable[[Obj], Obj]) -> Callable[[Obj], Obj]:
    """A store mutation that sets spec.replicas from the Scale new_scale(current Scale) returns."""

    def mutate(deployment: Obj) -> Obj:
        scale = new_scale(to_scale(deployment))
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise bad_request("Scale.spec.replicas must be an integer")
        deployment["spec"]["replicas"] = replicas
        sent_rv = (scale.get("metadata") or {}).get("resourceVersion")
        if sent_rv:
            deployment["metadata"]["resourceVersion"] = sent_rv
        return deployment

    return mutate
