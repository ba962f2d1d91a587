"""Defaults the API server fills in on create/update, so clients read back what a real cluster shows.

Values from the Kubernetes API reference (https://kubernetes.io/docs/reference/kubernetes-api/):
Deployment replicas 1, RollingUpdate 25%/25%, revisionHistoryLimit 10, progressDeadlineSeconds 600;
Pod restartPolicy Always, dnsPolicy ClusterFirst, schedulerName default-scheduler,
terminationGracePeriodSeconds 30, container imagePullPolicy (Always for :latest or no tag, else
IfNotPresent); Service type ClusterIP with an allocated clusterIP, port protocol TCP and targetPort = port.
Jobs and JobSets: `job_api` (a Job's template gets no restartPolicy: it must say Never or OnFailure).
"""

from __future__ import annotations

import itertools
from typing import Any

from interlude_localcloud.gke import job_api
from interlude_localcloud.gke.resources import ResourceType

_CLUSTER_IPS = itertools.count(10)


def _container(c: dict[str, Any]) -> None:
    image = str(c.get("image") or "")
    tag = image.rsplit("/", 1)[-1]
    latest = ":" not in tag or tag.endswith(":latest")
    c.setdefault("imagePullPolicy", "Always" if latest and "@" not in tag else "IfNotPresent")
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("resources", {})
    for p in c.get("ports") or []:
        p.setdefault("protocol", "TCP")


def pod_spec(spec: dict[str, Any], restart_policy: str | None = "Always") -> None:
    if restart_policy:
        spec.setdefault("restartPolicy", restart_policy)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for c in spec.get("containers") or []:
        if isinstance(c, dict):
            _container(c)


def _deployment(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        strategy["type"] = "RollingUpdate"
        ru = strategy.setdefault("rollingUpdate", {})
        ru.setdefault("maxSurge", "25%")
        ru.setdefault("maxUnavailable", "25%")
    template_spec = (spec.get("template") or {}).get("spec")
    if isinstance(template_spec, dict):
        pod_spec(template_spec)


def _service(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec.get("clusterIP") != "None" and not spec.get("clusterIP"):
        n = next(_CLUSTER_IPS)
        spec["clusterIP"] = f"34.118.{n // 250}.{n % 250 + 1}"
        spec["clusterIPs"] = [spec["clusterIP"]]
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    for p in spec.get("ports") or []:
        if isinstance(p, dict):
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", p.get("port"))
    obj.setdefault("status", {"loadBalancer": {}})


def _namespace(obj: dict[str, Any]) -> None:
    name = (obj.get("metadata") or {}).get("name")
    if name:
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
    obj.setdefault("spec", {"finalizers": ["kubernetes"]})
    obj.setdefault("status", {"phase": "Active"})


def _pod(obj: dict[str, Any]) -> None:
    if isinstance(obj.get("spec"), dict):
        pod_spec(obj["spec"])
    obj.setdefault("status", {"phase": "Pending", "qosClass": "BestEffort"})


_BY_KIND = {
    "Deployment": _deployment,
    "Service": _service,
    "Namespace": _namespace,
    "Pod": _pod,
    "Job": lambda obj: job_api.job_defaults(obj, lambda spec: pod_spec(spec, restart_policy=None)),
    "JobSet": job_api.jobset_defaults,
}


def apply(rt: ResourceType, obj: dict[str, Any]) -> None:
    fn = _BY_KIND.get(rt.kind)
    if fn is not None:
        fn(obj)
